#!/usr/bin/env python3
"""A sample's own cycles where a web server runs: the agent's slow paths timed in place.

    python3 benches/sample_cycles.py                       # this checkout, 2 runs
    python3 benches/sample_cycles.py --against ../old      # and another checkout, in turns

Builds mprof with `MPROF_AGENT_CYCLES=1` (in CHECKOUT/target/cycles, a few minutes the first
time): an agent that reads the processor's time-stamp counter around its slow paths (a sampled
allocation's call and record, a realloc and a free that took the slow path) and writes the
sums out when the process exits (`injector/agent/src/cycles.rs`). Runs the tornado server of
`overhead.py` under `mprof record` at the default rate, once with `--requests` and once with
`--long` requests after the same warm-up; the difference of the two is the steady state,
without the start-up's imports and first samples. Prints, per build, the slow paths' cycles a
request and a sample in the steady state, and their share of a request's time at the long
run's requests per second. What comes after a sample (the program fetching again what the
sample evicted) is not in these counts: compare with `pairs.py`, which sees all of it.
"""

import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter, tornado check, common options)
import runner  # noqa: E402  (the configurations, the tornado run)

PARTS = ["alloc_call", "alloc_record", "realloc", "free"]


def build(checkout):
    """The path of CHECKOUT's mprof built with the cycle counters, or exits with the error."""
    target = os.path.join(checkout, "target", "cycles")
    env = dict(os.environ, MPROF_AGENT_CYCLES="1", CARGO_TARGET_DIR=target)
    print("building %s with the cycle counters into %s" % (checkout, target), file=sys.stderr)
    done = subprocess.run(["cargo", "build", "--release", "--bin", "mprof"], cwd=checkout, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        sys.exit("sample_cycles.py: building %s failed:\n%s" % (checkout, runner.tail(done.stderr.decode())))
    return os.path.join(target, "release", "mprof")


def parse(text):
    """{name: (count, cycles)} and the counter's frequency in Hz from an agent's counts."""
    parts, hz = {}, None
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["tsc"] and len(fields) == 4 and int(fields[3]) > 0:
            hz = int(fields[1]) * 1e9 / int(fields[3])
        elif len(fields) == 3 and fields[0] in PARTS:
            parts[fields[0]] = (int(fields[1]), int(fields[2]))
    if set(parts) != set(PARTS) or hz is None:
        raise ValueError("unexpected counts: %r" % text[:200])
    return parts, hz


def one_run(args, mprof, requests, tmpdir):
    """(counts, Hz, requests/s) of one run of the server, or an error string."""
    out = tempfile.mkdtemp(dir=tmpdir)
    env = dict(runner.bench_env(), MPROF_CYCLES_OUT=out)
    config = runner.config_named(mprof, "mprof")
    result = runner.run_tornado(config, args, os.path.join(tmpdir, "capture.mprof"), env, requests)
    if result.error:
        return result.error
    files = os.listdir(out)
    if len(files) != 1:
        return "expected the counts of one process, found %d files (an agent without counters?)" % len(files)
    with open(os.path.join(out, files[0])) as f:
        try:
            parts, hz = parse(f.read())
        except ValueError as e:
            return str(e)
    return parts, hz, result.value


def steady(short, long_, extra_requests):
    """The steady state's figures from a short and a long run's counts."""
    (a, _, _), (b, hz, rps) = short, long_
    diff = {name: (b[name][0] - a[name][0], b[name][1] - a[name][1]) for name in PARTS}
    samples = diff["alloc_record"][0] + diff["realloc"][0]
    sample_cycles = sum(diff[name][1] for name in ["alloc_call", "alloc_record", "realloc"])
    per_request = sum(c for _, c in diff.values()) / extra_requests
    return {
        "samples a request": samples / extra_requests,
        "cycles a sample": sample_cycles / max(samples, 1),
        "cycles a request": per_request,
        "share %": 100.0 * per_request / hz * rps,
        "parts": {name: (n / extra_requests, c / max(n, 1)) for name, (n, c) in diff.items()},
    }


def main():
    p = overhead.tornado_parser(__doc__, runs=2, requests=10000)
    p.add_argument("--long", type=int, default=40000, help="requests of the long run (default 40,000)")
    p.add_argument("--checkout", default=overhead.ROOT, help="the checkout to build (default: this one)")
    p.add_argument("--against", help="another checkout, built and run in turns with the first")
    args = p.parse_args()
    args.mprof = sys.executable  # checked by check_tornado_args; the builds are made below
    overhead.check_tornado_args(p, args)
    if args.long <= args.requests:
        p.error("--long must be more than --requests")
    checkouts = [os.path.abspath(args.checkout)] + ([os.path.abspath(args.against)] if args.against else [])
    builds = [(c, build(c)) for c in checkouts]
    print("python: %s; %d run(s) of %d and %d requests; the default rate"
          % (args.python, args.runs, args.requests, args.long))
    figures = {c: [] for c in checkouts}
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-cycles-") as tmpdir:
            for i in range(args.runs):
                for checkout, mprof in builds:
                    short = one_run(args, mprof, args.requests, tmpdir)
                    long_ = one_run(args, mprof, args.long, tmpdir) if not isinstance(short, str) else short
                    if isinstance(long_, str):
                        print("  %s, run %d failed: %s" % (checkout, i + 1, long_), file=sys.stderr)
                        continue
                    f = steady(short, long_, args.long - args.requests)
                    figures[checkout].append(f)
                    print("  %s, run %d: %.0f cycles a request (%.3f%%), %.2f samples a request, "
                          "%.0f cycles a sample" % (checkout, i + 1, f["cycles a request"], f["share %"],
                                                    f["samples a request"], f["cycles a sample"]))
    finally:
        runner.kill_all_groups()
    for checkout, got in figures.items():
        if not got:
            continue
        med = {k: statistics.median(f[k] for f in got)
               for k in ["cycles a request", "share %", "samples a request", "cycles a sample"]}
        print("%s (median of %d):" % (checkout, len(got)))
        print("  the slow paths: %.0f cycles a request, %.3f%% of a request's time; %.2f samples a "
              "request at %.0f cycles each" % (med["cycles a request"], med["share %"],
                                               med["samples a request"], med["cycles a sample"]))
        for name in PARTS:
            n = statistics.median(f["parts"][name][0] for f in got)
            c = statistics.median(f["parts"][name][1] for f in got)
            print("  %-13s %6.3f a request, %6.0f cycles each" % (name, n, c))
    if not any(figures.values()):
        sys.exit("sample_cycles.py: no run succeeded")


if __name__ == "__main__":
    main()
