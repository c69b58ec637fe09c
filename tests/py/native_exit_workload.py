"""A short-lived program for tests/native_exit.rs: it loads the test's C extension
(tests/c/native_chain.c, built by the test into DIR) late, allocates through it and exits at
once, so that mprof's reader may not have read its memory map when it ends.

usage: native_exit_workload.py DIR [wait]
With "wait": prints "ready PID", waits for DIR/go before loading the extension; at its exit an
atexit handler prints "exiting" and waits for DIR/leave (the interpreter's finalization and the
agent's exit wait come after it); exits with status 3.
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


def wait_for(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.005)


def leave():
    print("exiting", flush=True)
    wait_for("leave")


if MODE == "wait":
    print("ready", os.getpid(), flush=True)
    wait_for("go")
    atexit.register(leave)
import native_chain  # noqa: E402  (late: nothing of it is mapped before this line)

alloc_in_chain()
native_chain.release_all()
if MODE == "wait":
    sys.exit(3)
