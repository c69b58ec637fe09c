"""A short-lived program for tests/native_exit.rs: it loads the test's C extension
(tests/c/native_chain.c, built by the test into DIR) late, allocates through it and exits at
once, so that mprof's reader may not have read its memory map when it ends.

usage: native_exit_workload.py DIR [wait | dlclose]
- With "wait": prints "ready PID", waits for DIR/go before loading the extension, prints
  "exiting" from an atexit handler (the agent's exit wait comes after it) and exits with
  status 3.
- With "dlclose": loads the library with ctypes instead, allocates through its exported
  chain_level2, unloads it (dlclose) and stays 0.3 s: only the unload can hide its code.
"""
import atexit
import os
import sys
import time

DIR = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else ""
sys.path.insert(0, DIR)


def alloc_in_chain():
    native_chain.entry(100003)


def alloc_through_ctypes(lib):
    lib.chain_level2(100003)


if MODE == "dlclose":
    import _ctypes
    import ctypes
    import glob

    lib = ctypes.CDLL(glob.glob(os.path.join(DIR, "native_chain*.so"))[0])
    lib.chain_level2.argtypes = [ctypes.c_size_t]
    lib.chain_level2.restype = ctypes.c_void_p
    alloc_through_ctypes(lib)
    _ctypes.dlclose(lib._handle)
    time.sleep(0.3)
    sys.exit(0)
if MODE == "wait":
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(os.path.join(DIR, "go")):
        time.sleep(0.01)
    atexit.register(lambda: print("exiting", flush=True))
import native_chain  # noqa: E402  (late: nothing of it is mapped before this line)

alloc_in_chain()
native_chain.release_all()
if MODE == "wait":
    sys.exit(3)
