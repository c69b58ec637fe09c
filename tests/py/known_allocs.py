"""Allocates exactly known byte counts in three functions and keeps them alive.

Each object is one allocation whose size is sys.getsizeof(object) (bytes objects carry no GC
header), and the list that keeps them is sized up front, so no other allocation stays live in
these functions. Run as a script, writes the truth as JSON to the path given as argv[1]; the
attach workload imports it to allocate the same way after mprof has attached.
"""
import json
import sys

KEEP = [None] * 22300


def small_objects(start, n):
    for i in range(start, start + n):
        KEEP[i] = bytes(200)
    return n * sys.getsizeof(bytes(200))


def medium_objects(start, n):
    for i in range(start, start + n):
        KEEP[i] = bytes(4000)
    return n * sys.getsizeof(bytes(4000))


def large_objects(start, n):
    for i in range(start, start + n):
        KEEP[i] = bytes(100000)
    return n * sys.getsizeof(bytes(100000))


def churn(n):
    """Allocates and frees: shows in 'allocated' but must not stay live."""
    total = 0
    for _ in range(n):
        total += len(bytes(5000))
    return total


def allocate():
    """Allocates everything; returns the true live bytes per function."""
    truth = {
        "small_objects": small_objects(0, 20000),
        "medium_objects": medium_objects(20000, 2000),
        "large_objects": large_objects(22000, 300),
    }
    churn(2000)
    return truth


def kept_bytes():
    """The payload bytes still held, to check nothing was corrupted."""
    return sum(len(b) for b in KEEP)


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(allocate(), f)
