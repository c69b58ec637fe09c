"""Touches 300 MiB at once, lets it go, then kills itself (no exit handshake with mprof).

The spike lasts about a tenth of a second: mprof's RSS readings, ten a second, catch it
part-way or not at all, and the program dies before the next.
"""
import os
import signal

spike = b"x" * (300 << 20)  # every page written: resident
del spike
os.kill(os.getpid(), signal.SIGKILL)
