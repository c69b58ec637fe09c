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

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import queue
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter, tornado check)
import runner  # noqa: E402  (the configurations, process groups, the server's stop)


def cpu_ns(pid):
    """Run time of every thread of `pid` so far, in nanoseconds (0 if it is gone)."""
    total = 0
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def children(pid):
    found = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return found


def one_run(args, config, env, tmpdir, i):
    """(reader ns, server ns) of one run, or an error string."""
    capture = os.path.join(tmpdir, "capture-%d.mprof" % i)
    script = [os.path.join(runner.WORKLOADS, "tornado_server.py"), "--max-seconds", str(args.timeout)]
    errfile = tempfile.TemporaryFile()
    mprof = runner.start_group(config.command(args.python, capture, script), stdout=subprocess.PIPE,
                               stderr=errfile, env=env)
    try:
        lines = queue.Queue()
        threading.Thread(target=runner.line_reader, args=(mprof.stdout, lines), daemon=True).start()
        port = runner.wait_for_port(lines, [], deadline=time.monotonic() + 60)
        if port is None:
            return "server printed no PORT line: %s" % runner.server_error(mprof, errfile)
        servers = children(mprof.pid)
        if len(servers) != 1:
            return "expected one child of mprof, found %s" % servers
        client = subprocess.run(
            [args.python, os.path.join(runner.WORKLOADS, "tornado_client.py"), str(port),
             "--requests", str(args.requests), "--connections", str(args.connections),
             "--max-seconds", str(args.timeout)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.timeout + 30, env=env,
        )
        if client.returncode != 0:
            return "client failed: %s" % runner.tail(client.stderr.decode(errors="replace"))
        reader, server = cpu_ns(mprof.pid), cpu_ns(servers[0])
        runner.stop_server(mprof, port)
        return reader, server
    finally:
        runner.kill_group(mprof)
        errfile.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=overhead.default_python(),
                   help="interpreter under test (default: the newest ~/.pyenv/versions/3.11.*)")
    p.add_argument("--mprof", default=os.path.join(overhead.ROOT, "target", "release", "mprof"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--requests", type=int, default=30000)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    if not args.python or not os.path.exists(args.python):
        p.error("no Python interpreter found; pass --python PATH")
    if not os.access(args.mprof, os.X_OK):
        p.error("%s not found: run `cargo build --release` first" % args.mprof)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if not overhead.runnable(args.python, ["tornado"]):
        sys.exit(1)
    config = {c.name: c for c in runner.make_configs(os.path.abspath(args.mprof), False)}["mprof"]
    env = runner.bench_env()
    print("python: %s; mprof: %s; %d run(s) of %d requests" % (args.python, args.mprof, args.runs, args.requests))
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
