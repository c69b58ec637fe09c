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

mod destination;
mod dir;
mod dirfd;
mod error;
mod pending;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use dir::OutputDir;
pub use error::OutputError;
pub use pending::Pending;

use destination::destination;
use error::io_err;
use pending::create_at;

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
    Ok(pending.path().to_path_buf())
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

    /// `-o /dev/null` as root once replaced the device with a plain file.
    #[test]
    fn devices_fifos_and_sockets_are_refused_and_left_as_they_are() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        crate::base::make_fifo(&fifo);
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let mut special = vec![(fifo, "FIFO"), (socket, "socket")];
        let null = dir.path().join("null");
        let c = std::ffi::CString::new(null.to_str().unwrap()).unwrap();
        // SAFETY: mknod reads a NUL-terminated path. Only root may make the device (CI runs
        // as root); elsewhere the case is left out.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
            special.push((null, "character device"));
        }
        for (path, what) in special {
            let err = write_file(&path, "test file", b"x", Access::Private).unwrap_err();
            assert!(
                matches!(err, OutputError::Special { what: w, .. } if w == what),
                "{err}"
            );
            assert!(err.to_string().contains(what), "{err}");
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            assert!(
                kind.is_fifo() || kind.is_socket() || kind.is_char_device(),
                "{} was replaced",
                path.display()
            );
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
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
