"""Allocates through the test's extension `native_names` (tests/c/native_names.c, built by the
test into DIR): 32 blocks of 1 MiB from each of its three functions, kept to the end.

usage: native_names_workload.py DIR
"""
import sys

sys.path.insert(0, sys.argv[1])
import native_names  # noqa: E402


def allocate():
    for _ in range(32):
        native_names.clone(1 << 20)
        native_names.refused(1 << 20)
        native_names.hidden(1 << 20)


allocate()
