"""Attach benchmark: how long `mprof attach` takes, and what the target's throughput is before,
during and after an attach.

The target is the tornado server of workloads/ (unprofiled at start); an unprofiled asyncio
client measures its requests/s in three phases:

    before   the server as started
    during   `mprof attach` running (default rate), attached before the phase starts
    after    after the detach: the agent stays loaded but is switched off

Attach latency is the time from starting the `mprof attach` command to its "attached" line,
measured on the idle server (blocked in epoll_wait) and on the server under load, together with
the time mprof itself reports (injection only, without process start-up).

usage: python3 benches/attach.py [--python PATH] [--mprof PATH] [--requests N] [--runs N]
Needs tornado in the interpreter under test (pip install -r benches/requirements.txt).
"""

import argparse
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def default_python():
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.11.*/bin/python3")))
    return found[-1] if found else "python3"


def client(python, port, requests):
    out = subprocess.run(
        [python, os.path.join(HERE, "workloads", "tornado_client.py"), str(port),
         "--requests", str(requests)],
        capture_output=True, text=True, check=True,
    ).stdout
    return float(re.search(r"rps=([\d.]+)", out).group(1))


class Attach:
    """A running `mprof attach`, started now; `wait_attached` returns (wall s, reported ms)."""

    def __init__(self, mprof, pid, output, duration=None):
        args = [mprof, "attach", "--pid", str(pid), "-o", output]
        if duration is not None:
            args += ["--duration", str(duration)]
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)

    def wait_attached(self):
        for line in self.proc.stderr:
            m = re.search(r"attached to PID \d+ .* in (\d+) ms", line)
            if m:
                return time.perf_counter() - self.start, int(m.group(1))
            if "error" in line:
                raise SystemExit(line.strip())
        raise SystemExit("mprof attach ended without attaching")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.stderr.read()
        if self.proc.wait(timeout=60) != 0:
            raise SystemExit("mprof attach failed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=default_python())
    parser.add_argument("--mprof", default=os.path.join(ROOT, "target", "release", "mprof"))
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    server = subprocess.Popen(
        [args.python, os.path.join(HERE, "workloads", "tornado_server.py")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(server.stdout.readline().split()[1])
        tmp = tempfile.mkdtemp()
        capture = os.path.join(tmp, "attach.mprof")
        phases = {"before": [], "during": [], "after": []}
        idle, busy = [], []
        client(args.python, port, args.requests)  # warm-up: caches, the CPU's clock
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}", file=sys.stderr)
            phases["before"].append(client(args.python, port, args.requests))
            a = Attach(args.mprof, server.pid, capture, duration=0.2)
            idle.append(a.wait_attached())
            a.stop()
            # Attach while the server is busy answering.
            load = subprocess.Popen(
                [args.python, os.path.join(HERE, "workloads", "tornado_client.py"), str(port),
                 "--requests", str(args.requests)],
                stdout=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            a = Attach(args.mprof, server.pid, capture, duration=0.2)
            busy.append(a.wait_attached())
            a.stop()
            load.wait()
            a = Attach(args.mprof, server.pid, capture)
            a.wait_attached()
            phases["during"].append(client(args.python, port, args.requests))
            a.stop()
            phases["after"].append(client(args.python, port, args.requests))
        version = subprocess.run([args.python, "-V"], capture_output=True, text=True).stdout.strip()
        print(f"tornado server on {version}, {args.requests} requests per phase, "
              f"median of {args.runs} runs\n")
        print("| phase | requests/s | vs before |")
        print("|---|---:|---:|")
        base = statistics.median(phases["before"])
        for name, values in phases.items():
            rps = statistics.median(values)
            print(f"| {name} | {rps:,.0f} | {100 * rps / base:.0f}% |")
        print("\n| attach to | command start to attached | injection (mprof's own figure) |")
        print("|---|---:|---:|")
        for name, values in (("idle server (epoll_wait)", idle), ("server under load", busy)):
            wall = statistics.median(v[0] for v in values)
            own = statistics.median(v[1] for v in values)
            print(f"| {name} | {wall * 1000:.0f} ms | {own:.0f} ms |")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
