"""Writes the wheel of the test package `tinylauncher` (tests/py/launcher_pkg/*.py) into DIR,
so that `pip install --no-index --find-links DIR tinylauncher` installs it with no network
and no build backend: a console script `tinylauncher` (an entry stub in the venv's bin/)
and `python -m tinylauncher`. Used by tests/your_code.rs.

usage: make_wheel.py DIR
"""
import base64
import hashlib
import os
import sys
import zipfile

NAME, VERSION = "tinylauncher", "1.0"
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher_pkg")
INFO = f"{NAME}-{VERSION}.dist-info"

files = {}
for source in sorted(os.listdir(HERE)):
    if source.endswith(".py"):
        with open(os.path.join(HERE, source), "rb") as f:
            files[f"{NAME}/{source}"] = f.read()
files[f"{INFO}/METADATA"] = f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode()
files[f"{INFO}/WHEEL"] = (
    b"Wheel-Version: 1.0\nGenerator: mprof-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
)
files[f"{INFO}/entry_points.txt"] = f"[console_scripts]\n{NAME} = {NAME}.cli:main\n".encode()


def digest(data):
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + raw.decode()


record = "".join(f"{path},{digest(data)},{len(data)}\n" for path, data in files.items())
files[f"{INFO}/RECORD"] = (record + f"{INFO}/RECORD,,\n").encode()
wheel = os.path.join(sys.argv[1], f"{NAME}-{VERSION}-py3-none-any.whl")
with zipfile.ZipFile(wheel, "w") as z:
    for path, data in files.items():
        z.writestr(path, data)
print(wheel)
