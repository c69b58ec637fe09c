"""The mprof agent inside this process: loaded from the image mprof hands over, or found
where ``mprof record`` or ``mprof attach`` (or an earlier session of this process) loaded it.

The agent is loaded once and never unloaded. Its entry points are called with the GIL held
(``PYFUNCTYPE``): no Python code of another thread runs while the agent puts its hooks in
front of the interpreter's allocators, or takes them out.
"""

import ctypes
import os

# The agent this process loaded, kept for the life of the process (it is never unloaded).
_loaded = []

_ENTRY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int)


def _mapped_agent():
    """The address where an mprof agent's image starts in this process, or None."""
    starts = {}
    executable = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) < 6 or "mprof-agent" not in fields[5]:
                continue
            key = (fields[5].strip(), fields[4])
            if int(fields[2], 16) == 0:
                starts.setdefault(key, int(fields[0].split("-")[0], 16))
            if "x" in fields[1]:
                executable.add(key)
    for key, start in starts.items():
        if key in executable:
            return start
    return None


class Agent:
    """The agent's entry points in this process."""

    def __init__(self, start, stop, loaded_here):
        self.start = start
        self.stop = stop
        self.loaded_here = loaded_here


def find_or_load(agent_fd, info):
    """The agent's entry points: of the agent already mapped here, if it is this very image
    (``info``: where the entry points and the first segment are in it, from mprof), else of
    the image in ``agent_fd``, loaded now."""
    start = _mapped_agent()
    loaded_here = False
    if start is None:
        _loaded.append(ctypes.PyDLL("/proc/self/fd/%d" % agent_fd, mode=os.RTLD_NOW))
        loaded_here = True
        start = _mapped_agent()
        if start is None:
            raise RuntimeError("pymprof: the mprof agent was loaded but is not mapped where expected")
    off, length = info["segment"]
    if off != 0:
        raise RuntimeError("pymprof: unexpected layout of the mprof agent (first segment at %d)" % off)
    base = start - info["first_vaddr"]
    image = os.pread(agent_fd, length, off)
    if ctypes.string_at(start, length) != image:
        raise RuntimeError(
            "pymprof: this process already holds the agent of another mprof version (loaded by "
            "mprof record or mprof attach); profile it with that mprof, or run the program "
            "without it"
        )
    return Agent(
        _ENTRY(base + info["start"]),
        _ENTRY(base + info["stop"]),
        loaded_here,
    )
