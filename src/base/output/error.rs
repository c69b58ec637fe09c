//! Why an output file or directory could not be made, in one line that names it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why an output file could not be made.
#[derive(Debug)]
pub enum OutputError {
    /// The final name is a symlink that belongs to someone else.
    ForeignSymlink {
        label: &'static str,
        path: PathBuf,
        owner: u32,
        target: PathBuf,
    },
    /// Symlinks lead to symlinks too many times.
    TooManyLinks(&'static str, PathBuf),
    /// The path names a directory or has no file name.
    NotAFile(&'static str, PathBuf),
    /// The final name is a device, FIFO or socket (`what`): renaming a file over it would
    /// replace it (`-o /dev/null` as root would leave a plain file there).
    Special {
        label: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    /// A system call failed.
    Io {
        label: &'static str,
        what: &'static str,
        path: PathBuf,
        err: io::Error,
    },
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::ForeignSymlink {
                label,
                path,
                owner,
                target,
            } => write!(
                f,
                "refusing to write {label} {}: it is a symlink to {} owned by uid {owner}, not by you \
                 (remove it or choose another name)",
                path.display(),
                target.display()
            ),
            OutputError::TooManyLinks(label, path) => {
                write!(f, "cannot write {label} {}: too many symlinks", path.display())
            }
            OutputError::NotAFile(label, path) => {
                write!(f, "cannot write {label} {}: not a file name", path.display())
            }
            OutputError::Special { label, path, what } => write!(
                f,
                "refusing to write {label} {}: it is a {what}, not a regular file (mprof would \
                 replace it; choose a file name)",
                path.display()
            ),
            OutputError::Io {
                label,
                what,
                path,
                err,
            } => write!(f, "cannot write {label} {}: {what}: {err}", path.display()),
        }
    }
}

impl std::error::Error for OutputError {}

/// Turns the `io::Error` of the step `what` on `path` into an [`OutputError`].
pub(super) fn io_err<'a>(
    label: &'static str,
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> OutputError + 'a {
    move |err| OutputError::Io {
        label,
        what,
        path: path.to_path_buf(),
        err,
    }
}
