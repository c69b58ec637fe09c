"""pymprof's pytest plugin (entry point ``pytest11``).

- ``@pytest.mark.limit_memory("24 MB")``: the test fails when what it allocated, at its peak,
  is over the limit; the failure names the sites that held the memory then.
- ``@pytest.mark.limit_leaks("1 MB")``: the test fails when more than the limit of what it
  allocated is still live after it (after a garbage collection).
- ``--pymprof``: at the end, the tests that allocated the most.

One session of mprof's agent serves the whole run, started at the first test that needs it;
each test is an *epoch* of it (the blocks sampled during its call). ``--pymprof-rate`` (or the
``pymprof_rate`` ini value) sets the sampling rate: 1 (the default) records every allocation
and the figures are exact; a larger rate costs less and gives estimates with a standard error
(SE). Then a limit is decided with its error bar: a test fails only when the estimate minus
two SE is over the limit; an estimate whose two-SE bar reaches across the limit is
*borderline*: it passes with a warning that says so, or fails with
``--pymprof-borderline=fail``.
"""

import gc
import warnings

import pytest

from ._session import Session, SessionError
from ._units import format_size, parse_size

_OWNER = "pymprof's pytest plugin"


def pytest_addoption(parser):
    group = parser.getgroup("pymprof", "memory limits and reports (pymprof)")
    group.addoption("--pymprof", action="store_true", default=False,
                    help="report the tests that allocated the most memory")
    group.addoption("--pymprof-top", type=int, default=5, metavar="N",
                    help="how many tests --pymprof lists (default 5)")
    group.addoption("--pymprof-rate", default=None, metavar="SIZE",
                    help="sampling rate: mean bytes between samples, 1 = every allocation "
                         "(default: the pymprof_rate ini value, else 1)")
    group.addoption("--pymprof-borderline", choices=("pass", "fail"), default=None,
                    help="what a limit within two standard errors of the estimate does "
                         "(default: pass, with a warning)")
    parser.addini("pymprof_rate", "pymprof's sampling rate (1: every allocation)", default="1")
    parser.addini("pymprof_native", "count the C allocator family and memory mappings too",
                  type="bool", default=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "limit_memory(limit): fail if the test's allocations at their peak exceed "
                   "limit (e.g. '24 MB'), per pymprof")
    config.addinivalue_line(
        "markers", "limit_leaks(limit): fail if more than limit (e.g. '1 MB') of what the test "
                   "allocated is still live after it, per pymprof")
    config.pluginmanager.register(_Plugin(config), "pymprof-plugin")


class _Plugin:
    def __init__(self, config):
        self.config = config
        rate = config.getoption("pymprof_rate") or config.getini("pymprof_rate")
        self.rate = parse_size(rate, "--pymprof-rate")
        if self.rate < 1:
            raise pytest.UsageError("--pymprof-rate must be at least 1 byte")
        self.borderline = config.getoption("pymprof_borderline") or "pass"
        self.report = config.getoption("pymprof")
        self.top = config.getoption("pymprof_top")
        self.native = config.getini("pymprof_native")
        self.session = None
        self.failed_to_start = None
        self.results = []

    def _session(self):
        if self.session is None and self.failed_to_start is None:
            s = Session(self.rate, _OWNER, native=self.native)
            try:
                s.start()
                self.session = s
            except (SessionError, RuntimeError) as e:
                self.failed_to_start = str(e)
        if self.session is None:
            raise SessionError(self.failed_to_start)
        return self.session

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        memory = item.get_closest_marker("limit_memory")
        leaks = item.get_closest_marker("limit_leaks")
        if memory is None and leaks is None and not self.report:
            return (yield)
        limits = [(m.name, parse_size(_limit(m), m.name)) for m in (memory, leaks) if m]
        try:
            session = self._session()
        except SessionError as e:
            if limits:
                pytest.fail("pymprof cannot measure this test's memory: %s" % e, pytrace=False)
            return (yield)
        gc.collect()
        session.ask("mark")
        try:
            result = yield
        except BaseException:
            self._measure(item, session, limits, leaks is not None, check=False)
            raise
        self._measure(item, session, limits, leaks is not None, check=True)
        return result

    def _measure(self, item, session, limits, collect, check):
        """The test's epoch: kept for --pymprof, and held against its limits."""
        if collect:
            gc.collect()
        root = str(getattr(item.config, "rootpath", item.config.rootdir))
        epoch = session.ask("epoch 5 %s" % root)
        self.results.append((item.nodeid, epoch))
        if check:
            for name, limit in limits:
                self._check(name, limit, epoch)

    def _check(self, name, limit, epoch):
        figure = epoch["peak"] if name == "limit_memory" else epoch["live"]
        sites = epoch["peak_sites"] if name == "limit_memory" else epoch["live_sites"]
        verdict, message = decide(name, limit, figure["bytes"], figure["variance"] ** 0.5,
                                  self.rate)
        if verdict is None:
            return
        if verdict == "borderline" and self.borderline == "pass":
            warnings.warn(pytest.PytestWarning("pymprof: " + message))
            return
        lines = [message, "where the memory was %s:" % (
            "at the peak" if name == "limit_memory" else "still live")]
        for s in sites:
            e = s["estimate"]
            if e["bytes"] < 0.01 * figure["bytes"]:
                continue
            lines.append("  %s: %s" % (s["site"], _estimate(e["bytes"], e["variance"] ** 0.5,
                                                             self.rate)))
        pytest.fail("\n".join(lines), pytrace=False)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.report:
            return
        tr = terminalreporter
        tr.write_sep("=", "pymprof: tests that allocated the most")
        if self.failed_to_start:
            tr.write_line("pymprof could not profile the tests: %s" % self.failed_to_start)
            return
        rate = "every allocation" if self.rate == 1 else "sampled every %s" % format_size(self.rate)
        tr.write_line("(%s; allocated: all the test's allocations, peak: the most live at "
                      "once, live: still live after it)" % rate)
        rows = sorted(self.results, key=lambda r: r[1]["allocated"]["bytes"], reverse=True)
        for nodeid, epoch in rows[:self.top]:
            tr.write_line("%12s allocated  %12s peak  %12s live  %s" % (
                format_size(epoch["allocated"]["bytes"]), format_size(epoch["peak"]["bytes"]),
                format_size(epoch["live"]["bytes"]), nodeid))

    def pytest_unconfigure(self, config):
        if self.session is not None:
            try:
                self.session.stop()
            except SessionError:
                pass
            self.session = None


def decide(name, limit, estimate, stderr, rate):
    """How a limit is held against a figure (see the module doc): ``(None, None)`` when it is
    kept, else ``("over", message)`` or ``("borderline", message)``."""
    if estimate - 2 * stderr > limit:
        verdict = "over"
    elif estimate + 2 * stderr > limit and stderr > 0:
        verdict = "borderline"
    else:
        return None, None
    what = ("allocated %s at its peak" if name == "limit_memory"
            else "left %s allocated after it") % _estimate(estimate, stderr, rate)
    if verdict == "over":
        return verdict, "%s: the test %s, over its limit of %s" % (name, what, format_size(limit))
    return verdict, ("%s: the test %s: within two standard errors of its limit of %s "
                     "(borderline; --pymprof-rate 1 gives the exact figure)"
                     % (name, what, format_size(limit)))


def _limit(marker):
    if marker.args:
        return marker.args[0]
    if "limit" in marker.kwargs:
        return marker.kwargs["limit"]
    raise pytest.UsageError("@pytest.mark.%s needs a limit, e.g. '24 MB'" % marker.name)


def _estimate(bytes_, se, rate):
    if rate == 1:
        return format_size(bytes_)
    return "%s ± %s" % (format_size(bytes_), format_size(se))
