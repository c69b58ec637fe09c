#!/usr/bin/env python3
"""The page faults the profiled server takes while it answers the client, per configuration.

    python3 benches/faults.py                                   # none, mprof; 3 runs each
    python3 benches/faults.py --configs "none,mprof --rate 1099511627776,mprof" --mprof OLD

A page fault in this VM costs 1.5 to 3 µs; the faults a profiler adds inside its samples are
part of what a sample costs. Each run starts the tornado server of `overhead.py` under the
configuration, and reads the server's own count of minor and major faults (/proc/PID/stat)
once it listens and again when the client (500 warm-up and `--requests` timed requests) is
done; prints the difference per run and the median per configuration, in turns.
"""

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (the interpreter, tornado check)
import runner  # noqa: E402  (the configurations, the tornado run)


def faults(pid):
    """Minor plus major faults of process `pid` so far, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return None
    # Fields after the command's closing parenthesis: state is 3rd, minflt 10th, majflt 12th.
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[7]) + int(fields[9])


def one_run(args, config, env, tmpdir, i):
    """Faults the server took during the client's run, or an error string."""
    capture = os.path.join(tmpdir, "capture-%d.out" % i)
    readings = []

    def read(popen, *_port):
        pid = runner.server_pid(popen, config.name != "none")
        readings.append(faults(pid) if pid is not None else None)

    result = runner.run_tornado(config, args, capture, env, args.requests,
                                at_client_start=read, at_client_exit=read)
    if result.error:
        return result.error
    if len(readings) != 2 or None in readings:
        return "the server's fault counts could not be read: %s" % readings
    return readings[1] - readings[0]


def main():
    p = overhead.tornado_parser(__doc__, runs=3, requests=10000)
    p.add_argument("--configs", default="none,mprof",
                   help='comma-separated: "none", "mprof" (the default rate) or "mprof --rate R"')
    args = p.parse_args()
    overhead.check_tornado_args(p, args)
    mprof = os.path.abspath(args.mprof)
    configs = []
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        config = runner.config_named(mprof, name)
        if config is None:
            p.error('--configs: "none", "mprof" or "mprof --rate R", not %r' % name)
        configs.append(config)
    env = runner.bench_env()
    print("python: %s; mprof: %s; %d run(s) of %d requests after %d warm-up"
          % (args.python, args.mprof, args.runs, args.requests, runner.WARMUP))
    counts = {c.name: [] for c in configs}
    try:
        with tempfile.TemporaryDirectory(prefix="mprof-faults-") as tmpdir:
            for i in range(args.runs):
                for config in configs:
                    r = one_run(args, config, env, tmpdir, i)
                    if isinstance(r, str):
                        print("  %s, run %d failed: %s" % (config.name, i + 1, r), file=sys.stderr)
                        continue
                    counts[config.name].append(r)
                    print("  %s, run %d: %d faults" % (config.name, i + 1, r))
    finally:
        runner.kill_all_groups()
    for name, got in counts.items():
        if got:
            print("%-28s median %6.0f faults (runs: %s)" % (name, statistics.median(got),
                                                            ", ".join(map(str, got))))
    if not any(counts.values()):
        sys.exit("faults.py: no run succeeded")


if __name__ == "__main__":
    main()
