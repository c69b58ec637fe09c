"""Four threads, each in its own function, allocate different known amounts and keep them.

Explicit loops, not comprehensions: before 3.12 a comprehension runs in a frame of its own.
The list holding the objects (8 bytes per item) is the only other live allocation of each
worker: under 0.1% of its total.
"""
import json
import sys
import threading

SIZE = 10000
KEEP = {}


def worker_1(n):
    out = [None] * n
    for i in range(n):
        out[i] = bytes(SIZE)
    KEEP[1] = out


def worker_2(n):
    out = [None] * n
    for i in range(n):
        out[i] = bytes(SIZE)
    KEEP[2] = out


def worker_3(n):
    out = [None] * n
    for i in range(n):
        out[i] = bytes(SIZE)
    KEEP[3] = out


def worker_4(n):
    out = [None] * n
    for i in range(n):
        out[i] = bytes(SIZE)
    KEEP[4] = out


counts = {worker_1: 250, worker_2: 500, worker_3: 750, worker_4: 1000}
threads = [threading.Thread(target=f, args=(n,)) for f, n in counts.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
one = sys.getsizeof(bytes(SIZE))
with open(sys.argv[1], "w") as f:
    json.dump({f.__name__: n * one for f, n in counts.items()}, f)
