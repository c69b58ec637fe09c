//! Reading the files a target has mapped, without trusting their paths: each is opened with
//! `O_PATH`, checked to be the very file of the mapping (device and inode), reopened for
//! reading and mapped read-only into mprof.

use crate::elf::Elf;
use crate::procmaps::{self, Mapping};
use std::io;

/// A file mapped read-only into mprof: parsing the symbols of a large libpython then touches
/// only the pages that hold them.
pub struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileMap {
    /// Maps the file at `path` if it is the regular file `m` maps (same device and inode).
    /// The path comes from the target, which may have replaced the file (by a FIFO that would
    /// block the open, a device, another library): it is opened with `O_PATH` first, which
    /// touches nothing, and reopened for reading only once checked.
    pub fn open(path: &std::path::Path, m: &Mapping) -> io::Result<FileMap> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(path)?;
        let meta = handle.metadata()?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if !meta.is_file() || meta.ino() != m.inode || dev != m.dev {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is no longer the file that is mapped", path.display()),
            ));
        }
        let file = std::fs::File::open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?;
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty file"));
        }
        // SAFETY: a private read-only mapping of a file we opened; failure is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMap { ptr, len })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a private read-only mapping of `len` bytes, alive as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made; nothing else uses it.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

pub fn load_elf(pid: u32, m: &Mapping) -> io::Result<(Elf, FileMap)> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, m.path.clone());
    for path in procmaps::file_paths(pid, m) {
        match FileMap::open(&path, m) {
            Ok(map) => return Ok((Elf::parse(map.bytes())?, map)),
            Err(e) => last = e,
        }
    }
    Err(last)
}
