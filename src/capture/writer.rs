//! Writing a capture as records arrive: samples and frees packed into runs ([`super::pack`]),
//! the records gathered into frames and each frame compressed ([`super::frame`]), the file
//! written frame by frame (see [`super::file`] for the layout).

use super::format::{FILE_HEADER, FORMAT_VERSION, MAGIC};
use super::frame::{FrameBuilder, FRAME_TARGET};
use super::pack::{Packer, PACK_TARGET};
use crate::base::output::{self, Access, Pending};
use anyhow::{Context, Result};
use mprof_common::record::{self, Record};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Writes a capture file as records arrive. The file is created under a temporary name (mode
/// 0600: a capture holds the command line) and appears at its final name on
/// [`CaptureWriter::place`]; dropped before that, it leaves nothing behind (see
/// `crate::base::output`).
pub struct CaptureWriter {
    out: BufWriter<File>,
    pending: Pending,
    /// Bytes of the file written, frames compressed (what the disk holds once flushed).
    written: u64,
    /// Samples and frees not written yet (see [`super::pack`]).
    packer: Packer,
    /// The records of the frame being gathered.
    frame: FrameBuilder,
    /// Why the file could no longer be written (a full disk, a quota), with the bytes it holds
    /// and the bytes lost since: from the first failed write on, nothing more is written (a
    /// file with a hole in it would read as corrupt), and the session goes on without it.
    stopped: Option<Stopped>,
    /// The most bytes the file may hold ([`CaptureWriter::limit`]).
    limit: Option<u64>,
}

/// A capture that could no longer be written.
#[derive(Clone, Debug)]
pub struct Stopped {
    pub why: String,
    /// Bytes the file held when the first write failed (its last frame may be cut short).
    pub kept: u64,
    /// Bytes of records that came later and were dropped (uncompressed).
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
            frame: FrameBuilder::default(),
            stopped: None,
            limit: None,
        })
    }

    /// The file holds `limit` bytes at most (`--capture-bytes` of a continuous session): the
    /// frame that would take it past is not written, and the capture stops there as after a
    /// failed write, whole frames only, while the session goes on.
    pub fn limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    /// Puts the capture at its final name (once the session has started); from then on it is
    /// written there.
    pub fn place(&mut self) -> Result<()> {
        Ok(self.pending.place()?)
    }

    /// Appends one already-encoded record (as it came out of the ring). A sample or a free
    /// joins the packed run; any other record follows it in the frame. Once a write has
    /// failed, records are counted as lost and not written (see [`CaptureWriter::stopped`]):
    /// the error is said once, and never ends the session, which goes on supervising the
    /// program.
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
             (its last frame may be cut short): what the program does from now on is not \
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
        self.frame.count(bytes);
        if self.packer.add(bytes).is_some() {
            if self.packer.len() >= PACK_TARGET {
                self.end_run();
                self.end_frame_if_full()?;
            }
            return Ok(());
        }
        self.end_run();
        self.frame.append(bytes);
        self.end_frame_if_full()
    }

    /// Moves the packed run gathered so far, if any, into the frame.
    fn end_run(&mut self) {
        if let Some(packed) = self.packer.take() {
            self.frame.append(&packed);
        }
    }

    fn end_frame_if_full(&mut self) -> Result<()> {
        if self.frame.len() >= FRAME_TARGET {
            self.write_frame()?;
        }
        Ok(())
    }

    /// Compresses the frame gathered so far, if any, and writes it.
    fn write_frame(&mut self) -> Result<()> {
        let Some(frame) = self.frame.take().context("compressing the capture")? else {
            return Ok(());
        };
        if let Some(limit) = self
            .limit
            .filter(|&l| self.written + frame.len() as u64 > l)
        {
            let size = crate::base::units::human_bytes(limit as f64);
            crate::say!(
                "mprof: the capture reached its limit ({size}, --capture-bytes) and ends here: \
                 the intervals go on"
            );
            self.stopped = Some(Stopped {
                why: format!("it reached --capture-bytes {size}"),
                kept: self.written,
                lost: frame.len() as u64,
            });
            return Ok(());
        }
        self.written += frame.len() as u64;
        self.out.write_all(&frame).context("writing capture file")
    }

    /// Bytes of the file written so far (compressed), with the records not compressed yet
    /// counted at their own size.
    pub fn written(&self) -> u64 {
        self.written + (self.frame.len() + self.packer.len()) as u64
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        self.write_raw(&record::encode(record))
    }

    /// Ends the frame and pushes it to the file, so a crash from here on loses nothing before
    /// it. (Dropping the writer writes the last frame too; the file buffer flushes itself.) A
    /// failure stops the capture as a failed write does.
    pub fn flush(&mut self) -> Result<()> {
        if self.stopped.is_some() {
            return Ok(());
        }
        self.end_run();
        let result = self
            .write_frame()
            .and_then(|()| self.out.flush().context("writing capture file"));
        self.stop_on(result);
        Ok(())
    }
}

impl Drop for CaptureWriter {
    fn drop(&mut self) {
        if self.stopped.is_none() {
            self.end_run();
            let _ = self.write_frame();
        }
    }
}
