"""A pre-fork server's life in a loop: THREADS threads fork children that exit at once (and are
waited for), while the main thread allocates.

usage: fork_storm.py DIR [THREADS]
Prints "ready PID", then "forks N" (the forks so far) every 0.2 s; runs until DIR/stop exists,
then prints "done forks=N" and exits 0. A fork that never returns (a lock the child or the
parent inherited held, a child that waits for a stopped mprof) shows as forks that stop
counting, and a target that never finishes.
"""
import os
import sys
import threading
import time
import warnings

warnings.simplefilter("ignore")  # 3.12+ warns of fork() in a process with threads
stop_file = os.path.join(sys.argv[1], "stop")
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 3
forks = [0] * threads
running = True


def forker(i):
    keep = []
    while running:
        keep.append(bytearray(512))
        if len(keep) > 100:
            keep = []
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forks[i] += 1


ts = [threading.Thread(target=forker, args=(i,)) for i in range(threads)]
for t in ts:
    t.start()
print("ready", os.getpid(), flush=True)
kept = []
last = time.monotonic()
while not os.path.exists(stop_file):
    kept.append(str(len(kept)) * 10)
    if len(kept) > 1000:
        kept = []
    time.sleep(0.0005)
    if time.monotonic() - last >= 0.2:
        last = time.monotonic()
        print("forks %d" % sum(forks), flush=True)
running = False
for t in ts:
    t.join()
print("done forks=%d" % sum(forks), flush=True)
