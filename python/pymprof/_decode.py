"""The snapshot table mprof's reader sends (``src/inprocess/wire.rs`` draws its layout),
taken in as a :class:`Table`: a few Python objects whatever the number of traces (every
Python allocation is a sample at rate 1, which the program would pay for, and the table
arrives while the program runs).

A :class:`Table` holds the traces group by group, a group being the traces of one (domain,
traceback): ``tracebacks`` is a list of ``(frames, total_nframe)`` (``frames``, a tuple of
``(filename, lineno)``, most recent first); ``groups`` a list of ``(domain, traceback index,
first trace, traces, bytes, count, variance, count variance)``, the last four summed over the
group's traces; and five columns, one value per trace: ``sizes`` and ``counts`` (what its
sample stands for), ``variances`` (its share of a sum's variance), ``blocks`` (the sampled
block's own size) and ``seqs`` (the sample's number in its session).
"""

import struct
from array import array

MAGIC = b"PMSNAP02"
_GROUP = struct.Struct("<IIIIdddd")
_NONE = 0xFFFFFFFF


class Table:
    __slots__ = ("tracebacks", "groups", "sizes", "counts", "variances", "blocks", "seqs")

    def __init__(self, tracebacks, groups, sizes, counts, variances, blocks, seqs):
        self.tracebacks = tracebacks
        self.groups = groups
        self.sizes = sizes
        self.counts = counts
        self.variances = variances
        self.blocks = blocks
        self.seqs = seqs

    def trace(self, group, j):
        """The raw trace ``j`` (an index into the columns) of ``group``: ``(domain, size,
        frames, total_nframe, count, variance, block size, seq)``."""
        frames, total = self.tracebacks[group[1]]
        return (group[0], self.sizes[j], frames, total, self.counts[j], self.variances[j],
                self.blocks[j], self.seqs[j])


def _column(kind, raw, pos, n):
    values = array(kind)
    values.frombytes(raw[pos:pos + 8 * n])
    return values, pos + 8 * n


def decode(raw):
    """(sample rate, :class:`Table`) of a snapshot table."""
    if raw[:8] != MAGIC:
        raise ValueError("not a snapshot table")
    (rate,) = struct.unpack_from("<Q", raw, 8)
    pos = 16
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    strings = []
    for _ in range(n):
        (length,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        strings.append(raw[pos:pos + length].decode("utf-8", "surrogateescape"))
        pos += length
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    flat = struct.unpack_from("<%dI" % (2 * n), raw, pos)
    pos += 8 * n
    frames = [(strings[flat[i]], flat[i + 1]) for i in range(0, 2 * n, 2)]
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    tracebacks = []
    for _ in range(n):
        total, k = struct.unpack_from("<II", raw, pos)
        pos += 8
        ids = struct.unpack_from("<%dI" % k, raw, pos)
        pos += 4 * k
        tracebacks.append((tuple(frames[i] for i in ids), None if total == _NONE else total))
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    groups = []
    start = 0
    for domain, tb, count, _, size, estimated, variance, count_variance in _GROUP.iter_unpack(
            raw[pos:pos + n * _GROUP.size]):
        groups.append((domain, tb, start, count, size, estimated, variance, count_variance))
        start += count
    pos += n * _GROUP.size
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    sizes, pos = _column("d", raw, pos, n)
    counts, pos = _column("d", raw, pos, n)
    variances, pos = _column("d", raw, pos, n)
    blocks, pos = _column("Q", raw, pos, n)
    seqs, pos = _column("Q", raw, pos, n)
    return rate, Table(tracebacks, groups, sizes, counts, variances, blocks, seqs)


def table_of(traces):
    """The :class:`Table` of raw traces: tracemalloc's ``(domain, size, frames, total_nframe)``
    (every block traced) or pymprof's longer ones (see :meth:`Table.trace`)."""
    by_key = {}
    for t in traces:
        by_key.setdefault((t[0], t[2], t[3] if len(t) > 3 else None), []).append(t)
    tracebacks, groups = [], []
    sizes, counts, variances = array("d"), array("d"), array("d")
    blocks, seqs = array("Q"), array("Q")
    for (domain, frames, total), members in by_key.items():
        tracebacks.append((tuple(frames), total))
        sums = [0.0, 0.0, 0.0, 0.0]
        for t in members:
            size, count, variance = t[1], (t[4] if len(t) > 4 else 1.0), (t[5] if len(t) > 5 else 0.0)
            sizes.append(size)
            counts.append(count)
            variances.append(variance)
            blocks.append(int(t[6]) if len(t) > 6 else int(size))
            seqs.append(int(t[7]) if len(t) > 7 else 0)
            sums[0] += size
            sums[1] += count
            sums[2] += variance
            sums[3] += count * (count - 1.0)
        groups.append((domain, len(tracebacks) - 1, len(sizes) - len(members), len(members),
                       *sums))
    return Table(tracebacks, groups, sizes, counts, variances, blocks, seqs)
