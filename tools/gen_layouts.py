#!/usr/bin/env python3
"""Generate common/src/layout_table.rs, the CPython struct offsets the mprof agent reads.

For each supported CPython minor version this writes a small C program against that version's
own headers, compiles it with `cc`, runs it and collects the offsetof/sizeof/enum values for every
field of `PyLayout` (see common/src/layout.rs). It also checks, failing loudly otherwise:
  - the PyASCIIObject.state bit-field puts interned in bits 0-1, kind in 2-4, compact in 5 and
    ascii in 6 (the agent decodes the word by hand);
  - for 3.13+, the offsets the interpreter itself publishes in `_PyRuntime.debug_offsets` agree
    with ours (the probe links against that version's libpython to read them).

Headers come from ~/.pyenv/versions/3.X.Y/include/python3.X (newest patch release per minor);
include dirs given on the command line replace pyenv's for their minor version.

Usage:
    tools/gen_layouts.py                  # write common/src/layout_table.rs
    tools/gen_layouts.py --check          # exit 1 if the committed table is out of date
    tools/gen_layouts.py DIR...           # use these include dirs (e.g. .../include/python3.12)
    tools/gen_layouts.py --compare DIR    # also probe DIR; note any difference from its row
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "common" / "src" / "layout_table.rs"
MINORS = range(8, 14)  # 3.8 ... 3.13

# PyLayout's offset fields, in declaration order.
FIELDS = [
    "tstate_frame",
    "cframe_current_frame",
    "frame_back",
    "frame_code",
    "frame_instr",
    "frame_owner",
    "code_filename",
    "code_name",
    "code_qualname",
    "code_firstlineno",
    "code_adaptive",
    "code_firsttraceable",
    "unicode_length",
    "unicode_state",
    "ascii_size",
    "compact_size",
    "owner_generator",
    "owner_cstack",
    "object_type",
    "frame_is_entry",
    "tstate_interp",
    "interp_own_gil",
    "code_linetable",
    "code_version",
    "bytes_size",
    "bytes_data",
    "type_dealloc",
    "runtime_finalizing",
    "runtime_tss",
    "runtime_auto_interp",
    "runtime_audit_head",
    "tss_key",
]

# Bits of the PyASCIIObject.state word the agent relies on: member -> (value to set, mask).
STATE_BITS = {
    "interned": (3, 0x03),
    "kind": (7, 0x1C),
    "compact": (1, 0x20),
    "ascii": (1, 0x40),
}

# 3.13+: our field -> the member of _PyRuntime.debug_offsets that must hold the same offset.
DEBUG_OFFSETS = {
    "tstate_frame": "thread_state.current_frame",
    "tstate_interp": "thread_state.interp",
    "code_linetable": "code_object.linetable",
    "frame_back": "interpreter_frame.previous",
    "frame_code": "interpreter_frame.executable",
    "frame_instr": "interpreter_frame.instr_ptr",
    "frame_owner": "interpreter_frame.owner",
    "code_filename": "code_object.filename",
    "code_name": "code_object.name",
    "code_qualname": "code_object.qualname",
    "code_firstlineno": "code_object.firstlineno",
    "code_adaptive": "code_object.co_code_adaptive",
    "runtime_finalizing": "runtime_state.finalizing",
}


def fail(message):
    sys.exit(f"gen_layouts: error: {message}")


def field_exprs(minor):
    """C expressions for each PyLayout field in 3.<minor>; None means the field is ABSENT."""
    if minor <= 10:
        frames = {
            "tstate_frame": "offsetof(PyThreadState, frame)",
            "cframe_current_frame": None,
            "frame_back": "offsetof(PyFrameObject, f_back)",
            "frame_code": "offsetof(PyFrameObject, f_code)",
            "frame_instr": "offsetof(PyFrameObject, f_lasti)",
            "frame_owner": None,
        }
    elif minor <= 12:
        frames = {
            "tstate_frame": "offsetof(PyThreadState, cframe)",
            "cframe_current_frame": "offsetof(_PyCFrame, current_frame)",
            "frame_back": "offsetof(_PyInterpreterFrame, previous)",
            "frame_code": "offsetof(_PyInterpreterFrame, f_code)",
            "frame_instr": "offsetof(_PyInterpreterFrame, prev_instr)",
            "frame_owner": "offsetof(_PyInterpreterFrame, owner)",
        }
    else:
        frames = {
            "tstate_frame": "offsetof(PyThreadState, current_frame)",
            "cframe_current_frame": None,
            "frame_back": "offsetof(_PyInterpreterFrame, previous)",
            "frame_code": "offsetof(_PyInterpreterFrame, f_executable)",
            "frame_instr": "offsetof(_PyInterpreterFrame, instr_ptr)",
            "frame_owner": "offsetof(_PyInterpreterFrame, owner)",
        }
    since_311 = minor >= 11
    return {
        **frames,
        "code_filename": "offsetof(PyCodeObject, co_filename)",
        "code_name": "offsetof(PyCodeObject, co_name)",
        "code_qualname": "offsetof(PyCodeObject, co_qualname)" if since_311 else None,
        "code_firstlineno": "offsetof(PyCodeObject, co_firstlineno)",
        "code_adaptive": "offsetof(PyCodeObject, co_code_adaptive)" if since_311 else None,
        "code_firsttraceable": (
            "offsetof(PyCodeObject, _co_firsttraceable)" if since_311 else None
        ),
        "unicode_length": "offsetof(PyASCIIObject, length)",
        "unicode_state": "offsetof(PyASCIIObject, state)",
        "ascii_size": "sizeof(PyASCIIObject)",
        "compact_size": "sizeof(PyCompactUnicodeObject)",
        "owner_generator": "FRAME_OWNED_BY_GENERATOR" if since_311 else None,
        "owner_cstack": "FRAME_OWNED_BY_CSTACK" if minor >= 12 else None,
        "object_type": "offsetof(PyObject, ob_type)",
        "frame_is_entry": "offsetof(_PyInterpreterFrame, is_entry)" if minor == 11 else None,
        "tstate_interp": "offsetof(PyThreadState, interp)",
        "interp_own_gil": (
            "offsetof(PyInterpreterState, ceval.own_gil)" if minor >= 12 else None
        ),
        "code_linetable": (
            "offsetof(PyCodeObject, co_lnotab)" if minor <= 9
            else "offsetof(PyCodeObject, co_linetable)"
        ),
        "code_version": "offsetof(PyCodeObject, co_version)" if minor >= 12 else None,
        "bytes_size": "offsetof(PyBytesObject, ob_base.ob_size)",
        "bytes_data": "offsetof(PyBytesObject, ob_sval)",
        "type_dealloc": "offsetof(PyTypeObject, tp_dealloc)",
        "runtime_finalizing": (
            "offsetof(_PyRuntimeState, finalizing)" if minor == 8
            else "offsetof(_PyRuntimeState, _finalizing)"
        ),
        "runtime_tss": (
            "offsetof(_PyRuntimeState, gilstate.autoTSSkey)" if minor <= 11
            else "offsetof(_PyRuntimeState, autoTSSkey)"
        ),
        "runtime_auto_interp": (
            "offsetof(_PyRuntimeState, gilstate.autoInterpreterState)" if minor <= 11 else None
        ),
        "runtime_audit_head": (
            "offsetof(_PyRuntimeState, audit_hook_head)" if minor <= 11
            else "offsetof(_PyRuntimeState, audit_hooks.head)"
        ),
        "tss_key": "offsetof(Py_tss_t, _key)",
    }


def probe_source(minor):
    """The C program that prints `name value` lines for 3.<minor>."""
    if minor <= 10:
        includes = [
            "#define Py_BUILD_CORE 1",
            "#include <Python.h>",
            '#include "code.h"',
            '#include "frameobject.h"',
            '#include "internal/pycore_pystate.h"' if minor == 8
            else '#include "internal/pycore_runtime.h"',
        ]
    else:
        includes = [
            "#define Py_BUILD_CORE 1",
            "#include <Python.h>",
            '#include "internal/pycore_code.h"',
            '#include "internal/pycore_frame.h"',
        ]
        if minor >= 12:
            includes.append('#include "internal/pycore_interp.h"')
        includes.append('#include "internal/pycore_runtime.h"')
    lines = includes + [
        "#include <stddef.h>",
        "#include <stdio.h>",
        "#include <string.h>",
        "",
        "static unsigned int state_word(const PyASCIIObject *o) {",
        "    unsigned int word = 0;",
        "    memcpy(&word, &o->state, sizeof word);",
        "    return word;",
        "}",
        "",
        "int main(void) {",
        "    PyASCIIObject o;",
        '    printf("version %s\\n", PY_VERSION);',
        '    printf("state_size %zu\\n", sizeof o.state);',
    ]
    for name, expr in field_exprs(minor).items():
        if expr is not None:
            lines.append(f'    printf("field.{name} %zu\\n", (size_t)({expr}));')
    for member, (value, _mask) in STATE_BITS.items():
        lines.append("    memset(&o, 0, sizeof o);")
        lines.append(f"    o.state.{member} = {value};")
        lines.append(f'    printf("state.{member} %u\\n", state_word(&o));')
    if minor >= 13:
        lines.append('    printf("debug.version %llu\\n", '
                     "(unsigned long long)_PyRuntime.debug_offsets.version);")
        lines.append('    printf("debug.header_version %llu\\n", '
                     "(unsigned long long)PY_VERSION_HEX);")
        for name, member in DEBUG_OFFSETS.items():
            lines.append(f'    printf("debug.{name} %llu\\n", '
                         f"(unsigned long long)_PyRuntime.debug_offsets.{member});")
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def header_version(include_dir):
    """The PY_VERSION string ("3.11.7") declared by the headers in include_dir."""
    patchlevel = Path(include_dir) / "patchlevel.h"
    match = re.search(r'#define\s+PY_VERSION\s+"([^"]+)"', patchlevel.read_text())
    if not match:
        fail(f"no PY_VERSION in {patchlevel}")
    return match.group(1)


def minor_of(version):
    return int(version.split(".")[1])


def libpython_flags(include_dir, minor):
    """Linker flags for the libpython matching include_dir (found next to its interpreter)."""
    config = Path(include_dir).resolve().parent.parent / "bin" / f"python3.{minor}-config"
    if not config.exists():
        fail(f"need {config} to link the 3.{minor} probe against libpython")
    out = subprocess.run([config, "--ldflags", "--embed"], capture_output=True, text=True,
                         check=True).stdout.split()
    rpaths = [f"-Wl,-rpath,{flag[2:]}" for flag in out if flag.startswith("-L")]
    return out + rpaths


def run_probe(include_dir, minor):
    """Compile and run the probe against include_dir; return its output as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.c"
        binary = Path(tmp) / "probe"
        source.write_text(probe_source(minor))
        command = ["cc", "-Werror=implicit-function-declaration", f"-I{include_dir}", str(source), "-o", str(binary)]
        if minor >= 13:
            command += libpython_flags(include_dir, minor)
        compiled = subprocess.run(command, capture_output=True, text=True)
        if compiled.returncode != 0:
            fail(f"probe for {include_dir} did not compile:\n{compiled.stderr}")
        output = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in output.splitlines())


def check_state_bits(values, version):
    """Fail unless the state bit-field is a 4-byte word with the bit positions we expect."""
    if values["state_size"] != "4":
        fail(f"{version}: PyASCIIObject.state is {values['state_size']} bytes, expected 4")
    for member, (_value, mask) in STATE_BITS.items():
        word = int(values[f"state.{member}"])
        if word != mask:
            fail(f"{version}: state.{member} sets bits {word:#x}, expected {mask:#x}")


def check_debug_offsets(values, row, version):
    """3.13+: fail unless the interpreter's own _Py_DebugOffsets agree with our row."""
    if values["debug.version"] != values["debug.header_version"]:
        fail(f"{version}: libpython is {int(values['debug.version']):#x}, headers are "
             f"{int(values['debug.header_version']):#x}")
    for name, member in DEBUG_OFFSETS.items():
        published = int(values[f"debug.{name}"])
        if published != row[name]:
            fail(f"{version}: {name} = {row[name]} but _Py_DebugOffsets.{member} = {published}")


def probe_layout(include_dir):
    """Probe one include dir; return (version, {field: offset or None})."""
    version = header_version(include_dir)
    minor = minor_of(version)
    values = run_probe(include_dir, minor)
    if values["version"] != version:
        fail(f"{include_dir}: compiled PY_VERSION {values['version']} != patchlevel.h {version}")
    check_state_bits(values, version)
    row = {}
    for name in FIELDS:
        value = values.get(f"field.{name}")
        row[name] = None if value is None else int(value)
        if row[name] is not None and row[name] >= 0xFFFF:
            fail(f"{version}: {name} = {row[name]} does not fit in a u16")
    if minor >= 13:
        check_debug_offsets(values, row, version)
    return version, row


def pyenv_include_dirs():
    """The newest pyenv-installed include dir per supported minor version: {minor: dir}."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = {}
    for include_dir in sorted(versions.glob("*/include/python3.*")):
        if not re.fullmatch(r"python3\.\d+", include_dir.name):
            continue  # e.g. python3.13t (free-threaded) has a different layout
        if not (include_dir / "patchlevel.h").exists():
            continue
        version = header_version(include_dir)
        minor = minor_of(version)
        patch = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
        if minor in MINORS and (minor not in found or patch > found[minor][0]):
            found[minor] = (patch, include_dir)
    return {minor: include_dir for minor, (_patch, include_dir) in found.items()}


def render(rows):
    """The Rust source for the table; rows is a list of (version, row) sorted by version."""
    versions = ", ".join(version for version, _row in rows)
    lines = [
        "// @generated by tools/gen_layouts.py from each CPython version's own headers.",
        "// Do not edit; rerun the script instead.",
        f"// Interpreter versions probed: {versions}.",
        "",
        "pub const LAYOUTS: &[PyLayout] = &[",
    ]
    for version, row in rows:
        lines.append(f"    // CPython {version}")
        lines.append("    PyLayout {")
        lines.append("        major: 3,")
        lines.append(f"        minor: {minor_of(version)},")
        for name in FIELDS:
            value = "ABSENT" if row[name] is None else str(row[name])
            lines.append(f"        {name}: {value},")
        lines.append("    },")
    lines.append("];")
    return rustfmt("\n".join(lines) + "\n")


def rustfmt(text):
    """Format text with rustfmt if it is on PATH, so `cargo fmt` leaves the file alone."""
    if shutil.which("rustfmt") is None:
        return text
    result = subprocess.run(["rustfmt", "--edition", "2021"], input=text, capture_output=True,
                            text=True, check=True)
    return result.stdout


def compare(include_dir, rows):
    """Probe an extra include dir and print a note if it differs from its minor version's row."""
    version, row = probe_layout(include_dir)
    table = {minor_of(v): (v, r) for v, r in rows}
    table_version, table_row = table.get(minor_of(version), (None, None))
    if table_row is None:
        print(f"note: {include_dir} is {version}, which has no row in the table")
        return
    diffs = [f"{name}: {row[name]} vs {table_row[name]}" for name in FIELDS
             if row[name] != table_row[name]]
    if diffs:
        print(f"NOTE: {version} ({include_dir}) differs from the {table_version} row: "
              + "; ".join(diffs))
    else:
        print(f"{version} ({include_dir}) matches the {table_version} row")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("include_dirs", nargs="*", type=Path,
                        help="include dirs to use instead of pyenv's for their minor version")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed table differs from a fresh one")
    parser.add_argument("--compare", action="append", default=[], type=Path, metavar="DIR",
                        help="also probe DIR and report differences from its version's row")
    args = parser.parse_args()

    dirs = pyenv_include_dirs()
    for include_dir in args.include_dirs:
        dirs[minor_of(header_version(include_dir))] = include_dir
    missing = [f"3.{minor}" for minor in MINORS if minor not in dirs]
    if missing:
        fail(f"no headers for {', '.join(missing)}; install them with pyenv or pass include dirs")

    rows = [probe_layout(dirs[minor]) for minor in MINORS]
    for include_dir in args.compare:
        compare(include_dir, rows)
    text = render(rows)

    if args.check:
        if not TABLE.exists() or TABLE.read_text() != text:
            fail(f"{TABLE.relative_to(REPO)} is out of date; run tools/gen_layouts.py")
        print(f"{TABLE.relative_to(REPO)} is up to date")
    else:
        TABLE.write_text(text)
        print(f"wrote {TABLE.relative_to(REPO)} ({', '.join(v for v, _r in rows)})")


if __name__ == "__main__":
    main()
