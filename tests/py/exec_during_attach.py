"""A target that replaces its program while mprof attaches: it allocates in three threads,
prints "ready PID", waits DELAY seconds and then, from its main thread or from another thread
(WHO: main|thread), execs PROGRAM with ARGS (a setuid-root `passwd -S`, or `sleep 1`).

usage: exec_during_attach.py DELAY WHO PROGRAM ARGV0 [ARGS...]
Started as root, it becomes `nobody` first (as a local user's process would be), so that a
setuid-root program really changes credentials when it is exec'd. The exit status seen by the
parent is the exec'd program's: a crash shows as a signal.
"""
import ctypes
import os
import sys
import threading
import time

if os.getuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as a user's own process has
delay, who, program, args = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]


def churn():
    kept = []
    while True:
        kept.append(bytearray(256))
        if len(kept) > 500:
            kept = []
        time.sleep(0.0002)


for _ in range(3):
    threading.Thread(target=churn, daemon=True).start()
print("ready", os.getpid(), flush=True)
time.sleep(delay)
sys.stdout.flush()
if who == "thread":
    threading.Thread(target=os.execv, args=(program, args)).start()
    time.sleep(30)
else:
    os.execv(program, args)
