#!/usr/bin/env python3
"""Overhead of mprof next to no profiler and tracemalloc, measured side by side.

    python3 benches/overhead.py [--python PATH] [--runs N] [--mprof PATH] [--markdown]
    python3 benches/overhead.py --instructions    # instruction counts under valgrind

Workloads (benches/workloads/):
  alloc    an allocation-heavy pure-Python job (parse log lines into objects,
           group, render JSON); its own time.perf_counter() around the work,
           so start-up is excluded, plus the wall time of the whole command
  tornado  a tornado HTTP server under the profiler, driven by an unprofiled
           keep-alive client on 127.0.0.1; throughput in requests/s
  native   native-allocation heavy: an in-memory SQLite job (the standard
           library's sqlite3, whose library calls malloc and free), timed
           like alloc

Configurations: none (plain python), mprof (default rate, native hooks on),
mprof --python-only (default rate, Python's allocators only), mprof --rate 1,
tracemalloc (python -X tracemalloc=1), and memray when it is importable
(at its defaults, which see pymalloc's arenas rather than every object).

Runs are interleaved (each round runs every configuration once, in a rotated
order) so that a noisy machine hurts every configuration alike. The table
gives per workload and configuration:
  median, best   of the in-script time (alloc, native) or of the client's requests/s
  ratio          against none, of the medians and of the bests; for
                 throughput none's requests/s over the configuration's, so
                 that above 1 means slower either way
  wall           alloc and native: the whole command, start-up and profiler included
  CPU            user + system seconds of the whole profiled command (for
                 tornado: the server), start-up and profiler included; less
                 sensitive than wall time to other load on the machine
  peak RSS       VmHWM of the profiled Python process, read by itself at exit
  capture        size of the profiler's output file
  capture/s      that size over the profiled work's own time (alloc, native: the
                 in-script time; tornado: the requests at the measured rate)

Standard library only. The tornado workload needs tornado in the interpreter
under test: python -m pip install -r benches/requirements.txt
"""

import argparse
import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from runner import (
    TIMED, WARMUP, bench_env, kill_all_groups, make_configs, rate_config, run_one, run_timed, run_tornado,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REQUIREMENTS = os.path.relpath(os.path.join(HERE, "requirements.txt"))

# ---------------------------------------------------------------------------
# Table


def fmt_bytes(count):
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return ("%d %s" % (count, unit)) if unit == "B" else ("%.1f %s" % (count, unit))
        count /= 1024.0


def capture_rate(workload, result, requests):
    """Capture bytes per second of the profiled work: over the in-script time (alloc, native) or
    over the requests at the measured rate (tornado: the timed requests and the warm-up ones)."""
    if result.capture_bytes is None or not result.value:
        return None
    seconds = result.value if workload in TIMED else (requests + WARMUP) / result.value
    return result.capture_bytes / seconds


def summarise(workload, config, results, baselines, requests=0):
    """One table row: a list of cells. baselines: none's (median, best) values."""
    good = [r for r in results if r.error is None]
    failed = len(results) - len(good)
    name = config.name + (" (%d failed)" % failed if failed else "")
    if not good:
        return [workload, name] + ["failed"] + [""] * (len(HEADERS) - 3)
    values = [r.value for r in good]
    med = statistics.median(values)
    best = min(values) if workload in TIMED else max(values)
    unit = "%.3f s" if workload in TIMED else "%.0f req/s"
    cells = [unit % med, unit % best]
    for mine, base in zip((med, best), baselines or (None, None)):
        cells.append("%.2fx" % slowdown(workload, mine, base) if base else "-")
    cells.append(median_of([r.wall for r in good], "%.2f s"))
    cells.append(median_of([r.cpu for r in good], "%.2f s"))
    rss = [r.rss_kib * 1024 for r in good if r.rss_kib]
    cells.append(fmt_bytes(statistics.median(rss)) if rss else "-")
    sizes = [r.capture_bytes for r in good if r.capture_bytes is not None]
    cells.append(fmt_bytes(statistics.median(sizes)) if sizes else "-")
    rates = [x for x in (capture_rate(workload, r, requests) for r in good) if x is not None]
    cells.append(fmt_bytes(statistics.median(rates)) + "/s" if rates else "-")
    return [workload, name] + cells


def slowdown(workload, value, baseline):
    """How many times slower than no profiler: a time ratio, or for throughput the inverse."""
    return value / baseline if workload in TIMED else baseline / value


def median_of(values, fmt):
    values = [v for v in values if v is not None]
    return fmt % statistics.median(values) if values else "-"


HEADERS = [
    "workload",
    "configuration",
    "median",
    "best",
    "ratio (medians)",
    "ratio (bests)",
    "wall",
    "CPU",
    "peak RSS",
    "capture",
    "capture/s",
]


def baseline_of(workload, results):
    """none's (median, best), or None when every run failed."""
    good = [r.value for r in results if r.error is None]
    if not good:
        return None
    return statistics.median(good), (min(good) if workload in TIMED else max(good))


def print_table(rows, markdown, headers=HEADERS):
    if markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    for n, row in enumerate([headers] + rows):
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def ratios(workload, results, baseline):
    """(ratio of medians, ratio of bests) against none, or None."""
    good = [r.value for r in results if r.error is None]
    if not good or not baseline:
        return None
    best = min(good) if workload in TIMED else max(good)
    return slowdown(workload, statistics.median(good), baseline[0]), slowdown(workload, best, baseline[1])


def cpu_overhead(results):
    """mprof's CPU seconds over none's, as a percentage string (medians)."""
    cpus = {}
    for name in ("none", "mprof"):
        values = [r.cpu for r in results[name] if r.error is None and r.cpu is not None]
        if not values:
            return "?"
        cpus[name] = statistics.median(values)
    return "%+.1f%%" % ((cpus["mprof"] / cpus["none"] - 1) * 100)


def print_targets(workloads, table):
    """The issue's targets, judged on medians: default rate <= 5% overhead; --rate 1 faster than tracemalloc=1."""
    print()
    for workload in workloads:
        base = baseline_of(workload, table[workload]["none"])
        results = table[workload]
        default = ratios(workload, results.get("mprof", []), base)
        every = ratios(workload, results.get("mprof --rate 1", []), base)
        traced = ratios(workload, results.get("tracemalloc=1", []), base)
        if default is not None:
            verdict = "met" if default[0] <= 1.05 else "MISSED by %.1f points" % ((default[0] - 1.05) * 100)
            print(
                "target [%s] mprof at the default rate <= 5%% overhead: %+.1f%% (best runs %+.1f%%, CPU %s) -> %s"
                % (workload, (default[0] - 1) * 100, (default[1] - 1) * 100, cpu_overhead(results), verdict)
            )
        if every is not None and traced is not None:
            verdict = "met" if every[0] < traced[0] else "MISSED"
            print(
                "target [%s] mprof --rate 1 faster than tracemalloc=1: %.2fx vs %.2fx -> %s"
                % (workload, every[0], traced[0], verdict)
            )


# ---------------------------------------------------------------------------
# Instruction counts (--instructions): the same workloads under valgrind, which
# counts instructions exactly. Instructions are not time, but they do not care
# about other load on the machine, so a few percent can be told from noise.

# Two sizes of each workload; the difference between them is pure steady-state work,
# with start-up, imports and the profiler's fixed costs cancelled out.
INSTRUCTION_SIZES = {
    "alloc": (["--lines", "5000", "--rounds", "1"], ["--lines", "5000", "--rounds", "3"], 2, "round of 5,000 lines"),
    "tornado": (1000, 3000, 2000, "request"),
    "native": (["--rows", "10000", "--rounds", "1"], ["--rows", "10000", "--rounds", "3"], 2, "round of 10,000 rows"),
}
# mprof --rate 1 and memray are left out: a reader slowed down ~50x by valgrind would
# make mprof drop records, and a number that flatters is worse than none.
INSTRUCTION_CONFIGS = ("none", "mprof", "mprof --python-only", "tracemalloc=1")


def counted_under_valgrind(name):
    """The configurations `--instructions` counts: those above, and any `mprof --rate R` asked for
    with `--configs` but `--rate 1` (a reader slowed down by valgrind would drop its records)."""
    return name in INSTRUCTION_CONFIGS or (name.startswith("mprof --rate ") and name != "mprof --rate 1")


def valgrind_counts(logdir, mprof):
    """Instructions and simulated cache misses (instruction L1, data L1, data last level) of the
    Python process and of the mprof process, from cachegrind's logs."""
    fields = {
        "I": r"I\s+refs:\s+([\d,]+)",
        "I1": r"I1\s+misses:\s+([\d,]+)",
        "D1": r"D1\s+misses:\s+([\d,]+)",
        "LLd": r"LLd\s+misses:\s+([\d,]+)",
    }
    counts = {who: dict.fromkeys(fields, 0) for who in ("python", "mprof")}
    for name in os.listdir(logdir):
        with open(os.path.join(logdir, name), errors="replace") as log:
            text = log.read()
        command = re.search(r"== Command: (\S+)", text)
        if command and re.search(fields["I"], text):
            who = "mprof" if os.path.realpath(command.group(1)) == os.path.realpath(mprof) else "python"
            for key, pattern in fields.items():
                found = re.search(pattern, text)
                counts[who][key] += int(found.group(1).replace(",", "")) if found else 0
        os.unlink(os.path.join(logdir, name))
    return counts


def count_once(workload, config, args, size, tmpdir, env):
    """Instruction counts of one valgrind run, or an error string."""
    logdir = os.path.join(tmpdir, "vg")
    os.makedirs(logdir, exist_ok=True)
    wrapper = [
        "valgrind", "--tool=cachegrind", "--cache-sim=yes", "--trace-children=yes",
        "--cachegrind-out-file=/dev/null", "--log-file=%s/%%p.log" % logdir,
    ]
    capture = os.path.join(tmpdir, "capture.out")
    if workload in TIMED:
        result = run_timed(workload, config, args, capture, env, script_args=size, wrapper=wrapper)
    else:
        result = run_tornado(config, args, capture, env, requests=size, warmup=0, wrapper=wrapper)
    counts = valgrind_counts(logdir, args.mprof)
    return result.error or counts


def run_instructions(args, workloads, configs, env):
    """Print instructions per unit of work for none, mprof (native hooks on and --python-only) and
    tracemalloc=1, and each one's ratio."""
    if not shutil.which("valgrind"):
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mprof-bench-") as tmpdir:
        for workload in workloads:
            small, large, units, unit_name = INSTRUCTION_SIZES[workload]
            base = None
            for config in [c for c in configs if counted_under_valgrind(c.name)]:
                first = count_once(workload, config, args, small, tmpdir, env)
                second = count_once(workload, config, args, large, tmpdir, env)
                failure = next((run for run in (first, second) if isinstance(run, str)), None)
                if failure is not None:
                    print("%s %s failed: %s" % (workload, config.name, failure), file=sys.stderr)
                    continue
                per = {
                    who: {k: (second[who][k] - first[who][k]) / units for k in first[who]}
                    for who in ("python", "mprof")
                }
                target, reader = per["python"]["I"], per["mprof"]["I"]
                base = per["python"] if config.name == "none" else base
                ratio = "%.3fx" % ((target + reader) / base["I"]) if base else "-"
                row = [
                    workload,
                    config.name,
                    unit_name,
                    "{:,.0f}".format(target),
                    "{:,.0f}".format(reader) if reader else "-",
                    ratio,
                    "{:,.0f}".format(per["python"]["D1"]),
                    "{:,.0f}".format(per["python"]["LLd"]),
                    "%+.1f%%" % (100 * (per["python"]["D1"] / base["D1"] - 1)) if base and base["D1"] else "-",
                    "{:,.0f}".format(per["python"]["I1"]),
                    "%+.1f%%" % (100 * (per["python"]["I1"] / base["I1"] - 1)) if base and base["I1"] else "-",
                ]
                print("  ".join(row), file=sys.stderr, flush=True)
                rows.append(row)
    headers = [
        "workload",
        "configuration",
        "per",
        "instructions (target)",
        "instructions (mprof CLI)",
        "ratio vs none",
        "D1 misses (target)",
        "LL data misses (target)",
        "D1 misses vs none",
        "I1 misses (target)",
        "I1 misses vs none",
    ]
    print()
    print("instructions and simulated cache misses counted by cachegrind; python: %s" % args.python)
    print()
    print_table(rows, args.markdown, headers)


# ---------------------------------------------------------------------------
# Set-up


def add_target_args(parser):
    """The interpreter under test and the mprof binary: the options every benchmark takes."""
    parser.add_argument("--python", default=default_python(),
                        help="interpreter under test (default: the newest ~/.pyenv/versions/3.11.*)")
    parser.add_argument("--mprof", default=os.path.join(ROOT, "target", "release", "mprof"))


def check_target_args(parser, args, needs_mprof=True):
    """Stops with a one-line error when `add_target_args`' interpreter or binary is missing
    (the binary only if `needs_mprof`: a benchmark that builds its own)."""
    if not args.python or not os.path.exists(args.python):
        parser.error("no Python interpreter found; pass --python PATH")
    if needs_mprof and not os.access(args.mprof, os.X_OK):
        parser.error("%s not found: run `cargo build --release` first" % args.mprof)


def tornado_parser(doc, runs, requests):
    """The options of a benchmark that runs the tornado server `--runs` times (its description
    and epilog from `doc`, a module docstring), to which it adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=doc.split("\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(parser)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=300)
    return parser


def check_tornado_args(parser, args, needs_mprof=True):
    """Stops with a one-line error on `tornado_parser`'s bad options or a missing tornado."""
    check_target_args(parser, args, needs_mprof)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not runnable(args.python, ["tornado"]):
        sys.exit(1)


def default_python():
    candidates = glob.glob(os.path.expanduser("~/.pyenv/versions/3.11.*/bin/python3"))
    candidates.sort(key=lambda p: [int(x) for x in re.findall(r"3\.11\.(\d+)", p)[:1]] or [0])
    return candidates[-1] if candidates else None


def importable(python, module):
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    return subprocess.run([python, "-c", "import " + module], **quiet).returncode == 0


def runnable(python, workloads):
    """`workloads` without tornado when the interpreter under test lacks it (saying so)."""
    if "tornado" in workloads and not importable(python, "tornado"):
        print("skipping the tornado workload: tornado is not installed for %s\n"
              "  install it with: %s -m pip install -r %s" % (python, python, REQUIREMENTS), file=sys.stderr)
        return [w for w in workloads if w != "tornado"]
    return list(workloads)


def describe(cmd):
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30).stdout.decode().strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    parser.add_argument(
        "--python",
        default=default_python(),
        help="interpreter under test (default: the newest ~/.pyenv/versions/3.11.*)",
    )
    parser.add_argument(
        "--mprof",
        default=os.path.join(ROOT, "target", "release", "mprof"),
        help="mprof binary (default: target/release/mprof)",
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration and workload (default 5)")
    parser.add_argument(
        "--workloads", default="alloc,tornado,native", help="comma-separated subset of alloc,tornado,native"
    )
    parser.add_argument("--requests", type=int, default=10000, help="timed requests per tornado run (default 10000)")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections of the client (default 8)")
    parser.add_argument("--no-memray", action="store_true", help="leave memray out even if it is importable")
    parser.add_argument(
        "--configs",
        help="comma-separated subset of configurations to run, e.g. 'none,mprof' (default: all; none is always run); "
        "'mprof --rate R' takes any rate",
    )
    parser.add_argument("--timeout", type=int, default=300, help="seconds before a run is killed (default 300)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions under valgrind instead of timing (none, mprof, mprof --python-only, "
        "tracemalloc=1): immune to machine load",
    )
    args = parser.parse_args()
    if not args.python or not os.path.exists(args.python):
        parser.error("no Python interpreter found; pass --python PATH (default: ~/.pyenv/versions/3.11.*/bin/python3)")
    if not os.access(args.mprof, os.X_OK):
        parser.error("%s not found: run `cargo build --release` first, or pass --mprof PATH" % args.mprof)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for workload in args.workloads:
        if workload not in ("alloc", "tornado", "native"):
            parser.error("unknown workload %r (choose from alloc, tornado, native)" % workload)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workloads = runnable(args.python, args.workloads)
    with_memray = not args.no_memray and importable(args.python, "memray")
    if not with_memray and not args.no_memray:
        print("memray is not importable for %s: leaving it out" % args.python, file=sys.stderr)
    if not workloads:
        sys.exit("nothing to run")
    configs = make_configs(os.path.abspath(args.mprof), with_memray)
    if args.configs:
        wanted = {"none"} | {name.strip() for name in args.configs.split(",")}
        known = {config.name for config in configs}
        configs += [rate_config(os.path.abspath(args.mprof), name) for name in sorted(wanted - known)]
        configs = [config for config in configs if config is not None]
        unknown = wanted - {config.name for config in configs}
        if unknown:
            have = ", ".join(config.name for config in configs)
            sys.exit("unknown or unavailable configuration(s): %s (have: %s)" % (", ".join(sorted(unknown)), have))
        configs = [config for config in configs if config.name in wanted]
    env = bench_env()
    if args.instructions:
        try:
            run_instructions(args, workloads, configs, env)
        finally:
            kill_all_groups()
        return

    header = [
        "python: %s (%s)" % (args.python, describe([args.python, "-c", "import sys; print(sys.version.split()[0])"])),
        "mprof: %s (%s)" % (args.mprof, describe([args.mprof, "--version"])),
        "runs: %d per configuration, interleaved; tornado: %d requests over %d connections"
        % (args.runs, args.requests, args.connections),
        "machine: %d CPUs, load average at start %.2f" % (os.cpu_count() or 0, os.getloadavg()[0]),
    ]
    table = {w: {c.name: [] for c in configs} for w in workloads}
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-bench-") as tmpdir:
            for run in range(args.runs):
                for workload in workloads:
                    shift = run % len(configs)
                    for config in configs[shift:] + configs[:shift]:
                        result = run_one(workload, config, args, tmpdir, env)
                        table[workload][config.name].append(result)
                        report_progress(run, args.runs, workload, config, result)
    finally:
        kill_all_groups()
    header.append("load average at end %.2f" % os.getloadavg()[0])

    rows = []
    for workload in workloads:
        base = baseline_of(workload, table[workload]["none"])
        for config in configs:
            rows.append(summarise(workload, config, table[workload][config.name], base, args.requests))
    print()
    for line in header:
        print(line)
    print()
    print_table(rows, args.markdown)
    print_targets(workloads, table)


def report_progress(run, runs, workload, config, result):
    if result.error is not None:
        what = "FAILED: " + result.error
    elif workload in TIMED:
        what = "%.3f s (wall %.2f s)" % (result.value, result.wall)
    else:
        what = "%.0f req/s" % result.value
    print("[%d/%d] %-7s %-15s %s" % (run + 1, runs, workload, config.name, what), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
