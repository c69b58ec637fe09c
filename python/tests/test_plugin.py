"""The pytest plugin, run on test files of its own in a pytest of their own (pytester), at rate
1 and at a sampling rate: a test over its memory limit fails with the site named, one under
it passes, a leaking test is caught, and --pymprof lists the tests that allocated most."""

import pytest

TESTS = '''
import pytest

MiB = 1024 * 1024
cache = []


def allocate(n):
    return [bytes(10000) for _ in range(n * 105)]  # allocate-line


@pytest.mark.limit_memory("24 MB")
def test_over_the_limit():
    big = allocate(40)  # big-line
    del big


@pytest.mark.limit_memory("24 MB")
def test_under_the_limit():
    small = allocate(8)
    del small


@pytest.mark.limit_leaks("1 MB")
def test_leaks():
    cache.append(allocate(6))  # leak-line


@pytest.mark.limit_leaks("1 MB")
def test_does_not_leak():
    temporary = allocate(20)
    del temporary


def test_unmarked():
    allocate(3)
'''


def line_of(tag):
    """The line of TESTS (as pytester writes it) that ends with ``# tag``."""
    lines = TESTS.strip().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.endswith("# " + tag))


def plugin_args():
    """`-p` for the plugin when no installed pymprof registers it (a source checkout)."""
    try:
        from importlib.metadata import entry_points
        eps = entry_points()
        group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
        if any(ep.name == "pymprof" for ep in group):
            return []
    except Exception:
        pass
    return ["-p", "pymprof.pytest_plugin"]


@pytest.mark.parametrize("rate", ["1", "64KiB"])
def test_limits_and_leaks_are_caught_with_the_site_named(pytester, rate):
    pytester.makepyfile(test_memory=TESTS)
    result = pytester.runpytest_subprocess(*plugin_args(), "--pymprof-rate", rate, "-p",
                                           "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "FAILED test_memory.py::test_over_the_limit" in out
    assert "FAILED test_memory.py::test_leaks" in out
    assert "limit_memory: the test allocated" in out and "over its limit of 24.0 MiB" in out
    assert "limit_leaks: the test left" in out
    # The sites: the lines of the test file that allocated.
    result.stdout.fnmatch_lines([
        "  test_memory.py:%d (*) ← test_memory.py:%d (test_over_the_limit): *"
        % (line_of("allocate-line"), line_of("big-line"))])
    result.stdout.fnmatch_lines([
        "  test_memory.py:%d (*) ← test_memory.py:%d (test_leaks): *"
        % (line_of("allocate-line"), line_of("leak-line"))])
    if rate != "1":
        assert "±" in out


def test_pymprof_lists_the_tests_that_allocated_most(pytester):
    pytester.makepyfile(test_memory=TESTS)
    result = pytester.runpytest_subprocess(*plugin_args(), "--pymprof", "--pymprof-top", "3",
                                           "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "pymprof: tests that allocated the most" in out
    # The table runs to the next section's rule (the short summary's FAILED lines, whole
    # when pytest sees CI set, also name tests and say "allocated").
    after = out.split("pymprof: tests that allocated the most")[1].splitlines()[1:]
    table = after[:next((i for i, line in enumerate(after) if line.startswith("=")), len(after))]
    rows = [line for line in table if "allocated" in line and "::" in line]
    assert len(rows) == 3
    assert rows[0].endswith("test_memory.py::test_over_the_limit")
    assert rows[1].endswith("test_memory.py::test_does_not_leak")


def test_a_limit_within_two_standard_errors_is_borderline():
    from pymprof.pytest_plugin import decide

    MiB = 1024 * 1024
    # Exact (rate 1): over is over, by a byte.
    assert decide("limit_memory", 24 * MiB, 24 * MiB + 1, 0.0, 1)[0] == "over"
    assert decide("limit_memory", 24 * MiB, 24 * MiB, 0.0, 1) == (None, None)
    # Sampled: over only when the estimate minus two standard errors is.
    assert decide("limit_memory", 24 * MiB, 30 * MiB, 2 * MiB, 65536)[0] == "over"
    verdict, message = decide("limit_memory", 24 * MiB, 26 * MiB, 2 * MiB, 65536)
    assert verdict == "borderline" and "within two standard errors" in message
    assert "26.0 MiB ± 2.0 MiB" in message
    assert decide("limit_leaks", 24 * MiB, 22 * MiB, 2 * MiB, 65536)[0] == "borderline"
    assert decide("limit_leaks", 24 * MiB, 19 * MiB, 2 * MiB, 65536) == (None, None)


def test_a_borderline_estimate_passes_with_a_warning_or_fails_when_asked(pytester):
    pytester.makepyfile(test_border='''
import pytest

@pytest.mark.limit_memory("4 MB")
def test_near_the_limit():
    data = [bytes(200000) for _ in range(20)]
''')
    # At 1 MiB a sample, 4 MB of 200 KB blocks rest on a few samples: the error bar is wide,
    # and most runs are borderline. Each run is held to what it says of itself.
    args = [*plugin_args(), "--pymprof-rate", "1MiB", "-p", "no:cacheprovider", "-W",
            "always::pytest.PytestWarning"]
    seen = set()
    for mode in ("pass", "fail", "pass", "fail"):
        result = pytester.runpytest_subprocess(*args, "--pymprof-borderline", mode)
        out = result.stdout.str()
        if "within two standard errors" in out:
            seen.add(mode)
            result.assert_outcomes(**({"passed": 1} if mode == "pass" else {"failed": 1}))
            assert ("PytestWarning" in out) == (mode == "pass")
        elif "over its limit" in out:
            result.assert_outcomes(failed=1)
        else:
            result.assert_outcomes(passed=1)
    if not seen:
        pytest.skip("no run was borderline this time (each is, most of the time)")


def test_a_bad_limit_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.limit_memory("lots")
def test_bad_limit():
    pass
''')
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "limit_memory 'lots'" in result.stdout.str() + result.stderr.str()
