//! The tests' C extensions, built for an interpreter: `tests/c/native_allocs.c` (native
//! allocations of known sizes) and `tests/c/native_chain.c` (known native call chains, for
//! mixed stacks).

use super::Python;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/c/native_allocs.c` for `py` into `dir`; None (with a note) when the
/// interpreter's headers are missing.
pub fn build_extension(py: &Python, dir: &Path) -> Option<PathBuf> {
    build(py, dir, "native_allocs", &["-O1", "-pthread"])
}

/// Builds `tests/c/native_chain.c` for `py` into `dir` with the compiler flags `flags`
/// (`-g -O1`, `-g -O2 -DWITH_INLINE`…); None (with a note) when the headers are missing.
pub fn build_chain(py: &Python, dir: &Path, flags: &[&str]) -> Option<PathBuf> {
    build(py, dir, "native_chain", flags)
}

/// Builds `tests/c/stack_switch.c` for `py` into `dir` (see `tests/py/stack_switch_workload.py`).
pub fn build_stack_switch(py: &Python, dir: &Path) -> Option<PathBuf> {
    build(py, dir, "stack_switch", &["-g", "-O1"])
}

/// The source line of the `/* LINE name */` marker in `tests/c/native_chain.c`.
pub fn chain_line(name: &str) -> u32 {
    let src = std::fs::read_to_string(chain_source()).unwrap();
    let marker = format!("/* LINE {name} */");
    1 + src
        .lines()
        .position(|l| l.contains(&marker))
        .unwrap_or_else(|| panic!("no marker {marker}")) as u32
}

/// The path of `tests/c/native_chain.c`.
pub fn chain_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/native_chain.c")
}

fn build(py: &Python, dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    let out = Command::new(&py.path)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['include']); \
             print(sysconfig.get_config_var('EXT_SUFFIX'))",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let (include, suffix) = (lines.next()?, lines.next()?);
    if !Path::new(include).join("Python.h").is_file() {
        // pyenv installs the headers with the interpreter; Debian's come with python3-dev,
        // which .ci/run installs.
        super::tier::skip(&py.label, &format!("no Python.h in {include}"));
        return None;
    }
    let so = dir.join(format!("{name}{suffix}"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-z,relro,-z,now", "-I", include])
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .status()
        .expect("cc");
    assert!(
        status.success(),
        "{}: building {name} with {flags:?} failed",
        py.label
    );
    Some(so)
}

/// Builds `tests/c/NAME.c`, a plain C library (no Python headers), into `dir/libNAME.so`.
pub fn build_library(dir: &Path, name: &str) -> PathBuf {
    let so = dir.join(format!("lib{name}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-Wl,-z,relro,-z,now"])
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(status.success(), "building {name} failed");
    so
}
