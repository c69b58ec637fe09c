"""A hostile target: once mprof's ring is mapped in this process, it scribbles on it.

Usage: ring_scribbler.py MODE [--drop]
MODE: header | head | length | state | garbage | truncate-race
--drop: become nobody first (for record, where the target starts as mprof's user).
Prints "ready PID" at start, "scribbled MODE" after the attack, and exits 0 a moment later.
With truncate-race, a thread tries to resize the ring's memory file from the moment its
descriptor appears (the attach injects it) and prints what the kernel answered."""

import ctypes
import errno
import os
import sys
import threading
import time

mode = sys.argv[1]
if "--drop" in sys.argv:
    os.setgid(65534)
    os.setuid(65534)


def ring_mapping():
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:mprof-ring" in line:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                return start, end
    return None


def ring_fds():
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "mprof-ring" in os.readlink("/proc/self/fd/" + name):
                fds.append(int(name))
        except OSError:
            pass
    return fds


answers = {}


def truncate_race():
    deadline = time.time() + 30
    kept = []  # private copies: the attach closes the target's descriptor once it is mapped
    while time.time() < deadline and "done" not in answers:
        for fd in ring_fds():
            if fd not in kept:
                try:
                    kept.append(os.dup(fd))
                except OSError:
                    pass
            for size in (0, 4096, 1 << 30):
                try:
                    os.ftruncate(fd, size)
                    answers["resized"] = answers.get("resized", 0) + 1
                except OSError as e:
                    name = errno.errorcode.get(e.errno, str(e.errno))
                    answers[name] = answers.get(name, 0) + 1


racer = None
if mode == "truncate-race":
    racer = threading.Thread(target=truncate_race, daemon=True)
    racer.start()

print("ready", os.getpid(), flush=True)
keep = []
deadline = time.time() + 30
while ring_mapping() is None and time.time() < deadline:
    keep.append(bytearray(1000))
    time.sleep(0.001)
span = ring_mapping()
if span is None:
    print("no ring", flush=True)
    sys.exit(3)
start, end = span
data_size = end - start - 4096
u64 = lambda off: ctypes.c_uint64.from_address(start + off)
u32 = lambda off: ctypes.c_uint32.from_address(start + off)
for i in range(2000):
    keep.append(bytearray(1000))

if mode == "header":
    ctypes.memmove(start, b"\xff" * 24, 24)  # magic, version, header size, data size
elif mode == "head":
    u64(512).value = 1 << 62
elif mode == "length":
    tail = u64(576).value
    u32(4096 + tail % data_size).value = 12
    u64(512).value = tail + 64
elif mode == "state":
    u32(48).value = 77
elif mode == "garbage":
    tail = u64(576).value
    pos = 4096 + tail % data_size
    junk = bytes((i * 37 + 11) % 256 for i in range(4096))
    ctypes.memmove(start + pos, junk, len(junk))
    u64(512).value = tail + 4096
print("scribbled", mode, flush=True)
for i in range(2000):
    keep.append(bytearray(1000))
time.sleep(1.5)
if racer is not None:
    answers["done"] = 1
    racer.join()
    print("truncate answers", sorted(answers.items()), flush=True)
print("target done", flush=True)
