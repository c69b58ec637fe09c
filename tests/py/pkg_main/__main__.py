"""Run with `python -m pkg_main`: allocates in a function of its own."""
KEEP = []


def module_main_alloc():
    for _ in range(100):
        KEEP.append(bytes(100000))


module_main_alloc()
