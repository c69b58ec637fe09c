"""Starts a daemon the classic way, as gunicorn --daemon, python-daemon and celery multi do:
fork, setsid, fork again, and the middle process exits at once, so the daemon is orphaned
(reparented) before it can do anything. The daemon allocates 30 MB in `daemon_work`; the
program waits for it and exits.
"""
import os
import time


def daemon_work():
    keep = bytearray(30_000_000)
    time.sleep(0.3)
    return len(keep)


if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.1)
        daemon_work()
        os._exit(0)
    os._exit(0)
time.sleep(1)
