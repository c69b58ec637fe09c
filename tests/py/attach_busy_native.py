"""A target whose only thread spends seconds in OpenSSL (hashlib.pbkdf2_hmac releases the
GIL and runs in libcrypto): attach must find it at a safe point there. Prints the digests,
which the test compares with an unprofiled run.

usage: attach_busy_native.py ROUNDS ITERATIONS
"""
import hashlib
import os
import sys

rounds, iterations = int(sys.argv[1]), int(sys.argv[2])
print("ready", os.getpid(), flush=True)
digests = []
for i in range(rounds):
    digests.append(hashlib.pbkdf2_hmac("sha256", b"mprof", b"salt%d" % i, iterations).hex())
    print("round", i, flush=True)
print("done", hashlib.sha256("".join(digests).encode()).hexdigest(), flush=True)
