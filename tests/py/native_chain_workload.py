"""Mixed C + Python stacks through the test's C extension `native_chain` (tests/c/native_chain.c,
built by the test into DIR), for tests/native_stacks.rs.

usage: native_chain_workload.py DIR [wait]
With "wait", prints "ready PID", waits for DIR/go, runs, prints "allocated" and waits for
DIR/finish (for attach). Without, it just runs.

Each function allocates through a known chain, with a size of its own:
- alloc_in_chain: Python → chain_entry → chain_level1 → [chain_inline →] chain_level2 → malloc
- outer: Python → callback_entry → callback_level1 → inner, a Python function that allocates
- sort_with_key: sorted() (C) calls key, which allocates
- reduce_it: functools.reduce (C) calls reduce_step, which allocates
"""
import functools
import os
import sys
import time

DIR = sys.argv[1]
WAIT = len(sys.argv) > 2
sys.path.insert(0, DIR)
import native_chain  # noqa: E402


def wait(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


def alloc_in_chain():
    native_chain.entry(100003)


def inner(n):
    return bytearray(n)


def outer():
    return native_chain.call_back(inner, 40009)


def key(x):
    return bytearray(30011)


def sort_with_key():
    return sorted(range(4), key=key)


def reduce_step(a, b):
    return bytearray(50021)


def reduce_it():
    return functools.reduce(reduce_step, range(4))


if WAIT:
    print("ready", os.getpid(), flush=True)
    wait("go")
for i in range(20):
    alloc_in_chain()
    outer()
    sort_with_key()
    reduce_it()
native_chain.release_all()
if WAIT:
    print("allocated", flush=True)
    wait("finish")
