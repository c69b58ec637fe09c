"""At rate 1, pymprof.tracemalloc's figures are the standard module's: the traced memory, its
peak and the statistics of every line that holds 1% of it, within 1%, on the same program."""

import json
import os
import subprocess
import sys

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "match_workload.py")


def run(which):
    out = subprocess.run([sys.executable, PROGRAM, which], check=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout)


def close(a, b, within=0.01):
    return abs(a - b) <= within * max(abs(a), abs(b))


def test_traced_memory_and_statistics_by_line_match_the_standard_module():
    standard = run("standard")
    ours = run("pymprof")
    print("standard:", standard)
    print("pymprof: ", ours)
    assert standard["current"] > 10 * 1024 * 1024
    assert close(ours["current"], standard["current"]), (ours["current"], standard["current"])
    assert close(ours["peak"], standard["peak"]), (ours["peak"], standard["peak"])
    big = [line for line, (size, _) in standard["lines"].items()
           if size >= 0.01 * standard["current"]]
    assert len(big) >= 5
    for line in big:
        size, count = standard["lines"][line]
        assert line in ours["lines"], line
        our_size, our_count = ours["lines"][line]
        assert close(our_size, size), (line, our_size, size)
        assert close(our_count, count), (line, our_count, count)
