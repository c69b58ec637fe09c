"""Allocations from stacks that change between samples in every way a thread's stack can.

usage: [SHAPES_MAX_DEPTH=N] stack_shapes.py DIR

The agent re-reads only the part of a thread's stack that changed since that thread's last
sample. This program makes the part that changes take every shape: recursion to depths that
jump about (from one frame to forty changed between two samples), two stacks that differ only in
their outermost frame (every frame inside it at the same address and instruction), a generator
resumed from two callers, one caller calling from two lines, recursion with a C function
between every two levels, a frame that allocates twice in a row (only it changes between the
two samples; its callers alternate), and two threads doing the same with the interpreter
switching between them all the time.

Every allocation that is checked is `bytes(n)` in `leaf`, of a whole number of UNIT bytes:
the interpreter's own allocations at the same line (3.8's caches of a code object's global
lookups, made once) are a few hundred bytes, so a sample put on the wrong stack shows as a
difference of UNIT or more. The same control flow runs twice: once probing (each `leaf` call
records its stack, from the `scenarios` or `worker` frame in, as (function, line) pairs: the
leaf's own line is the one of its allocation), then allocating. DIR/truth.json gets
{"unit": UNIT, "stacks": {stack: bytes}}, each stack written as mprof's folded export writes it
from that frame in, `name (path:line)` joined by `;`.

With SHAPES_MAX_DEPTH (mprof's `--max-depth`), a stack of more Python frames keeps its
innermost SHAPES_MAX_DEPTH under mprof's `<truncated stack>` pseudo-frame, as the export writes it; from the
`scenarios` or `worker` frame in when that frame is among the ones kept. The depths then jump
across the cut.
"""
import json
import os
import sys
import threading

HERE = os.path.abspath(__file__)
HEADER = sys.getsizeof(b"")
ROOTS = ("scenarios", "worker")
UNIT = 16384
# The lengths of bytes objects of k units, made once (the arithmetic would allocate ints).
LENGTHS = [max(0, k * UNIT - HEADER) for k in range(4)]
ALLOC_LINE = None  # the line of the allocation in `leaf`, found below
PROBING = [True]
TRUTH = {}
LOCK = threading.Lock()
MAX_DEPTH = [None]
TRUNCATED = "<truncated stack>"
ONCE, TWICE = (0,), (0, 1)


def leaf(k, again=0):
    """Allocates k UNITs, then `again` more at another instruction of the same line (each bytes
    object's header included): between those two samples only this frame changes."""
    if PROBING[0]:
        return probe(k + again)
    first = bytes(LENGTHS[k]); return first and bytes(LENGTHS[again])  # the allocation


def probe(k):
    f = sys._getframe(2)
    frames = ["leaf (%s:%d)" % (HERE, ALLOC_LINE)]
    names = ["leaf"]
    while f is not None:
        code = f.f_code
        frames.append("%s (%s:%d)" % (code.co_name, code.co_filename, f.f_lineno))
        names.append(code.co_name)
        f = f.f_back
    kept = MAX_DEPTH[0] or len(frames)
    if len(frames) > kept:
        frames, names = frames[:kept] + [TRUNCATED], names[:kept] + [TRUNCATED]
    root = next((i for i, name in enumerate(names) if name in ROOTS), len(frames) - 1)
    key = ";".join(reversed(frames[: root + 1]))
    with LOCK:
        TRUTH[key] = TRUTH.get(key, 0) + k * UNIT


def rec(depth, n):
    if depth == 0:
        return leaf(n)
    return rec(depth - 1, n)


def through_c(depth, n):
    """Recursion with a C function between every two levels (3.12+ puts a shim frame there)."""
    if depth == 0:
        return leaf(n)
    return max(map(through_c_next, [(depth, n)]))


def through_c_next(args):
    return through_c(args[0] - 1, args[1])


def x(n, again=0):
    return y(n, again)


def y(n, again):
    return z(n, again)


def z(n, again=0):
    # With `again`, `leaf` twice from one line: from its third sample on, only `leaf` changes
    # between two samples of the thread, and it runs what it ran two samples before.
    for _ in TWICE if again else ONCE:
        made = leaf(n, again)
    return made


def from_a(n, again=0):
    return x(n, again)


def from_b(n, again=0):
    return x(n, again)


def gen(n):
    while True:
        leaf(n)
        yield


def caller_one(g):
    next(g)


def caller_two(g):
    next(g)


def two_lines(i, n):
    if i % 2:
        return leaf(n)
    return leaf(n + 1)


def depths(seed):
    """Depths from 0 to 40 that jump about: runs of the same depth, small steps, large ones."""
    out, d = [], seed % 7
    for i in range(120):
        step = (i * 7919 + seed) % 13
        if step < 4:
            pass
        elif step < 9:
            d = max(0, min(40, d + step - 6))
        else:
            d = (d * 31 + step) % 41
        out.append(d)
    return out


def scenarios():
    for d in depths(1):
        rec(d, 1 + d % 3)
    for i in range(200):
        (from_a if i % 2 else from_b)(1 + i % 3)
    for i in range(200):
        (from_a if i % 2 else from_b)(1 + i % 3, 1 + i % 2)
    g = gen(2)
    for i in range(200):
        (caller_one if i % 3 else caller_two)(g)
    for i in range(200):
        two_lines(i, 1)
    for d in depths(2):
        rec(d, 3)
        z(2)
    for d in depths(5):
        through_c(d // 2, 1 + d % 3)


def worker(seed):
    for _ in range(5):
        for d in depths(seed):
            rec(d, 1 + seed % 3)
            (from_a if d % 2 else from_b)(2)


def run():
    scenarios()
    threads = [threading.Thread(target=worker, args=(s,)) for s in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(out_dir):
    global ALLOC_LINE
    MAX_DEPTH[0] = int(os.environ.get("SHAPES_MAX_DEPTH", 0)) or None
    with open(HERE) as src:
        ALLOC_LINE = next(i for i, line in enumerate(src, 1) if "# the allocation" in line)
    sys.setswitchinterval(1e-5)
    run()
    PROBING[0] = False
    run()
    with open(os.path.join(out_dir, "truth.json"), "w") as f:
        json.dump({"unit": UNIT, "stacks": TRUTH}, f)


if __name__ == "__main__":
    main(sys.argv[1])
