"""A program under an address-space limit (ulimit -v), for the ring-sizing tests.

usage: ulimit_target.py fill LIMIT_MIB [DIR]   allocate 1 MiB blocks until MemoryError and print
                                               "max N" (N MiB held); with DIR, wait for DIR/go
       ulimit_target.py near LIMIT_MIB         fill up to the limit, give back 4 MiB, print
                                               "full", then wait
A LIMIT_MIB of 0 keeps the limit that was inherited.
"""
import os
import resource
import sys
import time

mode, limit = sys.argv[1], int(sys.argv[2]) << 20
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
print("ready", os.getpid(), flush=True)
if len(sys.argv) > 3:
    while not os.path.exists(os.path.join(sys.argv[3], "go")):
        time.sleep(0.01)
held = []
try:
    while True:
        held.append(bytearray(1 << 20))
except MemoryError:
    pass
if mode == "fill":
    print("max", len(held), flush=True)
else:
    del held[-4:]
    print("full", len(held), flush=True)
    while True:
        time.sleep(1)
