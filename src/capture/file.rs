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

use super::format::check_header;
pub use super::format::{expansion, Pass, FILE_HEADER, FORMAT_VERSION, MAGIC, MAX_CAPTURE_RECORD};
use super::records::{Event, Records};
use anyhow::{bail, Context, Result};
use mprof_common::record::Record;
use std::fs::File;
use std::path::Path;
use std::time::SystemTime;

pub use super::writer::{CaptureWriter, Stopped};

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
        meta.len() < self.size || (meta.len() == self.size && meta.modified().ok() != self.modified)
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
        let version = super::format::header_version(&header);
        let pass = Pass {
            warning,
            changed: false,
            newer: (version > FORMAT_VERSION).then_some(version),
            unreadable: 0,
        };
        Ok(Records::new(input, self.size, pass))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::frame::frame_of;
    use mprof_common::record;
    use mprof_common::stacks::{encode_brief, encode_context, encode_stack, Node};

    /// The records of a capture, read by the streaming reader, and its pass.
    fn read(path: &Path) -> Result<(Vec<Record>, Pass)> {
        let mut out = Vec::new();
        let pass = CaptureFile::open(path)?.for_each(|r| {
            out.push(r);
            true
        })?;
        Ok((out, pass))
    }

    /// Records as the ring holds them: metadata, a code object, a stack node, a context, then
    /// `n` samples (every third freed) with a new context every 1000.
    fn ring_records(n: u64) -> Vec<Vec<u8>> {
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
        for i in 0..n {
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
    }

    /// Writes `raw` through the writer, flushing (ending a frame) every `every` records.
    fn written(dir: &Path, raw: &[Vec<u8>], every: usize) -> std::path::PathBuf {
        let path = dir.join("w.mprof");
        let mut w = CaptureWriter::create(&path).unwrap();
        for (i, r) in raw.iter().enumerate() {
            w.write_raw(r).unwrap();
            if i % every == every - 1 {
                w.flush().unwrap();
            }
        }
        w.flush().unwrap();
        let written = w.written();
        w.place().unwrap();
        drop(w);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), written);
        path
    }

    /// The same records, plain, in a file of format `version` (what older mprofs wrote).
    fn plain(dir: &Path, raw: &[Vec<u8>], version: u32) -> std::path::PathBuf {
        let path = dir.join(format!("plain{version}.mprof"));
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        raw.iter().for_each(|r| bytes.extend_from_slice(r));
        std::fs::write(&path, &bytes).unwrap();
        path
    }

    /// Samples and frees written through the writer are packed and compressed, and read back
    /// as the same records as the plain stream of an older format they came from.
    #[test]
    fn a_written_capture_reads_back_as_the_plain_records_of_older_formats() {
        let dir = tempfile::tempdir().unwrap();
        let raw = ring_records(50_000);
        let (packed, pass) = read(&written(dir.path(), &raw, 7_000)).unwrap();
        assert!(pass.warning.is_none(), "{:?}", pass.warning);
        assert_eq!(packed.len(), 50_000 + 16_667 + 2);
        for version in [3, 4] {
            let (plain, pass) = read(&plain(dir.path(), &raw, version)).unwrap();
            assert!(pass.warning.is_none());
            assert_eq!(packed, plain, "format {version}");
        }
        let size = std::fs::metadata(dir.path().join("w.mprof")).unwrap().len();
        let unpacked: usize = raw.iter().map(Vec::len).sum();
        assert!(size * 20 < unpacked as u64, "{size} bytes for {unpacked}");
    }

    /// A capture cut at any byte reads up to its last whole frame: exactly the records of the
    /// frames before the cut, with a warning when the cut is inside a frame.
    #[test]
    fn a_capture_cut_at_any_byte_reads_up_to_its_last_whole_frame() {
        let dir = tempfile::tempdir().unwrap();
        let raw = ring_records(3_000);
        let path = written(dir.path(), &raw, 700);
        let bytes = std::fs::read(&path).unwrap();
        // Where each frame ends, and the records read up to there.
        let mut ends = Vec::new();
        let mut at = FILE_HEADER;
        while at < bytes.len() {
            let (len, kind, _) = record::preamble(&bytes[at..]).unwrap();
            assert_eq!(kind, crate::capture::frame::KIND_FRAME);
            at += len;
            ends.push(at);
        }
        assert!(ends.len() >= 5, "{} frames", ends.len());
        let (all, _) = read(&path).unwrap();
        let mut upto = vec![0usize];
        for &end in &ends {
            std::fs::write(dir.path().join("cut.mprof"), &bytes[..end]).unwrap();
            upto.push(read(&dir.path().join("cut.mprof")).unwrap().0.len());
        }
        let cut_path = dir.path().join("cut.mprof");
        for cut in 0..=bytes.len() {
            std::fs::write(&cut_path, &bytes[..cut]).unwrap();
            let got = read(&cut_path);
            if cut < FILE_HEADER {
                assert!(got.is_err(), "cut {cut}");
                continue;
            }
            let (records, pass) = got.unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(records.len(), upto[whole], "cut {cut}");
            assert_eq!(records[..], all[..records.len()], "cut {cut}");
            let at_boundary = cut == FILE_HEADER || ends.contains(&cut);
            assert_eq!(pass.warning.is_some(), !at_boundary, "cut {cut}");
        }
    }

    #[test]
    fn garbage_is_an_error_and_a_damaged_frame_keeps_what_came_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.mprof");
        std::fs::write(&path, b"hello world, not a capture").unwrap();
        assert!(read(&path).is_err());
        let raw = ring_records(100);
        let mut bytes = std::fs::read(written(dir.path(), &raw[..4], 100)).unwrap();
        let first = bytes.len();
        let mut rest = Vec::new();
        raw[4..].iter().for_each(|r| rest.extend_from_slice(r));
        bytes.extend_from_slice(&frame_of(&rest));
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&path).unwrap().0.len(), 100 + 34 + 2);
        // A flipped byte in the second frame's payload: its checksum says so.
        bytes[first + 40] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let (records, pass) = read(&path).unwrap();
        assert_eq!(records.len(), 2);
        let warning = pass.warning.unwrap();
        assert!(
            warning.contains(&format!("corrupt record at byte {first}")),
            "{warning}"
        );
    }

    /// A frame that holds more stack nodes than it declares is refused, not read.
    #[test]
    fn a_frame_holding_more_than_it_declares_is_refused() {
        use crate::capture::frame::{encode, Declared};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lie.mprof");
        let mut records = Vec::new();
        for id in 1..=10u32 {
            records.extend(encode_stack(id, &Node::default()));
        }
        let payload = zstd::bulk::compress(&records, 1).unwrap();
        let declared = Declared {
            raw: records.len() as u32,
            nodes: 3,
            ..Declared::default()
        };
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&encode(&declared, &payload));
        std::fs::write(&path, &bytes).unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(
            err.contains("more stack nodes than it declares (3)"),
            "{err}"
        );
    }
}
