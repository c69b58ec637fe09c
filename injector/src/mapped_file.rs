//! Reading the files a target has mapped, without trusting their paths or their contents: each
//! is opened with `O_PATH`, checked to be the very file of the mapping (device and inode), and
//! reopened for reading. It is read with `pread`, never mapped into mprof: a file that the
//! target truncates while mprof reads it (a library the target owns) then gives a short read,
//! an error, where a mapping would have killed mprof with SIGBUS.

use crate::elf::Elf;
use crate::procmaps::{self, Mapping};
use crate::remote::Proc;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Most bytes read from one mapped file in one request (a library's executable segment).
pub const MAX_READ: u64 = 256 << 20;

/// A file that a target maps, opened for reading and checked to be that very file.
pub struct MappedFile {
    file: File,
    len: u64,
}

impl MappedFile {
    /// Opens the file at `path` if it is the regular file `m` maps (same device and inode).
    /// The path comes from the target, which may have replaced the file (by a FIFO that would
    /// block the open, a device, another library): it is opened with `O_PATH` first, which
    /// touches nothing, and reopened for reading only once checked.
    pub fn open(path: &std::path::Path, m: &Mapping) -> io::Result<MappedFile> {
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
        let file = File::open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty file"));
        }
        Ok(MappedFile { file, len })
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `len` bytes at `offset` (at most [`MAX_READ`]): an error if the file is shorter
    /// now.
    pub fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        if len > MAX_READ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{len} bytes is more than mprof reads of a mapped file"),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// A reader that parsers (`object`) use: it reads the parts they ask for, as they ask, and
    /// refuses to read more than [`MAX_READ`] in all (a file whose headers claim a table of
    /// terabytes is refused, not allocated for).
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            cache: object::ReadCache::new(&self.file),
            budget: std::cell::Cell::new(MAX_READ),
        }
    }
}

/// Parts of a [`MappedFile`] read on demand, within a budget.
pub struct Reader<'f> {
    cache: object::ReadCache<&'f File>,
    budget: std::cell::Cell<u64>,
}

impl<'a> object::ReadRef<'a> for &'a Reader<'_> {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        let left = self.budget.get().checked_sub(size).ok_or(())?;
        self.budget.set(left);
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(
        self,
        range: std::ops::Range<u64>,
        delimiter: u8,
    ) -> Result<&'a [u8], ()> {
        // The cache reads at most 4 KiB looking for the delimiter.
        let left = self.budget.get().checked_sub(4096).ok_or(())?;
        self.budget.set(left);
        (&self.cache).read_bytes_at_until(range, delimiter)
    }
}

/// The dynamic symbols of the file behind mapping `m` of the target, and the file.
pub fn load_elf(proc: &Proc, m: &Mapping) -> io::Result<(Elf, MappedFile)> {
    let file = open_mapped(proc, m)?;
    let elf = Elf::parse(&file.reader())?;
    Ok((elf, file))
}

/// The very file that mapping `m` of the target maps, if it can still be opened.
pub fn open_mapped(proc: &Proc, m: &Mapping) -> io::Result<MappedFile> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, m.path.clone());
    for path in procmaps::file_paths(proc, m) {
        match MappedFile::open(&path, m) {
            Ok(file) => return Ok(file),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file truncated after it was opened reads short: an error, not a signal.
    #[test]
    fn a_file_truncated_while_read_gives_an_error() {
        let dir = std::env::temp_dir().join(format!("mprof-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib.so");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&[7u8; 3 * 4096])
            .unwrap();
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&path).unwrap();
        let m = Mapping {
            start: 0x1000,
            end: 0x4000,
            write: false,
            exec: true,
            offset: 0,
            dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
            inode: meta.ino(),
            path: path.display().to_string(),
        };
        let f = MappedFile::open(&path, &m).unwrap();
        assert_eq!(f.read_at(4096, 4096).unwrap(), vec![7u8; 4096]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert!(f.read_at(4096, 4096).is_err());
        assert!(Elf::parse(&f.reader()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
