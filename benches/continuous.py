#!/usr/bin/env python3
"""Continuous profiling over a long run: mprof's own CPU and RSS, interval by interval.

    python3 benches/continuous.py [--minutes 10] [--rate 1MiB] [--every 10s] [--python PATH]
                                  [--otlp URL]

Runs the tornado server (benches/workloads/tornado_server.py) under `mprof record --rate RATE
--every EVERY --profiles-dir DIR` (and `--otlp URL` when given) for MINUTES, its client sending
requests all along, and every 30 s prints mprof's CPU time so far (user + system, from
/proc/PID/stat), its share of the server's CPU, its RSS and the profiles written. Memory that
grows with time, not with distinct stacks, shows as an RSS that keeps climbing.

The wall-time cost of the same configuration is a pairs run, beside its floor:

    python3 benches/pairs.py --workloads tornado --swap-every 20 --pairs 20 \\
        --configs "none,mprof --rate 1MiB --every 10s"
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = os.path.join(HERE, "workloads")


def cpu_seconds(pid):
    """User + system CPU seconds of `pid` so far (None once it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def server_child(pid):
    """The server: mprof's one child."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return None
    return children[0] if children else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", default="1MiB")
    p.add_argument("--every", default="10s")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mprof", default=os.path.join(ROOT, "target", "release", "mprof"))
    p.add_argument("--otlp", default=None)
    p.add_argument("--report-every", type=float, default=30.0)
    args = p.parse_args()
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        profiles = os.path.join(tmp, "profiles")
        cmd = [args.mprof, "record", "-q", "--rate", args.rate, "--every", args.every,
               "--profiles-dir", profiles, "-o", os.path.join(tmp, "c.mprof")]
        if args.otlp:
            cmd += ["--otlp", args.otlp]
        cmd += ["--", args.python, os.path.join(WORKLOADS, "tornado_server.py"),
                "--max-seconds", str(seconds + 120)]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        port = None
        for line in server.stdout:
            if line.startswith("PORT "):
                port = int(line.split()[1])
                break
        if port is None:
            sys.exit("the server never listened")
        client = subprocess.Popen(
            [args.python, os.path.join(WORKLOADS, "tornado_client.py"), str(port),
             "--requests", "100000000", "--warmup", "0", "--max-seconds", str(seconds)],
            stdout=subprocess.PIPE, text=True)
        py = server_child(server.pid)
        start = time.monotonic()
        print("%8s %12s %10s %12s %10s" % ("minutes", "mprof CPU s", "of server", "mprof RSS", "profiles"))
        while client.poll() is None:
            time.sleep(args.report_every)
            mine, theirs = cpu_seconds(server.pid), cpu_seconds(py) if py else None
            files = len(os.listdir(profiles)) if os.path.isdir(profiles) else 0
            share = "%.2f%%" % (100 * mine / theirs) if mine is not None and theirs else "?"
            print("%8.1f %12.2f %10s %9s KiB %10d" % (
                (time.monotonic() - start) / 60, mine or 0, share, rss_kib(server.pid), files), flush=True)
        out = client.communicate()[0]
        print("client:", out.strip().splitlines()[-1] if out.strip() else "(nothing)")
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
