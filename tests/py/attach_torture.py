"""Four threads allocate and free as fast as they can while mprof attaches and detaches.

Python objects, bytearrays, and a C-level malloc/free loop through ctypes; every iteration
checks what it built, so a corrupted allocation shows up as an error. A steady ballast gives
the process a realistic resident size. The test creates DIR/stop when it is done attaching; the
script then joins its threads, runs a fixed computation whose checksum must match an
unprofiled run, and prints one line: checksum, errors, RSS, iterations.

usage: attach_torture.py DIR
"""
import ctypes
import hashlib
import os
import sys
import threading
import time

DIR = sys.argv[1]
BALLAST = [bytes([i % 251]) * 100_000 for i in range(1000)]  # ~100 MB, kept all along
stop = threading.Event()
errors = []
counts = [0] * 4


def python_objects(slot):
    n = 0
    while not stop.is_set():
        d = {k: [k, str(k), (k, k * 2)] for k in range(200)}
        if sum(v[2][1] for v in d.values()) != 2 * sum(range(200)):
            errors.append("objects")
        n += 1
    counts[slot] = n


def bytearrays(slot):
    n = 0
    keep = []
    while not stop.is_set():
        size = 1000 + (n * 7919) % 200_000
        b = bytearray(size)
        b[::4096] = b"\x01" * len(range(0, size, 4096))
        keep.append(b)
        if len(keep) > 50:
            keep.pop(0)
        if b.count(1) != len(range(0, size, 4096)):
            errors.append("bytearray")
        n += 1
    counts[slot] = n


libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def c_malloc(slot):
    n = 0
    while not stop.is_set():
        size = 16 + (n * 104_729) % 65_536
        p = libc.malloc(size)
        libc.memset(p, n & 0xFF, size)
        if ctypes.string_at(p + size - 1, 1)[0] != n & 0xFF:
            errors.append("malloc")
        libc.free(p)
        n += 1
    counts[slot] = n


def strings(slot):
    n = 0
    while not stop.is_set():
        parts = [str(i) * (i % 7) for i in range(300)]
        s = "".join(parts)
        if len(s) != sum(len(p) for p in parts):
            errors.append("strings")
        n += 1
    counts[slot] = n


def checksum():
    h = hashlib.sha256()
    for i in range(20_000):
        h.update(repr({"i": i, "sq": i * i, "s": str(i) * 3}).encode())
    return h.hexdigest()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


threads = [
    threading.Thread(target=f, args=(i,))
    for i, f in enumerate([python_objects, bytearrays, c_malloc, strings])
]
for t in threads:
    t.start()
print("ready", os.getpid(), flush=True)
while not os.path.exists(os.path.join(DIR, "stop")):
    time.sleep(0.01)
stop.set()
for t in threads:
    t.join()
print(
    f"checksum={checksum()} errors={len(errors)} rss={rss_bytes()} "
    f"iterations={'/'.join(map(str, counts))} ballast={len(BALLAST)}",
    flush=True,
)
