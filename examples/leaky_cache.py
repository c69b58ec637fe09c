"""A request handler whose cache never forgets: the classic slow leak.

`render_profile()` memoises its output in a module-level dict keyed by the
request id. Request ids never repeat, so the cache never hits and only grows:
by the end it holds about 20,000 rendered pages (~40 MiB). The parsing done
for each request allocates much more in total but is freed at once.

    mprof record -o leaky.mprof -- python3 examples/leaky_cache.py
    mprof report leaky.mprof --view allocated   # parse_request and render_profile lead
    mprof report leaky.mprof --view live        # remember() holds almost everything
    mprof report leaky.mprof --view peak        # same: the cache is the peak

What the profile should show: in the allocated view the per-request work
(`parse_request`, `render_profile`) dominates; in the live and peak views
the line in `remember` that stores into `_CACHE` holds nearly all the bytes,
and the live heap at the end is about the size of the cache. That contrast
(allocated vs live) is how a leak looks.

Runs in about a second; Python 3.8+, standard library only.
"""

import json

_CACHE = {}


def parse_request(raw):
    """Turn a raw query string into a dict, allocating a fair amount on the way."""
    fields = {}
    for pair in raw.split("&"):
        key, _, value = pair.partition("=")
        fields[key] = value
    fields["history"] = [fields["user"] + "-" + str(i) for i in range(40)]
    return fields


def render_profile(fields):
    """A page of about 2 KB of text, built from the parsed request."""
    body = json.dumps(fields, indent=2)
    return "<html><body><pre>" + body + "</pre></body></html>"


def remember(request_id, page):
    # The bug: the key is unique per request, so nothing is ever reused or evicted.
    _CACHE[request_id] = page


def handle(request_id):
    raw = "user=u%05d&lang=en&theme=dark&page=%d&ref=search" % (request_id % 977, request_id)
    page = render_profile(parse_request(raw))
    remember(request_id, page)
    return len(page)


def main():
    served = sum(handle(request_id) for request_id in range(20000))
    cached = sum(len(page) for page in _CACHE.values())
    print("served %.1f MB, cache holds %d pages (%.1f MB of text)" % (served / 1e6, len(_CACHE), cached / 1e6))


if __name__ == "__main__":
    main()
