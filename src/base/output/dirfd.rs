//! The system calls that make every output, each relative to one open directory descriptor
//! (the `*at` calls), so that the directory cannot be swapped between two steps. Every
//! `unsafe` of the output module is here.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `name` as the NUL-ended string the system calls take.
pub(super) fn cstr(name: &OsStr) -> CString {
    // A name from a Path component holds no NUL.
    CString::new(name.as_bytes()).unwrap_or_default()
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The effective uid: the user mprof acts as.
pub(super) fn euid() -> libc::uid_t {
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// The real uid: the user who started mprof.
pub(super) fn uid() -> libc::uid_t {
    // SAFETY: getuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}

/// Symlinks followed at most while walking one directory path (as the kernel allows).
const MAX_DIR_LINKS: usize = 40;

/// Opens the directory `parent` (`O_PATH`: only as an anchor for the `*at` calls), one
/// component at a time, each relative to the one before and opened with `O_NOFOLLOW`. A
/// component that is a symlink is followed only when it belongs to root or to the invoking
/// user: a directory on the way that another user made a symlink (in a shared directory, with
/// `fs.protected_symlinks` off) cannot send root's output elsewhere.
pub(super) fn open_dir(parent: &Path) -> io::Result<OwnedFd> {
    use std::collections::VecDeque;
    use std::path::Component;
    let anchor = |p: &str| {
        // std adds O_CLOEXEC; O_PATH ignores the read access mode.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(p)
            .map(OwnedFd::from)
    };
    let owned = |c: Component| c.as_os_str().to_owned();
    let mut todo: VecDeque<OsString> = parent.components().map(owned).collect();
    let mut dir = anchor(if parent.is_absolute() { "/" } else { "." })?;
    let (mut links, mut walked) = (0, PathBuf::new());
    while let Some(part) = todo.pop_front() {
        walked.push(&part);
        if part == "/" {
            dir = anchor("/")?;
            continue;
        }
        if part == "." {
            continue;
        }
        let name = cstr(&part);
        let st = lstat_at(&dir, &name)?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            if st.st_uid != 0 && st.st_uid != uid() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a symlink of uid {}'s (not yours, not root's): mprof does not \
                         follow it",
                        walked.display(),
                        st.st_uid
                    ),
                ));
            }
            links += 1;
            if links > MAX_DIR_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = readlink_at(&dir, &name)?;
            for c in target.components().rev() {
                todo.push_front(owned(c));
            }
            continue;
        }
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        dir = open_at(&dir, &name, flags, 0)?;
    }
    Ok(dir)
}

/// `fstatat` without following a symlink; `None` if nothing is there.
pub(super) fn lstat_at(dir: &OwnedFd, name: &CString) -> io::Result<Option<libc::stat>> {
    // SAFETY: libc::stat is a C struct of integers only; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor we own for the whole call, `name` a NUL-ended
    // string that outlives it, and `st` a live, writable stat that fstatat fills in.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(r) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where the symlink `name` points.
pub(super) fn readlink_at(dir: &OwnedFd, name: &CString) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `dir` is an open descriptor we own, `name` a NUL-ended string, and readlinkat
    // writes at most `buf.len()` bytes into `buf`, which is that long.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsString::from_vec(buf)))
}

/// `openat`: the new descriptor, owned. `mode` is used only when `flags` hold `O_CREAT`.
pub(super) fn open_at(
    dir: &OwnedFd,
    name: &CString,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is an open directory descriptor we own and `name` a NUL-ended string,
    // both alive for the call; the mode is given as openat's variadic argument, which it
    // reads only with O_CREAT.
    let fd = check(unsafe {
        libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint)
    })?;
    // SAFETY: openat just returned `fd`, open and owned by nothing else: the OwnedFd becomes
    // its only owner and closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `renameat` within one directory: `from` replaces whatever entry `to` is.
pub(super) fn rename_at(dir: &OwnedFd, from: &CString, to: &CString) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: `fd` is our open directory descriptor (held by `dir`), and both names are
    // NUL-ended strings alive for the call.
    check(unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) }).map(drop)
}

/// `mkdirat`.
pub(super) fn mkdir_at(dir: &OwnedFd, name: &CString, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: `dir` is an open directory descriptor we own and `name` a NUL-ended string,
    // both alive for the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `unlinkat` (`flags`: 0 for a file, `AT_REMOVEDIR` for an empty directory).
pub(super) fn unlink_at(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `dir` is an open directory descriptor we own and `name` a NUL-ended string,
    // both alive for the call.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// Removes `name` from `dir` when it is a regular file of the user mprof acts as; anything
/// else is left alone, and a failure is harmless.
pub(super) fn unlink_own_file(dir: &OwnedFd, name: &CString) {
    if let Ok(Some(st)) = lstat_at(dir, name) {
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid() {
            let _ = unlink_at(dir, name, 0);
        }
    }
}
