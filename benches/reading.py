#!/usr/bin/env python3
"""Reading `--rate 1` captures: mprof's views beside memray's matching commands, side by side.

    python3 benches/reading.py                  # alloc job and tornado server, 3 runs per view
    python3 benches/reading.py --runs 5 --workloads alloc
    python3 benches/reading.py --keep /tmp/caps          # keep the captures there
    python3 benches/reading.py --captures /tmp/caps      # read captures kept before

Records each workload once with `mprof record --rate 1` and once with `memray run
--trace-python-allocators` (the same events: every allocation of Python's allocators; memray
compresses its capture at the end, as it does by default), and once more with each at its
defaults (mprof samples every 128 KiB, memray records every allocation of the C allocator),
for the sizes. Then it runs every view of mprof and the matching memray command on the two
`--rate 1` captures, in turns (each round runs every pair, the side that goes first
alternating), and prints per view the median wall time and the peak RSS (from wait4) of each
side, the ratio of the medians with the quartiles of the per-round ratios, and mprof's
samples per second of its own CPU time (user + system: per core, as the reader runs on one
thread; diff reads its capture twice). The views and their memray counterparts:

    report      mprof report              memray stats
    flamegraph  mprof flamegraph          memray flamegraph
    timeline    mprof timeline            memray flamegraph --temporal   (memray's view over time)
    html        mprof html                memray table                    (an HTML page of sites)
    diff        mprof diff CAP CAP        memray stats, twice             (memray has no diff)
    export      mprof export --format pprof   memray transform csv
    floor       mprof report              mprof report                    (the same command)

The floor pairs `mprof report` with itself: its ratio is what the machine's noise alone makes
of a pair, the scale against which to read the others. A ratio above 1 means mprof is faster.
Below the table the issue's goals are checked: the `--rate 1` capture no larger than memray's,
every view at least 5x faster than memray's, the report at 10 M samples per CPU second or more,
the reader's peak RSS within 128 MiB. Wall time on a shared machine swings: read the ratios of
one run, not the seconds across runs. Needs memray and tornado in the interpreter under test
(`pip install -r benches/requirements.txt`); the driver itself needs only the standard library.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter under test, tornado check)
import runner  # noqa: E402  (configurations, the workloads' runs)

MPROF = "mprof --rate 1"
MEMRAY = "memray --trace-python-allocators"
# The same profilers at their defaults, recorded for the capture sizes only.
DEFAULTS = ("mprof", "memray")
# The goals.
SPEEDUP = 5.0
SAMPLES_PER_CPU_SECOND = 10e6
RSS_BOUND_KIB = 128 * 1024


def views(mprof, python, mcap, rcap, out):
    """(view, mprof commands, memray commands) for captures `mcap` (mprof) and `rcap` (memray),
    writing into the directory `out`."""
    memray = [python, "-m", "memray"]
    o = lambda name: os.path.join(out, name)  # noqa: E731
    return [
        ("report", [[mprof, "report", mcap]], [memray + ["stats", rcap]]),
        (
            "flamegraph",
            [[mprof, "flamegraph", mcap, "-o", o("m.svg")]],
            [memray + ["flamegraph", "-f", "-o", o("r.html"), rcap]],
        ),
        (
            "timeline",
            [[mprof, "timeline", mcap, "-o", o("t.svg")]],
            [memray + ["flamegraph", "--temporal", "-f", "-o", o("rt.html"), rcap]],
        ),
        (
            "html",
            [[mprof, "html", mcap, "-o", o("m.html")]],
            [memray + ["table", "-f", "-o", o("rtable.html"), rcap]],
        ),
        ("diff", [[mprof, "diff", mcap, mcap]], [memray + ["stats", rcap], memray + ["stats", rcap]]),
        (
            "export",
            [[mprof, "export", mcap, "--format", "pprof", "-o", o("m.pb.gz")]],
            [memray + ["transform", "csv", "-f", "-o", o("r.csv"), rcap]],
        ),
        ("floor", [[mprof, "report", mcap]], [[mprof, "report", mcap]]),
    ]


class Timed:
    """One side of a pair, run once: wall seconds, CPU seconds (user + system) and the highest
    peak RSS (KiB) of its commands."""

    def __init__(self, wall, cpu, rss_kib):
        self.wall, self.cpu, self.rss_kib = wall, cpu, rss_kib


def timed(commands, env):
    """Runs `commands` one after the other: a Timed, or an error (a string)."""
    start = time.perf_counter()
    peak, cpu = 0, 0.0
    for cmd in commands:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            return "exit %d: %s" % (proc.returncode, runner.tail(err.decode(errors="replace"), 2))
        peak = max(peak, usage.ru_maxrss)
        cpu += usage.ru_utime + usage.ru_stime
    return Timed(time.perf_counter() - start, cpu, peak)


def kept_size(path):
    """The size of a capture, which is kept (the runner's `capture_size` deletes it: the
    overhead benchmarks only weigh their captures)."""
    return os.path.getsize(path) if os.path.exists(path) else None


def capture_path(directory, workload, config):
    """Where the capture of `workload` under the configuration `config` goes."""
    words = config.split()
    rate = "-rate1" if "--rate" in words or "--trace-python-allocators" in words else ""
    return os.path.join(directory, "%s-%s%s.%s" % (workload, words[0], rate, words[0]))


def record(workload, args, directory, env):
    """Records `workload` with both profilers, at `--rate 1` and at their defaults: {config
    name: capture path}."""
    runner.capture_size = kept_size
    captures = {}
    for name in (MPROF, MEMRAY) + DEFAULTS:
        config = runner.config_named(args.mprof, name, with_memray=True)
        capture = capture_path(directory, workload, name)
        if workload == "tornado":
            result = runner.run_tornado(config, args, capture, env, args.requests)
        else:
            result = runner.run_timed(workload, config, args, capture, env)
        if result.error:
            sys.exit("%s under %s: %s" % (workload, name, result.error))
        captures[name] = capture
        print("recorded %s under %s: %s" % (workload, name, human(os.path.getsize(capture))), file=sys.stderr)
    return captures


def recorded_before(workload, directory):
    """The captures of `workload` that `--keep` left in `directory`."""
    captures = {name: capture_path(directory, workload, name) for name in (MPROF, MEMRAY) + DEFAULTS}
    missing = [path for path in captures.values() if not os.path.exists(path)]
    if missing:
        sys.exit("%s not found: record them with --keep %s first" % (", ".join(missing), directory))
    return captures


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%.1f %s" % (n, unit)
        n /= 1024.0


def samples_of(mprof, capture, env):
    """The samples an mprof capture holds (from `mprof report --json`)."""
    out = subprocess.run([mprof, "report", capture, "--json", "--top", "1"], stdout=subprocess.PIPE, env=env)
    try:
        return json.loads(out.stdout)["samples"]
    except (ValueError, KeyError):
        return None


def quartiles(values):
    """The lower and upper quartiles of `values` (both the value itself for fewer than two)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def measure(workload, captures, args, tmpdir, env):
    """Runs the views of one workload's captures in turns: its rows for the table."""
    mcap, rcap = captures[MPROF], captures[MEMRAY]
    samples = samples_of(args.mprof, mcap, env)
    rows = [(workload, "capture", [os.path.getsize(captures[n]) for n in (MPROF, MEMRAY)], samples),
            (workload, "default", [os.path.getsize(captures[n]) for n in DEFAULTS], samples_of(
                args.mprof, captures["mprof"], env))]
    pairs = views(args.mprof, args.python, mcap, rcap, tmpdir)
    runs = {(view, side): [] for view, _, _ in pairs for side in (0, 1)}
    for run in range(args.runs):
        for view, ours, theirs in pairs:
            order = [(0, ours), (1, theirs)]
            if run % 2:
                order.reverse()
            for side, commands in order:
                got = timed(commands, env)
                if isinstance(got, str):
                    sys.exit("%s %s (%s): %s" % (workload, view, ("mprof", "memray")[side], got))
                runs[(view, side)].append(got)
        print("%s: round %d of %d done" % (workload, run + 1, args.runs), file=sys.stderr)
    for view, _, _ in pairs:
        ours, theirs = runs[(view, 0)], runs[(view, 1)]
        rows.append((workload, view, (ours, theirs), samples))
    return rows


def main():
    parser = overhead.tornado_parser(__doc__, runs=3, requests=10000)
    parser.add_argument("--workloads", default="alloc,tornado")
    parser.add_argument("--keep", metavar="DIR", help="record the captures into DIR and keep them")
    parser.add_argument("--captures", metavar="DIR", help="read the captures --keep left in DIR")
    args = parser.parse_args()
    overhead.check_tornado_args(parser, args)
    if not overhead.importable(args.python, "memray"):
        parser.error("memray is not importable by %s: pip install -r benches/requirements.txt" % args.python)
    args.mprof = os.path.abspath(args.mprof)
    env = runner.bench_env()
    view_env = dict(env, MPROF_PROGRESS="never")
    view_env.pop("MPROF_READ_MEMORY_MIB", None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mprof-reading-") as tmpdir:
        for workload in args.workloads.split(","):
            if args.captures:
                captures = recorded_before(workload, args.captures)
            else:
                directory = args.keep or tmpdir
                os.makedirs(directory, exist_ok=True)
                captures = record(workload, args, directory, env)
            rows.extend(measure(workload, captures, args, tmpdir, view_env))
    print_table(rows, args)
    print_goals(rows)


def print_table(rows, args):
    print("mprof --rate 1 vs memray --trace-python-allocators, %d runs per view, in turns" % args.runs)
    print("(median wall time, peak RSS; ratio of the medians [quartiles of the per-run ratios]; "
          "mprof's samples per CPU second)")
    print("%-8s %-10s %21s %21s %20s %12s" % ("workload", "view", "mprof", "memray", "ratio", "samples/cpu"))
    for workload, view, figures, samples in rows:
        if view in ("capture", "default"):
            ours, theirs = figures
            label = "capture" if view == "capture" else "defaults"
            print("%-8s %-10s %21s %21s %19.2fx %12s" % (
                workload, label, human(ours), human(theirs), theirs / ours,
                "%d samples" % samples if samples else ""))
            continue
        ours, theirs = figures
        m = statistics.median(r.wall for r in ours)
        r = statistics.median(t.wall for t in theirs)
        lo, hi = quartiles([t.wall / o.wall for o, t in zip(ours, theirs)])
        cpu = statistics.median(o.cpu for o in ours)
        reads = 2 if view == "diff" else 1  # diff reads the capture twice
        rate = "%.1f M/s" % (reads * samples / cpu / 1e6) if samples and cpu else ""
        print("%-8s %-10s %8.2f s %10s %8.2f s %10s %6.2fx [%.2f..%.2f] %12s" % (
            workload, view, m, human(max(o.rss_kib for o in ours) * 1024), r,
            human(max(t.rss_kib for t in theirs) * 1024), r / m, lo, hi, rate))


def print_goals(rows):
    """Says which of the issue's goals the rows meet."""
    print()
    for workload, view, figures, samples in rows:
        if view == "capture":
            ours, theirs = figures
            say(ours <= theirs, "%s: the --rate 1 capture is %s, memray's %s" % (workload, human(ours), human(theirs)))
            continue
        if view in ("default", "floor"):
            continue
        ours, theirs = figures
        ratio = statistics.median(t.wall for t in theirs) / statistics.median(o.wall for o in ours)
        rss = max(o.rss_kib for o in ours)
        say(ratio >= SPEEDUP, "%s %s: %.2fx faster than memray (goal %.0fx)" % (workload, view, ratio, SPEEDUP))
        say(rss <= RSS_BOUND_KIB, "%s %s: peak RSS %s (goal 128 MiB)" % (workload, view, human(rss * 1024)))
        if view == "report" and samples:
            rate = samples / statistics.median(o.cpu for o in ours)
            say(rate >= SAMPLES_PER_CPU_SECOND,
                "%s report: %.1f M samples per CPU second (goal 10 M)" % (workload, rate / 1e6))


def say(met, what):
    print("%-7s %s" % ("met" if met else "NOT met", what))


if __name__ == "__main__":
    main()
