"""A hostile target for `attach --native`: it loads a copy of a library it owns, then cuts that
file short and writes the rest back, over and over, hoping that root's mprof maps it and dies
of SIGBUS while it reads it. It cuts only what the loader does not map (the section headers and
the symbol table at the file's end): its own mappings of the library stay whole, so the target
itself never faults.

usage: truncating_library.py LIBRARY DIR
Started as root, it becomes `nobody` first. Copies LIBRARY into DIR (nobody's), loads the copy,
prints "ready PID" and truncates/rewrites until DIR/stop exists; then puts the file back whole,
prints "done rewrites=N" and leaves with os._exit(0) (the loader would read the library's
pages at exit).
"""
import ctypes
import os
import shutil
import sys
import threading
import time

lib, dir_ = sys.argv[1], sys.argv[2]
if os.getuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as a user's own process has
copy = os.path.join(dir_, "libvictim.so")
shutil.copyfile(lib, copy)
with open(copy, "rb") as f:
    whole = f.read()
ctypes.CDLL(copy)


def loaded_end(elf):
    """Where the last loaded segment's bytes end in the file, rounded up to a page."""
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    size = int.from_bytes(elf[0x36:0x38], "little")
    count = int.from_bytes(elf[0x38:0x3A], "little")
    end = 0
    for i in range(count):
        ph = elf[phoff + i * size:phoff + (i + 1) * size]
        if int.from_bytes(ph[0:4], "little") == 1:  # PT_LOAD
            offset = int.from_bytes(ph[8:16], "little")
            filesz = int.from_bytes(ph[32:40], "little")
            end = max(end, offset + filesz)
    return (end + 4095) & ~4095


cut = loaded_end(whole)
assert 0 < cut < len(whole), "no unmapped tail to cut"
stop = os.path.join(dir_, "stop")
rewrites = 0
running = True


def churn():
    kept = []
    while running:
        kept.append(bytearray(200))
        if len(kept) > 1000:
            kept = []
        time.sleep(0.0001)


threading.Thread(target=churn, daemon=True).start()
print("ready", os.getpid(), flush=True)
while not os.path.exists(stop):
    with open(copy, "r+b") as f:
        f.truncate(cut)
        f.flush()
        f.seek(cut)
        f.write(whole[cut:])
    rewrites += 1
running = False
with open(copy, "r+b") as f:
    f.write(whole)
print("done rewrites=%d" % rewrites, flush=True)
sys.stdout.flush()
os._exit(0)
