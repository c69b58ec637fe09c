"""Temporaries, as a numpy job's: 40 MB held while small objects come and go all the time, and
ten times a 100 MB block from the C library's malloc (as numpy's array data is) made and freed
at once, 150 ms apart; with TEMPORARIES=numpy, numpy arrays of 100 MB (`numpy.empty`). Between
two points of the timeline the heap rises by 100 MB and drops back: the timeline must show ten
rises and drops, not a plateau at what is held.
"""
import ctypes
import os
import time

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
held = bytearray(40 << 20)
for _ in range(10):
    end = time.monotonic() + 0.15
    while time.monotonic() < end:
        churn = [bytes(100) for _ in range(100)]
    if os.environ.get("TEMPORARIES") == "numpy":
        import numpy

        temporary = numpy.empty(100 << 20, dtype=numpy.uint8)
        del temporary
    else:
        temporary = libc.malloc(100 << 20)
        libc.free(temporary)
print("done", len(held), flush=True)
