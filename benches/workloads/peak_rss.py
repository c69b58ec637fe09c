"""What the timed workloads report of their memory on their BENCH line (imported from beside
them: a script's own directory is first on sys.path, under mprof, memray or valgrind alike)."""


def peak_rss_kib():
    """VmHWM of this process in KiB (Linux), or 0 when /proc is not there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
