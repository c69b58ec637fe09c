"""The documented behaviour of the standard tracemalloc module, as tests.

Written against ``tracemalloc`` alone: they pass on the standard module, and unchanged on
pymprof.tracemalloc when conftest.py puts it in its place (``PYMPROF_AS_TRACEMALLOC=1``).
"""

import contextlib
import gc
import os
import sys
import threading

import pytest

import tracemalloc
from tagged import tagged_line

MiB = 1024 * 1024
HERE = os.path.abspath(__file__)


def lineno(tag):
    """The line of this file that ends with ``# <tag>``."""
    return tagged_line(HERE, tag)


@contextlib.contextmanager
def traced(nframe=1):
    """Tracing, from a fresh start, keeping ``nframe`` frames; stopped on the way out."""
    tracemalloc.stop()
    tracemalloc.start(nframe)
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.fixture
def tracing():
    with traced():
        yield


class Payload:
    # Slots: on 3.11 the standard module finds no traceback for an instance with a __dict__.
    __slots__ = ("data",)

    def __init__(self, n):
        self.data = [bytes(1000) for _ in range(n)]  # payload-data


def make_payload(n):
    return Payload(n)  # make-payload


def allocate_blocks(n, size):
    return [bytes(size) for _ in range(n)]  # allocate-blocks


def call_allocate(n, size):
    return allocate_blocks(n, size)  # call-allocate


def blocks_and_their_traceback(n):
    """``call_allocate(n, 10000)``'s blocks, and their traceback from statistics('traceback')."""
    blocks = call_allocate(n, 10000)
    stats = tracemalloc.take_snapshot().statistics("traceback")
    return blocks, next(s.traceback for s in stats
                        if s.traceback[-1].lineno == lineno("allocate-blocks"))


def test_the_module_under_test_is_the_one_conftest_chose():
    expected = "pymprof.tracemalloc" if os.environ.get("PYMPROF_AS_TRACEMALLOC") == "1" else "tracemalloc"
    assert tracemalloc.__name__ == expected


def test_start_stop_and_is_tracing():
    tracemalloc.stop()
    assert not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        assert tracemalloc.is_tracing()
        tracemalloc.start()  # start() twice does nothing
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert not tracemalloc.is_tracing()
    tracemalloc.stop()  # stop() without start() does nothing
    assert not tracemalloc.is_tracing()


# 3.8's limit was higher than 65535.
@pytest.mark.parametrize("nframe", [0, -1] + ([65536] if sys.version_info >= (3, 9) else []))
def test_start_refuses_a_number_of_frames_out_of_range(nframe):
    with pytest.raises(ValueError):
        tracemalloc.start(nframe)
    assert not tracemalloc.is_tracing()


@pytest.mark.parametrize("nframe", ["1", 1.5, None])
def test_start_refuses_a_number_of_frames_that_is_not_an_int(nframe):
    with pytest.raises(TypeError):
        tracemalloc.start(nframe)
    assert not tracemalloc.is_tracing()


def test_take_snapshot_needs_tracing():
    tracemalloc.stop()
    with pytest.raises(RuntimeError):
        tracemalloc.take_snapshot()


def test_nothing_is_traced_when_not_tracing():
    tracemalloc.stop()
    assert tracemalloc.get_traced_memory() == (0, 0)
    assert tracemalloc.get_object_traceback(Payload(1)) is None
    tracemalloc.clear_traces()
    if hasattr(tracemalloc, "reset_peak"):
        tracemalloc.reset_peak()


def test_traced_memory_follows_allocations_and_the_peak_stays(tracing):
    before, _ = tracemalloc.get_traced_memory()
    data = bytearray(10 * MiB)
    now, peak = tracemalloc.get_traced_memory()
    assert 10 * MiB <= now - before <= 10 * MiB + 64 * 1024
    assert peak >= now
    del data
    after, peak_after = tracemalloc.get_traced_memory()
    assert after - before < 64 * 1024
    assert peak_after >= before + 10 * MiB


@pytest.mark.skipif(not hasattr(tracemalloc, "reset_peak"), reason="reset_peak is 3.9+")
def test_reset_peak_sets_the_peak_to_the_current_size(tracing):
    data = bytearray(8 * MiB)
    del data
    now, peak = tracemalloc.get_traced_memory()
    assert peak >= 8 * MiB and peak - now >= 8 * MiB - 64 * 1024
    tracemalloc.reset_peak()
    now, peak = tracemalloc.get_traced_memory()
    assert peak - now < 64 * 1024
    small = bytearray(MiB)
    now2, peak2 = tracemalloc.get_traced_memory()
    assert peak2 >= now2 >= now + MiB
    del small


def test_clear_traces_forgets_the_blocks_traced_so_far(tracing):
    blocks = allocate_blocks(100, 10000)
    tracemalloc.clear_traces()
    assert tracemalloc.is_tracing()
    assert tracemalloc.get_traced_memory()[0] < 100 * 10000
    snap = tracemalloc.take_snapshot()
    lines = [s.traceback[0].lineno for s in snap.statistics("lineno")]
    assert lineno("allocate-blocks") not in lines
    del blocks


def test_stop_clears_the_traces():
    tracemalloc.start()
    blocks = allocate_blocks(100, 10000)
    with traced():  # stop(), then start() again
        snap = tracemalloc.take_snapshot()
        assert lineno("allocate-blocks") not in [
            s.traceback[0].lineno for s in snap.statistics("lineno")]
    del blocks


def test_get_traceback_limit_is_the_number_of_frames_asked():
    with traced(7):
        assert tracemalloc.get_traceback_limit() == 7
        assert tracemalloc.take_snapshot().traceback_limit == 7


def test_get_tracemalloc_memory_is_a_number_of_bytes(tracing):
    used = tracemalloc.get_tracemalloc_memory()
    assert isinstance(used, int) and used >= 0


def test_get_object_traceback_names_the_line_that_made_the_object(tracing):
    obj = make_payload(10)
    tb = tracemalloc.get_object_traceback(obj)
    assert tb is not None
    assert isinstance(tb, tracemalloc.Traceback)
    assert tb[-1].filename == HERE
    assert tb[-1].lineno == lineno("make-payload")
    data = bytearray(100000)  # bytearray-object
    tb = tracemalloc.get_object_traceback(data)
    assert (tb[-1].filename, tb[-1].lineno) == (HERE, lineno("bytearray-object"))


def test_an_object_made_before_tracing_has_no_traceback():
    tracemalloc.stop()
    obj = make_payload(1)
    tracemalloc.start()
    try:
        assert tracemalloc.get_object_traceback(obj) is None
    finally:
        tracemalloc.stop()


def test_statistics_by_line_find_the_allocating_line(tracing):
    blocks = allocate_blocks(1000, 5000)
    snap = tracemalloc.take_snapshot()
    stats = snap.statistics("lineno")
    assert stats == sorted(stats, key=lambda s: (s.size, s.count), reverse=True)
    top = [s for s in stats if s.traceback[0].lineno == lineno("allocate-blocks")
           and s.traceback[0].filename == HERE]
    assert len(top) == 1
    assert 1000 * 5000 <= top[0].size <= 1000 * 5000 + 100 * 1024
    assert 1000 <= top[0].count <= 1010
    assert isinstance(top[0].size, int) and isinstance(top[0].count, int)
    assert len(top[0].traceback) == 1
    assert "size=" in str(top[0]) and "count=" in str(top[0])
    del blocks


def test_statistics_by_file_have_line_zero(tracing):
    blocks = allocate_blocks(100, 10000)
    stats = tracemalloc.take_snapshot().statistics("filename")
    mine = [s for s in stats if s.traceback[0].filename == HERE]
    assert len(mine) == 1
    assert mine[0].traceback[0].lineno == 0
    assert mine[0].size >= 100 * 10000
    del blocks


def test_statistics_by_traceback_keep_the_frames_oldest_first():
    with traced(3):
        blocks, tb = blocks_and_their_traceback(200)
        assert len(tb) == 3
        # From 3.12 the comprehension runs in its function's frame; before, in a frame of its own
        # on the same line.
        assert lineno("call-allocate") in [f.lineno for f in tb]
        assert all(f.filename == HERE for f in tb)
        assert tb.format()[-1].strip().endswith("# allocate-blocks")
        del blocks


def test_cumulative_statistics_count_every_frame():
    with traced(5):
        blocks = call_allocate(200, 10000)
        snap = tracemalloc.take_snapshot()
        plain = {s.traceback[0].lineno: s.size for s in snap.statistics("lineno")
                 if s.traceback[0].filename == HERE}
        summed = {s.traceback[0].lineno: s.size for s in snap.statistics("lineno", True)
                  if s.traceback[0].filename == HERE}
        assert lineno("call-allocate") not in plain
        assert summed[lineno("call-allocate")] >= 200 * 10000
        # Every frame counts, even two frames of one line (the comprehension's own before 3.12).
        frames_at_line = 1 if sys.version_info >= (3, 12) else 2
        assert summed[lineno("allocate-blocks")] == frames_at_line * plain[lineno("allocate-blocks")]
        del blocks


def test_statistics_refuse_unknown_keys(tracing):
    snap = tracemalloc.take_snapshot()
    with pytest.raises(ValueError):
        snap.statistics("function")
    with pytest.raises(ValueError):
        snap.statistics("traceback", cumulative=True)


def test_compare_to_finds_what_grew_biggest_first(tracing):
    old = tracemalloc.take_snapshot()
    blocks = allocate_blocks(300, 10000)
    new = tracemalloc.take_snapshot()
    diffs = new.compare_to(old, "lineno")
    assert diffs == sorted(diffs, key=lambda d: (abs(d.size_diff), d.size, abs(d.count_diff),
                                                 d.count), reverse=True)
    top = next(d for d in diffs if d.traceback[0].lineno == lineno("allocate-blocks"))
    assert top.size_diff >= 300 * 10000
    assert top.count_diff >= 300
    assert top.size >= top.size_diff
    assert "size=" in str(top) and "count=" in str(top)
    del blocks


def test_filter_traces_keeps_and_drops_by_file_line_and_domain(tracing):
    blocks = allocate_blocks(100, 10000)
    snap = tracemalloc.take_snapshot()
    total = len(snap.traces)
    mine = snap.filter_traces([tracemalloc.Filter(True, HERE)])
    assert 0 < len(mine.traces) <= total
    assert all(t.traceback[0].filename == HERE for t in mine.traces)
    others = snap.filter_traces([tracemalloc.Filter(False, HERE)])
    assert len(mine.traces) + len(others.traces) == total
    at_line = snap.filter_traces([tracemalloc.Filter(True, HERE, lineno("allocate-blocks"))])
    assert len(at_line.traces) >= 100
    pattern = snap.filter_traces([tracemalloc.Filter(True, os.path.dirname(HERE) + "/*.py")])
    assert len(pattern.traces) >= len(mine.traces)
    assert len(snap.filter_traces([tracemalloc.DomainFilter(True, 0)]).traces) == total
    assert len(snap.filter_traces([tracemalloc.DomainFilter(False, 0)]).traces) == 0
    assert len(snap.filter_traces([]).traces) == total
    both = snap.filter_traces([tracemalloc.Filter(True, HERE),
                               tracemalloc.Filter(False, HERE, lineno("allocate-blocks"))])
    assert len(both.traces) == len(mine.traces) - len(at_line.traces)
    with pytest.raises(TypeError):
        snap.filter_traces(tracemalloc.Filter(True, HERE))
    del blocks


def test_a_filter_on_all_frames_looks_past_the_most_recent():
    with traced(5):
        blocks = call_allocate(100, 10000)
        snap = tracemalloc.take_snapshot()
        here = tracemalloc.Filter(True, HERE, lineno("call-allocate"))
        anywhere = tracemalloc.Filter(True, HERE, lineno("call-allocate"), all_frames=True)
        assert len(snap.filter_traces([here]).traces) == 0
        assert len(snap.filter_traces([anywhere]).traces) >= 100
        del blocks


def test_filter_attributes():
    f = tracemalloc.Filter(True, "x.pyc", 3, True, 0)
    assert (f.inclusive, f.lineno, f.all_frames, f.domain) == (True, 3, True, 0)
    assert f.filename_pattern == "x.py"
    d = tracemalloc.DomainFilter(False, 5)
    assert (d.inclusive, d.domain) == (False, 5)


def test_dump_and_load_give_the_same_snapshot(tracing, tmp_path):
    blocks = allocate_blocks(50, 10000)
    snap = tracemalloc.take_snapshot()
    path = str(tmp_path / "snap.dump")
    snap.dump(path)
    loaded = tracemalloc.Snapshot.load(path)
    assert loaded.traceback_limit == snap.traceback_limit
    assert loaded.statistics("lineno") == snap.statistics("lineno")
    assert len(loaded.traces) == len(snap.traces)
    del blocks


def test_load_refuses_a_file_that_is_not_a_snapshot(tmp_path):
    path = tmp_path / "not-a-snapshot"
    path.write_bytes(b"this is not a snapshot\n" * 10)
    with pytest.raises(Exception):
        tracemalloc.Snapshot.load(str(path))


def test_traces_frames_and_tracebacks(tracing):
    blocks = allocate_blocks(10, 10000)
    snap = tracemalloc.take_snapshot()
    traces = snap.traces
    assert len(traces) > 0
    # The line made the list too: its biggest trace is one of the blocks.
    trace = max((t for t in traces if t.traceback[0].lineno == lineno("allocate-blocks")),
                key=lambda t: t.size)
    assert isinstance(trace, tracemalloc.Trace)
    assert trace.domain == 0
    assert isinstance(trace.size, int) and trace.size >= 10000
    assert trace in traces
    assert str(trace).startswith("%s:%s: " % (HERE, lineno("allocate-blocks")))
    frame = trace.traceback[0]
    assert isinstance(frame, tracemalloc.Frame)
    assert str(frame) == "%s:%s" % (HERE, lineno("allocate-blocks"))
    assert frame == trace.traceback[-1] and hash(frame) == hash(trace.traceback[-1])
    assert frame in trace.traceback
    assert len(traces[:2]) == 2
    del blocks


def test_traceback_format_limits_and_orders_the_frames():
    with traced(3):
        blocks, tb = blocks_and_their_traceback(10)
        lines = tb.format()
        assert lines[-2] == '  File "%s", line %s' % (HERE, lineno("allocate-blocks"))
        assert lines[-1].strip().endswith("# allocate-blocks")
        assert tb.format(limit=1) == lines[-2:]
        newest_first = tb.format(most_recent_first=True)
        assert newest_first[:2] == lines[-2:]
        # A negative limit leaves out the abs(limit) most recent frames.
        assert tb.format(limit=-1) == lines[:-2]
        total = getattr(tb, "total_nframe", None)  # 3.9+
        if total is not None:
            assert total >= len(tb)
        del blocks


def test_allocations_of_other_threads_are_traced(tracing):
    out = []
    worker = threading.Thread(target=lambda: out.append(allocate_blocks(100, 10000)))
    worker.start()
    worker.join()
    stats = tracemalloc.take_snapshot().statistics("lineno")
    top = [s for s in stats if s.traceback[0].lineno == lineno("allocate-blocks")]
    assert top and top[0].size >= 100 * 10000
    del out


def test_freed_blocks_leave_the_snapshot(tracing):
    blocks = allocate_blocks(100, 10000)
    del blocks
    gc.collect()
    stats = tracemalloc.take_snapshot().statistics("lineno")
    left = sum(s.size for s in stats if s.traceback[0].lineno == lineno("allocate-blocks"))
    assert left < 100 * 10000 / 10
