"""Three lines of the program that reach the same line of the standard library (json's
encoder builds each 10 MB document): 30, 20 and 10 MB kept, in that order, by dump_a, dump_b
and dump_c. By your code they are three rows; by line, one. Then waits for STOP to exist, so
that a live view shows the end. For tests/live.rs.

usage: views_agree.py STOP
"""
import json
import os
import sys
import time

KEEP = []
DOC = ["x" * 1000] * 10000


def dump_a():
    for _ in range(3):
        KEEP.append(json.dumps(DOC))  # LINE dump_a


def dump_b():
    for _ in range(2):
        KEEP.append(json.dumps(DOC))  # LINE dump_b


def dump_c():
    KEEP.append(json.dumps(DOC))  # LINE dump_c


# The smallest first: the heap peaks in dump_a's last document, when the others are done.
dump_c()
dump_b()
dump_a()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
