"""Small Python objects at mprof's default rate, where pymalloc frees them without passing
through mprof (see injector/agent/src/chain.rs): churn() makes and frees many, keep() keeps a
known number of bytes in small blocks.

Prints "blocks N": how many blocks sys.getallocatedblocks() says churn() left behind (pymalloc's
own count: the profiled program must see the same number as the unprofiled one). Writes the
kept bytes to DIR/truth.json. With FAST_FREES_TRACEMALLOC set, tracemalloc is started first (a
PEP 445 wrapper on top of mprof's hooks).

usage: fast_frees.py DIR [attach]
    attach: print "ready PID", wait for DIR/go, and after the work create DIR/done and wait
    for DIR/finish.
"""
import gc
import json
import os
import sys
import time

DIR = sys.argv[1]
ATTACH = sys.argv[2:] == ["attach"]
KEEP = [None] * 300000


def wait_for(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


def churn(rounds):
    for _ in range(rounds):
        xs = []
        for i in range(50000):
            # The list's item array grows by realloc, and so does each bytearray (from a
            # small block): a sampled block's realloc must be seen freeing it.
            grown = bytearray(i % 200)
            grown += b"y" * (i % 150)
            xs.append((i, str(i), b"x" * (i % 300), grown))
        del xs


def keep():
    for i in range(len(KEEP)):
        KEEP[i] = bytes(100)
    return len(KEEP) * sys.getsizeof(bytes(100))


if ATTACH:
    print("ready", os.getpid(), flush=True)
    wait_for("go")
if os.environ.get("FAST_FREES_TRACEMALLOC"):
    import tracemalloc

    tracemalloc.start()
gc.collect()
before = sys.getallocatedblocks()
churn(20)
gc.collect()
print("blocks", sys.getallocatedblocks() - before, flush=True)
with open(os.path.join(DIR, "truth.json"), "w") as f:
    json.dump({"keep": keep()}, f)
if ATTACH:
    open(os.path.join(DIR, "done"), "w").close()
    wait_for("finish")
# Zero-filled blocks stay zero-filled when sampled (bytes(n) is a calloc, which a sampled block
# made bigger asks as a malloc and clears itself).
ZERO = bytes(100)
assert all(b == ZERO for b in KEEP), "a calloc'd block was not zero-filled"
