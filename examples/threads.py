"""Four named threads allocating 1, 2, 4 and 8 units of memory.

Each thread runs its own function (`small_worker`, `medium_worker`,
`large_worker`, `huge_worker`) that builds lists of 1 KiB byte strings and
keeps them until the thread finishes; one unit is 4 MiB, so the threads hold
4, 8, 16 and 32 MiB at the same time when they meet at a barrier.

    mprof record -o threads.mprof -- python3 examples/threads.py
    mprof report threads.mprof --view peak --by function

What the profile should show: the four worker functions with bytes in the
ratio 1 : 2 : 4 : 8 (about 4, 8, 16 and 32 MiB) in the allocated and peak
views, within the ± stderr the report prints (exact with `--rate 1`); at the
end nothing of theirs is live, since every thread drops its data as it
exits. The threads are named small, medium, large and huge, for the views
that show threads.

Runs in well under a second; Python 3.8+, standard library only.
"""

import threading

UNIT = 4 * 1024 * 1024
CHUNK = 1024
_barrier = threading.Barrier(4)


# One function per thread, so that the profile tells them apart by function as well as by
# thread. Plain loops rather than comprehensions: before 3.12 a comprehension is a frame of
# its own (`<listcomp>`), which would hide the worker's name.


def small_worker(results):
    kept = []
    for _ in range(1 * UNIT // CHUNK):
        kept.append(bytes(CHUNK))
    _barrier.wait()
    results["small"] = len(kept)


def medium_worker(results):
    kept = []
    for _ in range(2 * UNIT // CHUNK):
        kept.append(bytes(CHUNK))
    _barrier.wait()
    results["medium"] = len(kept)


def large_worker(results):
    kept = []
    for _ in range(4 * UNIT // CHUNK):
        kept.append(bytes(CHUNK))
    _barrier.wait()
    results["large"] = len(kept)


def huge_worker(results):
    kept = []
    for _ in range(8 * UNIT // CHUNK):
        kept.append(bytes(CHUNK))
    _barrier.wait()
    results["huge"] = len(kept)


def main():
    results = {}
    jobs = (("small", small_worker), ("medium", medium_worker), ("large", large_worker), ("huge", huge_worker))
    workers = [threading.Thread(target=fn, args=(results,), name=name) for name, fn in jobs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for name in ("small", "medium", "large", "huge"):
        print("%-6s held %6d chunks (%d MiB)" % (name, results[name], results[name] * CHUNK // (1024 * 1024)))


if __name__ == "__main__":
    main()
