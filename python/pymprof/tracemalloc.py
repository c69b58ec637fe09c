"""A drop-in for the standard :mod:`tracemalloc`, on mprof's agent.

``sys.modules["tracemalloc"] = pymprof.tracemalloc`` (before the code that uses it imports it)
makes code and tests written for tracemalloc run on mprof: the same functions and classes,
with the same arguments, attributes and errors, as the standard library documents them.

``start()`` traces every allocation, as tracemalloc does (rate 1: sizes and counts exact).
``start(sample_rate=128 * 1024)`` samples instead: an allocation of ``s`` bytes is sampled
with probability ``1 - exp(-s / sample_rate)`` and stands for ``s / p`` bytes, so every size
and count below is an unbiased estimate; ``Statistic.size_stderr`` and friends say how far
to trust it. Written from the standard library's documentation.

What differs (see docs/python.md):

- the traces are kept by mprof's reader, a child process; ``get_tracemalloc_memory()`` is its
  resident memory;
- only Python's allocators (domain 0) are traced here, as in tracemalloc; ``pymprof.start()``
  sees the C allocator family (domain ``NATIVE_DOMAIN``) and memory mappings
  (``MMAP_DOMAIN``) too;
- an object taken from one of CPython's free lists keeps the traceback of the allocation
  that first made its memory (tracemalloc gives it the reusing line);
- tracebacks keep at most 256 frames; a deeper stack has ``total_nframe`` None.
"""

import math
import os
import sys
import threading

from . import _decode
from ._session import Session, SessionError, current
from ._snapshot import (BaseFilter, DomainFilter, Filter, Frame, Snapshot, Statistic,
                        StatisticDiff, Trace, Traceback, _whole)
from ._units import parse_size

__all__ = [
    "BaseFilter", "DomainFilter", "Filter", "Frame", "Snapshot", "Statistic", "StatisticDiff",
    "Trace", "Traceback", "clear_traces", "get_object_traceback", "get_traceback_limit",
    "get_traced_memory", "get_traced_memory_stderr", "get_tracemalloc_memory", "is_tracing",
    "reset_peak", "start", "stop", "take_snapshot",
]

#: The domain of blocks from the C allocator family (``pymprof.start(native=True)``).
NATIVE_DOMAIN = 1
#: The domain of anonymous memory mappings.
MMAP_DOMAIN = 2

_MAX_NFRAME = 65535


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.session = None
        self.nframe = 1


_state = _State()


def _running():
    """The drop-in's session, if it runs (and was not lost to a fork or a dead reader)."""
    s = _state.session
    if s is not None and (s.dead or current() is not s):
        _state.session = None
        return None
    return s


def start(nframe=1, *, sample_rate=1):
    """Starts tracing Python's allocations, keeping ``nframe`` frames a traceback (1 to
    65535). ``sample_rate`` (bytes, or a string such as ``"128 KiB"``): 1 traces every
    allocation; more samples them (see the module doc). Does nothing when tracing already."""
    if isinstance(nframe, bool) or not isinstance(nframe, int):
        raise TypeError("an integer is required (got type %s)" % type(nframe).__name__)
    if not 1 <= nframe <= _MAX_NFRAME:
        raise ValueError("the number of frames must be in range [1; %d]" % _MAX_NFRAME)
    rate = parse_size(sample_rate, "sample_rate")
    if rate < 1:
        raise ValueError("sample_rate must be at least 1 byte, got %r" % (sample_rate,))
    with _state.lock:
        if _running() is not None:
            return
        session = Session(rate, "pymprof.tracemalloc", native=False,
                          max_depth=min(256, max(nframe, 128)))
        try:
            session.start()
        except SessionError as e:
            raise RuntimeError(str(e)) from None
        _state.session = session
        _state.nframe = nframe


def stop():
    """Stops tracing and forgets the traces. Does nothing when not tracing."""
    with _state.lock:
        s = _running()
        _state.session = None
        if s is not None:
            s.stop()


def is_tracing():
    """Whether Python's allocations are being traced."""
    return _running() is not None


def _ask(line):
    s = _running()
    if s is None:
        return None
    try:
        return s.ask(line)
    except SessionError as e:
        raise RuntimeError(str(e)) from None


def get_traceback_limit():
    """The most frames a trace's traceback keeps (``start(nframe)``)."""
    return _state.nframe


def get_traced_memory():
    """(current, peak): bytes of the traced blocks now and at their highest."""
    reply = _ask("memory")
    if reply is None:
        return (0, 0)
    return (_whole(reply["current"]["bytes"]), _whole(reply["peak"]["bytes"]))


def get_traced_memory_stderr():
    """The standard errors of :func:`get_traced_memory`'s two figures (0 at rate 1)."""
    reply = _ask("memory")
    if reply is None:
        return (0.0, 0.0)
    return tuple(math.sqrt(max(reply[k]["variance"], 0.0)) for k in ("current", "peak"))


def reset_peak():
    """The peak becomes the traced memory now. Does nothing when not tracing."""
    _ask("reset_peak")


def clear_traces():
    """Forgets the traces of the blocks allocated so far. Does nothing when not tracing."""
    _ask("clear")


def get_tracemalloc_memory():
    """Bytes of memory used to keep the traces (mprof's reader's resident memory)."""
    reply = _ask("overhead")
    return 0 if reply is None else int(reply["bytes"])


def take_snapshot():
    """The traces of the blocks allocated since tracing started and still live."""
    s = _running()
    if s is None:
        raise RuntimeError("the tracemalloc module must be tracing memory allocations to "
                           "take a snapshot")
    return snapshot_of(s, _state.nframe)


def snapshot_of(session, nframe):
    """A :class:`Snapshot` of ``session``'s live blocks, tracebacks cut to ``nframe``."""
    try:
        raw = session.ask("snapshot %d" % nframe)
    except SessionError as e:
        raise RuntimeError(str(e)) from None
    rate, table = _decode.decode(raw)
    return Snapshot(table, nframe, rate, "%d:%d" % (os.getpid(), id(session)))


_PTR = 8 if sys.maxsize > 2 ** 32 else 4
_HAVE_GC = 1 << 14
_PREHEADER = (1 << 4) if sys.version_info[:2] == (3, 11) else (1 << 4) | (1 << 3)


def _block_address(obj):
    """Where the memory block that holds ``obj`` starts: before the object, the garbage
    collector's header (for types it tracks) and, from 3.11, the managed dict and weakref
    pointers."""
    flags = type(obj).__flags__
    before = 2 * _PTR if flags & _HAVE_GC else 0
    if sys.version_info >= (3, 11) and flags & _PREHEADER:
        before += 2 * _PTR
    return id(obj) - before


def get_object_traceback(obj):
    """Where ``obj`` was allocated, or None when not tracing or its block was not traced
    (sampled: was not sampled)."""
    reply = _ask("traceback %d %d" % (_block_address(obj), _state.nframe))
    if reply is None or reply.get("frames") is None:
        return None
    return Traceback(tuple((f, n) for f, n in reply["frames"]), reply.get("total"))
