//! Where an output finally goes: its directory, opened, and its name there, after following
//! the invoking user's own symlinks at the final name (anyone else's are refused). Only a
//! regular file (or nothing) may be there: a directory, device, FIFO or socket is refused,
//! since the file renamed into place would replace it.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::dirfd::{cstr, lstat_at, open_dir, readlink_at, uid};
use super::error::{io_err, OutputError};

/// Symlinks followed at most, one after the other, before giving up.
const MAX_LINKS: usize = 8;

/// The directory `path` is in (`.` for a bare name).
pub(super) fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The directory (opened) and the file name an output finally goes to, after following the
/// invoking user's own symlinks.
pub(super) fn destination(
    label: &'static str,
    path: &Path,
) -> Result<(OwnedFd, CString, PathBuf), OutputError> {
    let mut path = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let name = path
            .file_name()
            .filter(|n| *n != "..")
            .ok_or_else(|| OutputError::NotAFile(label, path.clone()))?
            .to_owned();
        let parent = parent_of(&path);
        let dir = open_dir(&parent).map_err(io_err(label, "opening its directory", &path))?;
        let cname = cstr(&name);
        let Some(st) = lstat_at(&dir, &cname).map_err(io_err(label, "lstat", &path))? else {
            return Ok((dir, cname, path));
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                let target = readlink_at(&dir, &cname).map_err(io_err(label, "readlink", &path))?;
                if st.st_uid != uid() {
                    return Err(OutputError::ForeignSymlink {
                        label,
                        path,
                        owner: st.st_uid,
                        target,
                    });
                }
                let next = parent.join(&target);
                crate::say!(
                    "mprof: {} is your symlink to {}; writing there",
                    path.display(),
                    target.display()
                );
                path = next;
            }
            libc::S_IFDIR => return Err(OutputError::NotAFile(label, path)),
            libc::S_IFREG => return Ok((dir, cname, path)),
            kind => {
                let what = match kind {
                    libc::S_IFCHR => "character device",
                    libc::S_IFBLK => "block device",
                    libc::S_IFIFO => "FIFO",
                    _ => "socket",
                };
                return Err(OutputError::Special { label, path, what });
            }
        }
    }
    Err(OutputError::TooManyLinks(label, path))
}
