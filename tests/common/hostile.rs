//! Shared by the hostile-input tests (tests/hostile*.rs): a root-owned sentinel file that must
//! never change, mprof's exit judged clean or not, a directory `nobody` can use.

use super::{script, Python};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

pub const LIMIT: Duration = Duration::from_secs(90);
pub const NOBODY: u32 = 65534;

/// A root-owned, private file whose contents must never change.
pub struct Sentinel {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    pub fn new() -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sentinel");
        let contents = b"root's precious file\n".to_vec();
        std::fs::write(&path, &contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Sentinel {
            path,
            contents,
            _dir: dir,
        }
    }

    pub fn check(&self) {
        assert_eq!(
            std::fs::read(&self.path).unwrap(),
            self.contents,
            "the sentinel changed"
        );
        let meta = std::fs::symlink_metadata(&self.path).unwrap();
        assert!(meta.is_file() && meta.mode() & 0o777 == 0o600 && meta.uid() == 0);
    }
}

/// mprof's exit must be its own decision: success, or a one-line error with status 2; never
/// a signal (SIGBUS, SIGSEGV) or a panic.
pub fn clean_exit(out: &Output, what: &str) -> bool {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.signal().is_none(),
        "{what}: mprof died of a signal ({}): {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{what}: mprof panicked: {err}");
    if out.status.success() {
        return true;
    }
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("mprof: error")).collect();
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert_eq!(errors.len(), 1, "{what}: one error line expected: {err}");
    false
}

/// A directory every user can enter, with the test scripts `nobody` needs.
pub fn workdir() -> tempfile::TempDir {
    let dir = super::tempdir();
    std::fs::copy(
        script("ring_scribbler.py"),
        dir.path().join("ring_scribbler.py"),
    )
    .unwrap();
    dir
}

/// The interpreter for tests that run one: Debian's (readable by `nobody`), else the first.
pub fn main_python(all: &[Python]) -> Python {
    all.iter()
        .find(|p| p.path == Path::new("/usr/bin/python3"))
        .unwrap_or(&all[0])
        .clone()
}
