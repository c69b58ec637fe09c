//! A directory of untrusted files (a capture's followed children, rolling interval profiles),
//! read through one descriptor: listed, and its entries opened relative to it without
//! following symlinks (a symlink planted there never sends mprof elsewhere) and without
//! waiting on a FIFO; only regular files are read.

use anyhow::{bail, Context, Result};
use std::ffi::{CString, OsString};
use std::fs::{File, FileType};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A directory opened.
pub struct Directory {
    fd: OwnedFd,
    path: PathBuf,
}

impl Directory {
    /// Opens the directory `path`; `follow` says whether `path` may itself be a symlink (a
    /// path the user typed) or not (a name read from a capture).
    pub fn open(path: &Path, follow: bool) -> Result<Directory> {
        let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
        // std adds O_CLOEXEC.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | nofollow)
            .open(path);
        match opened {
            Ok(file) => Ok(Directory {
                fd: OwnedFd::from(file),
                path: path.to_path_buf(),
            }),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) if !follow => {
                        "not a directory (a symlink there is not followed)".to_owned()
                    }
                    Some(libc::ENOTDIR) => "not a directory".to_owned(),
                    _ => e.to_string(),
                };
                bail!("{}: {why}", path.display())
            }
        }
    }

    /// Its path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its entries, as the system lists them: each name, and its type when the system says
    /// it without following it.
    pub fn entries(&self) -> Result<impl Iterator<Item = Result<(OsString, Option<FileType>)>>> {
        let path = self.path.clone();
        let listing = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .with_context(|| format!("{}: cannot list it", path.display()))?;
        Ok(listing.map(move |entry| {
            let entry = entry.with_context(|| format!("{}: cannot list it", path.display()))?;
            Ok((entry.file_name(), entry.file_type().ok()))
        }))
    }

    /// Opens the regular file `name` in it: not a symlink, without blocking on a FIFO.
    pub fn open_file(&self, name: &str) -> Result<File> {
        let path = self.path.join(name);
        let Ok(cname) = CString::new(std::ffi::OsStr::new(name).as_bytes()) else {
            bail!("{}: a name with a NUL byte", path.display());
        };
        // SAFETY: `self.fd` is an open directory descriptor `self` owns and `cname` a NUL-ended
        // string, both alive for the call; without O_CREAT openat takes no mode.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                cname.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ELOOP) {
                bail!("{} is a symlink: not followed", path.display());
            }
            return Err(e).with_context(|| format!("cannot open {}", path.display()));
        }
        // SAFETY: openat just returned `fd`, open and owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let meta = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_and_fifos_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"not yours").unwrap();
        let inner = dir.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::write(inner.join("plain"), b"ok").unwrap();
        std::os::unix::fs::symlink(&secret, inner.join("link")).unwrap();
        crate::base::make_fifo(&inner.join("fifo"));
        let d = Directory::open(&inner, false).unwrap();
        let mut names: Vec<String> = d
            .entries()
            .unwrap()
            .map(|e| e.unwrap().0.to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["fifo", "link", "plain"]);
        assert!(d.open_file("plain").is_ok());
        let e = d.open_file("link").unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        let e = d.open_file("fifo").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(d.open_file("missing").is_err());
        // The directory itself: a symlink to it is followed only when asked.
        let link = dir.path().join("to-inner");
        std::os::unix::fs::symlink(&inner, &link).unwrap();
        assert!(Directory::open(&link, true).is_ok());
        let e = Directory::open(&link, false).err().unwrap().to_string();
        assert!(e.contains("not followed"), "{e}");
        let e = Directory::open(&secret, true).err().unwrap().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
