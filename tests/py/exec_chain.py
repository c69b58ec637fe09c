"""A followed child that runs a new Python program by exec, in the same process.

usage: exec_chain.py TRUTH_FILE              (the program)
       exec_chain.py TRUTH_FILE first|second (the child, before and after its exec)
       exec_chain.py TRUTH_FILE first [slow] (run as the program: it runs the exec itself;
                                              slow: each program lasts at least 0.6 s)
The program runs the child and waits for it. The child's first program keeps 2,000,000 bytes
(in_first_program), then replaces itself with the second program (os.execv, same pid), which
keeps 6,000,000 bytes (in_second_program) and writes TRUTH_FILE: {"pid": the child's pid,
"first": 2000000, "second": 6000000}.
"""
import json
import os
import subprocess
import sys
import time

FIRST, SECOND = 2_000_000, 6_000_000


def in_first_program():
    kept = []
    for _ in range(FIRST // 10_000):
        kept.append(bytearray(10_000))
    return kept


def in_second_program():
    kept = []
    for _ in range(SECOND // 10_000):
        kept.append(bytearray(10_000))
    return kept


truth = sys.argv[1]
stage = sys.argv[2] if len(sys.argv) > 2 else "program"
if stage == "program":
    subprocess.run([sys.executable, __file__, truth, "first"], check=True)
elif stage == "first":
    kept = in_first_program()
    slow = sys.argv[3:] == ["slow"]
    if slow:
        time.sleep(0.6)
    os.execv(sys.executable, [sys.executable, __file__, truth, "second"] + sys.argv[3:])
else:
    kept = in_second_program()
    with open(truth, "w") as f:
        json.dump({"pid": os.getpid(), "first": FIRST, "second": SECOND}, f)
    if sys.argv[3:] == ["slow"]:
        time.sleep(0.6)
