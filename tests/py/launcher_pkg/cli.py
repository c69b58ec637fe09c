import importlib
import os
import sys

CACHE = []


def tool_work():
    # The tool's own allocations: no frame of the user's code above them.
    for _ in range(200):
        CACHE.append(bytearray(50000))


def main():
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(sys.argv[1])
    tool_work()
    module.run()
    return 0
