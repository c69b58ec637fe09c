"""A program and one forked worker that allocate until a stop file appears, for the live view
of a followed process tree.

usage: live_tree.py STOP_FILE
The program allocates in in_program, the worker (os.fork) in in_worker; each keeps up to 200
blocks of 10,000 bytes, replacing the oldest, so both keep allocating at a steady pace.
"""
import os
import sys
import time

KEPT = [None] * 200


def in_program(i):
    KEPT[i % 200] = bytes(10_000)


def in_worker(i):
    KEPT[i % 200] = bytes(10_000)


def run(work, stop):
    i = 0
    while not os.path.exists(stop):
        for _ in range(50):
            work(i)
            i += 1
        time.sleep(0.01)


if __name__ == "__main__":
    stop = sys.argv[1]
    pid = os.fork()
    if pid == 0:
        run(in_worker, stop)
        os._exit(0)
    run(in_program, stop)
    os.waitpid(pid, 0)
