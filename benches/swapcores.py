"""Both sides of a pair on both cores, in turns: cpuset cgroups whose cores are swapped every few ms.

On a shared VM one vCPU often runs a third slower than its neighbour for a second or more (a
busy sibling hyperthread on the host; the guest's steal time does not show it), so a pair pinned
for its whole run reads that core's luck as much as the profiler's cost. Each side of a pair here
runs in a cgroup of its own, which every program of that side (the server, its client, the
profiler's reader) joins before it starts, and a thread swaps the two cgroups' cores every
`period` seconds: each side then gets both cores for half of its run, and a slow spell on one
core costs both sides alike unless it is shorter than the period.

Needs root and a cpuset controller: cgroup v1's cpuset hierarchy, or cgroup v2 with the cpuset
controller available at its root.
"""

import os
import threading

V1 = "/sys/fs/cgroup/cpuset"
V2 = "/sys/fs/cgroup"


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _cpuset_root():
    """(root directory, whether it is cgroup v1), or an error string."""
    if os.path.exists(os.path.join(V1, "cgroup.procs")):
        return V1, True
    try:
        with open(os.path.join(V2, "cgroup.controllers")) as f:
            controllers = f.read().split()
    except OSError:
        controllers = []
    if "cpuset" in controllers:
        return V2, False
    return "no cpuset cgroup controller (neither %s nor cpuset in %s/cgroup.controllers)" % (V1, V2)


class CoreSwapper:
    """One cgroup per core of `cores` (pairs of neighbours 2k, 2k+1); `wrapper(core)` is the
    command prefix that starts a program in the cgroup that begins on `core`."""

    def __init__(self, cores, period):
        found = _cpuset_root()
        if isinstance(found, str):
            raise OSError(found)
        root, v1 = found
        self.period = period
        self.groups = {}
        if not v1:
            _write(os.path.join(root, "cgroup.subtree_control"), "+cpuset")
        mems = None
        if v1:
            with open(os.path.join(root, "cpuset.mems")) as f:
                mems = f.read().strip()
        try:
            for core in cores:
                path = os.path.join(root, "mprof-pairs-%d-core%d" % (os.getpid(), core))
                os.mkdir(path)
                self.groups[core] = path
                if mems is not None:
                    _write(os.path.join(path, "cpuset.mems"), mems)
                _write(os.path.join(path, "cpuset.cpus"), str(core))
        except OSError:
            self.close()
            raise
        self.swapped = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrapper(self, core):
        procs = os.path.join(self.groups[core], "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs]

    def _run(self):
        while not self.stop.wait(self.period):
            self.swapped = not self.swapped
            for core, path in self.groups.items():
                try:
                    _write(os.path.join(path, "cpuset.cpus"), str(core ^ 1 if self.swapped else core))
                except OSError:
                    pass  # written again at the next swap

    def close(self):
        if hasattr(self, "stop"):
            self.stop.set()
            self.thread.join()
        for path in self.groups.values():
            try:
                os.rmdir(path)
            except OSError:
                pass  # a program still in it (killed, not yet reaped): the kernel keeps it
