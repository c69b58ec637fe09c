"""Shared set-up of pymprof's Python tests (run from an installed pymprof, see tests/wheel.rs).

``PYMPROF_AS_TRACEMALLOC=1`` puts pymprof.tracemalloc in the place of the standard module
before any test module imports it: test_tracemalloc_compat.py, written against the standard
module, then runs unchanged on the drop-in.
"""

import os
import sys

if os.environ.get("PYMPROF_AS_TRACEMALLOC") == "1":
    import pymprof.tracemalloc

    sys.modules["tracemalloc"] = pymprof.tracemalloc

pytest_plugins = ["pytester"]
