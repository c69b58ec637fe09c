"""A stranger at mprof's rendezvous socket (run as another user, not a descendant of the program).

usage: rendezvous_stranger.py CAPTURE SECONDS OUT

It looks for the socket of the mprof whose command line names CAPTURE.
Anyone may connect to an abstract Unix socket, and its name is listed in /proc/net/unix. For
SECONDS this opens a connection every 40 ms and says nothing on it (kept open), and on every
fifth sends a well-formed hello with a memory file, as a child handing over its ring would.
Writes "silent N hellos M" to OUT at the end.
"""
import os
import re
import socket
import struct
import sys
import time

HELLO_MAGIC, BORN_FORKED = 0x4352504D, 1

capture, seconds, out = sys.argv[1].encode(), float(sys.argv[2]), sys.argv[3]


def socket_of_mprof():
    with open("/proc/net/unix") as f:
        for line in f:
            m = re.search(r"@(mprof-(\d+)-[0-9a-f]+)", line)
            if m:
                try:
                    with open("/proc/%s/cmdline" % m.group(2), "rb") as c:
                        if capture in c.read().split(b"\0"):
                            return m.group(1)
                except OSError:
                    pass
    return None


name = None
deadline = time.time() + 30
while name is None and time.time() < deadline:
    name = socket_of_mprof()
    time.sleep(0.02)
if name is None:
    sys.exit("no rendezvous socket of an mprof writing %s" % capture.decode())

silent, hellos, kept = 0, 0, []
end = time.time() + seconds
i = 0
while time.time() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    if i % 5 == 4:
        ring = os.memfd_create("ring")
        os.ftruncate(ring, 1 << 16)
        hello = struct.pack("<IIII", HELLO_MAGIC, BORN_FORKED, os.getppid(), 0)
        s.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", ring))])
        os.close(ring)
        hellos += 1
    else:
        silent += 1
    kept.append(s)
    i += 1
    time.sleep(0.04)
with open(out, "w") as f:
    f.write("silent %d hellos %d\n" % (silent, hellos))
