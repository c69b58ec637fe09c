"""How one configuration of a profiler runs one workload of benches/overhead.py, and what is
measured: the configurations' command lines, the process groups of the runs (killed on any exit
of the driver), the workloads that time themselves (alloc, native) and the tornado server driven
by its client. Shared by overhead.py, pairs.py and native.py.
"""

import os
import queue
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

WORKLOADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads")
# The in-process configuration's launcher (pymprof.start() inside the program).
INPROCESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inprocess.py")


# Process groups still running, killed on any exit of the driver.
LIVE_GROUPS = set()


class Config:
    """One way of running the target: a command prefix, given the interpreter and a capture path."""

    def __init__(self, name, prefix_fn):
        self.name = name
        self.prefix_fn = prefix_fn

    def command(self, python, capture, script_args):
        return self.prefix_fn(python, capture) + script_args


def make_configs(mprof, with_memray):
    configs = [
        Config("none", lambda py, cap: [py]),
        Config("mprof", lambda py, cap: [mprof, "record", "-q", "-o", cap, "--", py]),
        Config("mprof --python-only", lambda py, cap: [mprof, "record", "-q", "--python-only", "-o", cap, "--", py]),
        Config("mprof --rate 1", lambda py, cap: [mprof, "record", "-q", "--rate", "1", "-o", cap, "--", py]),
        Config("tracemalloc=1", lambda py, cap: [py, "-X", "tracemalloc=1"]),
    ]
    if with_memray:
        configs.append(Config("memray", lambda py, cap: [py, "-m", "memray", "run", "-q", "-f", "-o", cap]))
        configs.append(
            Config(
                "memray --trace-python-allocators",
                lambda py, cap: [py, "-m", "memray", "run", "-q", "-f", "--trace-python-allocators", "-o", cap],
            )
        )
    return configs


def rate_config(mprof, name):
    """`mprof --rate R` for any R (`64KiB`, `131072`), `mprof --rate R --every S` (continuous:
    a profile every S into a directory beside the capture), or the in-process `pymprof` (at the
    default rate, or `pymprof --rate R`: pymprof.start() inside the program, benches/inprocess.py),
    when `name` spells one; else None."""
    if name == "pymprof":
        return Config(name, lambda py, cap: [py, INPROCESS, "--mprof", mprof, "-o", cap])
    m = re.fullmatch(r"(py)?mprof --rate (\S+)( --every (\S+))?", name)
    if m is None or (m.group(1) and m.group(3)):
        return None
    rate = m.group(2)
    if m.group(1):
        return Config(name, lambda py, cap: [py, INPROCESS, "--mprof", mprof, "--rate", rate, "-o", cap])
    if m.group(3):
        # Continuous: a profile every interval into a rolling directory beside the capture.
        every = m.group(4)
        return Config(name, lambda py, cap: [mprof, "record", "-q", "--rate", rate, "--every", every,
                                             "--profiles-dir", cap + ".profiles", "-o", cap, "--", py])
    return Config(name, lambda py, cap: [mprof, "record", "-q", "--rate", rate, "-o", cap, "--", py])


def config_named(mprof, name, with_memray=False):
    """The configuration called `name` for this `mprof` (one of `make_configs`' or any `mprof
    --rate R`), or None."""
    for config in make_configs(mprof, with_memray):
        if config.name == name:
            return config
    return rate_config(mprof, name)


class Result:
    """One run of one configuration on one workload."""

    def __init__(self, value=None, wall=None, rss_kib=None, capture_bytes=None, error=None, cpu=None):
        self.value = value  # seconds (alloc, native) or requests/s (tornado)
        self.wall = wall  # seconds, the whole command
        self.cpu = cpu  # user + system seconds of the whole command, profiler included
        self.rss_kib = rss_kib
        self.capture_bytes = capture_bytes
        self.error = error


def parse_bench_line(text):
    """The key=value pairs of the last `BENCH ...` line in text, as strings."""
    found = None
    for line in text.splitlines():
        if line.startswith("BENCH "):
            found = line
    if found is None:
        return None
    return dict(pair.split("=", 1) for pair in found.split()[1:])


def start_group(cmd, **kwargs):
    """Popen in a new session, remembered so that it is killed if the driver dies."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    LIVE_GROUPS.add(proc.pid)
    return proc


def kill_group(proc):
    """SIGKILL the process group of proc (the profiler and its target) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    else:
        # The leader is gone; make sure nothing it started lingers.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    LIVE_GROUPS.discard(proc.pid)


def kill_all_groups():
    for pgid in list(LIVE_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    LIVE_GROUPS.clear()


def capture_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def tail(text, lines=8):
    return "\n".join(text.strip().splitlines()[-lines:])


def bench_env():
    """The environment of every run: a fixed hash seed (the same work each run), no .pyc written."""
    return dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")


# The workloads that time themselves (the rest, tornado, measure throughput), and their scripts.
TIMED = {"alloc": "alloc_heavy.py", "native": "native_heavy.py", "imports": "imports.py"}


def run_timed(workload, config, args, capture, env, script_args=(), wrapper=()):
    script = [os.path.join(WORKLOADS, TIMED[workload])] + list(script_args)
    cmd = list(wrapper) + config.command(args.python, capture, script)
    cpu_before = children_cpu()
    start = time.perf_counter()
    proc = start_group(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return Result(error="timed out after %ds" % args.timeout)
    finally:
        kill_group(proc)
    wall = time.perf_counter() - start
    cpu = children_cpu() - cpu_before
    size = capture_size(capture)
    fields = parse_bench_line(out.decode(errors="replace"))
    if proc.returncode != 0 or fields is None:
        return Result(error="exit %s: %s" % (proc.returncode, tail(err.decode(errors="replace"))))
    return Result(float(fields["elapsed_s"]), wall, int(fields["vmhwm_kib"]), size, cpu=cpu)


def children_cpu():
    """User + system CPU seconds of every child reaped so far (grandchildren reaped by them included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def line_reader(stream, lines):
    for line in iter(stream.readline, b""):
        lines.put(line.decode(errors="replace"))
    lines.put(None)


# Untimed requests the client sends before the timed ones (the server answers them too).
WARMUP = 500


def run_tornado(config, args, capture, env, requests, warmup=WARMUP, wrapper=(), at_client_exit=None,
                at_client_start=None, client_wrapper=()):
    """One run of the tornado workload, the server under `wrapper` and its client under
    `client_wrapper`; `at_client_exit(server)`, if given, is called with the
    server's Popen (the profiler's, under one) once the client is done, before the server stops;
    `at_client_start(server, port)` once the server listens on `port`, before the client starts."""
    script = [os.path.join(WORKLOADS, "tornado_server.py"), "--max-seconds", str(args.timeout)]
    errfile = tempfile.TemporaryFile()
    cmd = list(wrapper) + config.command(args.python, capture, script)
    server = start_group(cmd, stdout=subprocess.PIPE, stderr=errfile, env=env)
    try:
        result, cpu_at_client_exit = drive_server(
            server, errfile, args, env, requests, warmup, client_wrapper, at_client_exit, at_client_start
        )
    finally:
        kill_group(server)
        errfile.close()
    if result.error is None:
        # The client was reaped at cpu_at_client_exit, the server (and its profiler) since.
        result.cpu = children_cpu() - cpu_at_client_exit
    result.capture_bytes = capture_size(capture)
    return result


def drive_server(server, errfile, args, env, requests, warmup, client_wrapper=(), at_client_exit=None,
                 at_client_start=None):
    """Wait for the server's port, run the client against it, stop the server, collect its VmHWM.

    Returns (result, CPU seconds of reaped children right after the client was reaped)."""
    lines = queue.Queue()
    threading.Thread(target=line_reader, args=(server.stdout, lines), daemon=True).start()
    seen = []
    port = wait_for_port(lines, seen, deadline=time.monotonic() + 60)
    if port is None:
        return Result(error="server printed no PORT line: %s" % server_error(server, errfile)), None
    if at_client_start is not None:
        at_client_start(server, port)
    client_cmd = list(client_wrapper) + client_command(args, port, requests, warmup)
    try:
        client = subprocess.run(
            client_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.timeout + 30, env=env
        )
    except subprocess.TimeoutExpired:
        return Result(error="client timed out"), None
    cpu_at_client_exit = children_cpu()
    fields = parse_bench_line(client.stdout.decode(errors="replace"))
    if client.returncode != 0 or fields is None:
        return Result(error="client failed: %s" % tail(client.stderr.decode(errors="replace"))), None
    if at_client_exit is not None:
        at_client_exit(server)
    stop_server(server, port)
    seen.extend(drain(lines, deadline=time.monotonic() + 5))
    server_fields = parse_bench_line("".join(seen))
    rss = int(server_fields["vmhwm_kib"]) if server_fields else None
    return Result(float(fields["rps"]), None, rss, None), cpu_at_client_exit


def client_command(args, port, requests, warmup):
    """The tornado client's command against the server on `port`."""
    return [
        args.python,
        os.path.join(WORKLOADS, "tornado_client.py"),
        str(port),
        "--requests", str(requests),
        "--warmup", str(warmup),
        "--connections", str(args.connections),
        "--max-seconds", str(args.timeout),
    ]


def server_pid(popen, profiled):
    """The Python server's pid under `popen`: the command itself, or the profiler's one child
    (None if it has not exactly one)."""
    if not profiled:
        return popen.pid
    try:
        with open("/proc/%d/task/%d/children" % (popen.pid, popen.pid)) as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return None
    return children[0] if len(children) == 1 else None


def wait_for_port(lines, seen, deadline):
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if line is None:
            return None
        seen.append(line)
        match = re.match(r"PORT (\d+)", line)
        if match:
            return int(match.group(1))
    return None


def drain(lines, deadline):
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return
        if line is None:
            return
        yield line


def stop_server(server, port, grace=60):
    """Ask the server to stop, then wait for it (and its profiler) to exit; kill after grace seconds."""
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/shutdown" % port, timeout=10).read()
    except OSError:
        pass
    try:
        server.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print("  server did not exit within %ds; killing it" % grace, file=sys.stderr)
        kill_group(server)


def server_error(server, errfile):
    kill_group(server)
    errfile.seek(0)
    return tail(errfile.read().decode(errors="replace")) or "exit %s" % server.returncode


def run_one(workload, config, args, tmpdir, env):
    capture = os.path.join(tmpdir, "capture.out")
    if workload in TIMED:
        return run_timed(workload, config, args, capture, env)
    return run_tornado(config, args, capture, env, args.requests)
