//! The capture file (`.mprof`): what `record` and `attach` write and every view reads.
//!
//! ```text
//!  0         8        12       16
//!  +---------+--------+--------+------------------------------------- ... ---+
//!  | MPROFCAP| ver:u32|flags:u32| records, back to back (see mprof_common::record)
//!  +---------+--------+--------+------------------------------------- ... ---+
//! ```
//! Records are written as they arrive, so a run that dies leaves a file that reads up to the
//! last flushed record. A truncated or corrupt tail is skipped with a warning. New record kinds
//! are only ever added, so a reader accepts every older format version. Runs of samples and
//! frees (BRIEF and FREE records) are written packed (see [`super::pack`]): a sample and its
//! free take about 12 bytes of the file, where the ring holds them in 40.

use crate::base::output::{self, Access, Pending};
use anyhow::{bail, Context, Result};
use mprof_common::record::{self, DecodeError, Record};
use mprof_common::stacks::{Expanded, Expander};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::pack::{Packer, Unpacker, KIND_PACKED, PACK_TARGET};

thread_local! {
    static EXPANSION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many bytes more than their own the packed entries read so far on this thread stand for
/// (unpacked, as the ring held them). The reader's memory allowance, a multiple of the
/// capture's size, grows by as much: a packed capture may take what the same records unpacked
/// could, no more.
pub fn expansion() -> u64 {
    EXPANSION.with(|e| e.get())
}

/// Magic bytes at the start of every capture file.
pub const MAGIC: &[u8; 8] = b"MPROFCAP";
/// The format version this build writes. 4: BRIEF and FREE records are packed (PACKED records);
/// 3: most samples are BRIEF records after a CONTEXT;
/// 2: samples name interned stacks (STACK and SAMPLE records); 1 carried whole stacks in ALLOC
/// records (all still read).
pub const FORMAT_VERSION: u32 = 4;
const FILE_HEADER: usize = 16;

/// Writes a capture file as records arrive. The file is created under a temporary name (mode
/// 0600: a capture holds the command line) and appears at its final name on
/// [`CaptureWriter::place`]; dropped before that, it leaves nothing behind (see
/// `crate::base::output`).
pub struct CaptureWriter {
    out: BufWriter<File>,
    pending: Pending,
    written: u64,
    /// Samples and frees not written yet (see [`super::pack`]).
    packer: Packer,
    /// Why the file could no longer be written (a full disk, a quota), with the bytes it holds
    /// and the bytes lost since: from the first failed write on, nothing more is written (a
    /// file with a hole in it would read as corrupt), and the session goes on without it.
    stopped: Option<Stopped>,
}

/// A capture that could no longer be written.
#[derive(Clone, Debug)]
pub struct Stopped {
    pub why: String,
    /// Bytes the file held when the first write failed (its last records may be cut short).
    pub kept: u64,
    /// Bytes of records that came later and were dropped.
    pub lost: u64,
}

impl CaptureWriter {
    /// Creates the capture for `path` and writes the file header.
    pub fn create(path: &Path) -> Result<CaptureWriter> {
        let (file, pending) = output::create(path, "capture file", Access::Private)?;
        CaptureWriter::start(file, pending)
    }

    /// A capture named `name` in mprof's directory `dir` (a followed child's).
    pub fn create_in(dir: &output::OutputDir, name: &str) -> Result<CaptureWriter> {
        let (file, pending) = dir.create(name, "capture file", Access::Private)?;
        CaptureWriter::start(file, pending)
    }

    fn start(file: std::fs::File, pending: output::Pending) -> Result<CaptureWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.flush()?;
        Ok(CaptureWriter {
            out,
            pending,
            written: FILE_HEADER as u64,
            packer: Packer::default(),
            stopped: None,
        })
    }

    /// Puts the capture at its final name (once the session has started); from then on it is
    /// written there.
    pub fn place(&mut self) -> Result<()> {
        Ok(self.pending.place()?)
    }

    /// Appends one already-encoded record (as it came out of the ring). A sample or a free
    /// joins the packed run; any other record is written after it. Once a write has failed,
    /// records are counted as lost and not written (see [`CaptureWriter::stopped`]): the
    /// error is said once, and never ends the session, which goes on supervising the program.
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        if let Some(s) = &mut self.stopped {
            s.lost += bytes.len() as u64;
            return Ok(());
        }
        let result = self.append(bytes);
        self.stop_on(result);
        Ok(())
    }

    /// Why the capture stopped being written, if it did.
    pub fn stopped(&self) -> Option<&Stopped> {
        self.stopped.as_ref()
    }

    /// After a write that failed: the capture stops here, said once.
    fn stop_on(&mut self, result: Result<()>) {
        let Err(e) = result else { return };
        let kept = self.out.get_ref().metadata().map_or(0, |m| m.len());
        crate::say!(
            "mprof: warning: the capture cannot be written any more ({e:#}); it ends at {} \
             (its last record may be cut short): what the program does from now on is not \
             recorded, and mprof goes on supervising it",
            crate::base::units::human_bytes(kept as f64)
        );
        self.stopped = Some(Stopped {
            why: format!("{e:#}"),
            kept,
            lost: 0,
        });
    }

    /// [`CaptureWriter::write_raw`] before a failure.
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let starts_run = self.packer.is_empty();
        if let Some(added) = self.packer.add(bytes) {
            // The PACKED record's preamble is counted when its run starts.
            let preamble = if starts_run { record::PREAMBLE } else { 0 };
            self.written += (preamble + added) as u64;
            if self.packer.len() >= PACK_TARGET {
                self.write_packed()?;
            }
            return Ok(());
        }
        self.write_packed()?;
        self.written += bytes.len() as u64;
        self.out.write_all(bytes).context("writing capture file")
    }

    /// Writes the packed run gathered so far, if any.
    fn write_packed(&mut self) -> Result<()> {
        match self.packer.take() {
            Some(packed) => self.out.write_all(&packed).context("writing capture file"),
            None => Ok(()),
        }
    }

    /// Bytes written so far (buffered ones included).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        self.write_raw(&record::encode(record))
    }

    /// Pushes buffered records to the file, so a crash from here on loses nothing before it.
    /// (Dropping the writer writes the packed run too; the file buffer flushes itself.) A
    /// failure stops the capture as a failed write does.
    pub fn flush(&mut self) -> Result<()> {
        if self.stopped.is_some() {
            return Ok(());
        }
        let result = self
            .write_packed()
            .and_then(|()| self.out.flush().context("writing capture file"));
        self.stop_on(result);
        Ok(())
    }
}

impl Drop for CaptureWriter {
    fn drop(&mut self) {
        if self.stopped.is_none() {
            let _ = self.write_packed();
        }
    }
}

/// The largest record a capture reader accepts. Real records are far smaller (a stack of 256
/// frames is 4 KiB; the biggest is the metadata with the command line, which the kernel
/// limits to 2 MiB); anything larger is corruption, and this bounds what one record costs.
pub const MAX_CAPTURE_RECORD: usize = 4 << 20;

/// A capture file opened for reading. It is read through one descriptor and only up to the
/// size it had when opened, so every pass over it sees the same bytes unless someone rewrites
/// it in place meanwhile, which the [`Digest`] handed with each record lets the caller notice.
pub struct CaptureFile {
    file: File,
    /// Bytes read at most.
    pub size: u64,
    path: std::path::PathBuf,
}

/// What one pass over a capture saw.
#[derive(Debug, Default)]
pub struct Pass {
    /// Why reading stopped early, if it did (a truncated or corrupt tail).
    pub warning: Option<String>,
}

/// A cheap digest of bytes read, to notice a capture rewritten between two passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digest(u64);

impl Digest {
    /// A digest with a given value, for tests that feed passes by hand.
    #[cfg(test)]
    pub fn for_test(value: u64) -> Digest {
        Digest(value)
    }

    fn add(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
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
        })
    }

    /// The path it was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Streams the records to `f`, one at a time, without holding the file in memory, until
    /// `f` returns false or the file (as long as it was when opened) ends. `f` also gets the
    /// digest of every byte read up to and including its record. A file that is not a capture
    /// is an error; a damaged tail is a warning in the returned [`Pass`].
    pub fn for_each(&self, mut f: impl FnMut(Record, Digest) -> bool) -> Result<Pass> {
        let mut records = self.records(1 << 20)?;
        while let Some((r, digest)) = records.next_record()? {
            if !f(r, digest) {
                break;
            }
        }
        Ok(records.finish())
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
        let mut digest = Digest::default();
        digest.add(&header);
        Ok(Records {
            input,
            size: self.size,
            at: FILE_HEADER as u64,
            digest,
            buf: Vec::with_capacity(4096),
            pass: Pass { warning },
            done: false,
            expander: Expander::new(),
            unresolved: Unresolved::default(),
            unpacking: None,
        })
    }
}

/// The records of a capture, read one at a time ([`CaptureFile::records`]). Interned stacks
/// (STACK and SAMPLE records, see `mprof_common::stacks`) are expanded back into ALLOC
/// records by an [`Expander`] of the capture's own: a capture is one process's stream, and
/// its stack nodes mean nothing in another's.
pub struct Records<'a> {
    input: std::io::BufReader<std::io::Take<&'a File>>,
    size: u64,
    at: u64,
    digest: Digest,
    buf: Vec<u8>,
    pass: Pass,
    done: bool,
    expander: Expander,
    unresolved: Unresolved,
    /// The PACKED record being read back, and where it starts in the file.
    unpacking: Option<(Unpacker, u64)>,
}

impl Records<'_> {
    /// The next record with the digest of every byte up to it; `None` at the end of the file
    /// or at a damaged tail (then [`Records::finish`] says why). Only a read error is an error.
    pub fn next_record(&mut self) -> Result<Option<(Record, Digest)>> {
        while !self.done {
            match self.read_one()? {
                Some(Record::Unknown { .. }) => {}
                Some(r) => return Ok(Some((r, self.digest))),
                None => self.done = true,
            }
        }
        Ok(None)
    }

    /// What the pass saw (why it stopped early, if it did, and stack records that could not
    /// be resolved).
    pub fn finish(self) -> Pass {
        let mut pass = self.pass;
        if let Some(skipped) = self.unresolved.warning() {
            pass.warning = Some(match pass.warning {
                Some(tail) => format!("{tail}; {skipped}"),
                None => skipped,
            });
        }
        pass
    }

    /// Reads and decodes one record (a SAMPLE as the ALLOC it stands for; a STACK record, or
    /// a stack record that cannot be resolved, as `Record::Unknown`); `None` at the end or at
    /// a damaged tail.
    fn read_one(&mut self) -> Result<Option<Record>> {
        if let Some((unpacker, pack_at)) = &mut self.unpacking {
            match unpacker.next_entry() {
                Some(Ok(entry)) => {
                    let more = entry.bytes().len().saturating_sub(entry.packed()) as u64;
                    EXPANSION.with(|e| e.set(e.get() + more));
                    return match expand(&mut self.expander, &mut self.unresolved, entry.bytes()) {
                        Ok(r) => Ok(Some(r)),
                        Err(e) => {
                            self.pass.warning = Some(tail_warning(&e, *pack_at, self.size));
                            Ok(None)
                        }
                    };
                }
                Some(Err(why)) => {
                    let e = DecodeError::Corrupt(why);
                    self.pass.warning = Some(tail_warning(&e, *pack_at, self.size));
                    return Ok(None);
                }
                None => self.unpacking = None,
            }
        }
        let (at, size) = (self.at, self.size);
        let buf = &mut self.buf;
        buf.resize(record::PREAMBLE, 0);
        let damaged = |e: DecodeError| Some(tail_warning(&e, at, size));
        match read_full(&mut self.input, buf)? {
            0 => return Ok(None),
            n if n < record::PREAMBLE => {
                self.pass.warning = damaged(DecodeError::Truncated {
                    needed: record::PREAMBLE,
                    have: n,
                });
                return Ok(None);
            }
            _ => {}
        }
        let len = match record::preamble(buf) {
            Ok((len, _, _)) if len > MAX_CAPTURE_RECORD => {
                self.pass.warning = damaged(DecodeError::Corrupt(format!("record length {len}")));
                return Ok(None);
            }
            Ok((len, _, _)) if len as u64 > size - at => {
                // Never allocate for bytes the file does not have.
                self.pass.warning = damaged(DecodeError::Truncated {
                    needed: len,
                    have: (size - at) as usize,
                });
                return Ok(None);
            }
            Ok((len, _, _)) => len,
            Err(e) => {
                self.pass.warning = damaged(e);
                return Ok(None);
            }
        };
        buf.resize(len, 0);
        let got = read_full(&mut self.input, &mut buf[record::PREAMBLE..])?;
        let bytes = &buf[..record::PREAMBLE + got];
        self.digest.add(bytes);
        if got == len - record::PREAMBLE
            && matches!(record::preamble(bytes), Ok((_, KIND_PACKED, _)))
        {
            // Read back entry by entry from the next call on.
            let body = bytes[record::PREAMBLE..].to_vec();
            self.unpacking = Some((Unpacker::new(body), at));
            self.at += len as u64;
            return Ok(Some(Record::Unknown { kind: 0 }));
        }
        match expand(&mut self.expander, &mut self.unresolved, bytes) {
            Ok(r) => {
                self.at += len as u64;
                Ok(Some(r))
            }
            Err(e) => {
                self.pass.warning = damaged(e);
                Ok(None)
            }
        }
    }
}

/// Decodes one whole record through the capture's [`Expander`]: a STACK or CONTEXT record, or a
/// stack record that cannot be resolved, reads as `Record::Unknown`.
fn expand(
    expander: &mut Expander,
    unresolved: &mut Unresolved,
    bytes: &[u8],
) -> Result<Record, DecodeError> {
    let expanded;
    let bytes = match expander.feed(bytes) {
        Expanded::Pass(bytes) => bytes,
        Expanded::Alloc(alloc) => {
            expanded = alloc;
            &expanded
        }
        Expanded::Consumed => return Ok(Record::Unknown { kind: 0 }),
        Expanded::Bad(why) => {
            unresolved.note(why);
            return Ok(Record::Unknown { kind: 0 });
        }
    };
    record::decode(bytes).map(|(r, _)| r)
}

/// Stack records that could not be resolved (see `mprof_common::stacks`): skipped, counted,
/// and named once in the pass's warning.
#[derive(Default)]
struct Unresolved {
    count: u64,
    first: Option<&'static str>,
}

impl Unresolved {
    fn note(&mut self, why: &'static str) {
        self.count += 1;
        self.first.get_or_insert(why);
    }

    fn warning(&self) -> Option<String> {
        let first = self.first?;
        Some(format!(
            "{} stack record{} could not be resolved and {} skipped (first: {first})",
            self.count,
            if self.count == 1 { "" } else { "s" },
            if self.count == 1 { "was" } else { "were" },
        ))
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl std::io::Read, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading capture file"),
        }
    }
    Ok(n)
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

fn tail_warning(e: &DecodeError, at: u64, size: u64) -> String {
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
