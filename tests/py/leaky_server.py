"""A small HTTP server that leaks on every request (tests/continuous.rs).

Each GET keeps 20,000 bytes in a module-level list (the leak, at the line tagged below) and
makes some garbage that is freed at once. Prints "ready PID PORT" once it listens on
loopback; runs until SIGTERM or SIGINT, then exits 0.
"""

import http.server
import os
import signal
import sys

kept = []


def handle():
    kept.append(bytearray(20_000))  # leak-line
    garbage = [str(i) * 10 for i in range(200)]
    return len(garbage)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n = handle()
        body = b"%d %d\n" % (len(kept), n)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def stop(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, stop)
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print("ready", os.getpid(), server.server_address[1], flush=True)
try:
    server.serve_forever(poll_interval=0.05)
except KeyboardInterrupt:
    pass
sys.exit(0)
