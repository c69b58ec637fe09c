"""Four named threads allocating 1, 2, 4 and 8 units of memory.

Each thread runs its own function (`small_worker`, `medium_worker`,
`large_worker`, `huge_worker`) that builds lists of 1 KiB byte strings and
keeps them until the thread finishes; one unit is 4 MiB, so the threads hold
4, 8, 16 and 32 MiB at the same time when they meet at a barrier.

    mprof record -o threads.mprof -- python3 examples/threads.py
    mprof report threads.mprof --view peak --by function

What the profile should show: the four worker functions with bytes in the
ratio 1 : 2 : 4 : 8 (about 4, 8, 16 and 32 MiB) in the allocated and peak
views, and thread names small, medium, large and huge; at the end nothing
of theirs is live, since every thread drops its data before it exits.

Runs in well under a second; Python 3.8+, standard library only.
"""

import threading

UNIT = 4 * 1024 * 1024
CHUNK = 1024
_barrier = threading.Barrier(4)


def hold(units):
    """Build `units` x 4 MiB of 1 KiB byte strings, wait for the other threads, then drop them."""
    kept = [bytes(CHUNK) + b"" for _ in range(units * UNIT // CHUNK)]
    _barrier.wait()
    return len(kept)


def small_worker(results):
    results["small"] = hold(1)


def medium_worker(results):
    results["medium"] = hold(2)


def large_worker(results):
    results["large"] = hold(4)


def huge_worker(results):
    results["huge"] = hold(8)


def main():
    results = {}
    workers = [
        threading.Thread(target=fn, args=(results,), name=name)
        for name, fn in (("small", small_worker), ("medium", medium_worker), ("large", large_worker), ("huge", huge_worker))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for name in ("small", "medium", "large", "huge"):
        print("%-6s held %6d chunks (%d MiB)" % (name, results[name], results[name] * CHUNK // (1024 * 1024)))


if __name__ == "__main__":
    main()
