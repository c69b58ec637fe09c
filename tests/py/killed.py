"""Allocates, says it is ready by writing its pid, then waits to be killed."""
import os
import sys
import time

KEEP = []


def hold_memory():
    for _ in range(200):
        KEEP.append(bytes(50000))


hold_memory()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.05)
    KEEP.append(bytes(1000))
