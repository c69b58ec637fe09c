"""Native allocations of known sizes, each from its own Python function, through the test's
C extension `native_allocs` (built by the test into DIR) and through ctypes.

usage: native_workload.py DIR [wait]
With "wait", prints "ready PID" and waits for DIR/go before importing the extension (so that
an attach can come before or after the import: DIR/import-first imports it before "ready"),
then prints "allocated" and waits for DIR/finish. Without, it just runs.
The truth (live bytes each function keeps) is in TRUTH, printed as "truth NAME BYTES".
"""
import ctypes
import os
import sys

DIR = sys.argv[1]
WAIT = len(sys.argv) > 2
sys.path.insert(0, DIR)
PAGE = 4096
SIZE = 16 * PAGE
FNS = ["malloc", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
       "memalign", "valloc", "pvalloc", "mmap", "mremap"]
N, KEEP = 40, 25


def wait(name):
    import time
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


if WAIT and os.path.exists(os.path.join(DIR, "import-first")):
    import native_allocs
if WAIT:
    print("ready", os.getpid(), flush=True)
    wait("go")
import native_allocs  # noqa: E402 (after the attach when the test wants it so)


def make_caller(index, name):
    """A function of its own (its own code object) named use_NAME."""
    namespace = {"native_allocs": native_allocs, "SIZE": SIZE, "N": N, "KEEP": KEEP}
    exec(f"def use_{name}():\n    native_allocs.allocate({index}, SIZE, N, KEEP)\n", namespace)
    return namespace["use_" + name]


libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
ctypes_kept = []


def use_ctypes():
    for i in range(N):
        p = libc.malloc(SIZE)
        if i < KEEP:
            ctypes_kept.append(p)
        else:
            libc.free(p)


for index, name in enumerate(FNS):
    make_caller(index, name)()
use_ctypes()
for name in FNS + ["ctypes"]:
    print("truth", "use_" + name, KEEP * SIZE, N * SIZE, flush=True)
if WAIT:
    print("allocated", flush=True)
    wait("finish")
