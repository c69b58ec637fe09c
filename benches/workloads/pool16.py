"""16 multiprocessing workers (fork) doing allocation-heavy work, for benches/workers.py.

Each worker builds and drops dicts, lists and strings for ROUNDS rounds. Prints
"BENCH elapsed_s=<seconds>" (the pool's work only) as its last line.

usage: pool16.py [--workers N] [--rounds N]
"""
import argparse
import multiprocessing as mp
import time


def work(seed):
    total = 0
    for r in range(40):
        rows = [{"id": i, "name": "user%d" % (i * seed % 997), "tags": [str(i), str(r)]}
                for i in range(2000)]
        index = {row["name"]: row for row in rows}
        total += len(index) + sum(len(row["tags"]) for row in rows)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    with ctx.Pool(args.workers) as pool:
        for _ in range(args.rounds):
            pool.map(work, range(args.workers * 2))
    print("BENCH elapsed_s=%.6f" % (time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
