"""Load generator for benches/workloads/tornado_server.py (never profiled).

Opens --connections keep-alive HTTP/1.1 connections to 127.0.0.1:PORT and
sends GET /items/<id> on them one after another until --requests responses
have arrived (after --warmup untimed ones). Several connections keep the
single-threaded server busy all the time, so the throughput measured here is
the server's, and a profiler slowing the server down shows up in it.

The client is deliberately lean (asyncio streams, hand-written HTTP/1.1, no
JSON decoding except a spot check) so that it spends far less CPU per request
than the server. The last line of stdout is machine-readable for the driver:

    BENCH requests=<n> elapsed_s=<seconds> rps=<requests per second>

Exits non-zero if a response is malformed or --max-seconds pass first.
Python 3.8+, standard library only.
"""

import argparse
import asyncio
import json
import sys
import time


class BadResponse(Exception):
    pass


async def read_response(reader):
    """One response: (status, body). Only Content-Length framing, as tornado sends for these."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise BadResponse("bad status line %r" % lines[0])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None:
        raise BadResponse("response without Content-Length")
    body = await reader.readexactly(length)
    return int(parts[1]), body


async def connection(port, counter, total, index):
    """Send requests on one keep-alive connection while the shared budget lasts."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while counter[0] < total:
            counter[0] += 1
            item_id = (counter[0] * 7919 + index) % 100000
            writer.write(b"GET /items/%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % item_id)
            status, body = await read_response(reader)
            if status != 200:
                raise BadResponse("status %d for item %d" % (status, item_id))
            if counter[0] % 1000 == 0 and json.loads(body)["id"] != item_id:
                raise BadResponse("wrong body for item %d" % item_id)
    finally:
        writer.close()


async def drive(port, connections, requests):
    counter = [0]
    await asyncio.gather(*(connection(port, counter, requests, i) for i in range(connections)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--warmup", type=int, default=500, help="untimed requests sent first")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()

    async def bounded(count):
        await asyncio.wait_for(drive(args.port, args.connections, count), args.max_seconds)

    try:
        asyncio.run(bounded(args.warmup))
        start = time.perf_counter()
        asyncio.run(bounded(args.requests))
        elapsed = time.perf_counter() - start
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, BadResponse) as err:
        print("tornado_client: %s: %s" % (type(err).__name__, err), file=sys.stderr)
        sys.exit(1)
    print("BENCH requests=%d elapsed_s=%.6f rps=%.1f" % (args.requests, elapsed, args.requests / elapsed), flush=True)


if __name__ == "__main__":
    main()
