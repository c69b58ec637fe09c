#!/usr/bin/env python3
"""Reading `--rate 1` captures: mprof's views beside memray's matching commands, side by side.

    python3 benches/reading.py                  # alloc job and tornado server, 3 runs per view
    python3 benches/reading.py --runs 5 --workloads alloc

Records each workload once with `mprof record --rate 1` and once with `memray run
--trace-python-allocators` (the same events: every allocation of Python's allocators; memray
compresses its capture at the end, as it does by default), then runs every view of mprof and
the matching memray command on the two captures, in turns (each round runs every pair, the
side that goes first alternating), and prints per view the median wall time and the peak RSS
(from wait4) of each side and their ratio, and the two capture sizes. The views and their
memray counterparts:

    report      mprof report              memray stats
    flamegraph  mprof flamegraph          memray flamegraph
    timeline    mprof timeline            memray flamegraph --temporal   (memray's view over time)
    html        mprof html                memray table                    (an HTML page of sites)
    diff        mprof diff CAP CAP        memray stats, twice             (memray has no diff)
    export      mprof export --format pprof   memray transform csv

A ratio above 1 means mprof is faster. Wall time on a shared machine swings: read the ratios of
one run, not the seconds across runs. Needs memray and tornado in the interpreter under test
(`pip install -r benches/requirements.txt`); the driver itself needs only the standard library.
"""

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


def views(mprof, python, mcap, rcap, out):
    """(view, mprof command, memray command or commands) for captures `mcap` (mprof) and `rcap`
    (memray), writing into the directory `out`."""
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
    ]


def timed(commands, env):
    """Runs `commands` one after the other; (seconds, the highest peak RSS in KiB), or an error."""
    start = time.perf_counter()
    peak = 0
    for cmd in commands:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            return "exit %d: %s" % (proc.returncode, runner.tail(err.decode(errors="replace"), 2))
        peak = max(peak, usage.ru_maxrss)
    return time.perf_counter() - start, peak


def kept_size(path):
    """The size of a capture, which is kept (the runner's `capture_size` deletes it: the
    overhead benchmarks only weigh their captures)."""
    return os.path.getsize(path) if os.path.exists(path) else None


def record(workload, args, tmpdir, env):
    """Records `workload` with both profilers: {config name: (capture path, size)}."""
    runner.capture_size = kept_size
    captures = {}
    for name in (MPROF, MEMRAY):
        config = runner.config_named(args.mprof, name, with_memray=True)
        capture = os.path.join(tmpdir, "%s-%s.%s" % (workload, name.split()[0], name.split()[0]))
        if workload == "tornado":
            result = runner.run_tornado(config, args, capture, env, args.requests)
        else:
            result = runner.run_timed(workload, config, args, capture, env)
        if result.error:
            sys.exit("%s under %s: %s" % (workload, name, result.error))
        captures[name] = (capture, os.path.getsize(capture))
        print("recorded %s under %s: %s" % (workload, name, human(captures[name][1])), file=sys.stderr)
    return captures


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%.1f %s" % (n, unit)
        n /= 1024.0


def samples_of(mprof, capture, env):
    """The samples an mprof capture holds (from `mprof report --json`)."""
    import json

    out = subprocess.run([mprof, "report", capture, "--json", "--top", "1"], stdout=subprocess.PIPE, env=env)
    try:
        return json.loads(out.stdout)["samples"]
    except (ValueError, KeyError):
        return None


def main():
    parser = overhead.tornado_parser(__doc__, runs=3, requests=10000)
    parser.add_argument("--workloads", default="alloc,tornado")
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
            captures = record(workload, args, tmpdir, env)
            mcap, msize = captures[MPROF]
            rcap, rsize = captures[MEMRAY]
            samples = samples_of(args.mprof, mcap, view_env)
            rows.append((workload, "capture size", msize, rsize, samples))
            pairs = views(args.mprof, args.python, mcap, rcap, tmpdir)
            times = {(v, side): [] for v, _, _ in pairs for side in (0, 1)}
            rss = {}
            for run in range(args.runs):
                for view, ours, theirs in pairs:
                    order = [(0, ours), (1, theirs)]
                    if run % 2:
                        order.reverse()
                    for side, commands in order:
                        got = timed(commands, view_env)
                        if isinstance(got, str):
                            sys.exit("%s %s (%s): %s" % (workload, view, ("mprof", "memray")[side], got))
                        times[(view, side)].append(got[0])
                        rss[(view, side)] = max(rss.get((view, side), 0), got[1])
                print("%s: round %d of %d done" % (workload, run + 1, args.runs), file=sys.stderr)
            for view, _, _ in pairs:
                m = statistics.median(times[(view, 0)])
                r = statistics.median(times[(view, 1)])
                rows.append((workload, view, (m, rss[(view, 0)]), (r, rss[(view, 1)]), samples))
    print_table(rows, args)


def print_table(rows, args):
    print("mprof %s vs memray --trace-python-allocators, %d runs per view (median wall time; peak RSS)"
          % ("--rate 1", args.runs))
    print("%-8s %-12s %22s %22s %8s %10s" % ("workload", "view", "mprof", "memray", "ratio", "samples/s"))
    for workload, view, ours, theirs, samples in rows:
        if view == "capture size":
            print("%-8s %-12s %22s %22s %7.2fx %10s" % (
                workload, "capture", human(ours), human(theirs), theirs / ours,
                "%d samples" % samples if samples else ""))
            continue
        (m, mrss), (r, rrss) = ours, theirs
        rate = "%.1f M" % (samples / m / 1e6) if samples else ""
        print("%-8s %-12s %9.2f s %9s %9.2f s %9s %7.2fx %10s" % (
            workload, view, m, human(mrss * 1024), r, human(rrss * 1024), r / m, rate))


if __name__ == "__main__":
    main()
