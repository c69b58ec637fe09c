"""Byte sizes as people write them: ``"24 MB"``, ``"512KiB"``, ``4096``.

Every unit is 1024-based whatever its spelling (``KB`` and ``KiB`` are both 1024 bytes), as
in the ``mprof`` command's ``--rate`` and in memray's ``limit_memory``.
"""

import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(value, what="size"):
    """The number of bytes ``value`` says: an int, or a string such as ``"24 MB"``."""
    if isinstance(value, bool):
        raise TypeError("%s must be a number of bytes or a string such as '24 MB', not a bool" % what)
    if isinstance(value, int):
        if value < 0:
            raise ValueError("%s cannot be negative: %d" % (what, value))
        return value
    if not isinstance(value, str):
        raise TypeError(
            "%s must be a number of bytes or a string such as '24 MB', not %s"
            % (what, type(value).__name__)
        )
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if unit is not None and len(unit) > 1 and unit[1:] not in ("b", "ib"):
        unit = None
    if m is None or unit is None or unit[:1] not in _UNITS:
        raise ValueError(
            "%s %r: expected a number of bytes with an optional unit (B, KB, MB, GB, TB)"
            % (what, value)
        )
    return int(round(float(m.group(1)) * _UNITS[unit[:1]]))


def format_size(size):
    """``12.3 MiB``: a size for messages."""
    size = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (size, unit)
        size /= 1024
    return "%.1f TiB" % size
