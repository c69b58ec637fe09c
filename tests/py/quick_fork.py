"""Forks that are gone before mprof looks at them.

usage: quick_fork.py PID_FILE
The program forks 8 children one after another; each allocates 20 bytes objects of 10,000
bytes and exits at once (os._exit), and the parent reaps it straight away. PID_FILE gets the
children's pids, one a line. Then the program ends too: mprof may drain the children's rings
after every process of the tree is gone.
"""
import os
import sys

children = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        kept = [bytes(10_000) for _ in range(20)]
        os._exit(0)
    os.waitpid(pid, 0)
    children.append(pid)
with open(sys.argv[1], "w") as f:
    f.write("".join("%d\n" % pid for pid in children))
