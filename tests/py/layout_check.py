"""Loads the mprof agent into this interpreter with ctypes and asks it to check layout rows
(hex-encoded PyLayout structs, one per argument) against this interpreter, from inside a few
nested Python frames. Prints one line per row: "ok" or "refused: WHY". Then "alive".

usage: layout_check.py AGENT_SO ROW_HEX...
"""
import ctypes
import sys

agent = ctypes.CDLL(sys.argv[1])
check = agent.mprof_agent_check_layout
check.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
check.restype = ctypes.c_int


def nested(depth, row):
    if depth:
        return nested(depth - 1, row)
    msg = ctypes.create_string_buffer(512)
    r = check(bytes.fromhex(row), msg, len(msg))
    return "ok" if r == 0 else "refused: " + msg.value.decode()


for row in sys.argv[2:]:
    print(nested(5, row), flush=True)
print("alive", flush=True)
