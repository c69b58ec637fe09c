"""A library unloaded right after its allocation, for tests/native_exit.rs: loads the test's C
extension (tests/c/native_chain.c, built by the test into DIR) with ctypes, allocates through
its exported chain_level2, unloads it (dlclose) and stays 0.3 s, so that only the unload can
hide its code from mprof's reader.

usage: native_dlclose_workload.py DIR
"""
import _ctypes
import ctypes
import glob
import os
import sys
import time


def alloc_through_ctypes(lib):
    lib.chain_level2(100003)


lib = ctypes.CDLL(glob.glob(os.path.join(sys.argv[1], "native_chain*.so"))[0])
lib.chain_level2.argtypes = [ctypes.c_size_t]
lib.chain_level2.restype = ctypes.c_void_p
alloc_through_ctypes(lib)
_ctypes.dlclose(lib._handle)
time.sleep(0.3)
