"""pymprof: mprof, the sampling memory profiler for CPython, from pip.

- the ``mprof`` command (``python -m pymprof`` reaches it whatever else is on PATH);
- :mod:`pymprof.tracemalloc`, a drop-in for the standard ``tracemalloc``;
- :func:`start`: profile this process (or a ``with`` block) into a capture every ``mprof``
  view reads, with snapshots that include native allocations;
- a pytest plugin: ``@pytest.mark.limit_memory("24 MB")``, ``@pytest.mark.limit_leaks``,
  ``--pymprof``.

Reference: docs/python.md.
"""

from . import tracemalloc
from ._session import Session, SessionError, current
from ._units import parse_size
from .tracemalloc import MMAP_DOMAIN, NATIVE_DOMAIN, Snapshot

__all__ = [
    "MMAP_DOMAIN", "NATIVE_DOMAIN", "Profile", "SessionError", "Snapshot", "start", "stop",
    "take_snapshot", "get_traced_memory", "is_profiling", "tracemalloc",
]
__version__ = "0.1.0"

#: The sampling rate of :func:`start` by default: the ``mprof`` command's.
DEFAULT_RATE = 128 * 1024
#: Where :func:`start` writes its capture by default: the ``mprof`` command's default name.
DEFAULT_OUTPUT = "mprof.out.mprof"


class Profile:
    """A running profile of this process (:func:`start`); a context manager that stops it."""

    def __init__(self, session):
        self._session = session
        self.output = session.output
        self.sample_rate = session.rate
        #: What the reader said at the end (samples, dropped records), once stopped.
        self.result = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def running(self):
        return self.result is None and self._session.dead is None

    def stop(self):
        """Ends the profile and finishes the capture. Does nothing the second time."""
        if self.result is None:
            self.result = self._session.stop()
        return self.result

    def take_snapshot(self, nframe=1):
        """The blocks live now, as a :class:`pymprof.tracemalloc.Snapshot`: Python's in domain
        0, the C allocator family's in ``NATIVE_DOMAIN``, memory mappings in ``MMAP_DOMAIN``."""
        if not self.running:
            raise RuntimeError("pymprof: this profile has stopped")
        return tracemalloc.snapshot_of(self._session, nframe)

    def get_traced_memory(self):
        """(current, peak) estimated bytes of the blocks allocated since the start."""
        reply = self._session.ask("memory")
        return (int(round(reply["current"]["bytes"])), int(round(reply["peak"]["bytes"])))


def _rate(sample_rate):
    rate = parse_size(sample_rate, "sample_rate")
    if rate < 1:
        raise ValueError("sample_rate must be at least 1 byte, got %r" % (sample_rate,))
    return rate


def start(sample_rate=DEFAULT_RATE, native=True, output=DEFAULT_OUTPUT, native_stacks=False,
          max_depth=128, seed=0, focus=()):
    """Starts profiling this process; returns a :class:`Profile` (also a context manager).

    ``sample_rate``: mean bytes between samples (``"512 KiB"`` or an int; 1 records every
    allocation). ``native``: sample the C allocator family and memory mappings too, not only
    Python's allocators. ``output``: the capture to write (``mprof report``, ``flamegraph``,
    ``html``, ``diff`` read it), or None for none. ``native_stacks``: record each sample's C
    frames too (needs ``output``). ``max_depth``, ``seed``, ``focus``: as the ``mprof``
    command's ``--max-depth``, ``--seed`` and ``--focus``.

    Raises ``RuntimeError`` when this process is profiled already (by ``mprof record``,
    ``mprof attach``, :mod:`pymprof.tracemalloc` or another :func:`start`)."""
    rate = _rate(sample_rate)
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= 256:
        raise ValueError("max_depth must be an integer from 1 to 256, got %r" % (max_depth,))
    if native_stacks and output is None:
        raise ValueError("native_stacks needs an output capture (native frames are read there)")
    session = Session(rate, "pymprof.start()", native=bool(native), native_stacks=native_stacks,
                      output=output, max_depth=max_depth, seed=seed, focus=focus)
    try:
        session.start()
    except SessionError as e:
        raise RuntimeError(str(e)) from None
    return Profile(session)


def _profile():
    s = current()
    if s is None or s.owner != "pymprof.start()":
        return None
    return Profile(s)


def stop():
    """Stops the profile :func:`start` began, if one runs; returns the reader's last word."""
    s = current()
    if s is not None and s.owner == "pymprof.start()":
        return s.stop()
    return None


def is_profiling():
    """Whether a profile that :func:`start` began is running."""
    return _profile() is not None


def take_snapshot(nframe=1):
    """A snapshot of the running profile (see :meth:`Profile.take_snapshot`)."""
    p = _profile()
    if p is None:
        raise RuntimeError("pymprof: no profile is running (pymprof.start() first)")
    return p.take_snapshot(nframe)


def get_traced_memory():
    """(current, peak) of the running profile (see :meth:`Profile.get_traced_memory`)."""
    p = _profile()
    if p is None:
        raise RuntimeError("pymprof: no profile is running (pymprof.start() first)")
    return p.get_traced_memory()
