"""Allocates as a stack-switching library does (greenlet, under gevent and eventlet), through
the test's C extension `stack_switch` (tests/c/stack_switch.c, built by the test into DIR):
while it calls malloc, the words of its caller's frame (saved registers, return address) are
stale, as another greenlet's would be. For tests/native_stacks.rs.

usage: stack_switch_workload.py DIR [wait]
Without "wait", allocates 2,000 times in `switch_and_allocate` and prints "done". With it,
prints "ready PID" and allocates that way until DIR/finish appears (for attach), then prints
"done".
"""
import os
import sys
import time

DIR = sys.argv[1]
WAIT = len(sys.argv) > 2
sys.path.insert(0, DIR)
import stack_switch  # noqa: E402


def switch_and_allocate():
    return stack_switch.allocate(1000, 100)


if WAIT:
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(os.path.join(DIR, "finish")):
        switch_and_allocate()
        time.sleep(0.001)
else:
    for _ in range(20):
        switch_and_allocate()
print("done", flush=True)
