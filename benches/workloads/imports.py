"""Start-up with many shared libraries, for benches/agent_share.py: imports every extension
module of the standard library's lib-dynload (about 60 on CPython 3.11), the way an application
that imports numpy, pandas or torch loads a few hundred. Every load makes mprof's agent look for
the allocator functions among the loaded objects' imports (injector/agent/src/got.rs).

Prints `BENCH elapsed_s=<seconds> vmhwm_kib=<peak RSS> modules=<imported>`.
"""
import glob
import importlib
import os
import sys
import time

from peak_rss import peak_rss_kib

# Modules that need a terminal or a display, or exist only to be tested.
LEFT_OUT = {"_tkinter", "_curses", "_curses_panel", "readline", "xxlimited", "xxlimited_35", "xxsubtype"}


def main():
    where = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
    names = sorted({os.path.basename(f).split(".")[0] for f in glob.glob(os.path.join(where, "*.so"))})
    start = time.perf_counter()
    imported = 0
    for name in names:
        if name in LEFT_OUT or name.startswith(("_test", "_xx", "_ctypes_test")) or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            imported += 1
        except Exception:  # noqa: BLE001 (a module this build cannot import is left out)
            pass
    elapsed = time.perf_counter() - start
    print("BENCH elapsed_s=%.6f vmhwm_kib=%d modules=%d" % (elapsed, peak_rss_kib(), imported), flush=True)


if __name__ == "__main__":
    main()
