"""A program whose work is spread over a process tree, for the views over its processes.

usage: tree_workload.py TRUTH_JSON
The program keeps bytes in in_program, forks a child that keeps bytes in in_forked, runs
sys.executable on this file (mode `child`), which keeps bytes in in_exec_child, and runs a
non-Python program (/bin/sh) whose output it checks. Every function allocates bytes objects
of 10,000 bytes (one allocation each) and keeps them until its process ends. TRUTH_JSON gets
{function: [pid, bytes kept]} and "sh": what the shell printed and its exit status.
"""
import json
import os
import subprocess
import sys
import time

KEPT = [None] * 100
COUNT = [0]
SIZE = sys.getsizeof(bytes(10_000))


def in_program():
    for _ in range(40):
        KEPT[COUNT[0]] = bytes(10_000)
        COUNT[0] += 1
    return 40 * SIZE


def in_forked():
    for _ in range(25):
        KEPT[COUNT[0]] = bytes(10_000)
        COUNT[0] += 1
    return 25 * SIZE


def in_exec_child():
    for _ in range(15):
        KEPT[COUNT[0]] = bytes(10_000)
        COUNT[0] += 1
    return 15 * SIZE


def child(path):
    kept = in_exec_child()
    with open(path, "w") as f:
        f.write("%d %d" % (os.getpid(), kept))
    time.sleep(0.1)


def main(truth_path):
    truth = {"in_program": [os.getpid(), in_program()]}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        kept = in_forked()
        os.write(w, str(kept).encode())
        time.sleep(0.1)
        os._exit(0)
    os.close(w)
    truth["in_forked"] = [pid, int(os.read(r, 64).decode())]
    os.waitpid(pid, 0)
    out = truth_path + ".child"
    subprocess.run([sys.executable, __file__, "child", out], check=True)
    with open(out) as f:
        cpid, kept = f.read().split()
    truth["in_exec_child"] = [int(cpid), int(kept)]
    sh = subprocess.run(["/bin/sh", "-c", "echo $((6 * 7)) ${MPROF_RING_FD:-clean}"],
                        capture_output=True, text=True)
    truth["sh"] = [sh.stdout.strip(), sh.returncode]
    with open(truth_path, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        main(sys.argv[1])
