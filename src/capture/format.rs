//! The format's constants and what every reader of it shares: the header, the largest record,
//! what a pass saw and how a damaged tail is told (see [`super::file`] for the layout).

use anyhow::{bail, Result};
use mprof_common::record::DecodeError;

thread_local! {
    pub(super) static EXPANSION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many bytes more than their own the packed entries read so far on this thread stand for
/// (unpacked, as the ring held them), for PACKED records outside frames (formats 4 and
/// before). The reader's size-based memory allowance, a multiple of the capture's size, grows
/// by as much: a packed capture may take what the same records unpacked could, no more.
/// (What frames hold, they declare themselves.)
pub fn expansion() -> u64 {
    EXPANSION.with(|e| e.get())
}

/// Magic bytes at the start of every capture file.
pub const MAGIC: &[u8; 8] = b"MPROFCAP";
/// The format version this build writes. 5: the records are compressed in FRAME records;
/// 4: BRIEF and FREE records are packed (PACKED records);
/// 3: most samples are BRIEF records after a CONTEXT;
/// 2: samples name interned stacks (STACK and SAMPLE records); 1 carried whole stacks in ALLOC
/// records (all still read).
pub const FORMAT_VERSION: u32 = 5;
/// Size of the file header.
pub const FILE_HEADER: usize = 16;

/// The largest record a capture reader accepts. Real records are far smaller (a stack of 256
/// frames is 4 KiB; the biggest is the metadata with the command line, which the kernel
/// limits to 2 MiB); anything larger is corruption, and this bounds what one record costs.
pub const MAX_CAPTURE_RECORD: usize = 4 << 20;

/// What one pass over a capture saw.
#[derive(Debug, Default)]
pub struct Pass {
    /// Why reading stopped early, if it did (a truncated or corrupt tail).
    pub warning: Option<String>,
    /// The file became shorter than it was when opened, while it was read: it was rewritten
    /// in place, and what was read may mix two files.
    pub changed: bool,
    /// The capture's format, when a newer mprof wrote it.
    pub newer: Option<u32>,
    /// Records (and frames) of kinds this reader does not know, skipped.
    pub unreadable: u64,
}

/// The format version of a header [`check_header`] accepted.
pub(super) fn header_version(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

/// Checks the 16-byte file header; returns a warning for a newer format.
pub(super) fn check_header(bytes: &[u8]) -> Result<Option<String>> {
    if bytes.len() < FILE_HEADER || &bytes[..8] != MAGIC {
        bail!("missing the MPROFCAP header");
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version == 0 {
        bail!("format version 0 is invalid");
    }
    Ok((version > FORMAT_VERSION).then(|| {
        format!(
            "written by a newer mprof (format {version}, this one reads {FORMAT_VERSION}); \
             unknown records are skipped"
        )
    }))
}

pub(super) fn tail_warning(e: &DecodeError, at: u64, size: u64) -> String {
    let what = match e {
        DecodeError::Truncated { .. } => "ends with a truncated record",
        DecodeError::Corrupt(_) => "has a corrupt record",
    };
    format!(
        "capture {what} at byte {at} ({e}); the last {} bytes were skipped",
        size.saturating_sub(at)
    )
}
