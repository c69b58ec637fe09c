"""Eight threads that compress with lzma and zlib (both allocate through PyMem_RawMalloc with
the GIL released) and hash with hashlib (OpenSSL's malloc), keeping the compressed results in
a function of their own (keep_results_0 ... keep_results_7).

usage: raw_threads.py DIR
Prints "ready PID", waits for DIR/go, runs, prints "truth FUNCTION BYTES" (what each
function keeps, by sys.getsizeof), then "done", and waits for DIR/finish.
"""
import hashlib
import lzma
import os
import sys
import threading
import time
import zlib

DIR = sys.argv[1]
ROUNDS = 6
# Incompressible (compressed outputs as big as their input), so that what the functions keep
# dwarfs the few hundred bytes of caches the interpreter keeps per function (a frame, small
# bytes objects).
data = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(8192))
results = dict.fromkeys(range(8))  # sized now: no thread resizes it later


def wait(name):
    while not os.path.exists(os.path.join(DIR, name)):
        time.sleep(0.01)


def make_worker(i):
    namespace = {"lzma": lzma, "zlib": zlib, "hashlib": hashlib, "data": data, "ROUNDS": ROUNDS,
                 "results": results}
    exec(
        f"def keep_results_{i}():\n"
        f"    keep = []\n"
        f"    for r in range(ROUNDS):\n"
        f"        keep.append(lzma.compress(data[r:65536] + bytes([{i}])))\n"
        f"        keep.append(zlib.compress(data[:-r - 1], 6))\n"
        f"        hashlib.sha256(data).digest()\n"
        f"    results[{i}] = keep\n",
        namespace,
    )
    return namespace[f"keep_results_{i}"]


workers = [threading.Thread(target=make_worker(i)) for i in range(8)]
print("ready", os.getpid(), flush=True)
wait("go")
for t in workers:
    t.start()
for t in workers:
    t.join()
for i, keep in sorted(results.items()):
    print("truth", f"keep_results_{i}", sys.getsizeof(keep) + sum(map(sys.getsizeof, keep)),
          flush=True)
print("done", flush=True)
wait("finish")
