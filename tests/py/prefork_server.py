"""A pre-fork server for attach --follow-children: the master forks two workers and waits;
each worker serves "requests" in handle_request until STOP exists, then prints
"worker PID REQUESTS TOTAL" (TOTAL is a checksum of what it served) and exits.

usage: prefork_server.py STOP
"""
import os, sys, time
STOP = sys.argv[1]
KEEP = []
def handle_request(i):
    data = bytes(20_000 + i % 100)
    KEEP.append(data)
    if len(KEEP) > 200:
        del KEEP[:100]
    return len(data)
def worker():
    n = 0
    total = 0
    while not os.path.exists(STOP):
        total += handle_request(n)
        n += 1
        time.sleep(0.001)
    print("worker", os.getpid(), n, total, flush=True)
    os._exit(0)
pids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        worker()
    pids.append(pid)
print("ready", os.getpid(), flush=True)
for pid in pids:
    os.waitpid(pid, 0)
print("master done", flush=True)
