#!/usr/bin/env python3
"""Run directly through its #! line."""
KEEP = []


def shebang_alloc():
    for _ in range(100):
        KEEP.append(bytes(100000))


shebang_alloc()
