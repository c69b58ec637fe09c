#!/usr/bin/env python3
"""The reader's CPU time beside the profiled server's, from the kernel's per-thread counters.

    python3 benches/reader_cpu.py                        # 5 runs of 30,000 requests
    python3 benches/reader_cpu.py --runs 3 --mprof OLD   # another build, to compare in turns

`mprof record` (the reader) drains the agent's ring, packs the records into the capture, reads
the program's RSS and looks for its children. In the pinned pairs (`pairs.py`) it runs on the
program's core, so its CPU time is the program's loss. Each run starts the tornado server of
`overhead.py` under `mprof record` at the default rate, drives it with the client, and before
stopping it reads the run time of every thread of mprof and of the server from
/proc/PID/task/TID/schedstat (nanoseconds, counted by the scheduler: no sampling, no perf, so
it reads lower than `agent_share.py`'s reader line, which perf's own work inflates). Prints both
per run, the reader's share of the server's, and the median share.
"""

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter, tornado check)
import runner  # noqa: E402  (the configurations, the tornado run)


def per_task(pid, name, parse):
    """`parse` of every thread's /proc/PID/task/TID/NAME, for the threads that could be read."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return []
    found = []
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/%s" % (pid, tid, name)) as f:
                found.append(parse(f.read()))
        except (OSError, ValueError, IndexError):
            pass
    return found


def cpu_ns(pid):
    """Run time of every thread of `pid` so far, in nanoseconds (0 if it is gone)."""
    return sum(per_task(pid, "schedstat", lambda text: int(text.split()[0])))


def one_run(args, config, env, tmpdir, i):
    """(reader ns, server ns) of one run, or an error string."""
    capture = os.path.join(tmpdir, "capture-%d.mprof" % i)
    readings = []

    def read_cpu(mprof):
        servers = [c for cs in per_task(mprof.pid, "children", lambda text: [int(c) for c in text.split()])
                   for c in cs]
        if len(servers) == 1:
            readings.append((cpu_ns(mprof.pid), cpu_ns(servers[0])))
        else:
            readings.append("expected one child of mprof, found %s" % servers)

    result = runner.run_tornado(config, args, capture, env, args.requests, at_client_exit=read_cpu)
    if result.error:
        return result.error
    return readings[0] if readings else "the client's end was not reached"


def main():
    p = overhead.tornado_parser(__doc__, runs=5, requests=30000)
    p.add_argument("--config", default="mprof",
                   help='the profiled configuration: "mprof" (the default rate) or "mprof --rate R"')
    args = p.parse_args()
    overhead.check_tornado_args(p, args)
    config = runner.config_named(os.path.abspath(args.mprof), args.config)
    if config is None:
        p.error('--config: "mprof" or "mprof --rate R", not %r' % args.config)
    env = runner.bench_env()
    print("python: %s; mprof: %s (%s); %d run(s) of %d requests"
          % (args.python, args.mprof, args.config, args.runs, args.requests))
    shares = []
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-reader-") as tmpdir:
            for i in range(args.runs):
                r = one_run(args, config, env, tmpdir, i)
                if isinstance(r, str):
                    print("  run %d failed: %s" % (i + 1, r), file=sys.stderr)
                    continue
                reader, server = r
                if server <= 0:
                    print("  run %d: no CPU time read for the server" % (i + 1), file=sys.stderr)
                    continue
                shares.append(100.0 * reader / server)
                print("  run %d: reader %.1f ms, server %.0f ms: %.3f%% of the server's"
                      % (i + 1, reader / 1e6, server / 1e6, shares[-1]))
    finally:
        runner.kill_all_groups()
    if not shares:
        sys.exit("reader_cpu.py: no run succeeded")
    print("reader: %.3f%% of the server's CPU (median of %d)" % (statistics.median(shares), len(shares)))


if __name__ == "__main__":
    main()
