"""Allocates exactly known byte counts in three functions and keeps them alive.

Each object is one allocation whose size is sys.getsizeof(object) (bytes objects carry no GC
header), and the list that keeps them is sized up front, so no other allocation stays live in
these functions. Writes the truth as JSON to the path given as argv[1].
"""
import json
import sys

KEEP = [None] * 30000


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


truth = {
    "small_objects": small_objects(0, 20000),
    "medium_objects": medium_objects(20000, 2000),
    "large_objects": large_objects(22000, 300),
}
churn(2000)
with open(sys.argv[1], "w") as f:
    json.dump(truth, f)
