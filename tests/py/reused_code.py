"""Code objects that take the address of the one before: twelve modules imported in a row (a
module's code is freed once its import is done), or twelve templates compiled under one file
name and run in turn (`exec`). Each allocates about 1 MB on line k + 2 at the same bytecode
offset: k blank lines, which make no bytecode, come before it.

    reused_code.py import DIR TRUTH    # writes DIR/modKK.py, imports them
    reused_code.py exec TRUTH          # compiles and runs them under "<template>"

TRUTH gets {name: line}: the module's name, or the size of a template's buffers."""
import importlib
import json
import os
import sys

COUNT = 12


def source(k):
    return "import sys\n" + "\n" * k + "DATA = [bytearray(%d) for _ in range(200)]\n" % (5000 + 8 * k)


truth = {}
if sys.argv[1] == "import":
    where, out = sys.argv[2], sys.argv[3]
    for k in range(COUNT):
        with open(os.path.join(where, "mod%02d.py" % k), "w") as f:
            f.write(source(k))
        truth["mod%02d" % k] = k + 2
    sys.path.insert(0, where)
    importlib.invalidate_caches()
    modules = [importlib.import_module("mod%02d" % k) for k in range(COUNT)]
else:
    out = sys.argv[2]
    for k in range(COUNT):
        code = compile(source(k), "<template>", "exec")
        exec(code, {})
        del code
        truth[str(5000 + 8 * k)] = k + 2
with open(out, "w") as f:
    json.dump(truth, f)
