#!/usr/bin/env python3
"""What one sample costs the profiled program, in instructions and simulated cache misses.

    python3 benches/sample_cost.py                  # 30-deep Python stack, the newest 3.12
    python3 benches/sample_cost.py --depth 10 --python ~/.pyenv/versions/3.11.7/bin/python3
    python3 benches/sample_cost.py --native         # the same with --native (native unwind)
    python3 benches/sample_cost.py --depth 2,30     # two depths: the cost of each further frame
    python3 benches/sample_cost.py --workload alloc --rate 32768   # a sample of a real job
    python3 benches/sample_cost.py --workload web --rate 131072 --seed 7   # the web server's

With two or more depths it also splits the cost in two: what every further Python frame adds
(the walk reads each frame and compares it with the thread's previous sample) and the part
that does not depend on the depth (hooks, lock, thread state, interning, records, the free).

The workload (workloads/deep_stack.py) recurses to a fixed depth, then allocates in a loop. It
runs under valgrind's cachegrind (cache simulation on) *inside* `mprof record`: only the Python
process is under valgrind, the reader runs at full speed and keeps up, so no sample is dropped and
every sample is paid for.

`--workload alloc` costs the samples of the allocation-bound job instead (workloads/
alloc_heavy.py, one and three rounds of 5,000 log lines, `PYTHONHASHSEED=0`) at `--rate`, which
should then be a real one (32768, the old default; 131072, the default); compare two builds
with the same `--seed`, which takes the same samples and so leaves the same addresses to the
job's own blocks (its dictionaries keyed by identity, and so its own instruction count, move
with them: about a million instructions a round between two seeds). Its samples are what
wall time sees: a program does tens of microseconds of its own work between two of them, so the
sample's code and data are no longer in the first-level caches and every sample fetches them
again (the I1 column), where deep_stack's loop at `--rate 1` keeps them hot.

`--workload web` costs the samples of the tornado server (workloads/tornado_server.py,
serving 300 and 900 requests of its client on one connection) under callgrind, and counts only
the agent's own code: the server's own work moves with the timing of its event loop (how many
rounds a request takes), by more than the samples cost. So its figures leave out what a sample
costs the program after it (its code and data evicted from the caches), which the other two
workloads include.

Each configuration runs at two sizes of the loop; the difference cancels start-up and the
profiler's fixed costs. Then

    per sample = (cost at the sampling rate − cost with hooks but no samples) / samples taken

where "hooks but no samples" is `--rate` far above the bytes allocated, and the number of samples
is read from the capture. The hook-only cost per loop iteration is printed beside it.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runner  # noqa: E402  (the tornado run)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "deep_stack.py")
ALLOC_WORKLOAD = os.path.join(HERE, "workloads", "alloc_heavy.py")
NO_SAMPLES_RATE = 1 << 40


def newest_python(minor):
    found = glob.glob(os.path.expanduser("~/.pyenv/versions/3.%d.*/bin/python3" % minor))
    found.sort(key=lambda p: int(re.search(r"3\.%d\.(\d+)" % minor, p).group(1)))
    return found[-1] if found else None


def counters(log):
    """Instructions, I1, D1 and last-level misses from a cachegrind log."""
    def total(label):
        m = re.search(r"%s:\s+([\d,]+)" % label, log)
        return int(m.group(1).replace(",", "")) if m else 0
    return {
        "instr": total(r"I\s+refs"),
        "i1": total(r"I1\s+misses"),
        "d1": total(r"D1\s+misses"),
        "ll": total(r"LL\s+misses"),
    }


def samples_in(mprof, capture):
    """Samples taken (written + dropped) according to the capture's summary."""
    out = subprocess.run(
        [mprof, "report", "--json", capture], capture_output=True, text=True, check=True
    ).stdout
    doc = json.loads(out)
    return int(doc["samples"]) + int(doc["dropped"])


def run(args, rate, iterations, tmp):
    capture = os.path.join(tmp, "cost.mprof")
    log = os.path.join(tmp, "vg.log")
    cmd = [args.mprof, "record", "--quiet", "--rate", str(rate), "-o", capture]
    if args.native:
        cmd.append("--native")
    if args.seed:
        cmd += ["--seed", str(args.seed)]
    cmd += [
        "--", "valgrind", "--tool=cachegrind", "--cache-sim=yes",
        "--cachegrind-out-file=/dev/null", "--log-file=" + log,
        args.python,
    ]
    env = dict(os.environ)
    if args.workload == "alloc":
        cmd += [ALLOC_WORKLOAD, "--rounds", str(iterations), "--lines", "5000"]
        # The same Python work in every run: dict and set layouts follow the string hashes.
        env["PYTHONHASHSEED"] = "0"
    else:
        cmd += [WORKLOAD, str(iterations), str(args.depth)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    with open(log, errors="replace") as f:
        c = counters(f.read())
    c["samples"] = samples_in(args.mprof, capture)
    c["capture"] = os.path.getsize(capture)
    return c


def agent_counters(profile, agent):
    """Instructions and misses at the agent's own code, from a callgrind profile with the
    cache simulated and instruction addresses. The agent is loaded from a memfd, which
    callgrind cannot name: its code is at the addresses of the object called `???` that lie in
    `agent`, the agent's mappings (the shared libraries' PLT stubs are `???` too, elsewhere)."""
    events, cost, current, skip, positions = None, [0] * 9, None, False, 1
    with open(profile, errors="replace") as f:
        for line in f:
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("ob="):
                current = line[3:].strip()
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's, counted in the callee
            elif line[:1].isdigit() or line.startswith(("0x", "+", "-", "*")):
                if skip:
                    skip = False
                elif current == "???":
                    words = line.split()
                    at = int(words[0], 16)
                    if any(lo <= at < hi for lo, hi in agent):
                        for i, v in enumerate(words[positions:]):
                            cost[i] += int(v)
    by = dict(zip(events, cost))
    return {
        "instr": by["Ir"],
        "i1": by["I1mr"],
        "d1": by["D1mr"] + by["D1mw"],
        "ll": by["ILmr"] + by["DLmr"] + by["DLmw"],
    }


def agent_mappings(pid):
    """The address ranges of the agent in process `pid` (the server under valgrind), read
    while it runs; none when `pid` is None or cannot be read."""
    ranges = []
    if pid is None:
        return ranges
    try:
        with open("/proc/%d/maps" % pid) as f:
            for line in f:
                if "mprof-agent" in line:
                    lo, hi = line.split()[0].split("-")
                    ranges.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return []
    return ranges


def run_web(args, rate, requests, tmp):
    """The tornado server under callgrind, inside `mprof record`, serving `requests` requests
    of its client (benches/runner.py drives it), one connection, no warm-up (the small run's
    requests are the large run's warm-up)."""
    capture = os.path.join(tmp, "cost.mprof")
    profile = os.path.join(tmp, "callgrind.out")
    seed = ["--seed", str(args.seed)] if args.seed else []
    # The capture goes where the config says, not to the path `run_tornado` is given, which it
    # deletes once it has measured it: the samples are read from it here.
    config = runner.Config("mprof under callgrind", lambda py, _cap: [
        args.mprof, "record", "--quiet", "--rate", str(rate), *seed, "-o", capture,
        "--", "valgrind", "--tool=callgrind", "--cache-sim=yes", "--dump-instr=yes",
        "--compress-strings=no", "--compress-pos=no", "--callgrind-out-file=" + profile,
        "--log-file=" + profile + ".log", py,
    ])
    agent = []
    driver = argparse.Namespace(python=args.python, timeout=600, connections=1)
    env = dict(os.environ, PYTHONHASHSEED="0")
    result = runner.run_tornado(config, driver, os.path.join(tmp, "unused"), env, requests, warmup=0,
                                at_client_exit=lambda server: agent.extend(
                                    agent_mappings(runner.server_pid(server, profiled=True))))
    if result.error is not None:
        sys.exit("the tornado server under valgrind: %s (pip install -r benches/requirements.txt)" % result.error)
    if not agent:
        sys.exit("the tornado server under valgrind: no mapping of the agent found in it")
    c = agent_counters(profile, agent)
    c["samples"] = samples_in(args.mprof, capture)
    c["capture"] = os.path.getsize(capture)
    return c


def delta(a, b):
    return {k: b[k] - a[k] for k in a}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=newest_python(12) or "python3")
    p.add_argument("--mprof", default=os.path.join(HERE, "..", "target", "release", "mprof"))
    p.add_argument("--depth", default="30", help="Python frames on the stack when allocating (a comma-separated list for several)")
    p.add_argument("--rate", type=int, default=1, help="sampling rate whose samples are costed (bytes)")
    p.add_argument("--small", type=int, help="loop iterations (rounds with alloc) of the small run (default 20,000; 1)")
    p.add_argument("--large", type=int, help="loop iterations (rounds with alloc) of the large run (default 60,000; 3)")
    p.add_argument("--native", action="store_true", help="record with --native")
    p.add_argument("--seed", type=int, default=0,
                   help="mprof's --seed: the same samples in every run of the same program, so that two builds compare")
    p.add_argument("--workload", choices=("deep", "alloc", "web"), default="deep",
                   help="deep: deep_stack.py's loop (the default); alloc: the allocation-bound job; "
                   "web: the tornado server, the agent's own code only")
    args = p.parse_args()
    alloc, web = args.workload == "alloc", args.workload == "web"
    args.small = args.small or (1 if alloc else 300 if web else 20_000)
    args.large = args.large or (3 if alloc else 900 if web else 60_000)
    if alloc or web:
        args.depth = "0"  # not used: the job's own stacks
    depths = [int(d) for d in args.depth.split(",")]
    print("python %s, rate %d%s" % (args.python, args.rate, ", --native" if args.native else ""))
    costs = []
    for depth in depths:
        args.depth = depth
        costs.append((depth, cost_at(args)))
    if len(costs) >= 2:
        (d0, c0), (d1, c1) = min(costs), max(costs)
        per_frame = (c1 - c0) / (d1 - d0)
        print("  each further frame: %6.1f instructions; the rest (at --depth 0): %6.0f" % (
            per_frame, c0 - per_frame * d0))


def cost_at(args):
    """Measures and prints the cost of a sample at `args.depth`; returns its instructions."""
    with tempfile.TemporaryDirectory(prefix="mprof-cost-") as tmp:
        extra = args.large - args.small
        once = run_web if args.workload == "web" else run
        hooks = delta(once(args, NO_SAMPLES_RATE, args.small, tmp), once(args, NO_SAMPLES_RATE, args.large, tmp))
        sampled = delta(once(args, args.rate, args.small, tmp), once(args, args.rate, args.large, tmp))
    samples = sampled["samples"]
    if samples <= 0:
        sys.exit("no samples were taken: raise the loop size or lower --rate")
    per = {k: (sampled[k] - hooks[k]) / samples for k in ("instr", "i1", "d1", "ll")}
    if args.workload == "alloc":
        print("allocation-bound job (5,000 log lines a round)")
        print("  hooks only:  %8.0f instructions per round" % (hooks["instr"] / extra))
    elif args.workload == "web":
        print("tornado server, %d requests more in the large run; the agent's own code only" % extra)
        print("  hooks only:  %8.0f agent instructions per request" % (hooks["instr"] / extra))
    else:
        print("%d-deep stack" % args.depth)
        print("  hooks only:  %8.0f instructions per loop iteration" % (hooks["instr"] / extra))
    print("  per sample:  %8.0f instructions  %6.2f I1 misses  %6.2f D1 misses  %6.2f LL misses  (%d samples)" % (
        per["instr"], per["i1"], per["d1"], per["ll"], samples))
    print("  capture:     %8.1f bytes per sample" % (sampled["capture"] / samples))
    return per["instr"]


if __name__ == "__main__":
    main()
