"""Starts five short-lived Python children with an environment of their own (no LD_PRELOAD,
no MPROF_FOLLOW): four through subprocess with env={...} (fork or vfork, then execve), one
through os.posix_spawn. Each allocates 3 MB in `quick_child` and exits at once, sooner than
mprof's four looks a second for strays would find it.
"""
import os
import subprocess
import sys

CHILD = "def quick_child():\n    return bytearray(3_000_000)\nkeep = quick_child()\n"
env = {"PATH": os.environ.get("PATH", "/usr/bin")}
for _ in range(4):
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True)
pid = os.posix_spawn(sys.executable, [sys.executable, "-c", CHILD], env)
assert os.waitpid(pid, 0)[1] == 0
