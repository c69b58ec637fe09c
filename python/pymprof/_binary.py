"""Where the ``mprof`` binary that came with this package is.

The wheel installs it as the script ``mprof`` (maturin's binary packaging). Another
``mprof`` may come first on ``PATH`` (memory_profiler installs a Python script of that
name), so the binary is found through this distribution's own file list, never by ``PATH``
alone. ``PYMPROF_MPROF`` names another binary (the tests of a source checkout use the one
cargo built).
"""

import os
import sys
import sysconfig

_ELF = b"\x7fELF"


def _is_ours(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ELF and os.access(path, os.X_OK)
    except OSError:
        return False


def _from_distribution():
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - 3.8+ has it
        return None
    try:
        dist = metadata.distribution("pymprof")
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        parts = f.parts
        if parts and parts[-1] == "mprof" and len(parts) >= 2 and parts[-2] in ("bin", "scripts"):
            path = os.path.normpath(str(dist.locate_file(f)))
            if _is_ours(path):
                return path
    return None


def _from_scripts_dirs():
    schemes = [None]
    user = "%s_user" % os.name
    if user in sysconfig.get_scheme_names():
        schemes.append(user)
    for scheme in schemes:
        try:
            scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        path = os.path.join(scripts, "mprof")
        if _is_ours(path):
            return path
    path = os.path.join(os.path.dirname(sys.executable), "mprof")
    return path if _is_ours(path) else None


def find_mprof():
    """The path of the ``mprof`` binary; ``RuntimeError`` with what to do when it is missing."""
    override = os.environ.get("PYMPROF_MPROF")
    if override:
        if not _is_ours(override):
            raise RuntimeError("PYMPROF_MPROF=%s is not an executable mprof binary" % override)
        return override
    path = _from_distribution() or _from_scripts_dirs()
    if path is None:
        raise RuntimeError(
            "pymprof: the mprof binary that comes with the pymprof wheel was not found "
            "(reinstall it with `pip install --force-reinstall pymprof`, or set PYMPROF_MPROF "
            "to an mprof binary)"
        )
    return path
