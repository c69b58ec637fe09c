"""``python -m pymprof ARGS``: the ``mprof`` command, whichever ``mprof`` comes first on PATH."""

import os
import sys

from ._binary import find_mprof


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_mprof()
    except RuntimeError as e:
        sys.stderr.write("%s\n" % e)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, ["mprof"] + args)
    return 2  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
