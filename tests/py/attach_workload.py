"""A program that mprof attaches to while it runs, in steps driven through files in DIR.

1. prints "ready PID" and polls for DIR/go (idle: the attach finds it in a sleep);
2. allocates exactly known byte counts in three functions and keeps them alive (the same
   workload as known_allocs.py), churns some more, writes the truth to DIR/truth.json and
   creates DIR/allocated;
3. polls for DIR/finish (the test detaches first), then checks its data, prints
   "finished N" and exits with status 7.

usage: attach_workload.py DIR
"""
import json
import os
import sys
import time

DIR = sys.argv[1]
KEEP = [None] * 22300


def wait_for(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


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
    total = 0
    for _ in range(n):
        total += len(bytes(5000))
    return total


print("ready", os.getpid(), flush=True)
wait_for("go")
truth = {
    "small_objects": small_objects(0, 20000),
    "medium_objects": medium_objects(20000, 2000),
    "large_objects": large_objects(22000, 300),
}
churn(2000)
with open(os.path.join(DIR, "truth.json.tmp"), "w") as f:
    json.dump(truth, f)
os.rename(os.path.join(DIR, "truth.json.tmp"), os.path.join(DIR, "truth.json"))
open(os.path.join(DIR, "allocated"), "w").close()
wait_for("finish")
total = sum(len(b) for b in KEEP)
assert total == 20000 * 200 + 2000 * 4000 + 300 * 100000, total
print("finished", total, flush=True)
sys.exit(7)
