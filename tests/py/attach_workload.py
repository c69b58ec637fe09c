"""A program that mprof attaches to while it runs, in steps driven through files in DIR.

1. prints "ready PID" and polls for DIR/go (idle: the attach finds it in a sleep);
2. allocates exactly known byte counts in three functions and keeps them alive (the workload
   of known_allocs.py, imported), writes the truth to DIR/truth.json and creates DIR/allocated;
3. polls for DIR/finish (the test detaches first), then checks its data, prints
   "finished N" and exits with status 7.

usage: attach_workload.py DIR
"""
import json
import os
import sys
import time

import known_allocs

DIR = sys.argv[1]


def wait_for(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


print("ready", os.getpid(), flush=True)
wait_for("go")
truth = known_allocs.allocate()
with open(os.path.join(DIR, "truth.json.tmp"), "w") as f:
    json.dump(truth, f)
os.rename(os.path.join(DIR, "truth.json.tmp"), os.path.join(DIR, "truth.json"))
open(os.path.join(DIR, "allocated"), "w").close()
wait_for("finish")
total = known_allocs.kept_bytes()
assert total == 20000 * 200 + 2000 * 4000 + 300 * 100000, total
print("finished", total, flush=True)
sys.exit(7)
