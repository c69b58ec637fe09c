"""Allocation-heavy workload for benches/overhead.py: a small log-analytics job.

Access-log lines are generated once (not timed). Each round then parses every
line into a record object (splitting strings, decoding query strings into
dicts, converting numbers), groups the records by endpoint and by user with
percentiles, renders the summary to JSON, exports every record as a JSON line
and reads the lines back. That is the kind of code a Python user calls
allocation-heavy: millions of short-lived strings, dicts, lists and small
objects, with a working set of 100-200 MiB built and dropped once per round.

Only the work is timed (time.perf_counter() around it), so interpreter
start-up and the profiler's attach are excluded. The last line of stdout is
machine-readable for the driver:

    BENCH elapsed_s=<seconds> vmhwm_kib=<peak RSS of this process> checksum=<n>

Usage: python alloc_heavy.py [--rounds N] [--lines N]
Python 3.8+, standard library only.
"""

import argparse
import json
import random
import time

from peak_rss import peak_rss_kib

METHODS = ("GET", "GET", "GET", "POST", "PUT", "DELETE")
ENDPOINTS = (
    "/api/users",
    "/api/users/{id}",
    "/api/orders",
    "/api/orders/{id}/items",
    "/api/search",
    "/static/app.js",
    "/health",
)
USERS = tuple("user%03d" % i for i in range(300))
STATUSES = (200, 200, 200, 200, 201, 204, 301, 404, 500)


class Request:
    """One parsed log line."""

    def __init__(self, ts, method, path, endpoint, query, status, size, latency_ms, user, agent):
        self.ts = ts
        self.method = method
        self.path = path
        self.endpoint = endpoint
        self.query = query
        self.status = status
        self.size = size
        self.latency_ms = latency_ms
        self.user = user
        self.agent = agent


def generate(rng, count):
    """Access-log lines, one string each."""
    lines = []
    for i in range(count):
        template = rng.choice(ENDPOINTS)
        path = template.replace("{id}", str(rng.randrange(1, 100000)))
        keys = rng.sample(("page", "q", "sort", "limit", "lang"), rng.randrange(0, 4))
        params = "&".join("%s=%s" % (key, rng.randrange(1000)) for key in keys)
        if params:
            path = path + "?" + params
        lines.append(
            "2024-03-%02dT%02d:%02d:%02d.%03dZ %s %s %d %d %.3f user=%s agent=\"client/%d.%d\""
            % (
                1 + i % 28,
                rng.randrange(24),
                rng.randrange(60),
                rng.randrange(60),
                rng.randrange(1000),
                rng.choice(METHODS),
                path,
                rng.choice(STATUSES),
                rng.randrange(100, 50000),
                rng.expovariate(1 / 40.0),
                rng.choice(USERS),
                rng.randrange(1, 5),
                rng.randrange(10),
            )
        )
    return lines


def parse_query(text):
    query = {}
    for pair in text.split("&"):
        key, _, value = pair.partition("=")
        query[key] = int(value) if value.isdigit() else value
    return query


def parse(line):
    """One log line into a Request."""
    ts, method, target, status, size, latency, user, agent = line.split(" ", 7)
    path, _, query = target.partition("?")
    parts = path.strip("/").split("/")
    endpoint = "/" + "/".join("{id}" if part.isdigit() else part for part in parts)
    return Request(
        ts,
        method,
        path,
        endpoint,
        parse_query(query) if query else {},
        int(status),
        int(size),
        float(latency),
        user.partition("=")[2],
        agent.partition("=")[2].strip('"'),
    )


def percentile(sorted_values, fraction):
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def summarise(records):
    """Per-endpoint and per-user statistics, as plain dicts and lists."""
    by_endpoint = {}
    by_user = {}
    for rec in records:
        key = rec.method + " " + rec.endpoint
        group = by_endpoint.get(key)
        if group is None:
            group = by_endpoint[key] = {"latencies": [], "bytes": 0, "statuses": {}, "users": set()}
        group["latencies"].append(rec.latency_ms)
        group["bytes"] += rec.size
        group["statuses"][rec.status] = group["statuses"].get(rec.status, 0) + 1
        group["users"].add(rec.user)
        by_user.setdefault(rec.user, []).append((rec.ts, key, rec.status))
    endpoints = []
    for key, group in sorted(by_endpoint.items()):
        latencies = sorted(group["latencies"])
        endpoints.append(
            {
                "endpoint": key,
                "requests": len(latencies),
                "bytes": group["bytes"],
                "p50_ms": round(percentile(latencies, 0.50), 3),
                "p99_ms": round(percentile(latencies, 0.99), 3),
                "statuses": {str(code): n for code, n in sorted(group["statuses"].items())},
                "distinct_users": len(group["users"]),
            }
        )
    users = []
    for user, events in by_user.items():
        events.sort()
        errors = [event for event in events if event[2] >= 500]
        users.append({"user": user, "requests": len(events), "errors": len(errors), "last": events[-1][0]})
    users.sort(key=lambda item: (-item["requests"], item["user"]))
    return {"endpoints": endpoints, "top_users": users[:50], "users": users}


def to_json_lines(records):
    """Export records as JSON lines, as a pipeline would hand them to the next stage."""
    return [
        json.dumps(
            {
                "ts": rec.ts,
                "method": rec.method,
                "endpoint": rec.endpoint,
                "path": rec.path,
                "query": rec.query,
                "status": rec.status,
                "size": rec.size,
                "latency_ms": rec.latency_ms,
                "user": rec.user,
                "agent": rec.agent,
            }
        )
        for rec in records
    ]


def run(lines, rounds):
    """The timed work. Returns a checksum so that nothing is optimised away."""
    checksum = 0
    for _ in range(rounds):
        records = [parse(line) for line in lines]
        summary = summarise(records)
        text = json.dumps(summary, sort_keys=True)
        checksum += len(json.loads(text)["users"]) + len(text)
        exported = to_json_lines(records)
        del records
        reloaded = [json.loads(line) for line in exported]
        checksum += sum(1 for row in reloaded if row["status"] >= 500)
    return checksum


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=40000, help="log lines parsed per round")
    args = parser.parse_args()
    lines = generate(random.Random(12345), args.lines)
    start = time.perf_counter()
    checksum = run(lines, args.rounds)
    elapsed = time.perf_counter() - start
    print("BENCH elapsed_s=%.6f vmhwm_kib=%d checksum=%d" % (elapsed, peak_rss_kib(), checksum), flush=True)


if __name__ == "__main__":
    main()
