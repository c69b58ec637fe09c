"""Three interpreters with a GIL of their own each (CPython 3.12+) allocate at the same time, on
three threads, while the main interpreter allocates too. `churn` (in the interpreters) makes
small strings and 1000-byte buffers; `main_work` (here) makes 1000-byte buffers. With the
argument `legacy`, the interpreters share the main one's GIL (as mod_wsgi makes them)."""
import sys
import threading

CODE = """
def churn():
    data = []
    for i in range(150000):
        data.append(str(i) * 3)
        if len(data) > 5000:
            data.clear()
    big = [bytearray(1000) for _ in range(5000)]
    return len(big)
churn()
"""

LEGACY = sys.argv[1:] == ["legacy"]

if sys.version_info >= (3, 13):
    import _interpreters

    def run_isolated():
        interp = _interpreters.create("legacy" if LEGACY else "isolated")
        failed = _interpreters.exec(interp, CODE)
        _interpreters.destroy(interp)
        if failed is not None:
            raise RuntimeError(f"the interpreter failed: {failed}")
else:
    import _xxsubinterpreters as _interpreters

    def run_isolated():
        interp = _interpreters.create(isolated=not LEGACY)
        _interpreters.run_string(interp, CODE)
        _interpreters.destroy(interp)


def main_work():
    keep = [bytearray(1000) for _ in range(20000)]
    return len(keep)


threads = [threading.Thread(target=run_isolated) for _ in range(3)]
for t in threads:
    t.start()
main_work()
for t in threads:
    t.join()
