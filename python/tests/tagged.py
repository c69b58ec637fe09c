"""The tests find the lines they allocate at by a tag at the end of the line (``# tag``)."""


def tagged_line(path, tag):
    """The number of the line of ``path`` that ends with ``# <tag>``."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith("# " + tag):
                return n
    raise LookupError(tag)
