"""pymprof's own API: start() as a context manager that writes a capture every mprof view
reads, snapshots with native allocations, sampling with error bars, bad input, and a process
that another mprof session profiles already."""

import ctypes
import json
import math
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pymprof
import pymprof.tracemalloc as tm
from pymprof._binary import find_mprof
from tagged import tagged_line

MiB = 1024 * 1024
HERE = os.path.abspath(__file__)


def lineno(tag):
    return tagged_line(HERE, tag)


def mprof(*args, check=True):
    """`python -m pymprof ARGS` from this interpreter: the installed package's binary."""
    return subprocess.run([sys.executable, "-m", "pymprof"] + list(args), check=check,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    tm.stop()
    pymprof.stop()
    assert pymprof._session.current() is None


def allocate(n, size):
    return [bytes(size) for _ in range(n)]  # api-allocate


def test_python_m_pymprof_is_the_mprof_command():
    out = mprof("--version")
    assert out.stdout.startswith("mprof ")
    assert find_mprof().endswith("mprof")
    assert "record" in mprof("--help").stdout


def test_start_as_a_context_manager_writes_a_capture_every_view_reads(tmp_path):
    capture = str(tmp_path / "block.mprof")
    with pymprof.start(sample_rate=4096, output=capture) as profile:
        assert pymprof.is_profiling()
        kept = allocate(4000, 5000)
        current, peak = profile.get_traced_memory()
        assert current >= 10 * MiB and peak >= current
    assert not pymprof.is_profiling()
    assert profile.result["capture"] == capture
    report = json.loads(mprof("report", capture, "--json", "--view", "live", "--by", "line").stdout)
    assert report["meta"]["mode"] == "pymprof"
    assert report["meta"]["pid"] == str(os.getpid())
    top = report["locations"][0]
    assert (top["file"], top["line"]) == (HERE, lineno("api-allocate"))
    assert abs(top["live_bytes"] - 4000 * 5033) < 5 * top["live_stderr"] + 1
    for view in (["flamegraph", capture, "-o", str(tmp_path / "f.svg")],
                 ["html", capture, "-o", str(tmp_path / "r.html")],
                 ["timeline", capture, "-o", str(tmp_path / "t.svg")],
                 ["diff", capture, capture]):
        mprof(*view)
    assert os.path.getsize(str(tmp_path / "f.svg")) > 1000
    del kept


def test_snapshots_include_native_allocations_and_memory_mappings():
    with pymprof.start(sample_rate=1, output=None) as profile:
        # Looked up while profiling: ctypes' dlsym gets the agent's hook for malloc then.
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        block = libc.malloc(8 * MiB)  # native-malloc
        mapping = mmap.mmap(-1, 16 * MiB)  # anonymous-mmap
        snap = profile.take_snapshot()
        libc.free(block)
        mapping.close()
    by_domain = {}
    for t in snap.traces:
        by_domain.setdefault(t.domain, []).append(t)
    native = [t for t in by_domain.get(pymprof.NATIVE_DOMAIN, []) if t.size == 8 * MiB]
    mapped = [t for t in by_domain.get(pymprof.MMAP_DOMAIN, []) if t.size >= 16 * MiB]
    assert native and native[0].traceback[0].lineno == lineno("native-malloc")
    assert mapped and mapped[0].traceback[0].lineno == lineno("anonymous-mmap")
    python_only = snap.filter_traces([tm.DomainFilter(True, 0)])
    assert all(t.domain == 0 for t in python_only.traces)


def test_a_sampled_estimate_is_within_its_error_bars():
    truth = 8000 * (5000 + 33)
    tm.start(sample_rate=64 * 1024)
    try:
        blocks = allocate(8000, 5000)
        stat = next(s for s in tm.take_snapshot().statistics("lineno")
                    if s.traceback[0].lineno == lineno("api-allocate"))
        current_se, _ = tm.get_traced_memory_stderr()
    finally:
        tm.stop()
    assert 0 < stat.samples < 8000
    assert stat.size_stderr > 0 and stat.count_stderr > 0 and current_se > 0
    assert abs(stat.size - truth) < 4 * stat.size_stderr, (stat.size, truth, stat.size_stderr)
    assert abs(stat.count - 8000) < 4 * stat.count_stderr + 10
    del blocks


def test_a_sampled_diff_of_two_snapshots_cancels_the_samples_they_share():
    tm.start(sample_rate=64 * 1024)
    try:
        kept = allocate(4000, 5000)
        old = tm.take_snapshot()
        more = [bytes(5000) for _ in range(2000)]  # api-more
        new = tm.take_snapshot()
    finally:
        tm.stop()
    diffs = {d.traceback[0].lineno: d for d in new.compare_to(old, "lineno")}
    same = diffs[lineno("api-allocate")]
    assert same.size_diff == 0 and same.size_diff_stderr == 0
    grew = diffs[lineno("api-more")]
    assert grew.size_diff > 0 and grew.size_diff_stderr > 0
    del kept, more


@pytest.mark.parametrize("rate, error", [(0, ValueError), (-4096, ValueError),
                                         ("fast", ValueError), ("12 parsecs", ValueError),
                                         (1.5, TypeError), (True, TypeError), (None, TypeError)])
def test_a_bad_sample_rate_is_refused_and_nothing_starts(rate, error):
    with pytest.raises(error):
        tm.start(sample_rate=rate)
    assert not tm.is_tracing()
    with pytest.raises(error):
        pymprof.start(sample_rate=rate, output=None)
    assert not pymprof.is_profiling()


def test_misuse_gets_tracemallocs_own_answers():
    tm.stop()  # stop() without start(): nothing happens
    with pytest.raises(RuntimeError, match="must be tracing"):
        tm.take_snapshot()
    tm.start()
    tm.start()  # start() twice: nothing happens
    assert tm.is_tracing()
    tm.stop()
    assert pymprof.stop() is None
    with pytest.raises(RuntimeError, match="no profile is running"):
        pymprof.take_snapshot()


def test_only_one_session_at_a_time():
    profile = pymprof.start(output=None)
    try:
        with pytest.raises(RuntimeError, match="already profiling"):
            pymprof.start(output=None)
        with pytest.raises(RuntimeError, match="already profiling"):
            tm.start()
        assert profile.running
    finally:
        profile.stop()
    profile.stop()  # a second stop() does nothing
    tm.start()
    assert tm.is_tracing()
    tm.stop()


def test_a_file_that_is_not_a_snapshot_is_refused_clearly(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="is not a pymprof snapshot file"):
        tm.Snapshot.load(str(garbage))
    truncated = tmp_path / "truncated"
    tm.start()
    try:
        tm.take_snapshot().dump(str(truncated))
    finally:
        tm.stop()
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="damaged"):
        tm.Snapshot.load(str(truncated))
    out = mprof("report", str(garbage), check=False)
    assert out.returncode != 0 and out.stderr.count("\n") == 1 and "error" in out.stderr
    # The program goes on.
    tm.start()
    assert tm.is_tracing()
    tm.stop()


def test_a_forked_child_does_not_take_its_parents_session():
    with pymprof.start(output=None) as profile:
        pid = os.fork()
        if pid == 0:
            code = 0 if not pymprof.is_profiling() and not tm.is_tracing() else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert profile.running
        assert profile.take_snapshot() is not None


def test_a_program_under_mprof_record_is_refused_clearly_and_recorded(tmp_path):
    script = tmp_path / "under_record.py"
    script.write_text(textwrap.dedent("""
        import pymprof
        try:
            pymprof.start(output=None)
        except RuntimeError as e:
            print("refused:", e)
        data = [bytes(5000) for _ in range(2000)]
        print("done")
    """))
    capture = str(tmp_path / "rec.mprof")
    out = mprof("record", "-q", "-o", capture, "--", sys.executable, str(script))
    assert "refused:" in out.stdout and "already being profiled" in out.stdout
    assert "done" in out.stdout
    report = json.loads(mprof("report", capture, "--json").stdout)
    assert report["samples"] > 0


def test_mprof_attach_to_a_program_that_profiles_itself_refuses_clearly(tmp_path):
    script = tmp_path / "self_profiled.py"
    script.write_text(textwrap.dedent("""
        import sys, time, pymprof
        profile = pymprof.start(output=None, sample_rate=1)
        print("started", flush=True)
        sys.stdin.readline()
        data = [bytes(5000) for _ in range(1000)]
        snap = profile.take_snapshot()
        print("traces", len(snap.traces), flush=True)
        profile.stop()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, universal_newlines=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        out = mprof("attach", "--pid", str(proc.pid), "--duration", "1", "-o",
                    str(tmp_path / "a.mprof"), check=False)
        if "Operation not permitted" in out.stderr or "ptrace" in out.stderr.lower() and \
                "permission" in out.stderr.lower():
            pytest.skip("this machine does not let mprof attach: %s" % out.stderr.strip())
        assert out.returncode != 0
        assert "already being profiled" in out.stderr and "pymprof" in out.stderr
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith("traces") and int(line.split()[1]) >= 1000
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_reader_that_dies_ends_the_session_and_the_program_goes_on():
    tm.start()
    reader = pymprof._session.current()._proc
    os.kill(reader.pid, signal.SIGKILL)
    reader.wait()
    with pytest.raises(RuntimeError, match="reader"):
        tm.get_traced_memory()
    assert not tm.is_tracing()
    data = [bytes(1000) for _ in range(1000)]  # allocations go on, unprofiled
    tm.start()
    try:
        assert tm.is_tracing() and tm.get_traced_memory()[0] >= 0
    finally:
        tm.stop()
    del data
