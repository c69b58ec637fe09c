//! A directory of mprof's own beside an output (the captures of followed child processes),
//! private, opened without following a symlink and used only through its descriptor.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::destination::{destination, parent_of};
use super::dirfd::{cstr, euid, mkdir_at, open_at, open_dir, unlink_at, unlink_own_file};
use super::error::{io_err, OutputError};
use super::pending::{create_at, Pending};
use super::Access;

/// A directory of mprof's own beside an output (the captures of followed child processes):
/// made private, opened without following a symlink, and used only through its descriptor.
/// Like a streaming file it is prepared before the session starts and [`OutputDir::keep`]
/// once it has: dropped before that, it removes the directory only if this run made it (and
/// it is still empty), and never touches what an earlier run left there.
pub struct OutputDir {
    fd: OwnedFd,
    path: PathBuf,
    /// The directory holding it and its name there, to remove it if it is not kept.
    parent: OwnedFd,
    name: CString,
    made: bool,
    kept: bool,
}

impl OutputDir {
    /// Makes the directory `path` (mode 0700), or reuses it when it is already the invoking
    /// user's own directory. A symlink at `path` is followed only when it is the user's own
    /// (as for files); anything of someone else's there is refused.
    pub fn prepare(path: &Path, label: &'static str) -> Result<OutputDir, OutputError> {
        let (parent, name, path) = destination(label, path).or_else(|e| match e {
            // An existing directory (perhaps where the user's own symlink points) is what is
            // wanted here.
            OutputError::NotAFile(_, path) => {
                let name = cstr(path.file_name().unwrap_or_default());
                let dir = open_dir(&parent_of(&path)).map_err(io_err(
                    label,
                    "opening its directory",
                    &path,
                ))?;
                Ok((dir, name, path))
            }
            e => Err(e),
        })?;
        let made = match mkdir_at(&parent, &name, 0o700) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io_err(label, "creating it", &path)(e)),
        };
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let dir = File::from(open_at(&parent, &name, flags, 0).map_err(io_err(
            label,
            "opening it (a symlink there is refused)",
            &path,
        ))?);
        let uid = dir.metadata().map_err(io_err(label, "fstat", &path))?.uid();
        if uid != euid() {
            return Err(io_err(label, "using it", &path)(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("it belongs to uid {uid}, not to you"),
            )));
        }
        if made {
            // Exactly 0700 whatever the umask.
            dir.set_permissions(std::fs::Permissions::from_mode(0o700))
                .map_err(io_err(label, "chmod", &path))?;
        }
        let fd = OwnedFd::from(dir);
        Ok(OutputDir {
            fd,
            path,
            parent,
            name,
            made,
            kept: false,
        })
    }

    /// The session has started: the directory stays, and the captures (`*.mprof`) an earlier
    /// run left there are removed.
    pub fn keep(&mut self) {
        if !self.kept {
            self.kept = true;
            self.remove_old_captures();
        }
    }

    /// The session has started: the directory stays, with whatever an earlier run left in it
    /// (a directory of rolling profiles keeps its history).
    pub fn keep_as_it_is(&mut self) {
        self.kept = true;
    }

    /// A path that lists the directory itself (through its descriptor), whatever its name
    /// points to now.
    pub fn listing(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Removes this user's `*.mprof` files left in the directory by an earlier run.
    fn remove_old_captures(&self) {
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
        else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.as_encoded_bytes().ends_with(b".mprof") {
                unlink_own_file(&self.fd, &cstr(&name));
            }
        }
    }

    /// The directory's path (after following the user's own symlinks), as shown to the user.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file `name` of the directory (one mprof made there: a regular file of the
    /// invoking user; anything else is left alone).
    pub fn remove(&self, name: &str) {
        unlink_own_file(&self.fd, &cstr(name.as_ref()));
    }

    /// Creates the file `name` in the directory, as [`create`](super::create) does.
    pub fn create(
        &self,
        name: &str,
        label: &'static str,
        access: Access,
    ) -> Result<(File, Pending), OutputError> {
        let dir =
            self.fd
                .try_clone()
                .map_err(io_err(label, "opening its directory", &self.path))?;
        create_at(
            dir,
            cstr(name.as_ref()),
            self.path.join(name),
            label,
            access,
        )
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if self.made && !self.kept {
            // Fails, harmlessly, if anything is in it.
            let _ = unlink_at(&self.parent, &self.name, libc::AT_REMOVEDIR);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_directory_is_private_and_only_kept_once_the_session_started() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.mprof.d");
        // Made by a run that then failed: gone again.
        let made = OutputDir::prepare(&path, "test dir").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(made);
        assert!(!path.exists());
        // An earlier run's directory: a failed run leaves it and its captures alone; a run
        // that starts removes the old captures, and only those.
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("1.mprof"), b"old").unwrap();
        std::fs::write(path.join("notes"), b"mine").unwrap();
        drop(OutputDir::prepare(&path, "test dir").unwrap());
        assert!(path.join("1.mprof").exists());
        let mut kept = OutputDir::prepare(&path, "test dir").unwrap();
        kept.keep();
        drop(kept);
        assert!(!path.join("1.mprof").exists());
        assert!(path.join("notes").exists());
        // The user's own symlink to a directory is followed.
        let link = dir.path().join("l.mprof.d");
        std::os::unix::fs::symlink("c.mprof.d", &link).unwrap();
        let followed = OutputDir::prepare(&link, "test dir").unwrap();
        assert_eq!(followed.path(), path);
    }
}
