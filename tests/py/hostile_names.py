"""Allocates from code objects whose names and file names hold terminal control sequences
(screen clear, OSC 52 clipboard write, title change), from a deep recursion, from threads."""

import threading

EVIL_FILE = "evil\x1b]52;c;aGFja2Vk\x07\x1b[2J.py"
EVIL_NAME = "boom\x1b]0;pwned\x07\x1b[31m\u202e"

SOURCE = """
def grow(n):
    keep = []
    for i in range(n):
        keep.append(bytearray(4096))
    return keep
"""

namespace = {}
exec(compile(SOURCE, EVIL_FILE, "exec"), namespace)
grow = namespace["grow"]
grow.__code__ = grow.__code__.replace(co_name=EVIL_NAME, co_qualname=EVIL_NAME) if hasattr(
    grow.__code__, "co_qualname"
) else grow.__code__.replace(co_name=EVIL_NAME)


def deep(n):
    if n == 0:
        return grow(100)
    return deep(n - 1)


kept = [deep(300)]
threads = [threading.Thread(target=lambda: kept.append(grow(100))) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
del kept[1:]
print("done")
