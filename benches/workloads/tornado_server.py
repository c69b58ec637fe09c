"""Tornado HTTP server for benches/overhead.py (the process under the profiler).

Listens on 127.0.0.1 on an ephemeral port and prints `PORT <n>` on stdout once
it accepts connections. Routes:

    GET /items/<id>   a small JSON document built per request (dicts, lists,
                      strings, floats), the bread and butter of a JSON API
    GET /shutdown     answers, stops the IO loop, prints
                      `BENCH vmhwm_kib=<peak RSS of this process> requests=<n>`
                      and exits 0

SIGTERM stops it the same way, and it stops by itself after --max-seconds, so
a lost driver never leaves it running. Needs tornado (pip install -r benches/requirements.txt).
"""

import argparse
import hashlib
import signal
import socket
import sys

import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web

from peak_rss import peak_rss_kib

CATEGORIES = ("books", "games", "garden", "kitchen", "music", "office", "sports", "toys")


def build_item(item_id):
    """The response body: derived from the id so that it is built afresh every time."""
    digest = hashlib.sha1(str(item_id).encode()).hexdigest()
    return {
        "id": item_id,
        "sku": "SKU-%08d" % item_id,
        "name": "Item %s" % digest[:10],
        "category": CATEGORIES[item_id % len(CATEGORIES)],
        "price": {"amount": round((item_id % 9973) / 7.0, 2), "currency": "EUR"},
        "stock": [{"warehouse": "wh-%d" % w, "count": (item_id * (w + 3)) % 97} for w in range(3)],
        "tags": sorted({digest[i : i + 3] for i in range(0, 12, 3)}),
        "related": [(item_id * 31 + k) % 100000 for k in range(4)],
    }


class ItemHandler(tornado.web.RequestHandler):
    def get(self, item_id):
        self.application.settings["stats"]["requests"] += 1
        self.write(build_item(int(item_id)))


class ShutdownHandler(tornado.web.RequestHandler):
    def get(self):
        self.write({"stopping": True})
        self.finish()
        tornado.ioloop.IOLoop.current().add_callback(tornado.ioloop.IOLoop.current().stop)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop by itself after this long")
    args = parser.parse_args()

    stats = {"requests": 0}
    app = tornado.web.Application(
        [(r"/items/([0-9]+)", ItemHandler), (r"/shutdown", ShutdownHandler)],
        stats=stats,
    )
    sockets = tornado.netutil.bind_sockets(0, address="127.0.0.1", family=socket.AF_INET)
    server = tornado.httpserver.HTTPServer(app, xheaders=False)
    server.add_sockets(sockets)
    loop = tornado.ioloop.IOLoop.current()
    loop.call_later(args.max_seconds, loop.stop)
    loop.asyncio_loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print("PORT %d" % sockets[0].getsockname()[1], flush=True)
    loop.start()
    server.stop()
    print("BENCH vmhwm_kib=%d requests=%d" % (peak_rss_kib(), stats["requests"]), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
