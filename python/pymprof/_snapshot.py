"""The classes of pymprof.tracemalloc's snapshots, as the standard tracemalloc documents them:
``Snapshot`` (over a :class:`pymprof._decode.Table`: statistics and filters work group by
group, a ``Trace`` is made when one is asked for), ``Statistic``, ``StatisticDiff``,
``Trace``, ``Traceback``, ``Frame``, ``Filter``, ``DomainFilter``, and the snapshot file.
Sampled, every size and count is an estimate, with its standard error beside it.
"""

import bisect
import fnmatch
import json
import linecache
import math
import zlib
from array import array
from collections.abc import Sequence
from functools import total_ordering

from . import _decode

_FILE_MAGIC = b"PYMPROF-SNAPSHOT 1\n"


def _format_size(size, sign):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 100 and unit != "B":
            return ("%+.1f %s" if sign else "%.1f %s") % (size, unit)
        if abs(size) < 10 * 1024 or unit == "TiB":
            return ("%+.0f %s" if sign else "%.0f %s") % (size, unit)
        size /= 1024


def _whole(x):
    return int(round(x))


@total_ordering
class Frame:
    """A frame of a traceback: where a block was allocated."""

    __slots__ = ("_frame",)

    def __init__(self, frame):
        self._frame = frame

    @property
    def filename(self):
        return self._frame[0]

    @property
    def lineno(self):
        return self._frame[1]

    def __eq__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame == other._frame

    def __lt__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame < other._frame

    def __hash__(self):
        return hash(self._frame)

    def __str__(self):
        return "%s:%s" % (self.filename, self.lineno)

    def __repr__(self):
        return "<Frame filename=%r lineno=%r>" % (self.filename, self.lineno)


@total_ordering
class Traceback(Sequence):
    """The frames of an allocation, from the oldest to the most recent.

    Built from ``(filename, lineno)`` tuples most recent first, as tracemalloc's own."""

    __slots__ = ("_frames", "_total_nframe")

    def __init__(self, frames, total_nframe=None):
        Sequence.__init__(self)
        self._frames = tuple(frames)
        self._total_nframe = total_nframe

    @property
    def total_nframe(self):
        """Frames the traceback had before it was cut to the limit (None if unknown)."""
        return self._total_nframe

    def __len__(self):
        return len(self._frames)

    def __getitem__(self, index):
        n = len(self._frames)
        if isinstance(index, slice):
            return tuple(Frame(f) for f in self._frames[::-1][index])
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("traceback index out of range")
        return Frame(self._frames[n - 1 - index])

    def __contains__(self, frame):
        return isinstance(frame, Frame) and frame._frame in self._frames

    def __hash__(self):
        return hash(self._frames)

    def __eq__(self, other):
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames == other._frames

    def __lt__(self, other):
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames < other._frames

    def __str__(self):
        return str(self[0])

    def __repr__(self):
        s = "<Traceback %r" % (tuple(self),)
        if self._total_nframe is not None:
            s += " total_nframe=%s" % self._total_nframe
        return s + ">"

    def format(self, limit=None, most_recent_first=False):
        """The traceback as lines, with the source lines ``linecache`` finds. ``limit``: the
        ``limit`` most recent frames if positive; if negative, all but the ``abs(limit)`` most
        recent (what the standard module does)."""
        frames = list(self)
        if limit is not None:
            frames = frames[-limit:] if limit > 0 else frames[:limit]
        if most_recent_first:
            frames.reverse()
        lines = []
        for frame in frames:
            lines.append('  File "%s", line %s' % (frame.filename, frame.lineno))
            source = linecache.getline(frame.filename, frame.lineno).strip()
            if source:
                lines.append("    %s" % source)
        return lines


class Trace:
    """A memory block: its domain, size and traceback. Sampled, ``size`` is what the sample
    stands for, ``block_size`` the sampled block's own size and ``count`` the allocations it
    stands for."""

    __slots__ = ("_trace",)

    def __init__(self, trace):
        self._trace = trace

    @property
    def domain(self):
        return self._trace[0]

    @property
    def size(self):
        return _whole(self._trace[1])

    @property
    def traceback(self):
        return Traceback(self._trace[2], self._trace[3])

    @property
    def count(self):
        return self._trace[4] if len(self._trace) > 4 else 1.0

    @property
    def block_size(self):
        return self._trace[6] if len(self._trace) > 6 else self.size

    def __eq__(self, other):
        if not isinstance(other, Trace):
            return NotImplemented
        return self._trace[:4] == other._trace[:4]

    def __hash__(self):
        return hash(self._trace[:4])

    def __str__(self):
        return "%s: %s" % (self.traceback, _format_size(self.size, False))

    def __repr__(self):
        return "<Trace domain=%s size=%s, traceback=%r>" % (
            self.domain, _format_size(self.size, False), self.traceback)


class _Traces(Sequence):
    """The traces of a snapshot: its groups of a :class:`pymprof._decode.Table`, one
    :class:`Trace` made at a time."""

    def __init__(self, table, groups):
        Sequence.__init__(self)
        self._table = table
        self._groups = groups
        self._offsets = []
        n = 0
        for g in groups:
            self._offsets.append(n)
            n += g[3]
        self._len = n

    def __len__(self):
        return self._len

    def _raw(self, index):
        g = bisect.bisect_right(self._offsets, index) - 1
        group = self._groups[g]
        return self._table.trace(group, group[2] + index - self._offsets[g])

    def _raws(self):
        for group in self._groups:
            for j in range(group[2], group[2] + group[3]):
                yield self._table.trace(group, j)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(Trace(self._raw(i)) for i in range(*index.indices(self._len)))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("trace index out of range")
        return Trace(self._raw(index))

    def __iter__(self):
        return (Trace(t) for t in self._raws())

    def __contains__(self, trace):
        return isinstance(trace, Trace) and any(t[:4] == trace._trace[:4] for t in self._raws())

    def __eq__(self, other):
        if not isinstance(other, _Traces):
            return NotImplemented
        return list(self._raws()) == list(other._raws())

    def __repr__(self):
        return "<Traces len=%s>" % len(self)


class Statistic:
    """Statistic on memory allocations: ``size`` bytes in ``count`` blocks at ``traceback``.

    Sampled, ``size`` and ``count`` are estimates (rounded), with their standard errors in
    ``size_stderr`` and ``count_stderr``, resting on ``samples`` samples."""

    __slots__ = ("traceback", "size", "count", "size_stderr", "count_stderr", "samples")

    def __init__(self, traceback, size, count, size_stderr=0.0, count_stderr=0.0, samples=None):
        self.traceback = traceback
        self.size = size
        self.count = count
        self.size_stderr = size_stderr
        self.count_stderr = count_stderr
        self.samples = count if samples is None else samples

    def __hash__(self):
        return hash((self.traceback, self.size, self.count))

    def __eq__(self, other):
        if not isinstance(other, Statistic):
            return NotImplemented
        return (self.traceback == other.traceback and self.size == other.size
                and self.count == other.count)

    def __str__(self):
        text = "%s: size=%s, count=%i" % (
            self.traceback, _format_size(self.size, False), self.count)
        if self.count:
            text += ", average=%s" % _format_size(self.size / self.count, False)
        return text

    def __repr__(self):
        return "<Statistic traceback=%r size=%i count=%i>" % (
            self.traceback, self.size, self.count)

    def _sort_key(self):
        return (self.size, self.count, self.traceback)


class StatisticDiff:
    """The difference of a statistic between an old and a new snapshot; sampled, with the
    standard error of ``size_diff`` (samples in both snapshots cancel out)."""

    __slots__ = ("traceback", "size", "size_diff", "count", "count_diff", "size_diff_stderr")

    def __init__(self, traceback, size, size_diff, count, count_diff, size_diff_stderr=0.0):
        self.traceback = traceback
        self.size = size
        self.size_diff = size_diff
        self.count = count
        self.count_diff = count_diff
        self.size_diff_stderr = size_diff_stderr

    def __hash__(self):
        return hash((self.traceback, self.size, self.size_diff, self.count, self.count_diff))

    def __eq__(self, other):
        if not isinstance(other, StatisticDiff):
            return NotImplemented
        return ((self.traceback, self.size, self.size_diff, self.count, self.count_diff)
                == (other.traceback, other.size, other.size_diff, other.count,
                    other.count_diff))

    def __str__(self):
        text = "%s: size=%s (%s), count=%i (%+i)" % (
            self.traceback, _format_size(self.size, False),
            _format_size(self.size_diff, True), self.count, self.count_diff)
        if self.count:
            text += ", average=%s" % _format_size(self.size / self.count, False)
        return text

    def __repr__(self):
        return "<StatisticDiff traceback=%r size=%i (%+i) count=%i (%+i)>" % (
            self.traceback, self.size, self.size_diff, self.count, self.count_diff)

    def _sort_key(self):
        return (abs(self.size_diff), self.size, abs(self.count_diff), self.count,
                self.traceback)


def _normalize(filename):
    return filename[:-1] if filename.endswith(".pyc") else filename


class BaseFilter:
    """What :class:`Filter` and :class:`DomainFilter` share: ``inclusive``."""

    def __init__(self, inclusive):
        self.inclusive = inclusive

    def _match(self, trace):
        raise NotImplementedError


class Filter(BaseFilter):
    """Keeps (``inclusive``) or drops the traces allocated in files matching
    ``filename_pattern`` (``fnmatch``), at ``lineno`` if given, in ``domain`` if given;
    ``all_frames`` looks at every frame of the traceback, not only the most recent."""

    def __init__(self, inclusive, filename_pattern, lineno=None, all_frames=False, domain=None):
        super().__init__(inclusive)
        self.inclusive = inclusive
        self._filename_pattern = _normalize(filename_pattern)
        self.lineno = lineno
        self.all_frames = all_frames
        self.domain = domain

    @property
    def filename_pattern(self):
        return self._filename_pattern

    def _frame_matches(self, filename, lineno):
        if not fnmatch.fnmatch(_normalize(filename), self._filename_pattern):
            return False
        return self.lineno is None or lineno == self.lineno

    def _traceback_matches(self, frames):
        if self.all_frames:
            return any(self._frame_matches(f, n) for f, n in frames)
        return bool(frames) and self._frame_matches(*frames[0])

    def _match(self, trace):
        """Whether this filter keeps ``trace``."""
        hit = self._traceback_matches(trace[2])
        if self.domain is not None:
            hit = hit and trace[0] == self.domain
        return hit if self.inclusive else not hit


class DomainFilter(BaseFilter):
    """Keeps (``inclusive``) or drops the traces of one domain."""

    def __init__(self, inclusive, domain):
        super().__init__(inclusive)
        self.inclusive = inclusive
        self._domain = domain

    @property
    def domain(self):
        return self._domain

    def _match(self, trace):
        return (trace[0] == self._domain) == bool(self.inclusive)


class _Sums:
    """A statistic being summed: estimates, their variances, and the samples behind them."""

    __slots__ = ("size", "count", "variance", "count_variance", "samples", "total", "seqs")

    def __init__(self, total):
        self.size = self.count = self.variance = self.count_variance = 0.0
        self.samples = 0
        self.total = total
        self.seqs = None

    def add(self, group, table, keep_seqs):
        self.size += group[4]
        self.count += group[5]
        self.variance += group[6]
        self.count_variance += group[7]
        self.samples += group[3]
        if keep_seqs:
            if self.seqs is None:
                self.seqs = {}
            for j in range(group[2], group[2] + group[3]):
                self.seqs[table.seqs[j]] = table.variances[j]

    def statistic(self, traceback):
        return Statistic(traceback, _whole(self.size), _whole(self.count),
                         math.sqrt(max(self.variance, 0.0)),
                         math.sqrt(max(self.count_variance, 0.0)), self.samples)


class Snapshot:
    """The traces of the blocks live when the snapshot was taken."""

    def __init__(self, traces, traceback_limit, sample_rate=1, session=None):
        table = traces if isinstance(traces, _decode.Table) else _decode.table_of(traces)
        self._table = table
        self._groups = table.groups
        self.traces = _Traces(table, self._groups)
        self.traceback_limit = traceback_limit
        #: Mean bytes between samples (1: every allocation was traced).
        self.sample_rate = sample_rate
        self._session = session

    def _with_groups(self, groups):
        other = Snapshot(self._table, self.traceback_limit, self.sample_rate, self._session)
        other._groups = groups
        other.traces = _Traces(self._table, groups)
        return other

    def dump(self, filename):
        """Writes the snapshot into ``filename`` (read back with :meth:`load`)."""
        t = self._table
        tracebacks, groups = {}, []
        columns = {"sizes": [], "counts": [], "variances": [], "blocks": [], "seqs": []}
        for g in self._groups:
            index = tracebacks.setdefault(g[1], len(tracebacks))
            groups.append([g[0], index, g[3]] + list(g[4:]))
            for name, values in columns.items():
                values.extend(getattr(t, name)[g[2]:g[2] + g[3]])
        payload = {
            "traceback_limit": self.traceback_limit,
            "sample_rate": self.sample_rate,
            "session": self._session,
            "tracebacks": [[t.tracebacks[i][1], [list(f) for f in t.tracebacks[i][0]]]
                           for i in tracebacks],
            "groups": groups,
            "columns": columns,
        }
        with open(filename, "wb") as f:
            f.write(_FILE_MAGIC)
            f.write(zlib.compress(json.dumps(payload).encode()))

    @staticmethod
    def load(filename):
        """The snapshot :meth:`dump` wrote into ``filename``; ``ValueError`` for any other file."""
        with open(filename, "rb") as f:
            data = f.read()
        return _load(data, filename)

    def filter_traces(self, filters):
        """A new snapshot with the traces ``filters`` keep: a trace is kept when an
        inclusive filter (if there is any) matches it and no exclusive filter does."""
        if not isinstance(filters, (list, tuple)):
            raise TypeError("filters must be a list of filters, not %s" % type(filters).__name__)
        for f in filters:
            if not isinstance(f, BaseFilter):
                raise TypeError("filters must be Filter or DomainFilter instances, not %s"
                                % type(f).__name__)
        include = [f for f in filters if f.inclusive]
        exclude = [f for f in filters if not f.inclusive]
        kept = []
        for g in self._groups:
            frames, total = self._table.tracebacks[g[1]]
            trace = (g[0], None, frames, total)
            if include and not any(f._match(trace) for f in include):
                continue
            if all(f._match(trace) for f in exclude):
                kept.append(g)
        return self._with_groups(kept)

    def _group_by(self, key_type, cumulative, keep_seqs=False):
        if key_type not in ("traceback", "filename", "lineno"):
            raise ValueError("unknown key_type: %r" % (key_type,))
        if cumulative and key_type not in ("lineno", "filename"):
            raise ValueError("cumulative mode cannot by used with key type %r" % key_type)
        sums = {}
        for g in self._groups:
            frames, total = self._table.tracebacks[g[1]]
            if key_type == "traceback":
                keys = ((frames, total),)
            elif cumulative:
                keys = [(((f[0], 0) if key_type == "filename" else f,), None) for f in frames]
            else:
                f = frames[0] if frames else ("<unknown>", 0)
                keys = ((((f[0], 0) if key_type == "filename" else f,), None),)
            for key in keys:
                s = sums.get(key[0])
                if s is None:
                    s = sums[key[0]] = _Sums(key[1])
                s.add(g, self._table, keep_seqs)
        return sums

    def statistics(self, key_type, cumulative=False):
        """Statistics grouped by ``key_type`` (``'filename'``, ``'lineno'`` or
        ``'traceback'``), biggest first. ``cumulative``: every frame of a traceback counts,
        not only the most recent."""
        stats = [s.statistic(Traceback(frames, s.total))
                 for frames, s in self._group_by(key_type, cumulative).items()]
        stats.sort(reverse=True, key=Statistic._sort_key)
        return stats

    def compare_to(self, old_snapshot, key_type, cumulative=False):
        """What changed since ``old_snapshot``: :class:`StatisticDiff` instances, biggest
        change first."""
        same = self._session is not None and self._session == old_snapshot._session
        sampled = self.sample_rate != 1 or old_snapshot.sample_rate != 1
        new = self._group_by(key_type, cumulative, keep_seqs=sampled and same)
        old = old_snapshot._group_by(key_type, cumulative, keep_seqs=sampled and same)
        diffs = []
        for frames, s in new.items():
            traceback = Traceback(frames, s.total)
            o = old.pop(frames, None)
            if o is None:
                diffs.append(StatisticDiff(traceback, _whole(s.size), _whole(s.size),
                                           _whole(s.count), _whole(s.count),
                                           math.sqrt(max(s.variance, 0.0))))
                continue
            diffs.append(StatisticDiff(traceback, _whole(s.size), _whole(s.size - o.size),
                                       _whole(s.count), _whole(s.count - o.count),
                                       _diff_stderr(s, o, same)))
        for frames, o in old.items():
            diffs.append(StatisticDiff(Traceback(frames, o.total), 0, -_whole(o.size), 0,
                                       -_whole(o.count), math.sqrt(max(o.variance, 0.0))))
        diffs.sort(reverse=True, key=StatisticDiff._sort_key)
        return diffs


def _diff_stderr(new, old, same_session):
    if new.seqs is None or old.seqs is None or not same_session:
        return math.sqrt(max(new.variance + old.variance, 0.0))
    variance = sum(v for q, v in new.seqs.items() if q not in old.seqs)
    variance += sum(v for q, v in old.seqs.items() if q not in new.seqs)
    return math.sqrt(max(variance, 0.0))


def _load(data, filename):
    def bad(why):
        return ValueError("%s is not a pymprof snapshot file: %s" % (filename, why))

    if not data.startswith(_FILE_MAGIC):
        if data[:1] == b"\x80":
            raise bad("it looks like a pickle (the standard tracemalloc's dump format): load "
                      "it with the standard library's tracemalloc.Snapshot.load")
        raise bad("it does not start with %r" % _FILE_MAGIC.strip())
    try:
        payload = json.loads(zlib.decompress(data[len(_FILE_MAGIC):]).decode())
        tracebacks = [(tuple((str(f), int(n)) for f, n in frames),
                       None if total is None else int(total))
                      for total, frames in payload["tracebacks"]]
        columns = payload["columns"]
        kinds = {"sizes": "d", "counts": "d", "variances": "d", "blocks": "Q", "seqs": "Q"}
        arrays = {name: array(kind, columns[name]) for name, kind in kinds.items()}
        if len(set(len(a) for a in arrays.values())) != 1:
            raise ValueError("columns of different lengths")
        groups, start = [], 0
        for domain, tb, n, size, count, variance, count_variance in payload["groups"]:
            tracebacks[tb]  # noqa: B018 - an IndexError for a traceback that is not there
            groups.append((int(domain), int(tb), start, int(n), float(size), float(count),
                           float(variance), float(count_variance)))
            start += int(n)
        if start != len(arrays["sizes"]):
            raise ValueError("the groups hold %d traces, the columns %d"
                             % (start, len(arrays["sizes"])))
        table = _decode.Table(tracebacks, groups, **arrays)
        return Snapshot(table, int(payload["traceback_limit"]), int(payload["sample_rate"]),
                        payload.get("session"))
    except (zlib.error, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError,
            OverflowError) as e:
        raise bad("damaged (%s: %s)" % (type(e).__name__, e)) from None
