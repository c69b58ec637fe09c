//! The test's C extension (`tests/c/native_allocs.c`), built for an interpreter: native
//! allocations of known sizes for the native-allocation tests.

use super::Python;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/c/native_allocs.c` for `py` into `dir`; None (with a note) when the
/// interpreter's headers are missing.
pub fn build_extension(py: &Python, dir: &Path) -> Option<PathBuf> {
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
        eprintln!("SKIPPED {}: no Python.h in {include}", py.label);
        return None;
    }
    let so = dir.join(format!("native_allocs{suffix}"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/native_allocs.c");
    let status = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-pthread",
            "-Wl,-z,relro,-z,now",
            "-I",
            include,
        ])
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .status()
        .expect("cc");
    assert!(
        status.success(),
        "{}: building the extension failed",
        py.label
    );
    Some(so)
}
