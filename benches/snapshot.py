#!/usr/bin/env python3
"""How long pymprof.tracemalloc's take_snapshot() takes with 100,000 live samples (the goal:
under 100 ms), with the standard tracemalloc beside it on the same program.

    python3 benches/snapshot.py [--python PATH] [--mprof PATH] [--samples N] [--lines K]
                                [--nframe F] [--repeat R]

A child process traces at rate 1 (every allocation is a sample), makes N objects from K
different lines (and a list that keeps them), then takes R snapshots in a row and times each
one (time.perf_counter() around take_snapshot()): from the request to the Snapshot object
with its traces, the time a user waits. It prints the median and the best, the traces in the
snapshot, and what statistics("lineno") then takes. pymprof is imported from this checkout
(python/) with MPROF as its binary.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r'''
import json, statistics, sys, time
if sys.argv[1] == "pymprof":
    sys.path.insert(0, sys.argv[2])
    import pymprof.tracemalloc as tracemalloc
else:
    import tracemalloc
samples, lines, nframe, repeat = map(int, sys.argv[3:7])
# K functions, each allocating from a line of its own.
source = "\n".join("def make%d(n):\n    return [bytes(64 + %d) for _ in range(n)]" % (i, i)
                   for i in range(lines))
namespace = {}
exec(compile(source, "generated_lines.py", "exec"), namespace)
tracemalloc.start(nframe)
kept = [namespace["make%d" % (i % lines)](samples // lines) for i in range(lines)]
times = []
for _ in range(repeat):
    start = time.perf_counter()
    snap = tracemalloc.take_snapshot()
    times.append(time.perf_counter() - start)
    traces = len(snap.traces)
    del snap
snap = tracemalloc.take_snapshot()
start = time.perf_counter()
snap.statistics("lineno")
stats_s = time.perf_counter() - start
tracemalloc.stop()
print(json.dumps({"times": times, "traces": traces, "statistics_s": stats_s}))
'''


def default_python():
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.11.*/bin/python3")))
    return found[-1] if found else sys.executable


def run(which, args):
    env = dict(os.environ, PYMPROF_MPROF=os.path.abspath(args.mprof))
    out = subprocess.run(
        [args.python, "-c", CHILD, which, os.path.join(ROOT, "python"), str(args.samples),
         str(args.lines), str(args.nframe), str(args.repeat)],
        check=True, stdout=subprocess.PIPE, env=env)
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=default_python())
    p.add_argument("--mprof", default=os.path.join(ROOT, "target/release/mprof"))
    p.add_argument("--samples", type=int, default=100000)
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--nframe", type=int, default=1)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    print("python: %s; %d live samples from %d lines, nframe %d, %d snapshots each"
          % (args.python, args.samples, args.lines, args.nframe, args.repeat))
    print("%-22s %10s %10s %10s %16s" % ("module", "median", "best", "traces", "statistics()"))
    for which in ("pymprof", "standard"):
        r = run(which, args)
        times = sorted(r["times"])
        median = times[len(times) // 2]
        print("%-22s %8.1f ms %7.1f ms %10d %13.1f ms" % (
            "pymprof.tracemalloc" if which == "pymprof" else "tracemalloc", 1000 * median,
            1000 * times[0], r["traces"], 1000 * r["statistics_s"]))
        if which == "pymprof":
            verdict = "met" if median < 0.1 else "NOT met"
            print("  goal take_snapshot() < 100 ms with %d live samples: %s" % (args.samples, verdict))


if __name__ == "__main__":
    main()
