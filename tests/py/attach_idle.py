"""Idle targets for attach: blocked in a system call that the attach must not disturb.

usage: attach_idle.py sleep
       attach_idle.py selectors   (a TCP echo server on 127.0.0.1, port printed)
       attach_idle.py epoll       (epoll_wait called through ctypes: prints EINTR if the call
                                    ever returns early, which the attach must not cause)
       attach_idle.py futex SECS  (blocked in a raw futex wait, called through ctypes, until
                                    SIGALRM kills it after SECS: a wait mprof cannot tell
                                    from one inside the C library's locks, so no thread is
                                    ever at a safe point, and no Python code runs between the
                                    wait and the end)
       attach_idle.py lock_waits  (every thread waits on a Python lock: the main thread in
                                    Thread.join(), a worker in queue.get(); SIGUSR1 puts a
                                    1 MiB item in the queue, the worker prints "got N" and
                                    ends, and so does the program)
       attach_idle.py select_after_signals  (handles fifty SIGUSR1s while 40 frames deep and
                                    busy, then waits in select.select(), whose uninitialised
                                    locals keep the old signal frames' return addresses)
       attach_idle.py busy_then_idle FILE  (allocates in a loop 40 frames deep until FILE
                                    exists, then waits in select.select())
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

elif mode == "futex":
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    word = ctypes.c_int(0)
    signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))  # SIGALRM's default: terminate
    print("ready", os.getpid(), flush=True)
    # futex(&word, FUTEX_WAIT, 0, NULL): waits until a signal ends the process.
    libc.syscall(202, ctypes.byref(word), 0, 0, None)

elif mode == "lock_waits":
    import queue
    import signal

    items = queue.Queue()
    signal.signal(signal.SIGUSR1, lambda *_: items.put(bytearray(1 << 20)))
    got = []
    worker = threading.Thread(target=lambda: got.append(len(items.get())))
    worker.start()
    print("ready", os.getpid(), flush=True)
    worker.join()
    print("got", got[0], flush=True)

elif mode in ("select_after_signals", "busy_then_idle"):
    import json
    import select
    import signal

    def deep(n, work):
        return deep(n - 1, work) if n else work()

    if mode == "select_after_signals":
        signal.signal(signal.SIGUSR1, lambda *_: None)
        main = threading.get_ident()
        def signaller():
            for _ in range(50):
                signal.pthread_kill(main, signal.SIGUSR1)
                time.sleep(0.02)
        def busy():
            # In the JSON encoder's C code while the signals come: each signal's frame is
            # written below it, where select's locals will lie.
            sender = threading.Thread(target=signaller)
            sender.start()
            while sender.is_alive():
                json.dumps({"a": [1, 2, 3] * 100, "b": {"c": [{"d": "e"}] * 50}})
            sender.join()
        deep(40, busy)
        print("ready", os.getpid(), flush=True)
    else:
        print("ready", os.getpid(), flush=True)
        def busy():
            while not os.path.exists(sys.argv[2]):
                [bytearray(1000) for _ in range(2000)]
                select.select([], [], [], 0.001)
        deep(40, busy)
        print("idle", flush=True)
    while True:
        select.select([], [], [], 0.5)  # idle, as a server between requests

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
