#!/usr/bin/env python3
"""What `--native` (mixed C + Python stacks) costs, on the alloc workload of overhead.py.

    python3 benches/native.py [--python PATH] [--runs N] [--mprof PATH]

Two measurements, runs interleaved as in overhead.py:
  1. the default rate with and without --native: the in-script time and the CPU time of the
     whole command (profiler included), medians over --runs; the target is at most 1% more;
  2. the per-sample cost of the native unwind: the same workload at --rate 1 (every
     allocation a sample) with and without --native; the CPU time difference divided by the
     number of samples (read from the capture with `mprof report --json`).
Standard library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402
import runner  # noqa: E402

# Keep the capture after a run: its sample count is read before it is removed.
runner.capture_size = lambda path: os.path.getsize(path) if os.path.exists(path) else None


def configs(mprof):
    def record(*extra):
        return lambda py, cap: [mprof, "record", "-q", *extra, "-o", cap, "--", py]

    return [
        runner.Config("mprof", record()),
        runner.Config("mprof --native", record("--native")),
        runner.Config("mprof --rate 1", record("--rate", "1")),
        runner.Config("mprof --rate 1 --native", record("--rate", "1", "--native")),
    ]


def samples(mprof, capture):
    out = subprocess.run([mprof, "report", capture, "--json", "--top", "1"], stdout=subprocess.PIPE, check=True)
    return json.loads(out.stdout)["samples"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=overhead.default_python())
    parser.add_argument("--mprof", default=os.path.join(overhead.ROOT, "target", "release", "mprof"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--lines", default="20000", help="log lines per round of the alloc workload")
    args = parser.parse_args()
    env = dict(os.environ)
    script = ["--lines", args.lines, "--rounds", "1"]
    results = {c.name: [] for c in configs(args.mprof)}
    with tempfile.TemporaryDirectory(prefix="mprof-native-") as tmp:
        for run in range(args.runs):
            order = configs(args.mprof)
            order = order[run % len(order):] + order[: run % len(order)]
            for config in order:
                capture = os.path.join(tmp, "c.mprof")
                r = runner.run_timed("alloc", config, args, capture, env, script_args=script)
                if r.error:
                    sys.exit("%s: %s" % (config.name, r.error))
                n = samples(args.mprof, capture)
                os.unlink(capture)
                results[config.name].append((r.value, r.cpu, n))
                print("run %d %-24s %.3f s in script, %.3f s CPU, %d samples" % (run, config.name, r.value, r.cpu, n),
                      file=sys.stderr, flush=True)

    def median(name, i):
        return statistics.median(x[i] for x in results[name])

    print("python: %s, %d runs, alloc workload with %s lines" % (args.python, args.runs, args.lines))
    for name in results:
        print("%-24s median %.3f s in script, %.3f s CPU, %d samples"
              % (name, median(name, 0), median(name, 1), median(name, 2)))
    for what, i in (("in-script time", 0), ("CPU time", 1)):
        extra = median("mprof --native", i) / median("mprof", i) - 1
        verdict = "ok" if extra <= 0.01 else "above the 1% target"
        print("--native at the default rate: %+.1f%% %s (%s)" % (100 * extra, what, verdict))
    cpu = median("mprof --rate 1 --native", 1) - median("mprof --rate 1", 1)
    n = median("mprof --rate 1 --native", 2)
    print("native unwind and its records: %.2f us of CPU per sample (%d samples at --rate 1)" % (1e6 * cpu / n, n))


if __name__ == "__main__":
    main()
