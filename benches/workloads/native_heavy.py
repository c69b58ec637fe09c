"""Native-allocation-heavy workload for benches/overhead.py: an in-memory SQLite job.

Rows are generated once (not timed). Each round loads them into a fresh in-memory SQLite
database (the standard library's sqlite3, whose library allocates with the C library's
malloc, realloc and free), indexes them, runs grouping, sorting and join queries and drops
the database. Most allocations are the library's own, outside Python's allocators: the kind
of program where mprof's native hooks, not its PEP 445 hooks, do the work.

Only the work is timed (time.perf_counter() around it). The last line of stdout is
machine-readable for the driver:

    BENCH elapsed_s=<seconds> vmhwm_kib=<peak RSS of this process> checksum=<n>

Usage: python native_heavy.py [--rounds N] [--rows N]
Python 3.8+, standard library only.
"""

import argparse
import random
import sqlite3
import time

from peak_rss import peak_rss_kib

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def generate(rng, count):
    """(id, customer, category, amount, note) rows."""
    return [
        (
            i,
            "customer%05d" % rng.randrange(5000),
            rng.choice(WORDS),
            rng.randrange(1, 100000) / 100.0,
            " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 12))),
        )
        for i in range(count)
    ]


def one_round(rows):
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, category TEXT, amount REAL, note TEXT)")
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", rows)
    db.execute("CREATE INDEX by_customer ON orders (customer)")
    checksum = 0
    for _, total in db.execute("SELECT category, SUM(amount) FROM orders GROUP BY category"):
        checksum += int(total)
    for (note,) in db.execute("SELECT note FROM orders ORDER BY note, amount DESC LIMIT 100"):
        checksum += len(note)
    checksum += db.execute(
        "SELECT COUNT(*) FROM orders a JOIN orders b ON a.customer = b.customer AND a.id < b.id "
        "WHERE a.category = 'alpha' AND b.category = 'bravo'"
    ).fetchone()[0]
    checksum += len(db.execute("SELECT DISTINCT customer || '/' || category FROM orders").fetchall())
    db.execute("DELETE FROM orders WHERE amount < 500")
    checksum += db.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    db.close()
    return checksum


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rows", type=int, default=50000, help="rows loaded per round")
    args = parser.parse_args()
    rows = generate(random.Random(12345), args.rows)
    start = time.perf_counter()
    checksum = sum(one_round(rows) for _ in range(args.rounds))
    elapsed = time.perf_counter() - start
    print("BENCH elapsed_s=%.6f vmhwm_kib=%d checksum=%d" % (elapsed, peak_rss_kib(), checksum), flush=True)


if __name__ == "__main__":
    main()
