"""Workload for the live-view tests: allocates known amounts in named functions, then idles
until a stop file appears (or a deadline passes), so a test can read the screen meanwhile.

hot_function allocates 2000 blocks of 100,000 bytes (200 MB) and frees each at once;
keeper_function allocates 300 blocks of 100,000 bytes (30 MB) and keeps them all.

Usage: live_workload.py STOP_FILE DEADLINE_SECONDS
"""

import os
import sys
import time

KEEP = []


def hot_function(n):
    for _ in range(n):
        block = bytearray(100_000)
        del block


def keeper_function(n):
    for _ in range(n):
        KEEP.append(bytearray(100_000))


def main():
    stop, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    print("workload started", flush=True)
    for _ in range(10):
        hot_function(200)
        keeper_function(30)
    print("workload allocated", flush=True)
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("workload done", flush=True)


main()
