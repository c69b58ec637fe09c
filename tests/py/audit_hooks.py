"""Counts the C audit hooks (PEP 578) of this interpreter whose function lies in mprof's agent.

Reads the interpreter's list of C audit hooks from `_PyRuntime` the only way a program can: it
looks in `_PyRuntime` for words that point at readable memory whose second word (an entry's
function) lies in the agent's executable mapping. Pointers are followed only into readable
mappings of /proc/self/maps. Prints "agent hooks N" and "events ok" after raising a few
audit events (a Python audit hook counts them: they must still reach it).

usage: audit_hooks.py
"""
import ctypes
import sys


def mappings():
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            out.append((lo, hi, parts[1], path))
    return out


maps = mappings()
agent_code = [(lo, hi) for lo, hi, perms, path in maps if "mprof-agent" in path and "x" in perms]
readable = [(lo, hi) for lo, hi, perms, _ in maps if perms.startswith("r")]


def inside(addr, spans, size=8):
    return any(lo <= addr and addr + size <= hi for lo, hi in spans)


runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
end = next(hi for lo, hi in readable if lo <= runtime < hi)
hooks = 0
for at in range(runtime, min(end, runtime + (1 << 20)) - 7, 8):
    word = ctypes.c_size_t.from_address(at).value
    if word % 8 == 0 and inside(word, readable, 24):
        function = ctypes.c_size_t.from_address(word + 8).value
        if inside(function, agent_code, 1):
            hooks += 1
print("agent code mapped", bool(agent_code))
print("agent hooks", hooks)

seen = []
sys.addaudithook(lambda event, args: seen.append(event) if event == "mprof.test" else None)
for _ in range(3):
    sys.audit("mprof.test", 1)
print("events ok" if len(seen) == 3 else "events lost %d" % len(seen), flush=True)
