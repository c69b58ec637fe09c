#!/usr/bin/env python3
"""The agent's share of the profiled program's CPU time, per function, sampled with perf.

    python3 benches/agent_share.py                          # tornado, 3 runs of 20,000 requests
    python3 benches/agent_share.py --workloads tornado,alloc --runs 5
    python3 benches/agent_share.py --configs "mprof,mprof --python-only"
    python3 benches/agent_share.py --inlined 2              # by inlined function, two levels deep

Wall time on a shared VM moves by more than the overhead being measured, and instruction counts
(`overhead.py --instructions`) cannot see cache misses. This measures what the agent's own
code costs in time, misses included, in a way the machine's speed does not move: each run
launches the workload under `mprof record` inside `perf record -e cpu-clock` (a software timer,
so it works in VMs without hardware counters) and counts, among the profiled Python process's
CPU samples, those whose instruction is in the agent. The agent is mapped from a memfd that perf
cannot read, so its samples are symbolised here against the agent library of the build
(`target/release/build/mprof-injector-*/out/libmprof_agent.so`, or --agent).

What it cannot see: time the agent costs the program's own code indirectly (cache lines and
branch history it evicts); the I1/D1 columns of `overhead.py --instructions` bound that. The
reader's CPU (the mprof process) is printed beside it, as a share of the profiled process's.

Needs perf (Debian: `apt-get install linux-perf`) and a perf_event_paranoid that lets it
sample (root, or at most 2 for one's own processes).
"""

import argparse
import bisect
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter, tornado check)
import runner  # noqa: E402  (the workloads, configurations and runners)

AGENT_MAP = "mprof-agent"
MMAP = re.compile(r"(\d+)/\d+: \[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|\d+)")


def newest_agent(mprof):
    found = glob.glob(os.path.join(os.path.dirname(mprof), "build", "mprof-injector-*", "out", "libmprof_agent.so"))
    return max(found, key=os.path.getmtime) if found else None


class Symbols:
    """Function names of the agent library by address, and how its file offsets map to them."""

    def __init__(self, path):
        nm = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True, check=True)
        rows = []
        for line in nm.stdout.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tT":
                rows.append((int(parts[0], 16), parts[2]))
        rows.sort()
        self.starts = [r[0] for r in rows]
        self.names = [r[1] for r in rows]
        # The executable segment: a file offset `o` in it is the address `o + shift`.
        seg = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=True).stdout
        self.shift, self.text_size = 0, 0
        for line in seg.splitlines():
            f = line.split()
            if f[:1] == ["LOAD"] and "E" in f[6:-1]:
                self.shift = int(f[2], 16) - int(f[1], 16)
                self.text_size = int(f[5], 16)

    def name(self, addr):
        i = bisect.bisect_right(self.starts, addr) - 1
        return self.names[i] if i >= 0 else "?"


def short(name):
    """`mprof_agent::hooks::hook_malloc` without the crate, generic hashes or closures' noise."""
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    return name.replace("mprof_agent::", "").replace("mprof_common::", "common::")


def shares(perf_data, symbols, addresses=None):
    """(samples of the profiled process, of the agent by function, of other processes, warnings);
    the agent's samples are also counted by address (in the library) into `addresses`, if given."""
    out = subprocess.run(
        ["perf", "script", "-i", perf_data, "--show-mmap-events", "-F", "pid,ip,dso"],
        capture_output=True, text=True, errors="replace",
    ).stdout
    maps = {}  # pid -> (start, end, pgoff) of the agent's executable mapping
    per_pid = {}
    agent = {}
    warnings = []
    # In the order perf wrote them: a process's mapping of the agent comes before its samples.
    for line in out.splitlines():
        if "PERF_RECORD_MMAP" in line:
            if AGENT_MAP in line and "r-xp" in line:
                m = MMAP.search(line)
                if m:
                    pid, start, length, pgoff = int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 0)
                    maps[pid] = (start, start + length, pgoff)
                    if abs(length - symbols.text_size) > 8192:
                        warnings.append("the agent mapped (%d bytes of code) is not the library read (%d): "
                                        "pass the right one with --agent" % (length, symbols.text_size))
            continue
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        pid, ip = int(parts[0]), int(parts[1], 16)
        per_pid[pid] = per_pid.get(pid, 0) + 1
        span = maps.get(pid)
        if span and span[0] <= ip < span[1]:
            at = ip - span[0] + span[2] + symbols.shift
            name = short(symbols.name(at))
            agent[name] = agent.get(name, 0) + 1
            if addresses is not None:
                addresses[at] = addresses.get(at, 0) + 1
    profiled = [pid for pid in per_pid if pid in maps]
    if not profiled:
        return None, agent, 0, warnings + ["no process with the agent mapped was sampled"]
    total = sum(per_pid[pid] for pid in profiled)
    others = sum(n for pid, n in per_pid.items() if pid not in maps)
    return total, agent, others, warnings


def run_once(workload, config, args, env, tmpdir, i):
    data = os.path.join(tmpdir, "perf-%s-%d.data" % (workload, i))
    capture = os.path.join(tmpdir, "capture-%d" % i)
    wrapper = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(args.frequency), "-o", data, "--"]
    if workload in runner.TIMED:
        result = runner.run_timed(workload, config, args, capture, env, wrapper=wrapper)
    else:
        result = runner.run_tornado(config, args, capture, env, args.requests, wrapper=wrapper)
    return result, data


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    overhead.add_target_args(p)
    p.add_argument("--agent", help="the agent library the mprof binary carries (default: the newest of its build)")
    p.add_argument("--workloads", default="tornado", help="comma-separated: tornado, alloc, native, imports")
    p.add_argument("--configs", default="mprof", help="comma-separated mprof configurations (default: mprof)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=20000, help="timed requests per tornado run (default 20000)")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--frequency", type=int, default=4999, help="perf samples per second (default 4999)")
    p.add_argument("--top", type=int, default=12, help="agent functions listed (default 12)")
    p.add_argument("--inlined", type=int, metavar="DEPTH",
                   help="also list the agent's time by inlined function (addr2line -i), the chain of "
                        "functions a sample was in cut DEPTH levels below the real function: what "
                        "inside a function that inlines most of the sample path takes the time")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    overhead.check_target_args(p, args)
    args.agent = args.agent or newest_agent(os.path.abspath(args.mprof))
    if not args.agent or not os.path.exists(args.agent):
        p.error("the agent library was not found next to %s; pass --agent PATH" % args.mprof)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    return args


def main():
    args = parse_args()
    if not shutil.which("perf"):
        sys.exit("agent_share.py: perf is not installed (Debian: apt-get install linux-perf)")
    probe = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit("agent_share.py: perf cannot sample here: %s" % runner.tail(probe.stderr, 2))
    symbols = Symbols(args.agent)
    configs = {c.name: c for c in runner.make_configs(os.path.abspath(args.mprof), False)}
    env = runner.bench_env()
    workloads = overhead.runnable(args.python, args.workloads)
    print("python: %s; agent: %s; perf cpu-clock at %d Hz, %d run(s) each"
          % (args.python, args.agent, args.frequency, args.runs))
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-share-") as tmpdir:
            for workload in workloads:
                for name in args.configs:
                    if name not in configs or not name.startswith("mprof"):
                        print("skipping %r: not an mprof configuration" % name, file=sys.stderr)
                        continue
                    report(workload, configs[name], args, env, tmpdir, symbols)
    finally:
        runner.kill_all_groups()


def report(workload, config, args, env, tmpdir, symbols):
    per_run, reader, by_function, total_all = [], [], {}, 0
    addresses = {} if args.inlined is not None else None
    for i in range(args.runs):
        result, data = run_once(workload, config, args, env, tmpdir, i)
        if result.error:
            print("  %s / %s run %d failed: %s" % (workload, config.name, i + 1, result.error), file=sys.stderr)
            continue
        total, agent, others, warnings = shares(data, symbols, addresses)
        for w in warnings:
            print("  warning: %s" % w, file=sys.stderr)
        os.unlink(data)
        if not total:
            continue
        per_run.append(100.0 * sum(agent.values()) / total)
        reader.append(100.0 * others / total)
        total_all += total
        for fn, n in agent.items():
            by_function[fn] = by_function.get(fn, 0) + n
    print("\n%s, %s: %d run(s), %d samples of the profiled process" % (workload, config.name, len(per_run), total_all))
    if not per_run:
        return
    print("  agent: %.2f%% of the process's CPU (median; runs: %s)"
          % (statistics.median(per_run), ", ".join("%.2f" % s for s in per_run)))
    print("  reader (mprof) and other processes under perf: %.2f%% of it" % statistics.median(reader))
    for fn, n in sorted(by_function.items(), key=lambda kv: -kv[1])[: args.top]:
        print("  %7.3f%%  %s" % (100.0 * n / total_all, fn))
    if addresses:
        print("  by inlined function (%d level(s) below the real one):" % args.inlined)
        for chain, n in by_inlined(args.agent, addresses, args.inlined)[: args.top]:
            print("  %7.3f%%  %s" % (100.0 * n / total_all, chain))


def by_inlined(library, addresses, depth):
    """[(chain, samples)] for the agent's samples by address: each address's chain of inlined
    functions (outermost first, from addr2line) cut `depth` levels below the real function."""
    if not shutil.which("addr2line"):
        return [("addr2line is not installed (Debian: binutils)", sum(addresses.values()))]
    ats = sorted(addresses)
    out = subprocess.run(["addr2line", "-a", "-f", "-i", "-C", "-e", library] + ["%#x" % a for a in ats],
                         capture_output=True, text=True, errors="replace").stdout.splitlines()
    chains, at, i = {}, None, 0
    # Each address: a line with the address, then a (function, file:line) pair per inlined level,
    # innermost first.
    while i < len(out):
        if re.fullmatch(r"0x[0-9a-f]+", out[i]):
            at = int(out[i], 16)
            chains[at] = []
            i += 1
            continue
        chains.setdefault(at, []).append(short(out[i]).split("::")[-1])
        i += 2
    totals = {}
    for a in ats:
        names = list(reversed(chains.get(a) or ["?"]))[: depth + 1]
        key = " > ".join(names)
        totals[key] = totals.get(key, 0) + addresses[a]
    return sorted(totals.items(), key=lambda kv: -kv[1])


if __name__ == "__main__":
    main()
