"""A request handler whose cache never forgets: the classic slow leak.

Every request is parsed, rendered to a page of about 1.2 KB, and the page is
memoised in a module-level dict keyed by the request id. Request ids never
repeat, so the cache never hits and only grows: by the end it holds 20,000
pages (about 23 MB). The parsing and JSON encoding done for each request
allocate twenty times more in total, but that memory is freed at once.

    mprof record -o leaky.mprof -- python3 examples/leaky_cache.py
    mprof report leaky.mprof --view allocated   # parse_request and json lead
    mprof report leaky.mprof --view live        # render_profile's page line holds ~85%
    mprof report leaky.mprof --view peak        # same: the cache is the peak

What the profile should show: in the allocated view the per-request work
(`parse_request`, the json encoder) dominates, around 500 MiB; in the live
and peak views it has vanished, and the line of `render_profile` that builds
the page (the string the cache keeps) holds most of a ~25 MiB heap, with the
cache dict itself growing in `remember`. That contrast between allocated and
live is how a leak looks: the place that allocates the leaked objects, not
the one that stores them, is what the live view names.

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
    history = []  # a loop, not a comprehension: before 3.12 that would be a frame of its own
    for i in range(60):
        history.append(fields["user"] + "-" + str(i))
    fields["history"] = history
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
