"""A target for the kill-mprof-at-random-moments test.

Does a fixed amount of work (floats kept in vector registers, strings, lists) and prints a
result that depends on every step, so that a thread whose registers, vector state or signal
mask an aborted attach changed would print something else, or die. `idle` sleeps between
steps (the attach then finds the thread blocked in a system call); `busy` never does (it is
found running Python code).

usage: kill_target.py busy|idle STEPS
"""

import math
import os
import sys
import time

mode, steps = sys.argv[1], int(sys.argv[2])
print("ready", os.getpid(), flush=True)
acc = 0.0
h = 0
keep = []
for i in range(steps):
    if mode == "idle" and i % 8 == 0:
        time.sleep(0.002)
    v = [math.sin(i * 0.001 + k) * 1.000001 for k in range(48)]
    acc += math.fsum(v) / (1.0 + (i % 7))
    s = "%d:%r" % (i, acc)
    h = (h * 31 + hash(len(s)) + ord(s[-1])) % 1000000007
    if i % 16 == 0:
        keep.append(s)
print("done %r %d %d" % (acc, h, len(keep)), flush=True)
