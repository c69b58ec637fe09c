"""Leaks steadily for SECONDS: leak() keeps a bytearray of 256 KiB every 50 ms (about 5 MiB a
second, never freed); churn() allocates 50 KiB of temporaries beside it. The leaking line is
the one marked LEAK (tests/continuous_read.rs finds it by that mark).

usage: rolling_leak.py SECONDS
"""
import sys
import time

kept = []


def leak():
    kept.append(bytearray(256 * 1024))  # LEAK


def churn():
    return sum(len(b) for b in [bytearray(1000) for _ in range(50)])


end = time.time() + float(sys.argv[1])
while time.time() < end:
    leak()
    churn()
    time.sleep(0.05)
