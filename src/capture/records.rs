//! Reading a capture's records back, one at a time, in file order (see [`super::file`] for the
//! layout): plain records, the records of each compressed frame ([`super::frame`]), and the
//! entries of each PACKED run ([`super::pack`]), unpacked in place.
//!
//! Samples that name an interned stack come out as [`Event::Sample`], a [`Brief`] that names
//! its stack node: the analysis turns a node into a stack once per epoch instead of walking
//! its frames for every sample (see [`super::stacks`]). Everything else comes out as the
//! decoded [`Record`].
//!
//! The reader checks as it goes that each frame holds no more stack nodes, text and samples
//! than it declares ([`Undeclared`] otherwise), and keeps the sum of what the frames read so
//! far declare ([`Records::declared`]): the analysis derives the memory it may take from it.

use super::format::{tail_warning, Pass, EXPANSION, FILE_HEADER, MAX_CAPTURE_RECORD};
use super::frame::{
    decompress, Counts, Declared, FrameError, SeenStacks, KIND_FRAME, MAX_FRAME_RECORD,
};
use super::pack::{Item, Unpacker, KIND_PACKED};
use super::stacks::{Brief, Interned, Stacks};
use anyhow::{Context, Result};
use mprof_common::record::{self, DecodeError, Frame, Record, KIND_SPAWN};
use mprof_common::stacks::{KIND_BRIEF, KIND_CONTEXT, KIND_SAMPLE, KIND_STACK};
use std::fs::File;
use std::io::{BufReader, Read, Take};

/// How many entries of a packed run are read ahead of the one handed on, at least: about as
/// many as the memory misses a reader of the live blocks can have under way while it works
/// through them (see [`Records::upcoming`]).
const AHEAD: usize = 16;
/// Entries of a packed run decoded at a time: a run's entries are decoded in batches, in a
/// loop of their own, rather than one at a time between the reader's work on each.
const BATCH: usize = 64;

/// Why a packed run stopped before its end: said once the entries before it are handed on.
enum Stop {
    /// A malformed entry: the capture's damaged tail starts there.
    Damaged(&'static str),
    /// More samples than the frame declares.
    Undeclared(Undeclared),
}

/// The entries of a packed run decoded ahead of the one handed on (see [`BATCH`]): a ring of
/// events, handed on in place ([`Records::current`]).
struct Ahead {
    entries: [Event; BATCH],
    /// The next entry to hand on (an index into the ring, unwrapped), and how many follow.
    head: usize,
    len: usize,
    stop: Option<Stop>,
}

impl Default for Ahead {
    fn default() -> Ahead {
        Ahead {
            entries: std::array::from_fn(|_| Event::Free(0)),
            head: 0,
            len: 0,
            stop: None,
        }
    }
}

impl Ahead {
    /// Where the next entry is in the ring, taken off it.
    #[inline(always)]
    fn pop(&mut self) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let at = self.head % BATCH;
        self.head += 1;
        self.len -= 1;
        Some(at)
    }

    #[inline(always)]
    fn push(&mut self, event: Event) {
        self.entries[(self.head + self.len) % BATCH] = event;
        self.len += 1;
    }
}

/// Where the event handed on last is.
#[derive(Clone, Copy)]
enum Current {
    /// In the ring of entries decoded ahead, at this index.
    Ahead(usize),
    /// In [`Records::own`].
    Own,
}

/// One thing read from a capture.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Any other record (boxed: samples and frees, which are most events, stay small).
    Record(Box<Record>),
    /// A sample naming a stack node of the capture ([`Records::stacks`]).
    Sample(Brief),
    /// A free of a sampled block (from a packed run: the commonest record of all, kept small).
    Free(u64),
}

impl Event {
    /// The time of a timed event: a sample, an ALLOC record, an RSS reading, an END.
    pub fn time_ns(&self) -> Option<u64> {
        match self {
            Event::Sample(b) => Some(b.time_ns),
            Event::Record(r) => match **r {
                Record::Alloc { time_ns, .. }
                | Record::Rss { time_ns, .. }
                | Record::End { time_ns, .. } => Some(time_ns),
                _ => None,
            },
            Event::Free(_) => None,
        }
    }
}

/// What the frames read so far declare, summed (for the live blocks: the most any one frame
/// declares).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub frames: u64,
    pub nodes: u64,
    pub text: u64,
    pub samples: u64,
    pub live: u64,
    pub stacks: u64,
}

impl Totals {
    /// Adds another capture's totals (the captures of a set are read together).
    pub fn merge(&mut self, other: &Totals) {
        self.frames += other.frames;
        self.nodes += other.nodes;
        self.text += other.text;
        self.samples += other.samples;
        self.live += other.live;
        self.stacks += other.stacks;
    }

    /// Takes back totals merged before.
    pub fn unmerge(&mut self, other: &Totals) {
        self.frames -= other.frames;
        self.nodes -= other.nodes;
        self.text -= other.text;
        self.samples -= other.samples;
        self.live -= other.live;
        self.stacks -= other.stacks;
    }
}

/// A frame that holds more than it declares: the capture is corrupt or crafted, and reading
/// stops (an error, not a damaged tail: the frame's checksum was right).
#[derive(Debug)]
pub struct Undeclared {
    /// Where the frame starts in the file.
    pub at: u64,
    pub what: &'static str,
    pub declared: u32,
}

impl std::fmt::Display for Undeclared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its frame at byte {} holds more {} than it declares ({}): the capture is corrupt \
             or crafted",
            self.at, self.what, self.declared
        )
    }
}

impl std::error::Error for Undeclared {}

/// The frame being read: what it declares, and what was found in it so far.
#[derive(Default)]
struct Framed {
    declared: Declared,
    nodes: u32,
    text: u32,
    samples: u32,
    stacks: u32,
}

/// The records of a capture, read one at a time ([`super::file::CaptureFile::records`]).
pub struct Records<'a> {
    pub(super) input: BufReader<Take<&'a File>>,
    pub(super) size: u64,
    /// Where the next top-level record starts.
    pub(super) at: u64,
    buf: Vec<u8>,
    /// The records of the frame being read, or the body of a top-level PACKED record.
    chunk: Vec<u8>,
    chunk_at: usize,
    /// Where the record the chunk came from starts in the file.
    chunk_origin: u64,
    framed: Option<Framed>,
    /// The PACKED run being read from `chunk`, and whether it is a top-level one (whose
    /// expansion counts towards the size-based allowance, see [`EXPANSION`]); None once its
    /// last entry is decoded.
    unpacking: Option<(Unpacker, bool)>,
    /// The entries of that run decoded ahead of the one handed on (see
    /// [`Records::upcoming`]).
    ahead: Ahead,
    /// The event handed on last ([`Records::current`]), and the one that is not an entry of
    /// a packed run.
    current: Current,
    own: Event,
    stacks: Stacks,
    unresolved: Unresolved,
    pub(super) pass: Pass,
    done: bool,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    totals: Totals,
    /// Frames of a codec this reader does not know, skipped.
    unknown_codecs: u64,
    /// The whole stacks of samples read so far in frames.
    seen_stacks: SeenStacks,
}

impl<'a> Records<'a> {
    pub(super) fn new(input: BufReader<Take<&'a File>>, size: u64, pass: Pass) -> Records<'a> {
        Records {
            input,
            size,
            at: FILE_HEADER as u64,
            buf: Vec::with_capacity(4096),
            chunk: Vec::new(),
            chunk_at: 0,
            chunk_origin: 0,
            framed: None,
            unpacking: None,
            ahead: Ahead::default(),
            current: Current::Own,
            own: Event::Free(0),
            stacks: Stacks::default(),
            unresolved: Unresolved::default(),
            pass,
            done: false,
            decompressor: None,
            totals: Totals::default(),
            unknown_codecs: 0,
            seen_stacks: SeenStacks::default(),
        }
    }

    /// The capture's stack nodes, as far as it was read.
    #[inline(always)]
    pub fn stacks(&self) -> &Stacks {
        &self.stacks
    }

    /// What the frames read so far declare.
    pub fn declared(&self) -> &Totals {
        &self.totals
    }

    /// The live blocks the frame being read declares at most (None outside frames: a record
    /// of an older format, which declares nothing).
    #[inline(always)]
    pub fn live_declared(&self) -> Option<u32> {
        self.framed.as_ref().map(|f| f.declared.live)
    }

    /// The address of a block that a sample or free a few events from now will name, when it
    /// is known already (samples and frees of a packed run are read [`AHEAD`] entries ahead):
    /// a reader can bring the memory where it keeps that block into the cache meanwhile.
    #[inline(always)]
    pub fn upcoming(&self) -> Option<u64> {
        let a = &self.ahead;
        let last = a.len.checked_sub(1)?;
        match &a.entries[(a.head + (AHEAD - 1).min(last)) % BATCH] {
            Event::Sample(b) => Some(b.addr),
            Event::Free(addr) => Some(*addr),
            Event::Record(_) => None,
        }
    }

    /// Bytes of the file read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// Moves on to the next event, [`Records::current`]; false at the end of the file or at
    /// a damaged tail (then [`Records::finish`] says why). A read error, or a frame holding
    /// more than it declares ([`Undeclared`]), is an error. Entries of packed runs (most
    /// events) are handed on where they were decoded, not moved.
    #[inline(always)]
    pub fn advance(&mut self) -> Result<bool> {
        if self.ahead.len <= AHEAD && self.unpacking.is_some() {
            self.decode_ahead();
        }
        if let Some(at) = self.ahead.pop() {
            self.current = Current::Ahead(at);
            return Ok(true);
        }
        self.advance_past_entries()
    }

    /// [`Records::advance`] past the entries decoded ahead.
    fn advance_past_entries(&mut self) -> Result<bool> {
        while !self.done {
            if let Some(event) = self.step()? {
                self.own = event;
                self.current = Current::Own;
                return Ok(true);
            }
            if let Some(at) = self.ahead.pop() {
                self.current = Current::Ahead(at);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The event [`Records::advance`] moved on to.
    #[inline(always)]
    pub fn current(&self) -> &Event {
        match self.current {
            Current::Ahead(at) => &self.ahead.entries[at],
            Current::Own => &self.own,
        }
    }

    /// The next event, taken out; `None` at the end (see [`Records::advance`]).
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        if !self.advance()? {
            return Ok(None);
        }
        Ok(Some(match self.current {
            Current::Ahead(at) => self.ahead.entries[at].clone(),
            Current::Own => std::mem::replace(&mut self.own, Event::Free(0)),
        }))
    }

    /// The next record, samples expanded into the ALLOC records they stand for (for tools and
    /// tests; the analysis reads [`Records::next_event`]).
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        Ok(self.next_event()?.map(|event| match event {
            Event::Record(r) => *r,
            Event::Free(addr) => Record::Free { addr },
            Event::Sample(b) => {
                let mut frames: Vec<Frame> = Vec::new();
                self.stacks.frames(b.node, &mut frames, None);
                Record::Alloc {
                    tid: b.tid,
                    flags: b.flags,
                    addr: b.addr,
                    size: b.size,
                    time_ns: b.time_ns,
                    frames,
                    native: None,
                }
            }
        }))
    }

    /// What the pass saw (why it stopped early, if it did, and stack records that could not
    /// be resolved).
    pub fn finish(self) -> Pass {
        let mut pass = self.pass;
        pass.unreadable += self.unknown_codecs;
        let mut notes: Vec<String> = self.unresolved.warning().into_iter().collect();
        if self.unknown_codecs > 0 {
            notes.push(format!(
                "{} frame(s) compressed in a way this mprof does not know were skipped \
                 (written by a newer mprof)",
                self.unknown_codecs
            ));
        }
        for note in notes {
            pass.warning = Some(match pass.warning {
                Some(tail) => format!("{tail}; {note}"),
                None => note,
            });
        }
        pass
    }

    /// Reads one thing: an event, or None for a record that makes none (or the end, then
    /// `done` is set; or the start of a packed run, whose entries are then decoded ahead).
    fn step(&mut self) -> Result<Option<Event>> {
        if self.unpacking.is_some() {
            self.decode_ahead();
            if self.ahead.len > 0 {
                return Ok(None);
            }
        }
        match self.ahead.stop.take() {
            Some(Stop::Damaged(why)) => {
                self.damaged(&DecodeError::Corrupt(why.into()), self.chunk_origin);
                return Ok(None);
            }
            Some(Stop::Undeclared(e)) => return Err(e.into()),
            None => {}
        }
        if self.chunk_at < self.chunk.len() && self.framed.is_some() {
            return self.framed_record();
        }
        self.framed = None;
        self.chunk.clear();
        self.chunk_at = 0;
        self.top_level()
    }

    /// Decodes the next entries of the packed run being read, up to [`BATCH`] ahead; at its
    /// end (or at an entry that stops it early, [`Stop`]) the run is over. Samples are counted
    /// against what the frame declares and resolved here ([`Stacks::brief`]): no record of
    /// the run's can change the stacks meanwhile.
    #[inline(never)]
    fn decode_ahead(&mut self) {
        let Some((run, plain)) = &mut self.unpacking else {
            return;
        };
        // A copy the loop can keep in registers, written back after it.
        let mut unpacker = *run;
        let a = &mut self.ahead;
        let mut expansion = 0;
        let mut over = false;
        while a.len < BATCH {
            let (item, size) = match unpacker.next_item(&self.chunk) {
                Some(Ok(entry)) => entry,
                Some(Err(why)) => {
                    a.stop = Some(Stop::Damaged(why));
                    over = true;
                    break;
                }
                None => {
                    over = true;
                    break;
                }
            };
            expansion += item.unpacked_len().saturating_sub(size);
            match item {
                Item::Free(addr) => a.push(Event::Free(addr)),
                Item::Brief {
                    aux,
                    size,
                    addr,
                    node,
                } => {
                    if let Some(f) = &mut self.framed {
                        f.samples += 1;
                        if f.samples > f.declared.samples {
                            a.stop = Some(Stop::Undeclared(Undeclared {
                                at: self.chunk_origin,
                                what: "samples",
                                declared: f.declared.samples,
                            }));
                            over = true;
                            break;
                        }
                    }
                    match self.stacks.brief(addr, size, node, aux) {
                        Ok(b) => a.push(Event::Sample(b)),
                        Err(why) => self.unresolved.note(why),
                    }
                }
            }
        }
        *run = unpacker;
        if *plain {
            EXPANSION.with(|e| e.set(e.get() + expansion as u64));
        }
        if over {
            self.unpacking = None;
        }
    }

    /// The next record of the frame being read.
    fn framed_record(&mut self) -> Result<Option<Event>> {
        let at = self.chunk_at;
        let rest = &self.chunk[at..];
        let len = match record::preamble(rest) {
            Ok((len, _, _)) if len <= rest.len() => len,
            Ok((len, _, _)) => {
                let e = DecodeError::Truncated {
                    needed: len,
                    have: rest.len(),
                };
                self.damaged(&e, self.chunk_origin);
                return Ok(None);
            }
            Err(e) => {
                self.damaged(&e, self.chunk_origin);
                return Ok(None);
            }
        };
        self.chunk_at += len;
        let bytes = std::mem::take(&mut self.chunk);
        let result = self.record(&bytes[at..at + len], at, true);
        self.chunk = bytes;
        result
    }

    /// Reads the next top-level record from the file.
    fn top_level(&mut self) -> Result<Option<Event>> {
        let (at, size) = (self.at, self.size);
        self.buf.resize(record::PREAMBLE, 0);
        let n = read_full(&mut self.input, &mut self.buf)?;
        if n < record::PREAMBLE {
            if at + (n as u64) < size {
                // The file was longer when it was opened.
                self.pass.changed = true;
            } else if n > 0 {
                let e = DecodeError::Truncated {
                    needed: record::PREAMBLE,
                    have: n,
                };
                self.damaged(&e, at);
            }
            self.done = true;
            return Ok(None);
        }
        let (len, kind) = match record::preamble(&self.buf) {
            Ok((len, kind, _)) => (len, kind),
            Err(e) => {
                self.damaged(&e, at);
                return Ok(None);
            }
        };
        let limit = match kind {
            KIND_FRAME => MAX_FRAME_RECORD,
            _ => MAX_CAPTURE_RECORD,
        };
        if len > limit {
            self.damaged(&DecodeError::Corrupt(format!("record length {len}")), at);
            return Ok(None);
        }
        if len as u64 > size - at {
            // Never allocate for bytes the file does not have.
            let e = DecodeError::Truncated {
                needed: len,
                have: (size - at) as usize,
            };
            self.damaged(&e, at);
            return Ok(None);
        }
        self.buf.resize(len, 0);
        let got = read_full(&mut self.input, &mut self.buf[record::PREAMBLE..])?;
        if got < len - record::PREAMBLE {
            // The file held these bytes when it was opened (checked above): it shrank.
            self.pass.changed = true;
            self.done = true;
            return Ok(None);
        }
        self.at += len as u64;
        let bytes = std::mem::take(&mut self.buf);
        let result = self.record(&bytes, 0, false);
        self.buf = bytes;
        result
    }

    /// One whole record: at the top level, or at `chunk_at` in the frame being read.
    fn record(&mut self, bytes: &[u8], chunk_at: usize, framed: bool) -> Result<Option<Event>> {
        let (len, kind, aux) = record::preamble(bytes).expect("checked by the caller");
        let body = &bytes[record::PREAMBLE..len];
        let origin = if framed {
            self.chunk_origin
        } else {
            self.at - len as u64
        };
        if framed {
            self.count(Counts::of(bytes))?;
            self.count_stack(bytes)?;
        }
        let interned = match kind {
            KIND_FRAME if !framed => return self.frame(body, aux, origin),
            KIND_PACKED => {
                if framed {
                    self.unpacking = Some((
                        Unpacker::new(chunk_at + record::PREAMBLE, chunk_at + len),
                        false,
                    ));
                } else {
                    self.chunk.clear();
                    self.chunk.extend_from_slice(body);
                    self.chunk_at = self.chunk.len();
                    self.chunk_origin = origin;
                    self.unpacking = Some((Unpacker::new(0, body.len()), true));
                }
                return Ok(None);
            }
            KIND_STACK => self.stacks.define(body, aux).map(|()| Interned::Consumed),
            KIND_CONTEXT => self.stacks.context(body).map(|()| Interned::Consumed),
            KIND_BRIEF => self.stacks.brief_record(body, aux).map(Interned::Sample),
            KIND_SAMPLE => self.stacks.sample(body, aux),
            KIND_SPAWN => self.stacks.spawn(&bytes[..len]),
            _ => {
                return match record::decode(bytes) {
                    Ok((Record::Unknown { .. }, _)) => {
                        self.pass.unreadable += 1;
                        Ok(None)
                    }
                    Ok((r, _)) => Ok(Some(Event::Record(Box::new(r)))),
                    Err(e) => {
                        self.damaged(&e, origin);
                        Ok(None)
                    }
                }
            }
        };
        match interned {
            Ok(Interned::Consumed) => Ok(None),
            Ok(Interned::Sample(b)) => Ok(Some(Event::Sample(b))),
            Ok(Interned::Record(r)) => Ok(Some(Event::Record(Box::new(r)))),
            Err(why) => {
                self.unresolved.note(why);
                Ok(None)
            }
        }
    }

    /// A FRAME record at the top level: its records are read next.
    fn frame(&mut self, body: &[u8], codec: u16, origin: u64) -> Result<Option<Event>> {
        let decompressor = match &mut self.decompressor {
            Some(d) => d,
            None => self
                .decompressor
                .insert(zstd::bulk::Decompressor::new().context("starting zstd")?),
        };
        match decompress(codec, body, &mut self.chunk, decompressor) {
            Ok(declared) => {
                let t = &mut self.totals;
                t.frames += 1;
                t.nodes += declared.nodes as u64;
                t.text += declared.text as u64;
                t.samples += declared.samples as u64;
                t.live = t.live.max(declared.live as u64);
                t.stacks += declared.stacks as u64;
                self.framed = Some(Framed {
                    declared,
                    ..Framed::default()
                });
                self.chunk_at = 0;
                self.chunk_origin = origin;
            }
            Err(FrameError::Codec(_)) => self.unknown_codecs += 1,
            Err(FrameError::Corrupt(why)) => self.damaged(&DecodeError::Corrupt(why), origin),
        }
        Ok(None)
    }

    /// Counts what a record of the frame being read adds to its declarations.
    fn count(&mut self, counts: Counts) -> Result<()> {
        let Some(f) = &mut self.framed else {
            return Ok(());
        };
        let d = &f.declared;
        let over = match counts {
            Counts::Node => {
                f.nodes += 1;
                (f.nodes > d.nodes).then_some(("stack nodes", d.nodes))
            }
            Counts::Text(n) => {
                f.text = f.text.saturating_add(n);
                (f.text > d.text).then_some(("bytes of names and text", d.text))
            }
            Counts::Sample(_) => {
                f.samples += 1;
                (f.samples > d.samples).then_some(("samples", d.samples))
            }
            Counts::Free(_) | Counts::Nothing => None,
        };
        match over {
            Some((what, declared)) => Err(Undeclared {
                at: self.chunk_origin,
                what,
                declared,
            }
            .into()),
            None => Ok(()),
        }
    }

    /// Counts the whole stack a sample record of the frame being read carries, if it is one
    /// the capture had not had (see [`Declared::stacks`]).
    fn count_stack(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(f) = &mut self.framed else {
            return Ok(());
        };
        f.stacks = f.stacks.saturating_add(self.seen_stacks.new_bytes(bytes));
        if f.stacks > f.declared.stacks {
            return Err(Undeclared {
                at: self.chunk_origin,
                what: "bytes of whole stacks",
                declared: f.declared.stacks,
            }
            .into());
        }
        Ok(())
    }

    /// Reading stops at a damaged record that starts at `at` in the file.
    fn damaged(&mut self, e: &DecodeError, at: u64) {
        self.pass.warning = Some(tail_warning(e, at, self.size));
        self.done = true;
    }
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
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
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
