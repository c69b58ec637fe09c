//! The capture file (`.mprof`): what `record` and `attach` write and every view reads.
//!
//! ```text
//!  0         8        12       16
//!  +---------+--------+--------+------------------------------------- ... ---+
//!  | MPROFCAP| ver:u32|flags:u32| records, back to back (see mprof_common::record)
//!  +---------+--------+--------+------------------------------------- ... ---+
//!
//!  format 5: the records are FRAME records, each a zstd frame of records (super::frame)
//!  +--------+------+------+------------------------+-------------------------+---------
//!  | len    | 15   | 1    | raw nodes text samples | zstd(records back to    | FRAME ...
//!  |        |      |codec | live 0    (u32 each)   |  back, PACKED runs too) |
//!  +--------+------+------+------------------------+-------------------------+---------
//! ```
//! Records are written as they arrive, a frame at a time (a frame ends at 1 MiB of records
//! and at every flush, every 200 ms of a session), so a run that dies leaves a file that
//! reads up to its last whole frame. A truncated or corrupt tail is skipped with a warning.
//! New record kinds are only ever added, so a reader accepts every older format version:
//! plain records (formats 1 to 4) and frames read alike, in any mix. Runs of samples and frees
//! (BRIEF and FREE records) are packed (see [`super::pack`]) before they are compressed.
//!
//! Reading is [`super::records`], writing [`super::writer`].

use super::records::{Event, Records};
use anyhow::{bail, Context, Result};
use mprof_common::record::{DecodeError, Record};
use std::fs::File;
use std::path::Path;
use std::time::SystemTime;

pub use super::writer::{CaptureWriter, Stopped};

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
pub(super) const FILE_HEADER: usize = 16;

/// The largest record a capture reader accepts. Real records are far smaller (a stack of 256
/// frames is 4 KiB; the biggest is the metadata with the command line, which the kernel
/// limits to 2 MiB); anything larger is corruption, and this bounds what one record costs.
pub const MAX_CAPTURE_RECORD: usize = 4 << 20;

/// A capture file opened for reading. It is read through one descriptor and only up to the
/// size it had when opened, so every pass over it sees the same bytes unless someone rewrites
/// it in place meanwhile, which [`Pass::changed`] and [`CaptureFile::changed`] notice.
pub struct CaptureFile {
    file: File,
    /// Bytes read at most.
    pub size: u64,
    path: std::path::PathBuf,
    /// When it was last modified, as it was opened (to notice a rewrite, see
    /// [`CaptureFile::changed`]).
    modified: Option<SystemTime>,
}

/// What one pass over a capture saw.
#[derive(Debug, Default)]
pub struct Pass {
    /// Why reading stopped early, if it did (a truncated or corrupt tail).
    pub warning: Option<String>,
    /// The file became shorter than it was when opened, while it was read: it was rewritten
    /// in place, and what was read may mix two files.
    pub changed: bool,
}

impl CaptureFile {
    /// Opens `path` and notes its size. A FIFO is opened without waiting for a writer (and
    /// refused below, as every file that is not a regular one).
    pub fn open(path: &Path) -> Result<CaptureFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        CaptureFile::from_file(file, path)
    }

    /// A capture already opened (by `crate::capture::processes`, which opens the files of followed
    /// children without following symlinks); `path` names it in messages.
    pub fn from_file(file: File, path: &Path) -> Result<CaptureFile> {
        let meta = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            bail!("{} is a directory, not a capture file", path.display());
        }
        if !meta.is_file() {
            // A pipe, a socket or a device: a capture is read more than once, from its start,
            // and a FIFO would wait for a writer for ever.
            bail!(
                "{} is not a regular file (a pipe, a socket or a device): mprof reads captures \
                 from files",
                path.display()
            );
        }
        let size = meta.len();
        Ok(CaptureFile {
            file,
            size,
            path: path.to_path_buf(),
            modified: meta.modified().ok(),
        })
    }

    /// The path it was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Streams the records to `f`, one at a time, without holding the file in memory, until
    /// `f` returns false or the file (as long as it was when opened) ends; samples come as
    /// the ALLOC records they stand for. A file that is not a capture is an error; a damaged
    /// tail is a warning in the returned [`Pass`].
    pub fn for_each(&self, mut f: impl FnMut(Record) -> bool) -> Result<Pass> {
        let mut records = self.records(1 << 20)?;
        while let Some(r) = records.next_record()? {
            if !f(r) {
                break;
            }
        }
        Ok(records.finish())
    }

    /// [`CaptureFile::for_each`] of the events the analysis reads ([`Records::next_event`]);
    /// `f` also gets the reader, for the capture's stack nodes and declarations.
    pub fn for_each_event(&self, mut f: impl FnMut(Event, &Records) -> bool) -> Result<Pass> {
        let mut records = self.records(1 << 20)?;
        while let Some(event) = records.next_event()? {
            if !f(event, &records) {
                break;
            }
        }
        Ok(records.finish())
    }

    /// Whether the file was rewritten since it was opened: it is shorter now, or as long with
    /// another modification time (a capture still being written only grows).
    pub fn changed(&self) -> bool {
        let Ok(meta) = self.file.metadata() else {
            return true;
        };
        meta.len() < self.size
            || (meta.len() == self.size && meta.modified().ok() != self.modified)
    }

    /// The records one at a time, read through a buffer of `buffer` bytes (at most the
    /// file's size): for readers that interleave several captures (see
    /// `crate::capture::processes`). A file that is not a capture is an error.
    pub fn records(&self, buffer: usize) -> Result<Records<'_>> {
        use std::io::{Read, Seek};
        let path = &self.path;
        let context = || format!("{} is not a usable mprof capture", path.display());
        if self.size == 0 {
            // What an mprof killed before its first write leaves.
            return Err(anyhow::anyhow!("the file is empty")).with_context(context);
        }
        let mut handle = &self.file;
        handle
            .seek(std::io::SeekFrom::Start(0))
            .context("reading capture file")?;
        let buffer = buffer.min(self.size as usize).max(FILE_HEADER);
        let mut input = std::io::BufReader::with_capacity(buffer, handle.take(self.size));
        let mut header = [0u8; FILE_HEADER];
        input
            .read_exact(&mut header)
            .map_err(|_| anyhow::anyhow!("missing the MPROFCAP header"))
            .with_context(context)?;
        let warning = check_header(&header).with_context(context)?;
        let pass = Pass {
            warning,
            changed: false,
        };
        Ok(Records::new(input, self.size, pass))
    }
}

/// Checks the 16-byte file header; returns a warning for a newer format.
fn check_header(bytes: &[u8]) -> Result<Option<String>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A capture file parsed in memory: the reference the streaming reader is checked against.
    pub struct Capture {
        pub records: Vec<Record>,
        /// Why reading stopped early, if it did (a truncated or corrupt tail).
        pub warning: Option<String>,
    }

    /// Parses the bytes of a capture file.
    pub fn parse(bytes: &[u8]) -> Result<Capture> {
        let mut warning = check_header(bytes)?;
        let mut records = Vec::new();
        let mut at = FILE_HEADER;
        while at < bytes.len() {
            match record::decode(&bytes[at..]) {
                Ok((Record::Unknown { kind: KIND_PACKED }, used)) => {
                    let mut entries =
                        Unpacker::new(bytes[at + record::PREAMBLE..at + used].to_vec());
                    while let Some(entry) = entries.next_entry() {
                        match entry
                            .map_err(DecodeError::Corrupt)
                            .and_then(|e| record::decode(e.bytes()))
                        {
                            Ok((Record::Unknown { .. }, _)) => {}
                            Ok((r, _)) => records.push(r),
                            Err(e) => {
                                let warning = Some(tail_warning(&e, at as u64, bytes.len() as u64));
                                return Ok(Capture { records, warning });
                            }
                        }
                    }
                    at += used;
                }
                Ok((Record::Unknown { .. }, used)) => at += used,
                Ok((r, used)) => {
                    records.push(r);
                    at += used;
                }
                Err(e) => {
                    warning = Some(tail_warning(&e, at as u64, bytes.len() as u64));
                    break;
                }
            }
        }
        Ok(Capture { records, warning })
    }

    fn sample_file() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.mprof");
        let mut w = CaptureWriter::create(&path).unwrap();
        w.write(&Record::Meta {
            text: "pid=1\n".into(),
        })
        .unwrap();
        for addr in [7, 4096, 4112] {
            w.write(&Record::Free { addr }).unwrap();
        }
        w.flush().unwrap();
        w.place().unwrap();
        std::fs::read(&path).unwrap()
    }

    #[test]
    fn a_written_file_reads_back() {
        let c = parse(&sample_file()).unwrap();
        assert_eq!(c.records.len(), 4);
        assert_eq!(c.records[3], Record::Free { addr: 4112 });
        assert!(c.warning.is_none());
    }

    #[test]
    fn every_truncation_point_reads_or_warns_never_panics() {
        let bytes = sample_file();
        for cut in 0..bytes.len() {
            match parse(&bytes[..cut]) {
                Ok(c) => assert!(cut >= FILE_HEADER && c.records.len() <= 4),
                Err(_) => assert!(cut < FILE_HEADER),
            }
        }
        let c = parse(&bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(c.records.len(), 1);
        assert!(c.warning.unwrap().contains("truncated"));
    }

    /// The streaming reader sees exactly what the in-memory parser sees, at every cut.
    #[test]
    fn streaming_agrees_with_parsing_at_every_truncation_point() {
        let bytes = sample_file();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.mprof");
        for cut in 0..=bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let mut streamed = Vec::new();
            let result = CaptureFile::open(&path).and_then(|c| {
                c.for_each(|r, _| {
                    streamed.push(r);
                    true
                })
            });
            match parse(&bytes[..cut]) {
                Ok(c) => {
                    assert_eq!(streamed, c.records, "cut {cut}");
                    assert_eq!(result.unwrap().warning, c.warning, "cut {cut}");
                }
                Err(_) => assert!(result.is_err(), "cut {cut}"),
            }
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"hello world, not a capture").is_err());
        let mut bytes = sample_file();
        bytes[FILE_HEADER] = 1; // record length 1: corrupt
        bytes[FILE_HEADER + 1..FILE_HEADER + 4].fill(0);
        let c = parse(&bytes).unwrap();
        assert!(c.records.is_empty());
        assert!(c.warning.unwrap().contains("corrupt"));
    }

    /// Samples and frees written through the writer are packed, and read back as the same
    /// records as the unpacked stream they came from, whatever else is written between them.
    #[test]
    fn packed_samples_read_back_as_written() {
        use mprof_common::stacks::{encode_brief, encode_context, encode_stack, Node};
        let dir = tempfile::tempdir().unwrap();
        let raw: Vec<Vec<u8>> = {
            let mut raw = vec![
                record::encode(&Record::Meta {
                    text: "pid=1\n".into(),
                }),
                record::encode(&Record::Code {
                    code: 0x1000,
                    firstline: 1,
                    filename: "a.py".into(),
                    name: "f".into(),
                }),
                encode_stack(
                    1,
                    &Node {
                        parent: 0,
                        code: 0x1000,
                        line: 3,
                        entry: false,
                    },
                ),
                encode_context(9, 1_000),
            ];
            for i in 0..5000u64 {
                raw.push(encode_brief(
                    0x7f00_0000_0000 + i * 64,
                    100 + i as u32,
                    1,
                    1,
                ));
                if i % 3 == 0 {
                    raw.push(record::encode(&Record::Free {
                        addr: 0x7f00_0000_0000 + i * 64,
                    }));
                }
                if i % 1000 == 999 {
                    raw.push(encode_context(9, 1_000 + i));
                }
            }
            raw
        };
        let read = |path: &Path| {
            let mut out = Vec::new();
            let pass = CaptureFile::open(path)
                .unwrap()
                .for_each(|r, _| {
                    out.push(r);
                    true
                })
                .unwrap();
            assert!(pass.warning.is_none(), "{:?}", pass.warning);
            out
        };
        let packed = dir.path().join("packed.mprof");
        let mut w = CaptureWriter::create(&packed).unwrap();
        for r in &raw {
            w.write_raw(r).unwrap();
        }
        let written = w.written();
        w.flush().unwrap();
        w.place().unwrap();
        drop(w);
        assert_eq!(std::fs::metadata(&packed).unwrap().len(), written);
        // The same records, unpacked, in a file of the previous format.
        let plain = dir.path().join("plain.mprof");
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        raw.iter().for_each(|r| bytes.extend_from_slice(r));
        std::fs::write(&plain, &bytes).unwrap();
        let (packed_records, plain_records) = (read(&packed), read(&plain));
        assert_eq!(packed_records.len(), 5000 + 1667 + 2);
        assert_eq!(packed_records, plain_records);
        assert!(
            written * 3 < bytes.len() as u64,
            "{written} of {}",
            bytes.len()
        );
    }

    /// A damaged entry inside a packed run keeps what came before it and says where.
    #[test]
    fn a_damaged_packed_run_keeps_what_came_before() {
        let mut bytes = sample_file();
        let n = bytes.len();
        bytes[n - 2] = 0x40; // the last entry's tag: no such tag
        let c = parse(&bytes).unwrap();
        assert_eq!(c.records.len(), 3);
        assert!(
            c.warning.as_deref().unwrap().contains("corrupt"),
            "{:?}",
            c.warning
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.mprof");
        std::fs::write(&path, &bytes).unwrap();
        let mut streamed = Vec::new();
        let pass = CaptureFile::open(&path)
            .unwrap()
            .for_each(|r, _| {
                streamed.push(r);
                true
            })
            .unwrap();
        assert_eq!(streamed, c.records);
        assert_eq!(pass.warning, c.warning);
    }
}
