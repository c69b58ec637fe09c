"""Libraries loaded where an unloaded one was, for tests/native.rs: loads copy A of the test's C
extension (tests/c/native_chain.c, copies in DIR/a, DIR/b, DIR/s) with ctypes, then copy S
(another load: mprof's agent scans the loaded objects again and finds A a second time), then
unloads A (dlclose) and loads B, which the loader usually puts where A was. Allocates a size of
its own through A (in alloc_a) and through B (in alloc_b), never freed, and prints the sizes and
whether B was loaded where A was.

usage: native_reload_workload.py DIR
"""
import _ctypes
import ctypes
import glob
import os
import sys

SIZES = {"a": 1_234_567, "b": 2_345_678}


def load(copy):
    lib = ctypes.CDLL(glob.glob(os.path.join(sys.argv[1], copy, "native_chain*.so"))[0])
    lib.chain_level2.argtypes = [ctypes.c_size_t]
    lib.chain_level2.restype = ctypes.c_void_p
    return lib


def alloc_a(lib):
    lib.chain_level2(SIZES["a"])


def alloc_b(lib):
    lib.chain_level2(SIZES["b"])


def where(lib):
    return ctypes.cast(lib.chain_level2, ctypes.c_void_p).value


a = load("a")
alloc_a(a)
at_a = where(a)
spacer = load("s")
_ctypes.dlclose(a._handle)
b = load("b")
alloc_b(b)
print("sizes", SIZES["a"], SIZES["b"], flush=True)
print("same-place", int(where(b) == at_a), flush=True)
