"""Native allocations of known sizes, each from its own Python function, through the test's
C extension `native_allocs` (built by the test into DIR) and through ctypes.

usage: native_workload.py DIR [wait]
With "wait", prints "ready PID" and waits for DIR/go before importing the extension (so that
an attach can come before or after the import: DIR/import-first imports it before "ready"),
then prints "allocated" and waits for DIR/finish. Without, it just runs. DIR/go is a FIFO the
workload blocks on in read() until a byte is written to it: the wait makes no allocation, so
that after an attach with a fixed --seed the sampling is the same every run.

use_pointer and use_const_pointer allocate and free with malloc and free through function
pointers in the extension's data (writable, and read-only after relocation), as libxml2, glib
and libcurl do.

Prints the truth: "truth NAME LIVE ALLOCATED" for each function (a realloc or mremap first
allocates half the size, then the whole), "native-live BYTES" for all the heap and anonymous
bytes the extension and ctypes keep, and "file-backed NAME BYTES" for use_mmap_file, whose
file mappings are not heap.
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
       "memalign", "valloc", "pvalloc", "mmap", "mremap", "pointer", "const_pointer"]
N, KEEP = 40, 25


def wait(name):
    import time
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


def wait_fifo(name):
    """Blocks in read() (where an attach may come) until a byte is written to the FIFO."""
    fd = os.open(os.path.join(DIR, name), os.O_RDWR)  # does not wait for a writer
    os.read(fd, 1)
    os.close(fd)


initial_pointers = None
if WAIT and os.path.exists(os.path.join(DIR, "import-first")):
    import native_allocs
    initial_pointers = native_allocs.pointers()
if WAIT:
    os.mkfifo(os.path.join(DIR, "go"))
    print("ready", os.getpid(), flush=True)
    wait_fifo("go")
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


MAPPED_FILE = os.path.join(DIR, "mapped.bin")
with open(MAPPED_FILE, "wb") as f:
    f.write(b"\1" * SIZE)


def use_mmap_file():
    native_allocs.map_file(MAPPED_FILE, SIZE, N, KEEP)


for index, name in enumerate(FNS):
    make_caller(index, name)()
use_ctypes()
use_mmap_file()
for name in FNS + ["ctypes"]:
    grows = name in ("realloc", "reallocarray", "mremap")
    print("truth", "use_" + name, KEEP * SIZE, N * SIZE * 3 // 2 if grows else N * SIZE, flush=True)
print("native-live", native_allocs.kept_bytes() + len(ctypes_kept) * SIZE, flush=True)
print("file-backed", "use_mmap_file", KEEP * SIZE, flush=True)
if WAIT:
    # Imported before the attach: the writable function pointers were the C library's
    # functions then; they point elsewhere (the hooks) during the session and hold the same
    # again after the detach (the read-only ones are compared byte for byte by the test).
    if initial_pointers is not None:
        hooked = native_allocs.pointers() != initial_pointers
        print("pointers", "hooked" if hooked else "untouched", flush=True)
    print("allocated", flush=True)
    wait("finish")
    if initial_pointers is not None:
        back = native_allocs.pointers() == initial_pointers
        print("pointers", "restored" if back else "changed", flush=True)
