"""Known bytes from each allocator, each from its own Python function: Python objects
(bytearrays, PEP 445), the C allocator family (the test's extension `native_allocs`, built
into DIR, and ctypes' malloc) and anonymous mappings (mmap, mremap).

usage: allocator_workload.py DIR [wait]
With "wait", prints "ready PID", waits for DIR/go, allocates, prints "allocated" and waits
for DIR/finish (for attach). Prints "truth FUNCTION ALLOCATOR LIVE_BYTES" for each function.
"""
import ctypes
import os
import sys
import time

DIR = sys.argv[1]
WAIT = len(sys.argv) > 2
sys.path.insert(0, DIR)
import native_allocs  # noqa: E402

SIZE = 16 * 4096
N, KEEP = 40, 25
# The indices of the extension's functions (tests/c/native_allocs.c).
MALLOC, CALLOC, MMAP, MREMAP = 0, 1, 9, 10
kept = []


def wait(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


def use_malloc():
    native_allocs.allocate(MALLOC, SIZE, N, KEEP)


def use_calloc():
    native_allocs.allocate(CALLOC, SIZE, N, KEEP)


def use_mmap():
    native_allocs.allocate(MMAP, SIZE, N, KEEP)


def use_mremap():
    native_allocs.allocate(MREMAP, SIZE, N, KEEP)


libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]


def use_ctypes():
    for i in range(N):
        p = libc.malloc(SIZE)
        if i < KEEP:
            kept.append(p)
        else:
            libc.free(p)


def use_python():
    for i in range(N):
        b = bytearray(SIZE)
        if i < KEEP:
            kept.append(b)


CALLS = [
    (use_malloc, "native"),
    (use_calloc, "native"),
    (use_ctypes, "native"),
    (use_mmap, "mmap"),
    (use_mremap, "mmap"),
    (use_python, "python"),
]

if WAIT:
    print("ready", os.getpid(), flush=True)
    wait("go")
for fn, _ in CALLS:
    fn()
for fn, allocator in CALLS:
    print("truth", fn.__name__, allocator, KEEP * SIZE, flush=True)
if WAIT:
    print("allocated", flush=True)
    wait("finish")
