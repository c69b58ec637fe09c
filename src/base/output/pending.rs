//! An output file under a temporary name beside its final one: created so that nothing
//! planted there is opened, then renamed into place, or removed if the run fails first.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::dirfd::{lstat_at, open_at, rename_at, unlink_at};
use super::error::{io_err, OutputError};
use super::Access;

/// A temporary name for `name`, unique to this process and attempt.
fn temp_name(name: &CString, attempt: u32) -> CString {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut base = name.as_bytes().to_vec();
    base.truncate(100);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let suffix = format!(".tmp-mprof-{}-{n}-{attempt}-{nanos:x}", std::process::id());
    let mut bytes = b".".to_vec();
    bytes.extend_from_slice(&base);
    bytes.extend_from_slice(suffix.as_bytes());
    CString::new(bytes).unwrap_or_default()
}

/// An output file under its temporary name, not yet in place. Dropping it before
/// [`Pending::place`] removes the temporary file (and nothing else).
pub struct Pending {
    label: &'static str,
    dir: OwnedFd,
    temp: CString,
    name: CString,
    /// The final path, as shown to the user.
    path: PathBuf,
    dev: u64,
    ino: u64,
    placed: bool,
}

impl Pending {
    /// The path the file ends up at (after following the user's own symlinks).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file over its final name.
    pub fn place(&mut self) -> Result<(), OutputError> {
        if self.placed {
            return Ok(());
        }
        rename_at(&self.dir, &self.temp, &self.name).map_err(io_err(
            self.label,
            "renaming it into place",
            &self.path,
        ))?;
        self.placed = true;
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.placed {
            return;
        }
        // Remove the temporary name only while it is still our file.
        if let Ok(Some(st)) = lstat_at(&self.dir, &self.temp) {
            if st.st_dev == self.dev && st.st_ino == self.ino {
                // The result does not matter in a drop.
                let _ = unlink_at(&self.dir, &self.temp, 0);
            }
        }
    }
}

/// [`create`](super::create) for the file `name` in the opened directory `dir` (`path` is
/// shown to the user).
pub(super) fn create_at(
    dir: OwnedFd,
    name: CString,
    path: PathBuf,
    label: &'static str,
    access: Access,
) -> Result<(File, Pending), OutputError> {
    for attempt in 0..100 {
        let temp = temp_name(&name, attempt);
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let file = match open_at(&dir, &temp, flags, access.mode()) {
            Ok(fd) => File::from(fd),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(label, "creating it", &path)(e)),
        };
        if access == Access::Private {
            // An inherited umask can only remove bits; make sure nothing else was set.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(label, "chmod", &path))?;
        }
        let st = file.metadata().map_err(io_err(label, "fstat", &path))?;
        let pending = Pending {
            label,
            dir,
            temp,
            name,
            path,
            dev: st.dev(),
            ino: st.ino(),
            placed: false,
        };
        return Ok((file, pending));
    }
    Err(io_err(label, "creating it", &path)(io::Error::from(
        io::ErrorKind::AlreadyExists,
    )))
}
