"""Many workers under `mprof record --follow-children`: does the reader keep up?

Runs benches/workloads/pool16.py (16 forked workers, allocation-heavy) unprofiled and under
mprof at the default rate (and at --rate 1 with --rate-one), and prints per configuration:
the pool's elapsed time (median of --runs), the ratio against no profiler, the records the
agents dropped (summed over every process, from the merged report), the number of processes
profiled, the samples taken, the CPU time of mprof alone (the reader: `reader_cpu_ms` in the
capture's metadata) and of everything (mprof and the workload). One ring per process: drops
would show the reader falling behind.

usage: python3 benches/workers.py [--python PATH] [--mprof PATH] [--runs N] [--workers N] [--rate-one]
"""
import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    elapsed = float(out.stdout.strip().splitlines()[-1].split("=")[1])
    return elapsed, cpu


def figures(mprof, capture):
    """(dropped, processes, samples, reader CPU seconds) of a followed capture, merged."""
    r = json.loads(subprocess.run([mprof, "report", capture, "--json", "--top", "1"],
                                  capture_output=True, text=True, check=True).stdout)
    reader = int(r["meta"].get("reader_cpu_ms", "0")) / 1000
    return r["dropped"], len(r.get("processes") or [1]), r["samples"], reader


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=os.path.expanduser(
        sorted(glob.glob("~/.pyenv/versions/3.11.*/bin/python3".replace("~", os.path.expanduser("~"))))[-1]))
    p.add_argument("--mprof", default=os.path.join(HERE, "..", "target", "release", "mprof"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rate-one", action="store_true", help="also measure --rate 1")
    a = p.parse_args()
    workload = [a.python, os.path.join(HERE, "workloads", "pool16.py"), "--workers", str(a.workers)]
    configs = [("none", [])]
    configs.append(("mprof", ["--follow-children"]))
    if a.rate_one:
        configs.append(("mprof --rate 1", ["--follow-children", "--rate", "1"]))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run_i in range(a.runs):
            for name, flags in configs:
                capture = os.path.join(tmp, "c%d.mprof" % run_i)
                if name == "none":
                    cmd = workload
                else:
                    cmd = [a.mprof, "record", "-q", "-o", capture] + flags + ["--"] + workload
                elapsed, cpu = run(cmd)
                extra = figures(a.mprof, capture) if name != "none" else (0, 1, 0, 0.0)
                rows.setdefault(name, []).append((elapsed, cpu, extra))
                print("run %d %s: %.2f s" % (run_i, name, elapsed), file=sys.stderr)
    base = statistics.median(r[0] for r in rows["none"])
    print("| configuration | pool elapsed (median) | ratio | dropped records | processes "
          "| samples | reader CPU | CPU (all processes) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, _ in configs:
        rs = rows[name]
        med = statistics.median(r[0] for r in rs)
        print("| %s | %.2f s | %.2fx | %d | %d | %d | %.2f s | %.1f s |" % (
            name, med, med / base, max(r[2][0] for r in rs), rs[0][2][1],
            statistics.median(r[2][2] for r in rs), statistics.median(r[2][3] for r in rs),
            statistics.median(r[1] for r in rs)))


if __name__ == "__main__":
    main()
