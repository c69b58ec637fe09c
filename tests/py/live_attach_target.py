"""Target for the `attach --live` test: allocates and frees in a named function until a stop
file appears (or a deadline passes), then exits with status 0."""

import os
import sys
import time

stop, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])


def attached_loop():
    kept = []
    while not os.path.exists(stop) and time.monotonic() < deadline:
        for _ in range(200):
            kept.append(bytes(10_000))
        del kept[:]
        time.sleep(0.001)


print("target ready", flush=True)
attached_loop()
