"""Targets for the agent-lifecycle tests. Each prints "ready PID" and then obeys files that the
test creates in DIR (the script waits for DIR/NAME to exist).

usage: lifecycle_target.py fork DIR         wait for "go", fork a child (which exits at once),
                                            print "forked"; run with -W error::DeprecationWarning
                                            so a fork warning ends the program with an error
       lifecycle_target.py tracemalloc DIR  tracemalloc started before any attach; on "stop",
                                            tracemalloc.stop() then allocate in after_stop(); on
                                            "second", allocate in second_session(); on "finish", exit
       lifecycle_target.py churn            allocate and free forever, in a loop
"""
import os
import sys
import time

mode = sys.argv[1]


def wait(name):
    path = os.path.join(sys.argv[2], name)
    while not os.path.exists(path):
        time.sleep(0.005)


def mark(name):
    with open(os.path.join(sys.argv[2], name), "w"):
        pass


kept = []


def after_stop():
    for _ in range(200):
        kept.append(bytearray(10000))


def second_session():
    for _ in range(300):
        kept.append(bytearray(10000))


if mode == "fork":
    print("ready", os.getpid(), flush=True)
    wait("go")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print("forked", flush=True)
elif mode == "tracemalloc":
    import tracemalloc

    tracemalloc.start()
    print("ready", os.getpid(), flush=True)
    wait("stop")
    tracemalloc.stop()
    after_stop()
    mark("stopped")
    wait("second")
    second_session()
    mark("allocated")
    wait("finish")
elif mode == "churn":
    print("ready", os.getpid(), flush=True)
    while True:
        junk = [str(i) * 3 for i in range(2000)]
        kept.append(bytearray(4096))
        if len(kept) > 200:
            del kept[:100]
