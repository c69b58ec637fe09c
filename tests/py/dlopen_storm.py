"""A benign target whose threads load and unload libraries while they allocate: native threads
(tests/c/dlopen_storm.c, loaded from LIBSTORM, holding no GIL) dlopen, malloc, free and dlclose
system libraries in a loop, while the Python main thread allocates too.

usage: dlopen_storm.py LIBSTORM DIR [THREADS]
Prints "ready PID"; runs until DIR/stop exists, then prints "done loads=N" and exits 0 (1 if a
thread's allocation failed).
"""
import ctypes
import os
import sys
import time

storm = ctypes.CDLL(sys.argv[1])
stop_file = os.path.join(sys.argv[2], "stop")
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
storm.storm_stop.restype = ctypes.c_long
assert storm.storm_start(threads) == threads
print("ready", os.getpid(), flush=True)
kept = []
while not os.path.exists(stop_file):
    kept.append([bytearray(100), str(len(kept))])
    if len(kept) > 1000:
        kept = []
    time.sleep(0.001)
loads = storm.storm_stop()
print("done loads=%d" % loads, flush=True)
sys.exit(0 if loads > 0 else 1)
