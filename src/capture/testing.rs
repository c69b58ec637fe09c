//! Builders for records and capture files made by hand. The unit tests, the integration tests
//! (`tests/*.rs`) and the golden fixtures all build their captures with these, so that a
//! change of the wire format is made in one place.

use crate::capture::file::{FORMAT_VERSION, MAGIC};
use mprof_common::record::{encode, Allocator, Frame, Record};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Whether the golden-file tests rewrite their files instead of comparing: only when
/// `MPROF_BLESS` is `1`. Any other value (`0`, empty) compares, as when it is unset.
pub fn bless() -> bool {
    bless_value(std::env::var_os("MPROF_BLESS").as_deref())
}

/// [`bless`] for the value `MPROF_BLESS` has (`None`: unset).
pub fn bless_value(value: Option<&OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

/// A Code record: the code object at address `code` is `name` in `file`, starting at
/// `firstline`.
pub fn code(code: u64, file: &str, name: &str, firstline: u32) -> Record {
    Record::Code {
        code,
        firstline,
        filename: file.into(),
        name: name.into(),
    }
}

/// A sample of `size` bytes at `addr` by thread `tid`, from Python's allocators; `frames` are
/// (code, line), innermost first.
pub fn alloc(tid: u32, addr: u64, size: u64, time_ns: u64, frames: &[(u64, u32)]) -> Record {
    alloc_from(Allocator::Python, tid, addr, size, time_ns, frames)
}

/// [`alloc`] of a block from `allocator` (its ALLOC flags say so).
pub fn alloc_from(
    allocator: Allocator,
    tid: u32,
    addr: u64,
    size: u64,
    time_ns: u64,
    frames: &[(u64, u32)],
) -> Record {
    Record::Alloc {
        tid,
        flags: allocator.flags(),
        addr,
        size,
        time_ns,
        frames: frames
            .iter()
            .map(|&(code, line)| Frame { code, line })
            .collect(),
        native: None,
    }
}

/// A Meta record of `key=value` lines.
pub fn meta(text: &str) -> Record {
    Record::Meta { text: text.into() }
}

/// A capture file under construction, in memory.
#[derive(Clone, Debug)]
pub struct CaptureBuilder {
    /// The file's bytes so far: the header, then the records.
    pub bytes: Vec<u8>,
}

impl Default for CaptureBuilder {
    fn default() -> CaptureBuilder {
        CaptureBuilder::new()
    }
}

impl CaptureBuilder {
    /// A capture with its header and no record.
    pub fn new() -> CaptureBuilder {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        CaptureBuilder { bytes }
    }

    /// Appends a record.
    pub fn push(&mut self, r: Record) -> &mut CaptureBuilder {
        self.bytes.extend_from_slice(&encode(&r));
        self
    }

    /// Appends a Meta record.
    pub fn meta(&mut self, text: &str) -> &mut CaptureBuilder {
        self.push(meta(text))
    }

    /// Appends a Code record.
    pub fn code(&mut self, addr: u64, file: &str, name: &str, firstline: u32) -> &mut Self {
        self.push(code(addr, file, name, firstline))
    }

    /// Appends a sample by thread 1.
    pub fn alloc(
        &mut self,
        addr: u64,
        size: u64,
        time_ns: u64,
        frames: &[(u64, u32)],
    ) -> &mut Self {
        self.push(alloc(1, addr, size, time_ns, frames))
    }

    /// Appends a sample by thread `tid`.
    pub fn alloc_in(
        &mut self,
        tid: u32,
        addr: u64,
        size: u64,
        time_ns: u64,
        frames: &[(u64, u32)],
    ) -> &mut Self {
        self.push(alloc(tid, addr, size, time_ns, frames))
    }

    /// Appends a sample by thread 1 of a block from `allocator`.
    pub fn alloc_by(
        &mut self,
        allocator: Allocator,
        addr: u64,
        size: u64,
        time_ns: u64,
        frames: &[(u64, u32)],
    ) -> &mut Self {
        self.push(alloc_from(allocator, 1, addr, size, time_ns, frames))
    }

    /// Appends a Free record.
    pub fn free(&mut self, addr: u64) -> &mut CaptureBuilder {
        self.push(Record::Free { addr })
    }

    /// Writes the capture as `dir/name` and returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.bytes).expect("write a test capture");
        path
    }
}

#[cfg(test)]
mod tests {
    use super::bless_value;
    use std::ffi::OsStr;

    /// `MPROF_BLESS=0`, an empty value or none compare with the golden files; `1` rewrites.
    #[test]
    fn only_mprof_bless_1_rewrites_golden_files() {
        for off in [
            None,
            Some(""),
            Some("0"),
            Some(" 1"),
            Some("no"),
            Some("false"),
        ] {
            assert!(!bless_value(off.map(OsStr::new)), "{off:?} must not bless");
        }
        assert!(bless_value(Some(OsStr::new("1"))));
    }
}
