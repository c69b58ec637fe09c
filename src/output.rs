//! Every file mprof writes (captures, `CAPTURE.out`, pictures, reports, exports) is created
//! here, so that a user who owns the output directory cannot make mprof (perhaps running as
//! root) write anywhere else.
//!
//! A file is first created under a fresh temporary name in the directory of the final name,
//! with `O_CREAT|O_EXCL|O_NOFOLLOW` (so nothing planted there is opened), then `rename`d over
//! the final name (which replaces whatever entry is there: a symlink is replaced, never
//! followed). Every step works relative to one descriptor of the directory, so the directory
//! cannot be swapped between the steps.
//!
//! A symlink at the final name is followed only when it belongs to the invoking user (mprof
//! says so on stderr): then the file goes where the link points, by the same rules. A symlink
//! owned by anyone else is refused with a one-line error.
//!
//! A streaming file (a capture, the program's output) is renamed into place as soon as the
//! session starts, then written through its descriptor. If the run fails before that, only
//! the temporary file is removed: a failed run never deletes a file it did not create.

use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Who may read the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Mode 0600: captures and the program's output (they hold the full command line and
    /// whatever the program printed).
    Private,
    /// Mode 0666 less the umask, like any file a tool writes (pictures, reports, exports).
    Shared,
}

impl Access {
    fn mode(self) -> libc::mode_t {
        match self {
            Access::Private => 0o600,
            Access::Shared => 0o666,
        }
    }
}

/// Symlinks followed at most, one after the other, before giving up.
const MAX_LINKS: usize = 8;

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

fn io_err<'a>(
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

fn cstr(name: &OsStr) -> CString {
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
fn euid() -> libc::uid_t {
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Opens the directory `parent` (`O_PATH`: only as an anchor for the `*at` calls).
fn open_dir(parent: &Path) -> io::Result<OwnedFd> {
    // std adds O_CLOEXEC; O_PATH ignores the read access mode.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(parent)
        .map(OwnedFd::from)
}

/// `fstatat` without following a symlink; `None` if nothing is there.
fn lstat_at(dir: &OwnedFd, name: &CString) -> io::Result<Option<libc::stat>> {
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

fn readlink_at(dir: &OwnedFd, name: &CString) -> io::Result<PathBuf> {
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

/// The directory (opened) and the file name an output finally goes to, after following the
/// invoking user's own symlinks.
fn destination(
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
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = open_dir(&parent).map_err(io_err(label, "opening its directory", &path))?;
        let cname = cstr(&name);
        let Some(st) = lstat_at(&dir, &cname).map_err(io_err(label, "lstat", &path))? else {
            return Ok((dir, cname, path));
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                let target = readlink_at(&dir, &cname).map_err(io_err(label, "readlink", &path))?;
                // SAFETY: getuid takes nothing, cannot fail and touches no memory of ours.
                let me = unsafe { libc::getuid() };
                if st.st_uid != me {
                    return Err(OutputError::ForeignSymlink {
                        label,
                        path,
                        owner: st.st_uid,
                        target,
                    });
                }
                let next = parent.join(&target);
                eprintln!(
                    "mprof: {} is your symlink to {}; writing there",
                    path.display(),
                    target.display()
                );
                path = next;
            }
            libc::S_IFDIR => return Err(OutputError::NotAFile(label, path)),
            _ => return Ok((dir, cname, path)),
        }
    }
    Err(OutputError::TooManyLinks(label, path))
}

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
        let fd = self.dir.as_raw_fd();
        // SAFETY: `fd` is our open directory descriptor (held by `self.dir`), and both names
        // are NUL-ended strings owned by `self`, alive for the call.
        check(unsafe { libc::renameat(fd, self.temp.as_ptr(), fd, self.name.as_ptr()) })
            .map_err(io_err(self.label, "renaming it into place", &self.path))?;
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
                // SAFETY: `self.dir` is our open directory descriptor and `self.temp` a
                // NUL-ended string owned by `self`; the result does not matter in a drop.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.temp.as_ptr(), 0) };
            }
        }
    }
}

/// Creates the output `path` under a temporary name (see the module doc). The file is written
/// through the returned `File`; [`Pending::place`] puts it at its final name.
/// `label` names the file in errors ("capture file").
pub fn create(
    path: &Path,
    label: &'static str,
    access: Access,
) -> Result<(File, Pending), OutputError> {
    let (dir, name, path) = destination(label, path)?;
    create_at(dir, name, path, label, access)
}

/// [`create`] for the file `name` in the opened directory `dir` (`path` is shown to the user).
fn create_at(
    dir: OwnedFd,
    name: CString,
    path: PathBuf,
    label: &'static str,
    access: Access,
) -> Result<(File, Pending), OutputError> {
    for attempt in 0..100 {
        let temp = temp_name(&name, attempt);
        // SAFETY: `dir` is an open directory descriptor we own and `temp` a NUL-ended string,
        // both alive for the call; O_CREAT is given its mode argument as openat requires.
        let r = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                temp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                access.mode() as libc::c_uint,
            )
        };
        let fd = match check(r) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(label, "creating it", &path)(e)),
        };
        // SAFETY: openat just returned `fd`, open and not owned by anything else: the File
        // becomes its only owner and closes it.
        let file = unsafe { File::from_raw_fd(fd) };
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
                let parent = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                let dir =
                    open_dir(&parent).map_err(io_err(label, "opening its directory", &path))?;
                Ok((dir, name, path))
            }
            e => Err(e),
        })?;
        // SAFETY: `parent` is an open directory descriptor we own and `name` a NUL-ended
        // string, both alive for the call.
        let made = unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o700) } == 0;
        if !made && io::Error::last_os_error().kind() != io::ErrorKind::AlreadyExists {
            return Err(io_err(label, "creating it", &path)(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: as for mkdirat above; without O_CREAT openat takes no mode.
        let fd = check(unsafe {
            libc::openat(
                parent.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })
        .map_err(io_err(
            label,
            "opening it (a symlink there is refused)",
            &path,
        ))?;
        // SAFETY: openat just returned `fd`, open and owned by nothing else.
        let dir = unsafe { File::from_raw_fd(fd) };
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

    /// Removes this user's `*.mprof` files left in the directory by an earlier run.
    fn remove_old_captures(&self) {
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
        else {
            return;
        };
        let me = euid();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.as_encoded_bytes().ends_with(b".mprof") {
                continue;
            }
            let cname = cstr(&name);
            if let Ok(Some(st)) = lstat_at(&self.fd, &cname) {
                if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == me {
                    // SAFETY: `self.fd` is our open directory descriptor and `cname` a
                    // NUL-ended string; a failed unlink is harmless here.
                    unsafe { libc::unlinkat(self.fd.as_raw_fd(), cname.as_ptr(), 0) };
                }
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file `name` of the directory (one mprof made there: a regular file of the
    /// invoking user; anything else is left alone).
    pub fn remove(&self, name: &str) {
        let cname = cstr(name.as_ref());
        let me = euid();
        if let Ok(Some(st)) = lstat_at(&self.fd, &cname) {
            if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == me {
                // SAFETY: `self.fd` is our open directory descriptor and `cname` a NUL-ended
                // string; a failed unlink is harmless here.
                unsafe { libc::unlinkat(self.fd.as_raw_fd(), cname.as_ptr(), 0) };
            }
        }
    }

    /// Creates the file `name` in the directory, as [`create`] does.
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
            // SAFETY: `self.parent` is an open directory descriptor `self` owns and `self.name`
            // a NUL-ended string it owns, both alive for the call.
            unsafe {
                libc::unlinkat(
                    self.parent.as_raw_fd(),
                    self.name.as_ptr(),
                    libc::AT_REMOVEDIR,
                )
            };
        }
    }
}

/// Writes a whole file at once: `bytes` under a temporary name, then renamed into place.
/// Returns the path written (after following the user's own symlinks).
pub fn write_file(
    path: &Path,
    label: &'static str,
    bytes: &[u8],
    access: Access,
) -> Result<PathBuf, OutputError> {
    use std::io::Write;
    let (mut file, mut pending) = create(path, label, access)?;
    file.write_all(bytes)
        .and_then(|()| file.flush())
        .map_err(io_err(label, "writing", pending.path()))?;
    drop(file);
    pending.place()?;
    Ok(pending.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_file_appears_only_when_placed_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.mprof");
        let (mut file, mut pending) = create(&path, "test file", Access::Private).unwrap();
        use std::io::Write;
        file.write_all(b"x").unwrap();
        assert!(!path.exists());
        pending.place().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"x");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_unplaced_file_is_removed_and_the_old_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.mprof");
        std::fs::write(&path, b"winner").unwrap();
        let (_file, pending) = create(&path, "test file", Access::Private).unwrap();
        drop(pending);
        assert_eq!(std::fs::read(&path).unwrap(), b"winner");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn own_symlinks_are_followed_and_replaced_files_are_new() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.svg");
        let link = dir.path().join("link.svg");
        std::os::unix::fs::symlink("real.svg", &link).unwrap();
        let written = write_file(&link, "test file", b"svg", Access::Shared).unwrap();
        assert_eq!(written, real);
        assert_eq!(std::fs::read(&real).unwrap(), b"svg");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        // A hard link to the old file keeps the old content: the name is replaced.
        let other = dir.path().join("other");
        std::fs::hard_link(&real, &other).unwrap();
        write_file(&real, "test file", b"new", Access::Shared).unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"svg");
        assert_ne!(
            std::fs::metadata(&other).unwrap().ino(),
            std::fs::metadata(&real).unwrap().ino()
        );
    }

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

    #[test]
    fn directories_and_empty_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            write_file(dir.path(), "test file", b"", Access::Shared),
            Err(OutputError::NotAFile(..))
        ));
        assert!(write_file(
            &dir.path().join("no/such/dir/x"),
            "test file",
            b"",
            Access::Shared
        )
        .is_err());
    }
}
