"""Allocates steadily for SECONDS: a bytearray of 1,000 bytes at a time in steady(), keeping the
last 5,000. Writes how many it made to OUT.

usage: steady_alloc.py SECONDS OUT
"""
import sys
import time


def steady(seconds):
    kept, made = [], 0
    end = time.time() + seconds
    while time.time() < end:
        kept.append(bytearray(1000))
        made += 1
        if len(kept) > 5000:
            kept.clear()
    return made


made = steady(float(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    f.write("%d\n" % made)
