"""Forks, runs a subprocess, and uses tracemalloc while being profiled.

The forked child must not write into the parent's profile; the subprocess must see the
environment it would have had without mprof; tracemalloc must work on top of the agent.
"""
import json
import os
import subprocess
import sys
import tracemalloc

KEEP = []


def parent_alloc():
    for _ in range(50):
        KEEP.append(bytes(100000))


def child_alloc():
    for _ in range(50):
        KEEP.append(bytes(100000))


parent_alloc()
pid = os.fork()
if pid == 0:
    child_alloc()
    os._exit(7)
_, status = os.waitpid(pid, 0)
env = subprocess.run(
    [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
    check=True,
    stdout=subprocess.PIPE,
).stdout
tracemalloc.start()
traced = [bytes(10000) for _ in range(10)]
current, _ = tracemalloc.get_traced_memory()
tracemalloc.stop()
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "child_status": os.WEXITSTATUS(status),
            "child_env": json.loads(env),
            "tracemalloc_current": current,
        },
        f,
    )
