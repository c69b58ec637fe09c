"""Which pymprof the tests run: under tests/wheel.rs (PYMPROF_EXPECT_INSTALLED=1), the copy
installed from the wheel into this venv, its mprof binary included, never the source tree."""

import os
import shutil
import sys

import pytest

import pymprof
from pymprof._binary import find_mprof

installed = pytest.mark.skipif(os.environ.get("PYMPROF_EXPECT_INSTALLED") != "1",
                               reason="run from a source checkout")


@installed
def test_pymprof_and_its_binary_come_from_the_venv():
    prefix = os.path.realpath(sys.prefix)
    assert sys.prefix != sys.base_prefix, "not in a venv"
    assert os.path.realpath(pymprof.__file__).startswith(prefix + os.sep), pymprof.__file__
    binary = os.path.realpath(find_mprof())
    assert binary.startswith(prefix + os.sep), binary
    assert "PYMPROF_MPROF" not in os.environ
    on_path = shutil.which("mprof", path=os.path.dirname(sys.executable))
    assert on_path is not None and os.path.realpath(on_path) == binary
