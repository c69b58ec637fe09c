"""Runs Python children with environments of their own, as a supervisor starting workers
does: one through subprocess with env={...}, one through `env -i`. Neither inherits
LD_PRELOAD, so neither loads the agent itself. Each works for 1.5 s in `worker_loop`,
allocating 100 kB every 10 ms.
"""
import os
import subprocess
import sys

WORKER = """
import time
def worker_loop():
    keep = []
    start = time.time()
    while time.time() - start < 1.5:
        keep.append(bytearray(100_000))
        time.sleep(0.01)
worker_loop()
"""

own_env = subprocess.Popen(
    [sys.executable, "-c", WORKER], env={"PATH": os.environ.get("PATH", "/usr/bin")}
)
cleared = subprocess.Popen(["/usr/bin/env", "-i", sys.executable, "-c", WORKER])
assert own_env.wait() == 0 and cleared.wait() == 0
