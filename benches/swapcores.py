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
    """(root directory, whether it is cgroup v1); OSError where there is no cpuset controller."""
    if os.path.exists(os.path.join(V1, "cgroup.procs")):
        return V1, True
    try:
        with open(os.path.join(V2, "cgroup.controllers")) as f:
            if "cpuset" in f.read().split():
                return V2, False
    except OSError:
        pass
    raise OSError("no cpuset cgroup controller (neither %s nor cpuset in %s/cgroup.controllers)" % (V1, V2))


class CoreSwapper:
    """One cgroup per core of `cores` (pairs of neighbours 2k, 2k+1); `wrapper(core)` is the
    command prefix that starts a program in the cgroup that begins on `core`."""

    def __init__(self, cores, period):
        root, v1 = _cpuset_root()
        if v1:
            with open(os.path.join(root, "cpuset.mems")) as f:
                mems = f.read().strip()
        else:
            _write(os.path.join(root, "cgroup.subtree_control"), "+cpuset")
        self.period = period
        self.groups = {}
        try:
            for core in cores:
                path = os.path.join(root, "mprof-pairs-%d-core%d" % (os.getpid(), core))
                os.mkdir(path)
                self.groups[core] = path
                if v1:
                    _write(os.path.join(path, "cpuset.mems"), mems)
                _write(os.path.join(path, "cpuset.cpus"), str(core))
        except OSError:
            self._remove_groups()
            raise
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrapper(self, core):
        procs = os.path.join(self.groups[core], "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs]

    def _run(self):
        swapped = False
        while not self.stop.wait(self.period):
            swapped = not swapped
            for core, path in self.groups.items():
                try:
                    _write(os.path.join(path, "cpuset.cpus"), str(core ^ 1 if swapped else core))
                except OSError:
                    pass  # written again at the next swap

    def close(self):
        self.stop.set()
        self.thread.join()
        self._remove_groups()

    def _remove_groups(self):
        for path in self.groups.values():
            try:
                os.rmdir(path)
            except OSError:
                pass  # a program still in it (killed, not yet reaped): the kernel keeps it
