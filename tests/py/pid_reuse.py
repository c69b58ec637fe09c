"""Drives PID reuse during an attach, inside a PID namespace of its own (run it as PID 1 of
one: `unshare --pid --fork --mount-proc python3 pid_reuse.py ...`, as root).

usage: pid_reuse.py PYTHON TRIALS SEED [MPROF]
Each trial starts a victim Python that waits on a lock for ever (no thread at a safe point:
mprof goes on looking through its threads), starts `MPROF attach` on it (none without MPROF:
the control), kills the victim after a few milliseconds, then makes the next Python started
take the victim's PID (writing /proc/sys/kernel/ns_last_pid) and lets it run 0.15 s,
its threads allocating and reading a pipe (a safe point for an attach that looks there). Prints one line per trial ("trial I reused=0|1 reuser=STATUS mprof=LAST LINE"), then
"trials=N reused=R harmed=H" where H counts reusers that did not end well.
"""
import os
import random
import subprocess
import sys
import time

python, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mprof = sys.argv[4] if len(sys.argv) > 4 else None
rng = random.Random(seed)
VICTIM = "import threading\nlock = threading.Lock()\nlock.acquire()\nprint('ready', flush=True)\nlock.acquire()\n"
REUSER = """import os, sys, threading, time
print(os.getpid(), flush=True)
r, w = os.pipe()
threading.Thread(target=os.read, args=(r, 1), daemon=True).start()
x = []
end = time.monotonic() + 0.15
while time.monotonic() < end:
    x.append(bytearray(100))
    if len(x) > 2000:
        x = []
    time.sleep(0.0005)
os.write(w, b"x")
sys.exit(0)
"""
reused = harmed = 0
for i in range(trials):
    victim = subprocess.Popen([python, "-c", VICTIM], stdout=subprocess.PIPE, text=True)
    victim.stdout.readline()
    pid = victim.pid
    attach = None
    if mprof:
        attach = subprocess.Popen(
            [mprof, "attach", "--pid", str(pid), "--duration", "0.1", "--timeout", "2", "-q",
             "-o", "/tmp/reuse-%d.mprof" % i],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(rng.uniform(0.0, 0.04))
    victim.kill()
    victim.wait()
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    reuser = subprocess.Popen([python, "-c", REUSER], stdout=subprocess.PIPE, text=True)
    got = int(reuser.stdout.readline() or 0)
    said = ""
    if attach:
        try:
            _, err = attach.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            attach.kill()
            _, err = attach.communicate()
        said = (err.strip().splitlines() or ["ok"])[-1].replace(str(pid), "PID")
    try:
        status = reuser.wait(timeout=60)
    except subprocess.TimeoutExpired:
        reuser.kill()
        status = "hung"
    reused += got == pid
    # Any reuser that ends badly is harmed (one that got a thread id of the victim's, or the
    # next PID because a thread of mprof took the victim's, is as exposed).
    harmed += status != 0
    print("trial %d reused=%d reuser=%s mprof=%s" % (i, got == pid, status, said), flush=True)
print("trials=%d reused=%d harmed=%d" % (trials, reused, harmed), flush=True)
