"""A parent whose Python children do the work, like a gunicorn master, and a churning
program: for the hints mprof gives.

usage: workers.py parent N    starts N children (`workers.py child`), prints
                              "ready PID CHILD1 CHILD2 ..." and sleeps; idle itself
       workers.py child       allocates and frees small objects until its parent is gone
       workers.py churn SECS  prints "ready PID", allocates and frees small objects in small
                              batches for SECS seconds, then exits
"""
import os
import subprocess
import sys
import time


def churn_once():
    batch = [str(i) * 3 for i in range(200)]
    del batch


mode = sys.argv[1]

if mode == "parent":
    children = [
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "child"])
        for _ in range(int(sys.argv[2]))
    ]
    print("ready", os.getpid(), *[c.pid for c in children], flush=True)
    time.sleep(1000)

elif mode == "child":
    parent = os.getppid()
    while os.getppid() == parent:
        churn_once()
        time.sleep(0.001)

elif mode == "churn":
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        churn_once()
        time.sleep(0.01)
