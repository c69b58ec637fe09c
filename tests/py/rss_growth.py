"""Grows to about 300 MiB of resident memory over about a second, then holds it a moment.

usage: rss_growth.py DIR (DIR unused: the common test runner passes one)
"""
import time

KEEP = []
for _ in range(30):
    block = bytearray(10 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just mapped
    KEEP.append(block)
    time.sleep(0.03)
time.sleep(0.4)
