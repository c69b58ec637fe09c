"""One program, traced by the standard tracemalloc or by pymprof.tracemalloc (argv[1]:
"standard" or "pymprof"); prints the traced memory and the statistics by line as JSON.

Its allocations are the kinds a program makes (bytes, strings, a dict, objects, a buffer grown
in place, a big temporary for the peak), at lines of their own; none comes from one of
CPython's free lists, which the two modules attribute differently (see docs/python.md).
"""

import json
import sys

if sys.argv[1] == "pymprof":
    import pymprof.tracemalloc

    sys.modules["tracemalloc"] = pymprof.tracemalloc

import tracemalloc  # noqa: E402


class Node:
    __slots__ = ("left", "right")

    def __init__(self):
        self.left = self.right = None


def build():
    keep = []
    keep.append([bytes(2000) for _ in range(3000)])
    keep.append(["x" * 100 + str(i) for i in range(50000)])
    keep.append({i: "value %d" % i for i in range(30000)})
    temporary = [bytearray(10000) for _ in range(2000)]
    del temporary
    keep.append([Node() for _ in range(30000)])
    buf = bytearray()
    for _ in range(2000):
        buf += b"y" * 1000
    keep.append(buf)
    return keep


tracemalloc.start()
data = build()
current, peak = tracemalloc.get_traced_memory()
stats = tracemalloc.take_snapshot().statistics("lineno")
lines = {
    str(s.traceback[0].lineno): [s.size, s.count]
    for s in stats
    if s.traceback[0].filename == __file__
}
tracemalloc.stop()
print(json.dumps({"current": current, "peak": peak, "lines": lines}))
