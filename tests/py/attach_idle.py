"""Idle targets for attach: blocked in a system call that the attach must not disturb.

usage: attach_idle.py sleep
       attach_idle.py selectors   (a TCP echo server on 127.0.0.1, port printed)
       attach_idle.py epoll       (epoll_wait called through ctypes: prints EINTR if the call
                                    ever returns early, which the attach must not cause)
       attach_idle.py lock SECS   (blocked on a threading.Lock until SIGALRM kills it after
                                    SECS: no thread is ever at a safe point, and no Python
                                    code runs between the wait and the end)
       attach_idle.py code_dealloc FILE  (sleeps in short steps; appends to FILE every value
                                    code objects' tp_dealloc slot takes, the first one first)
Prints "ready PID [PORT]" first.
"""
import ctypes
import os
import selectors
import socket
import sys
import threading
import time

mode = sys.argv[1]

if mode == "sleep":
    print("ready", os.getpid(), flush=True)
    time.sleep(1000)

elif mode == "selectors":
    sel = selectors.DefaultSelector()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    sel.register(server, selectors.EVENT_READ)
    print("ready", os.getpid(), server.getsockname()[1], flush=True)
    while True:
        for key, _ in sel.select():
            if key.fileobj is server:
                conn, _ = server.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
            else:
                data = key.fileobj.recv(4096)
                if data:
                    key.fileobj.sendall(data)
                else:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()

elif mode == "epoll":
    libc = ctypes.CDLL(None, use_errno=True)
    epfd = libc.epoll_create1(0)
    events = ctypes.create_string_buffer(12 * 8)
    print("ready", os.getpid(), flush=True)
    while True:
        n = libc.epoll_wait(epfd, events, 8, 100_000)
        if n < 0:
            print("EINTR" if ctypes.get_errno() == 4 else f"errno {ctypes.get_errno()}", flush=True)

elif mode == "lock":
    import signal

    lock = threading.Lock()
    lock.acquire()
    signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))  # SIGALRM's default: terminate
    print("ready", os.getpid(), flush=True)
    lock.acquire()

elif mode == "code_dealloc":
    # PyTypeObject.tp_dealloc: after the object head (refcount, type, size), tp_name,
    # tp_basicsize and tp_itemsize, in every release build.
    slot = ctypes.c_void_p.from_address(id(type(compile("", "", "exec"))) + 48)
    seen = None
    print("ready", os.getpid(), flush=True)
    while True:
        if slot.value != seen:
            seen = slot.value
            with open(sys.argv[2], "a") as f:
                f.write("%d\n" % seen)
        time.sleep(0.002)
