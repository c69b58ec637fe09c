"""Allocates at a steady pace for a few seconds, keeping a known number of bytes, while the
test stops and resumes the reader (mprof) again and again. Writes the true live bytes per
function as JSON to argv[1] at the end.

Each round keeps 100 bytes objects of 200 bytes in a list sized up front (so nothing else
stays live in `kept`), churns 2,000 objects of 1,000 bytes that are freed at once, and sleeps
5 ms: some 50 MB/s of records at `--rate 1`, so that a stopped reader has a backlog to catch up
with, and time to.
"""
import json
import sys
import time

ROUNDS = 400
PER_ROUND = 100
KEEP = [None] * (ROUNDS * PER_ROUND)


def kept(start, n):
    for i in range(start, start + n):
        KEEP[i] = bytes(200)
    return n * sys.getsizeof(bytes(200))


def churn(n):
    total = 0
    for _ in range(n):
        total += len(bytes(1000))
    return total


if __name__ == "__main__":
    truth = 0
    for r in range(ROUNDS):
        truth += kept(r * PER_ROUND, PER_ROUND)
        churn(2_000)
        time.sleep(0.005)
    with open(sys.argv[1], "w") as f:
        json.dump({"kept": truth}, f)
