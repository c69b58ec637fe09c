"""The snapshot table mprof's reader sends (``src/inprocess/wire.rs`` draws its layout),
turned into the raw traces a :class:`pymprof.tracemalloc.Snapshot` holds.

A raw trace is a tuple ``(domain, size, frames, total_nframe, count, variance, block_size,
seq)``: ``frames`` is a tuple of ``(filename, lineno)``, most recent first (shared between the
traces of one traceback); ``size`` and ``count`` are what the sample stands for (the block's
own size and 1 when every allocation is traced), ``variance`` its share of a sum's variance,
``seq`` the sample's number in its session.
"""

import struct

MAGIC = b"PMSNAP01"
_ROW = struct.Struct("<IIdddQQ")
_NONE = 0xFFFFFFFF


def decode(raw):
    """(sample rate, raw traces) of a snapshot table."""
    if raw[:8] != MAGIC:
        raise ValueError("not a snapshot table")
    (rate,) = struct.unpack_from("<Q", raw, 8)
    pos = 16
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    strings = []
    for _ in range(n):
        (length,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        strings.append(raw[pos:pos + length].decode("utf-8", "surrogateescape"))
        pos += length
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    flat = struct.unpack_from("<%dI" % (2 * n), raw, pos)
    pos += 8 * n
    frames = [(strings[flat[i]], flat[i + 1]) for i in range(0, 2 * n, 2)]
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    tracebacks = []
    for _ in range(n):
        total, k = struct.unpack_from("<II", raw, pos)
        pos += 8
        ids = struct.unpack_from("<%dI" % k, raw, pos)
        pos += 4 * k
        tracebacks.append((tuple(frames[i] for i in ids), None if total == _NONE else total))
    (n,) = struct.unpack_from("<I", raw, pos)
    pos += 4
    rows = _ROW.iter_unpack(raw[pos:pos + n * _ROW.size])
    traces = [
        (domain, size, tracebacks[tb][0], tracebacks[tb][1], count, variance, block, seq)
        for domain, tb, size, count, variance, block, seq in rows
    ]
    return rate, traces
