//! Opening the files a capture names (libraries, debug files) without trusting the names: a
//! capture may come from anywhere and name `/dev/zero`, a FIFO that would block the open, or a
//! file someone else can truncate under us. A file is opened with `O_PATH` first (which reads
//! nothing and cannot block), must be a regular file of a sane size, and is then reopened for
//! reading through the descriptor. Files that only root or the user running mprof can change
//! are mapped read-only; any other file is read into memory (up to [`MAX_COPIED`] bytes, and
//! [`MAX_COPIED_TOTAL`] for all files together), so that nobody can make mprof fault by
//! truncating a mapped file, nor make it hold gigabytes by naming large files of their own in
//! a capture (a copy that cannot be allocated is a warning, never an abort).
//!
//! Files are kept for the life of the process, once per (device, inode, size, mtime): the
//! symbols borrow from them (`'static`), and a second report of the same capture in the same
//! process (the live view, the tests) reuses them.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

/// Largest file mapped (debug files of big C++ libraries reach several GiB).
pub const MAX_MAPPED: u64 = 16 << 30;
/// Largest file copied into memory (one that others could truncate under a mapping).
pub const MAX_COPIED: u64 = 256 << 20;
/// Most bytes copied into memory from all such files together, in one process.
pub const MAX_COPIED_TOTAL: u64 = 512 << 20;

/// Bytes copied so far (see [`MAX_COPIED_TOTAL`]).
static COPIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Most distinct files kept open by one process.
pub const MAX_FILES: usize = 1024;

type FileKey = (u64, u64, u64, i64, i64);

static FILES: Mutex<Option<HashMap<FileKey, &'static [u8]>>> = Mutex::new(None);

/// The bytes of the regular file at `path`, kept for the life of the process. Errors are one
/// line, for a warning.
pub fn read(path: &Path) -> Result<&'static [u8], String> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = handle.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() == 0 || meta.len() > MAX_MAPPED {
        return Err(format!("a file of {} bytes", meta.len()));
    }
    let key = (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
    );
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    let files = files.get_or_insert_with(HashMap::new);
    if let Some(bytes) = files.get(&key) {
        return Ok(bytes);
    }
    if files.len() >= MAX_FILES {
        return Err(format!("more than {MAX_FILES} files opened"));
    }
    let file =
        File::open(format!("/proc/self/fd/{}", handle.as_raw_fd())).map_err(|e| e.to_string())?;
    let bytes = if only_trusted_can_change(&meta) {
        map(&file, meta.len())?
    } else {
        copy(file, meta.len())?
    };
    files.insert(key, bytes);
    Ok(bytes)
}

/// Whether only root or this process's user can write the file (then it is mapped).
fn only_trusted_can_change(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    (meta.uid() == 0 || meta.uid() == me) && meta.mode() & 0o022 == 0
}

/// Maps `len` bytes of `file` read-only for the life of the process.
fn map(file: &File, len: u64) -> Result<&'static [u8], String> {
    // SAFETY: a private read-only mapping of a file we opened; failure is checked. The file
    // is writable only by root or by us, so nobody else can truncate it under the mapping.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: the mapping is `len` bytes long, readable, and never unmapped.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) })
}

/// Reads the file into memory kept for the life of the process, within the budgets.
fn copy(file: File, len: u64) -> Result<&'static [u8], String> {
    use std::sync::atomic::Ordering;
    if len > MAX_COPIED {
        return Err(format!(
            "a file of {len} bytes that other users can change (at most {MAX_COPIED} are read)"
        ));
    }
    let before = COPIED.fetch_add(len, Ordering::Relaxed);
    if before + len > MAX_COPIED_TOTAL {
        COPIED.fetch_sub(len, Ordering::Relaxed);
        return Err(format!(
            "a file of {len} bytes that other users can change, past the {} MiB read of such \
             files in all",
            MAX_COPIED_TOTAL >> 20
        ));
    }
    let mut bytes = Vec::new();
    let read = bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| format!("no memory for a copy of its {len} bytes"))
        .and_then(|()| {
            file.take(len)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = read {
        COPIED.fetch_sub(len, Ordering::Relaxed);
        return Err(e);
    }
    Ok(Box::leak(bytes.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        crate::base::make_fifo(&fifo);
        for path in [
            fifo.as_path(),
            Path::new("/dev/zero"),
            dir.path(),
            Path::new("/nonexistent/lib.so"),
        ] {
            assert!(read(path).is_err(), "{}", path.display());
        }
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(read(&empty).is_err());
    }

    #[test]
    fn a_file_reads_once_and_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let a = read(&path).unwrap();
        assert_eq!(a, b"hello");
        assert_eq!(read(&path).unwrap().as_ptr(), a.as_ptr());
    }
}
