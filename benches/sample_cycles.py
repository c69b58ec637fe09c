#!/usr/bin/env python3
"""A sample's own cycles where a web server runs: the agent's slow paths timed in place.

    python3 benches/sample_cycles.py                       # this checkout, 3 runs
    python3 benches/sample_cycles.py --against ../old      # and another checkout, in turns

Builds mprof with `MPROF_AGENT_CYCLES=1` (in CHECKOUT/target/cycles, a few minutes the first
time): an agent that reads the processor's time-stamp counter around its slow paths (a sampled
allocation's call and record, a realloc and a free that took the slow path) and sums the
cycles and counts in its memory (`injector/agent/src/cycles.rs`). Each run starts the tornado
server of `overhead.py` under `mprof record` at the default rate, warms it with `--warm`
requests, reads the sums out of the running server (/proc/PID/mem, at the address of the
agent's `MPROF_CYCLES`), drives it with `--requests` more and reads them again: the
difference is the steady state, without the start-up's imports and first samples. Prints, per
build, the slow paths' cycles a request and a sample, and their share of a request's time at
the measured requests per second. What comes after a sample (the program fetching again what
the sample evicted) is not in these counts: compare with `pairs.py`, which sees all of it.
"""

import glob
import os
import statistics
import struct
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


def agent_symbol(mprof):
    """The address of `MPROF_CYCLES` in the agent library `mprof` embeds (its build's copy)."""
    out = os.path.join(os.path.dirname(mprof), "build")
    libs = glob.glob(os.path.join(out, "*", "out", "libmprof_agent.so"))
    if not libs:
        sys.exit("sample_cycles.py: no agent library under %s" % out)
    lib = max(libs, key=os.path.getmtime)
    nm = subprocess.run(["nm", lib], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    for line in nm.stdout.decode().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] == "MPROF_CYCLES":
            return int(fields[0], 16)
    sys.exit("sample_cycles.py: %s has no MPROF_CYCLES: not built with MPROF_AGENT_CYCLES=1" % lib)


def read_counts(pid, symbol):
    """{part: (count, cycles)} read out of the running process `pid`'s agent."""
    base = None
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and "mprof-agent" in fields[5] and int(fields[2], 16) == 0:
                base = int(fields[0].split("-")[0], 16)
                break
    if base is None:
        raise ValueError("no agent mapped in process %d" % pid)
    fd = os.open("/proc/%d/mem" % pid, os.O_RDONLY)
    try:
        raw = os.pread(fd, 8 * 2 * len(PARTS), base + symbol)
    finally:
        os.close(fd)
    words = struct.unpack("<%dQ" % (2 * len(PARTS)), raw)
    return {name: (words[i], words[len(PARTS) + i]) for i, name in enumerate(PARTS)}


def counter_hz(out):
    """The time-stamp counter's frequency, from what the agent wrote at exit into `out`."""
    for name in os.listdir(out):
        with open(os.path.join(out, name)) as f:
            fields = f.readline().split()
        if len(fields) == 4 and fields[0] == "tsc" and int(fields[3]) > 0:
            return int(fields[1]) * 1e9 / int(fields[3])
    return None


def one_run(args, mprof, symbol, tmpdir):
    """The steady state's figures of one run, or an error string."""
    out = tempfile.mkdtemp(dir=tmpdir)
    env = dict(runner.bench_env(), MPROF_CYCLES_OUT=out)
    config = runner.config_named(mprof, "mprof")
    readings = []

    def warm_then_read(popen, port):
        warm = subprocess.run(runner.client_command(args, port, args.warm, 0), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=args.timeout + 30)
        if warm.returncode != 0:
            readings.append("the warm-up client failed: %s" % runner.tail(warm.stderr.decode()))
        read(popen)

    def read(popen, *_port):
        pid = runner.server_pid(popen, True)
        try:
            readings.append(read_counts(pid, symbol) if pid is not None else "no server process")
        except (OSError, ValueError) as e:
            readings.append("reading the counts failed: %s" % e)

    result = runner.run_tornado(config, args, os.path.join(tmpdir, "capture.mprof"), env, args.requests,
                                warmup=0, at_client_start=warm_then_read, at_client_exit=read)
    if result.error:
        return result.error
    errors = [r for r in readings if isinstance(r, str)]
    if errors or len(readings) != 2:
        return errors[0] if errors else "the counts were not read twice"
    hz = counter_hz(out)
    if hz is None:
        return "the agent wrote no counter frequency at exit"
    a, b = readings
    diff = {name: (b[name][0] - a[name][0], b[name][1] - a[name][1]) for name in PARTS}
    n = args.requests
    samples = diff["alloc_record"][0] + diff["realloc"][0]
    sample_cycles = sum(diff[name][1] for name in ["alloc_call", "alloc_record", "realloc"])
    per_request = sum(c for _, c in diff.values()) / n
    return {
        "samples a request": samples / n,
        "cycles a sample": sample_cycles / max(samples, 1),
        "cycles a request": per_request,
        "share %": 100.0 * per_request / hz * result.value,
        "parts": {name: (count / n, c / max(count, 1)) for name, (count, c) in diff.items()},
    }


def main():
    p = overhead.tornado_parser(__doc__, runs=3, requests=30000)
    p.add_argument("--warm", type=int, default=10000, help="requests before the first reading (default 10,000)")
    p.add_argument("--checkout", default=overhead.ROOT, help="the checkout to build (default: this one)")
    p.add_argument("--against", help="another checkout, built and run in turns with the first")
    args = p.parse_args()
    overhead.check_tornado_args(p, args, needs_mprof=False)  # the builds are made below
    checkouts = [os.path.abspath(args.checkout)] + ([os.path.abspath(args.against)] if args.against else [])
    builds = [(c, build(c)) for c in checkouts]
    builds = [(c, mprof, agent_symbol(mprof)) for c, mprof in builds]
    print("python: %s; %d run(s) of %d requests after %d; the default rate"
          % (args.python, args.runs, args.requests, args.warm))
    figures = {c: [] for c in checkouts}
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-cycles-") as tmpdir:
            for i in range(args.runs):
                for checkout, mprof, symbol in builds:
                    f = one_run(args, mprof, symbol, tmpdir)
                    if isinstance(f, str):
                        print("  %s, run %d failed: %s" % (checkout, i + 1, f), file=sys.stderr)
                        continue
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
