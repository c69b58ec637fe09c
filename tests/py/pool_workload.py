"""multiprocessing workers that keep known bytes in a function of their own.

usage: pool_workload.py METHOD TRUTH_JSON
METHOD: fork | spawn | forkserver | prefork | forkbomb
Each worker runs keep_in_worker(n) for its tasks, which allocates n bytes objects of 10,000
bytes (one allocation each, sys.getsizeof bytes) and keeps them until the worker exits. The
parent writes {worker pid: bytes keep_in_worker keeps} to TRUTH_JSON.
prefork: a pre-fork server (a listening socket, os.fork() twice); a loopback client makes 40
connections and each worker serves 20 of them in handle_request, then exits.
forkbomb: 100 short-lived children, each allocating in short_lived() and exiting at once.
"""
import json
import multiprocessing as mp
import os
import socket
import sys
import time

# Sized up front, and the object size computed once, so that the functions below allocate
# nothing but the objects they keep.
KEPT = [None] * 1000
COUNT = [0]
SIZE = sys.getsizeof(bytes(10_000))
# Connections each pre-fork worker serves.
REQUESTS = 20


def keep_in_worker(n):
    for _ in range(n):
        KEPT[COUNT[0]] = bytes(10_000)
        COUNT[0] += 1
    # Long enough that every worker gets tasks.
    time.sleep(0.1)
    return os.getpid(), n * SIZE


def handle_request(i):
    KEPT[COUNT[0]] = bytes(5_000 + i)
    COUNT[0] += 1
    return 5_000 + i + SIZE - 10_000


def short_lived(i):
    return len([bytes(1000) for _ in range(10 + i % 5)])


def pool(method, truth_path):
    ctx = mp.get_context(method)
    truth = {}
    with ctx.Pool(2) as p:
        for pid, nbytes in p.map(keep_in_worker, [30, 20, 30, 20, 10, 40], chunksize=1):
            truth[pid] = truth.get(pid, 0) + nbytes
    return truth


def serve(srv, wfd):
    """A worker: serves REQUESTS connections (each a number, answered "ok"), then reports."""
    total = 0
    for _ in range(REQUESTS):
        conn, _ = srv.accept()
        n = int(conn.recv(64).decode())
        total += handle_request(n)
        conn.sendall(b"ok")
        conn.close()
    os.write(wfd, str(total).encode())
    os._exit(0)


def prefork():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    truth = {}
    pids = []
    for w in range(2):
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            serve(srv, wfd)
        os.close(wfd)
        pids.append((pid, r))
    srv.close()
    # The bounded loopback client: each worker serves REQUESTS connections and exits, so the
    # other takes the rest and both handle requests.
    for i in range(2 * REQUESTS):
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(str(i).encode())
            assert c.recv(2) == b"ok"
    for pid, r in pids:
        truth[pid] = int(os.read(r, 64).decode())
        os.waitpid(pid, 0)
    return truth


def mprof_fds():
    """This process's descriptors and mappings of mprof's memfds (its ring, a child's)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if "memfd:mprof" in target:
            found.append(target)
    with open("/proc/self/maps") as maps:
        found += sorted(line.split(None, 5)[-1].strip() for line in maps if "memfd:mprof" in line)
    return found


def zombies():
    """Processes whose parent is this one and that are zombies."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(pid))
    return found


def forkbomb():
    before = mprof_fds()
    for i in range(100):
        pid = os.fork()
        if pid == 0:
            short_lived(i)
            os._exit(0)
        os.waitpid(pid, 0)
    # What the 100 children left behind in their parent: mprof descriptors, zombies.
    with open(sys.argv[2] + ".leaks", "w") as f:
        json.dump({"fds_before": before, "fds_after": mprof_fds(), "zombies": zombies()}, f)
    return {}


if __name__ == "__main__":
    method, truth_path = sys.argv[1], sys.argv[2]
    if method == "prefork":
        truth = prefork()
    elif method == "forkbomb":
        truth = forkbomb()
    else:
        truth = pool(method, truth_path)
    with open(truth_path, "w") as f:
        json.dump({str(k): v for k, v in truth.items()}, f)
