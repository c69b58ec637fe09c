#!/usr/bin/env python3
"""Overhead as simultaneous pinned pairs: the way to read a few percent on a noisy machine.

    python3 benches/pairs.py [--python PATH] [--pairs N] [--readings K] [--workloads alloc,tornado]
                             [--configs mprof,mprof --rate 1,mprof --rate 128KiB,memray,...]
                             [--against OTHER_MPROF | --base CONFIG]

Each pair runs the unprofiled program on one core and the profiled one on its neighbour at the
same moment, so both see the same machine (the other tenants of a shared VM, turbo, thermal
state); the sides swap every other pair. The profiler runs on the profiled program's core (its
reader's CPU is part of the cost); tornado's client runs on its server's core. Every configuration is also paired once more with itself
unprofiled ("none"): that row is the noise floor of the method on this machine.

Per workload and configuration it prints the median and the quartiles of the ratios
(profiled / unprofiled time for alloc, unprofiled / profiled requests per second for tornado: above
1 is slower either way). One slot (cores 0 and 1) unless --slots says more; a machine with fewer
than 2 CPUs cannot pair. The workloads and configurations are benches/overhead.py's (benches/runner.py).

With `--against OTHER_MPROF` each configuration is paired with the same configuration of another
build instead of with the unprofiled program: the ratio is this build's cost over that one's
(above 1: this build is slower), with the two builds side by side at the same moment, where two
runs of the table an hour apart differ by more than a small change does. With `--base CONFIG`
each configuration is paired with CONFIG instead (`--base "mprof --rate 1099511627776"`: what
the samples add to the hooks, side by side).

The median of 40 pairs of the web server moves by about a percent from one reading to the next
on this project's VM, as much as a goal of 1.02 leaves. `--readings K` takes K readings of every
configuration, in turns (the floor, then each configuration, K times over), and prints beside
them the mean of their medians with its standard error, and the median of all their pairs with
an interval from resampling whole readings: `--pairs 40 --readings 5 --workloads tornado
--configs none,mprof` is how the README's web server figure is read (about 25 minutes).

On a noisy VM one vCPU runs slower than the other for seconds at a time, which a pair pinned for
its whole run cannot tell from overhead: `--swap-every 20` swaps the two sides' cores every 20 ms
(cpuset cgroups, root only; benches/swapcores.py), so that each side gets both cores for half its
run; there the web server's floor narrows from quartiles 20 points apart to 2.
"""

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the set-up and the table)
import runner  # noqa: E402  (the workloads, configurations and runners)
import swapcores  # noqa: E402  (--swap-every)


def run_pinned(workload, config, args, tmpdir, env, core, out, key, start_together):
    """One side of a pair; a web server's client starts only once the other side's server
    listens too (`start_together`, a barrier of the pair's two sides): otherwise the side whose
    server is ready first (the unprofiled one, or in the floor the one started first) runs
    ahead and, at its end, leaves the other side the machine to itself for its last requests,
    which reads as the other side going faster."""
    swapper = getattr(args, "swapper", None)
    wrapper = swapper.wrapper(core) if swapper else ["taskset", "-c", str(core)]
    capture = os.path.join(tmpdir, "capture-%s.out" % key)

    def wait_for_the_other_side(server, port):
        try:
            start_together.wait(timeout=args.timeout)
        except threading.BrokenBarrierError:
            pass  # the other side failed (its pair is dropped) or never came

    try:
        if workload in runner.TIMED:
            # The workload's own arguments, when the caller has some (benches/native.py's sizes).
            script_args = getattr(args, "script_args", ())
            result = runner.run_timed(workload, config, args, capture, env, script_args=script_args,
                                      wrapper=wrapper)
        else:
            result = runner.run_tornado(config, args, capture, env, args.requests, wrapper=wrapper,
                                        client_wrapper=wrapper, at_client_start=wait_for_the_other_side)
    finally:
        # Past the barrier, or failed before it: either way the other side must not wait on it.
        start_together.abort()
    out[key] = result


def ratio(workload, base, other):
    if base.error or other.error:
        return None
    if workload in runner.TIMED:
        return other.value / base.value
    return base.value / other.value


def pairs_of(workload, base_config, config, args, tmpdir, env):
    """`args.pairs` ratios (after one warm-up pair) of config against base_config."""
    ratios, failures = [], []
    for rep in range(args.pairs + 1):
        out, threads = {}, []
        for slot in range(args.slots):
            a, b = 2 * slot, 2 * slot + 1
            if rep % 2:
                a, b = b, a
            start_together = threading.Barrier(2)
            for cfg, core, side in ((base_config, a, "a"), (config, b, "b")):
                key = "%d%s" % (slot, side)
                threads.append(threading.Thread(
                    target=run_pinned, args=(workload, cfg, args, tmpdir, env, core, out, key, start_together)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if rep == 0:
            continue
        for slot in range(args.slots):
            base, other = out["%da" % slot], out["%db" % slot]
            r = ratio(workload, base, other)
            if r is None:
                failures.append(base.error or other.error)
            else:
                ratios.append(r)
        print("  %s %s pair %d/%d: %s" % (workload, config.name, rep, args.pairs,
                                         "%.3f" % ratios[-1] if ratios else "failed"),
              file=sys.stderr, flush=True)
    return ratios, failures


def summary(ratios):
    if len(ratios) < 2:
        return ["%.3f" % ratios[0] if ratios else "-", "-", "-"]
    q = statistics.quantiles(ratios, n=4)
    return ["%.3f" % statistics.median(ratios), "%.3f..%.3f" % (q[0], q[2]),
            "%.3f..%.3f" % (min(ratios), max(ratios))]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    overhead.add_target_args(p)
    p.add_argument("--pairs", type=int, default=12, help="pairs per configuration (default 12)")
    p.add_argument("--readings", type=int, default=1,
                   help="readings of --pairs pairs per configuration, in turns (default 1); with two "
                        "or more, also the mean of their medians and the median of all their pairs")
    p.add_argument("--slots", type=int, default=1, help="pairs run at once, on cores 2k and 2k+1")
    p.add_argument("--workloads", default="alloc,tornado", help="comma-separated: alloc, tornado, native")
    p.add_argument("--configs", default="none,mprof,mprof --rate 1,memray,memray --trace-python-allocators",
                   help="comma-separated; 'none' pairs the program with itself (the noise floor); "
                        "'mprof --rate R' takes any rate")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--swap-every", type=float, default=0, metavar="MS",
                   help="swap the two sides' cores every MS milliseconds while they run (cpuset "
                        "cgroups; needs root), so that each side gets both cores for half its run; "
                        "0 (the default): each side pinned to one core for its whole run")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--against", metavar="OTHER_MPROF",
                   help="pair each configuration with the same one of this other mprof build, "
                        "not with the unprofiled program")
    p.add_argument("--base", metavar="CONFIG",
                   help="pair each configuration with this one (of this build), not with the unprofiled program")
    args = p.parse_args()
    if args.readings < 1:
        p.error("--readings: at least 1")
    if args.against and args.base:
        p.error("--against and --base: one or the other")
    if (os.cpu_count() or 1) < 2 * args.slots:
        p.error("%d slot(s) need %d CPUs, this machine has %d" % (args.slots, 2 * args.slots, os.cpu_count()))
    overhead.check_target_args(p, args)
    if args.swap_every < 0:
        p.error("--swap-every: 0 or more milliseconds")
    if args.against and not os.access(args.against, os.X_OK):
        p.error("--against: %s is not an executable" % args.against)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    return args


def main():
    args = parse_args()
    # Killed (SIGTERM), the run still kills the programs it started (the `finally` below): the
    # default action would leave a server and its client running for up to --timeout seconds.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with_memray = overhead.importable(args.python, "memray")
    mprof = os.path.abspath(args.mprof)
    unprofiled = runner.config_named(mprof, "none")
    base = None
    if args.base:
        base = runner.config_named(mprof, args.base, with_memray)
        if base is None:
            sys.exit("pairs.py: --base %r is no configuration" % args.base)
    env = runner.bench_env()
    workloads = overhead.runnable(args.python, args.workloads)
    # What each configuration is paired with: the unprofiled program (and so "none"
    # with itself), or what --against or --base names.
    paired = []
    for name in args.configs:
        config = runner.config_named(mprof, name, with_memray)
        if config is None:
            print("skipping %r: not available (memray not importable?)" % name, file=sys.stderr)
            continue
        other, label = unprofiled, name
        if name == "none":
            label = "none (noise floor)"
        elif args.against:
            other = runner.config_named(os.path.abspath(args.against), name, with_memray)
            label += " (over --against)"
        elif base is not None:
            other = base
            label += " (over %s)" % args.base
        paired.append((config, other, label))
    rows, readings = [], {}
    if args.swap_every:
        try:
            args.swapper = swapcores.CoreSwapper(range(2 * args.slots), args.swap_every / 1000)
        except OSError as e:
            sys.exit("pairs.py: --swap-every: %s" % e)
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-pairs-") as tmpdir:
            for reading in range(1, args.readings + 1):
                for workload in workloads:
                    for config, other, label in paired:
                        ratios, failures = pairs_of(workload, other, config, args, tmpdir, env)
                        shown = label if args.readings == 1 else "%s, reading %d" % (label, reading)
                        rows.append([workload, shown, str(len(ratios))] + summary(ratios))
                        if ratios:
                            readings.setdefault((workload, label), []).append(ratios)
                        for failure in failures[:2]:
                            print("  failed: %s" % failure, file=sys.stderr)
    finally:
        runner.kill_all_groups()
        if args.swap_every:
            args.swapper.close()
    print()
    print("python: %s; %d pair(s) per row, one slot = cores 0 and 1, sides swapped every other pair%s; "
          "load average %.2f" % (args.python, args.pairs,
                                 ", cores swapped every %g ms" % args.swap_every if args.swap_every else "",
                                 os.getloadavg()[0]))
    if args.against:
        print("each configuration of %s paired with the same one of %s" % (args.mprof, args.against))
    print()
    overhead.print_table(rows, args.markdown,
                         ["workload", "configuration", "pairs", "median ratio", "quartiles", "min..max"])
    if args.readings > 1:
        print()
        overhead.print_table(readings_table(readings), args.markdown,
                             ["workload", "configuration", "readings", "mean of the medians",
                              "standard error", "median of all pairs", "its 95% interval"])


def readings_table(readings):
    """One row per workload and configuration, from its readings' ratios: the mean of the
    readings' medians with the standard error of that mean (their spread over the square root of
    their number), and the median of all their pairs with a 95% interval found by resampling
    whole readings (the pairs of one reading share its hour of the machine, so they are not
    resampled one by one), with five readings or more."""
    rows = []
    rng = random.Random(0)
    for (workload, label), rs in readings.items():
        medians = [statistics.median(r) for r in rs]
        mean = statistics.fmean(medians)
        se = statistics.stdev(medians) / len(medians) ** 0.5 if len(medians) > 1 else float("nan")
        pooled = statistics.median([x for r in rs for x in r])
        # Too few readings to resample: their few combinations say nothing.
        interval = "-"
        if len(rs) >= 5:
            resampled = sorted(
                statistics.median([x for _ in rs for x in rs[rng.randrange(len(rs))]])
                for _ in range(2000))
            interval = "%.4f..%.4f" % (resampled[49], resampled[1949])
        rows.append([workload, label, str(len(rs)), "%.4f" % mean, "%.4f" % se, "%.4f" % pooled, interval])
    return rows


if __name__ == "__main__":
    main()
