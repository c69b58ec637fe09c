"""Work done on threads that run none of the user's code: a `threading.Thread` whose target
is a library's (`worklib`, written into a site-packages folder of DIR), and, when a C
library is given (THREAD_ORIGIN_LIBRARY), a native thread that library starts with
pthread_create. The lines that start them are marked; tests/thread_origins.rs reads the marks.

    THREAD_ORIGIN_LIBRARY=LIBRARY python thread_origins.py DIR
"""
import ctypes
import os
import sys
import threading

out = sys.argv[1]
sys.path.insert(0, os.path.join(out, "lib", "site-packages"))
import worklib  # noqa: E402

kept = []
worker = threading.Thread(target=worklib.work, args=(kept, 200, 10_000))
worker.start()  # mark: python thread
worker.join()
if os.environ.get("THREAD_ORIGIN_LIBRARY"):
    library = ctypes.CDLL(os.environ["THREAD_ORIGIN_LIBRARY"])
    library.start_and_join.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    assert library.start_and_join(8, 1 << 20) == 0  # mark: native thread
