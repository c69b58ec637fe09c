"""Memory the process keeps resident though its live heap is small, one way per MODE:

- malloc: a burst of 5 KB strings (the C library's malloc serves them), freed but for one
  allocated after them, which pins the heap's top: glibc cannot give the rest back.
- pymalloc: two million small objects (pymalloc's arenas), all freed but one in fifty: every
  pool keeps a live object, so no arena is given back.
- reserve: a 1 GiB anonymous mapping of which 16 MiB is touched: mapped, mostly not resident.

usage: rss_kept.py DIR MODE [serve]. Then it runs on for 1.5 s (mprof reads the mappings once
a second) as a service in its steady state does, allocating and freeing a little (1 MB every
10 ms, in blocks of 20 KB: what it holds does not change), and prints "done". With `serve`, it
prints "ready PID" once its memory is kept and runs on so for up to 60 s, until killed (a
process mprof attaches to after its RSS grew).
"""
import mmap
import os
import sys
import time

mode = sys.argv[2]
held = None
if mode == "malloc":
    burst = ["x" * 5000 + str(i) for i in range(40000)]
    held = "y" * 5000 + "pin"
    del burst
elif mode == "pymalloc":
    objs = [bytes(40) + i.to_bytes(4, "little") for i in range(2000000)]
    held = objs[::50]
    del objs
elif mode == "reserve":
    held = mmap.mmap(-1, 1 << 30)
    for off in range(0, 16 << 20, 4096):
        held[off] = 1
else:
    sys.exit("unknown mode " + mode)
serve = sys.argv[3:] == ["serve"]
if serve:
    print("ready", os.getpid(), flush=True)
end = time.monotonic() + (60 if serve else 1.5)
while time.monotonic() < end:
    work = [bytearray(20000) for _ in range(50)]
    del work
    time.sleep(0.01)
print("done", flush=True)
