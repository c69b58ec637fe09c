#!/usr/bin/env python3
"""What `--native` (mixed C + Python stacks) costs, on the alloc workload of overhead.py.

    python3 benches/native.py [--python PATH] [--mprof PATH] [--parts pairs,instructions,unwind]
                              [--pairs N] [--runs N] [--lines N] [--instr-lines N] [--markdown]

The target: `--native` at its default rate adds at most 1% over the same run without it. Three
measurements, each a --parts name:

  pairs         simultaneous pinned pairs (pairs.py's method: the two commands at the same
                moment on neighbouring cores, sides swapped every other pair, a warm-up pair
                dropped): `mprof record --native` against `mprof record` (the command with
                and without the flag; both sample at the default 128 KiB since it became
                --native's too) and against `mprof record --rate 128KiB` (the same rate named:
                what the native stacks alone cost, whatever the default). The median and
                quartiles of the in-script time ratios; `mprof` against itself is the noise
                floor. Wall time on a shared machine is noisy: read the quartiles.
  instructions  cachegrind instruction counts of the profiled Python process per round of the
                workload, from runs of one and of three rounds so that start-up cancels out,
                for none, mprof, mprof --rate 128KiB and mprof --native; the ratios. valgrind
                runs inside `mprof record`, so the reader keeps its own pace (a reader slowed
                down with the target would read /proc 50 times as often per round) and is not
                counted: it runs on another core. Counts do not move with the load on the
                machine: the repeatable figure.
  unwind        the per-sample cost of the native unwind and its larger records: --rate 1 with
                and without --native, run one after the other --runs times; the CPU time
                difference over the sample count the capture reports.

Standard library only; `instructions` needs valgrind, `pairs` two CPUs and taskset.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the set-up and the table)
import pairs  # noqa: E402
import runner  # noqa: E402  (the configurations and runners)

NATIVE_RATE = "128KiB"
PARTS = ("pairs", "instructions", "unwind")

# Keep the capture after a run (runner.py removes it): the unwind part reads its sample count.
runner.capture_size = lambda path: os.path.getsize(path) if os.path.exists(path) else None


def configs(mprof):
    def record(*extra):
        return lambda py, cap: [mprof, "record", "-q", *extra, "-o", cap, "--", py]

    return {
        c.name: c
        for c in [
            runner.Config("none", lambda py, cap: [py]),
            runner.Config("mprof", record()),
            runner.Config("mprof --rate " + NATIVE_RATE, record("--rate", NATIVE_RATE)),
            runner.Config("mprof --native", record("--native")),
            runner.Config("mprof --rate 1", record("--rate", "1")),
            runner.Config("mprof --rate 1 --native", record("--rate", "1", "--native")),
        ]
    }


def samples(mprof, capture):
    out = subprocess.run([mprof, "report", capture, "--json", "--top", "1"], stdout=subprocess.PIPE, check=True)
    return json.loads(out.stdout)["samples"]


def percent(ratio):
    return "%+.1f%%" % (100 * (ratio - 1))


def measure_pairs(args, all_configs, env):
    """--native against mprof and against mprof at the same rate, and mprof against itself."""
    rows = []
    comparisons = [
        ("mprof", "mprof"),
        ("mprof", "mprof --native"),
        ("mprof --rate " + NATIVE_RATE, "mprof --native"),
    ]
    with tempfile.TemporaryDirectory(prefix="mprof-native-pairs-") as tmp:
        for base, other in comparisons:
            ratios, failures = pairs.pairs_of("alloc", all_configs[base], all_configs[other], args, tmp, env)
            for failure in failures[:2]:
                print("  failed: %s" % failure, file=sys.stderr)
            label = "%s / %s" % (other, base) + (" (noise floor)" if base == other else "")
            rows.append([label, str(len(ratios))] + pairs.summary(ratios))
    print()
    print("simultaneous pairs, alloc workload (%s lines, %s rounds), in-script time ratios; python: %s; "
          "one slot = cores 0 and 1; load average %.2f"
          % (args.lines, args.rounds, args.python, os.getloadavg()[0]))
    print()
    overhead.print_table(rows, args.markdown, ["ratio", "pairs", "median", "quartiles", "min..max"])


# The mprof flags of each configuration of the instructions part (None: no profiler).
INSTRUCTION_CONFIGS = {
    "none": None,
    "mprof": [],
    "mprof --rate " + NATIVE_RATE: ["--rate", NATIVE_RATE],
    "mprof --native": ["--native"],
}


def count_target(args, flags, script, tmp, env):
    """Instructions of the profiled Python process alone (valgrind runs inside `mprof record`,
    so the reader keeps its own pace and is not counted), and the samples of the capture."""
    log, capture = os.path.join(tmp, "vg.log"), os.path.join(tmp, "c.mprof")
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                "--log-file=" + log, args.python, os.path.join(runner.WORKLOADS, "alloc_heavy.py")] + script
    cmd = valgrind if flags is None else [args.mprof, "record", "-q", *flags, "-o", capture, "--", *valgrind]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=args.timeout, env=env)
    with open(log, errors="replace") as f:
        found = re.search(r"I\s+refs:\s+([\d,]+)", f.read())
    n = 0
    if flags is not None:
        n = samples(args.mprof, capture)
        os.unlink(capture)
    return int(found.group(1).replace(",", "")), n


def measure_instructions(args, env):
    """Instructions per round of the profiled program for none, mprof, mprof at 128 KiB and
    --native, from runs of one and of three rounds; the ratios."""
    if not shutil.which("valgrind"):
        sys.exit("the instructions part needs valgrind (apt-get install valgrind)")
    sizes = [["--lines", args.instr_lines, "--rounds", rounds] for rounds in ("1", "3")]
    per_round = {}
    with tempfile.TemporaryDirectory(prefix="mprof-native-vg-") as tmp:
        for name, flags in INSTRUCTION_CONFIGS.items():
            (i1, n1), (i3, n3) = (count_target(args, flags, size, tmp, env) for size in sizes)
            per_round[name] = ((i3 - i1) / 2, (n3 - n1) / 2)
            print("  %s: %.0f instructions and %.0f samples per round" % ((name,) + per_round[name]),
                  file=sys.stderr, flush=True)
    base = per_round["none"][0]
    rows = [[name, "{:,.0f}".format(i), "{:,.0f}".format(n) if INSTRUCTION_CONFIGS[name] is not None else "-",
             "%.4fx" % (i / base)] for name, (i, n) in per_round.items()]
    print()
    print("instructions of the profiled program per round of %s lines (cachegrind, the Python process "
          "alone: mprof's reader runs beside it); python: %s" % (args.instr_lines, args.python))
    print()
    overhead.print_table(rows, args.markdown, ["configuration", "instructions", "samples", "vs none"])
    print()
    native = per_round["mprof --native"][0]
    for other in ("mprof", "mprof --rate " + NATIVE_RATE):
        ratio = native / per_round[other][0]
        verdict = "ok" if ratio <= 1.01 else "above the 1% target"
        print("instructions: mprof --native / %s = %.4f (%s, %s)" % (other, ratio, percent(ratio), verdict))


def measure_unwind(args, all_configs, env):
    """The CPU cost per sample of the native unwind, from --rate 1 runs with and without it."""
    names = ["mprof --rate 1", "mprof --rate 1 --native"]
    results = {name: [] for name in names}
    script = ["--lines", args.lines, "--rounds", "1"]
    with tempfile.TemporaryDirectory(prefix="mprof-native-") as tmp:
        for run in range(args.runs):
            for name in names if run % 2 == 0 else reversed(names):
                capture = os.path.join(tmp, "c.mprof")
                r = runner.run_timed("alloc", all_configs[name], args, capture, env, script_args=script)
                if r.error:
                    sys.exit("%s: %s" % (name, r.error))
                n = samples(args.mprof, capture)
                os.unlink(capture)
                results[name].append((r.cpu, n))
                print("  run %d %-24s %.3f s CPU, %d samples" % (run, name, r.cpu, n), file=sys.stderr, flush=True)
    cpu = {name: statistics.median(x[0] for x in results[name]) for name in names}
    n = statistics.median(x[1] for x in results[names[1]])
    print()
    print("native unwind and its records: %.2f us of CPU per sample (%d samples at --rate 1, median of %d runs)"
          % (1e6 * (cpu[names[1]] - cpu[names[0]]) / n, n, args.runs))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--python", default=overhead.default_python())
    p.add_argument("--mprof", default=os.path.join(overhead.ROOT, "target", "release", "mprof"))
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    p.add_argument("--pairs", type=int, default=12, help="pairs per ratio (default 12)")
    p.add_argument("--runs", type=int, default=5, help="runs of each configuration for the unwind part")
    p.add_argument("--lines", default="20000", help="log lines per round of the alloc workload")
    p.add_argument("--rounds", default="2", help="rounds of the alloc workload in the pairs part")
    p.add_argument("--instr-lines", default="5000", help="log lines per round under valgrind (1 and 3 rounds)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = [x for x in args.parts if x not in PARTS]
    if unknown:
        p.error("unknown part(s) %s" % ", ".join(unknown))
    if not args.python or not os.path.exists(args.python):
        p.error("no Python interpreter found; pass --python PATH")
    if not os.access(args.mprof, os.X_OK):
        p.error("%s not found: run `cargo build --release` first" % args.mprof)
    if "pairs" in args.parts and (os.cpu_count() or 1) < 2:
        p.error("pairs need two CPUs")
    args.slots = 1  # pairs.pairs_of: one pair at a time, on cores 0 and 1
    args.script_args = ["--lines", args.lines, "--rounds", args.rounds]  # pairs.run_pinned's
    args.mprof = os.path.abspath(args.mprof)
    return args


def main():
    args = parse_args()
    env = runner.bench_env()
    all_configs = configs(args.mprof)
    try:
        if "pairs" in args.parts:
            measure_pairs(args, all_configs, env)
        if "instructions" in args.parts:
            measure_instructions(args, env)
        if "unwind" in args.parts:
            measure_unwind(args, all_configs, env)
    finally:
        runner.kill_all_groups()


if __name__ == "__main__":
    main()
