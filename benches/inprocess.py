#!/usr/bin/env python3
"""The in-process configuration of the overhead benchmarks (`pymprof` in runner.py): a
workload profiled by pymprof.start() from inside the program, at the rate `mprof record` uses
by default, writing a capture as `record` does; `pairs.py --configs none,mprof,pymprof` puts
the two side by side.

    python inprocess.py --mprof MPROF [--rate SIZE] [-o CAPTURE] -- SCRIPT [ARGS...]

pymprof is imported from this checkout (python/), with MPROF as its binary. The profile starts
before the script runs and stops after it, like `record`'s agent, which the workloads' own
timing leaves out as well.
"""

import argparse
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mprof", required=True)
    p.add_argument("--rate", default=str(128 * 1024))
    p.add_argument("-o", "--output", default=None)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    os.environ["PYMPROF_MPROF"] = args.mprof
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import pymprof

    script = os.path.abspath(args.script)
    sys.argv = [script] + [a for a in args.args if a != "--"]
    sys.path[0] = os.path.dirname(script)
    profile = pymprof.start(sample_rate=args.rate, output=args.output)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        profile.stop()


if __name__ == "__main__":
    main()
