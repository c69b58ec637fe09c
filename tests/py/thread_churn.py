"""Requests handled for SECONDS, about 800 a second, each on a thread of its own (`thread`)
or on one of four long-lived threads (`pool`): the same allocations either way."""
import queue
import sys
import threading
import time


def handle(i):
    parts = [bytes(100) for _ in range(20)]
    index = {j: str(j) for j in range(20)}
    return len(parts) + len(index)


mode, seconds = sys.argv[1], float(sys.argv[2])
if mode == "pool":
    jobs, done = queue.Queue(), queue.Queue()

    def worker():
        while True:
            done.put(handle(jobs.get()))

    for _ in range(4):
        threading.Thread(target=worker, daemon=True).start()

    def run(i):
        jobs.put(i)
        done.get()

else:

    def run(i):
        t = threading.Thread(target=handle, args=(i,))
        t.start()
        t.join()


print("ready", flush=True)
n = 0
start = time.monotonic()
while time.monotonic() - start < seconds:
    for _ in range(40):
        run(n)
        n += 1
    # Paced to 800 a second (slower when the machine is).
    time.sleep(max(0.0, start + n / 800 - time.monotonic()))
print("requests", n, flush=True)
