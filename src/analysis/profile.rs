//! A capture, aggregated: estimated bytes per stack (and per thread) for every view.
//!
//! Per stack the profile keeps three estimates (see [`View`]): bytes allocated over the whole
//! capture, bytes still live at its end, and bytes live at the moment the whole estimated live
//! heap was highest. The estimates are explained in [`crate::analysis::estimate`], the interning of
//! stacks in [`crate::analysis::names`], the replay rules in [`crate::analysis::aggregate`].
//!
//! A capture is untrusted input. It is read through one descriptor and only as far as it
//! reached when opened ([`crate::capture::file::CaptureFile`]); a digest of the records notices
//! a file rewritten while it is read ([`LoadError::Changed`]); names, stacks and metadata
//! are bounded where they are interned ([`MAX_NAME`], [`MAX_DEPTH`], [`MAX_META_VALUE`]); and
//! the reader's memory is checked as it reads (`Budget`, counted by [`crate::base::memory`])
//! against an allowance derived from what the capture's frames declare (stack nodes, names,
//! live blocks, whole stacks: [`MEMORY_PER_NODE`], [`MEMORY_PER_TEXT`], [`MEMORY_PER_LIVE`],
//! [`MEMORY_PER_STACK_BYTE`]), plus
//! [`MEMORY_PER_BYTE`] times the size of its plain records (formats before 5) plus
//! [`MEMORY_FIXED`]. The reader holds nothing per sample: a capture of any length opens.

use crate::analysis::aggregate::ProcessFigures;
pub use crate::analysis::aggregate::{MAX_META_KEYS, MAX_META_VALUE};
use crate::analysis::allocators::{Allocator, Allocators, ByAllocator, NATIVE_META};
pub use crate::analysis::estimate::{Estimate, Figures, Sample, View};
use crate::analysis::focus::Focus;
use crate::analysis::names::Names;
pub use crate::analysis::names::{
    FastMap, Location, StackId, MAX_DEPTH, MAX_NAME, NO_PYTHON_FRAME, TRUNCATED, UNKNOWN,
};
use crate::base::progress::Progress;
use crate::capture::meta::meta_rate;
use crate::capture::processes::{CaptureSet, Pick};
use crate::capture::records::Totals;
use crate::capture::rolling::{Listing, Range, Spec};
use anyhow::{Context, Result};
use mprof_common::record::Record;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The reader's memory may reach this many times the capture's size, plus [`MEMORY_FIXED`].
/// Packed records (`capture::pack`) count at the size of the records they stand for
/// ([`crate::capture::file::expansion`]).
pub const MEMORY_PER_BYTE: usize = 4;
/// The fixed part of the reader's memory allowance (buffers, one record of up to 4 MiB).
pub const MEMORY_FIXED: usize = 64 << 20;

/// Why a capture could not be aggregated (beyond not being readable at all).
#[derive(Debug)]
pub enum LoadError {
    /// The reader would need more memory than a real capture of this size could need.
    TooDense { size: u64, limit: u64 },
    /// The capture's frames declare more than a real capture needs (see
    /// [`MEMORY_CEILING`]).
    Declares { declared: Totals, memory: u64 },
    /// A frame holds more live blocks than it declares.
    LiveUndeclared { declared: u32 },
    /// The file changed while it was read.
    Changed,
    /// A newer mprof wrote it, and nothing in it is of a kind this one reads.
    Newer { format: u32, unreadable: u64 },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::TooDense { size, limit } => write!(
                f,
                "reading its {size} bytes would take more than {} MiB of memory, more than a \
                 capture of this size needs unless it holds millions of distinct stacks: it may \
                 be corrupt or crafted. To read it anyway, allow more memory with {}=<MiB>",
                (limit * 3) >> 20,
                build::MEMORY_ENV
            ),
            LoadError::Declares { declared, memory } => write!(
                f,
                "its frames declare {} stack nodes, {} bytes of names, {} live blocks and {} \
                 bytes of whole stacks: reading it would take {} MiB of memory, more than the \
                 {} MiB mprof takes without asking, and more than real captures need: it may \
                 be corrupt or crafted. To read it anyway, allow more memory with {}=<MiB>",
                declared.nodes,
                declared.text,
                declared.live,
                declared.stacks,
                memory >> 20,
                MEMORY_CEILING >> 20,
                build::MEMORY_ENV
            ),
            LoadError::Newer { format, unreadable } => write!(
                f,
                "a newer mprof wrote it (capture format {format}; this one reads up to {}) and \
                 none of its {unreadable} records is of a kind this one reads: read it with \
                 that newer mprof",
                crate::capture::file::FORMAT_VERSION
            ),
            LoadError::LiveUndeclared { declared } => write!(
                f,
                "a frame holds more live blocks than it declares ({declared}): the capture is \
                 corrupt or crafted"
            ),
            LoadError::Changed => write!(
                f,
                "the capture changed while it was being read (rewritten in place?); \
                 it is treated as corrupt"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// How a view reads a capture beyond its records: which files count as your code
/// (`--focus`) and which allocators it keeps (`--allocator`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Lens<'a> {
    /// Files that count as your code, besides those the capture names.
    pub focus: &'a [PathBuf],
    /// The allocators kept.
    pub allocators: Allocators,
    /// The processes shown (`--pid`): all of them merged, or one.
    pub pick: Pick,
}

/// What a read keeps beside the figures that every view needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Keep {
    /// The figures alone.
    #[default]
    Figures,
    /// The figures and the timeline's series ([`Profile::series`]): for the views that draw
    /// the timeline (`timeline`, `html`). Recording it costs a read about a tenth more.
    Series,
}

/// Warnings about the other processes' captures shown at most (then how many more).
const MAX_PROCESS_WARNINGS: usize = 8;

/// How far a capture got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completeness {
    /// The agent wrote its END record: sampling ended cleanly.
    Ended,
    /// No END record, but mprof finished the file (its Stats record): the program ended
    /// without a last sampled event after finalization started, or was killed.
    Finished,
    /// Neither: mprof was killed, or the capture is still being written. Figures stop at the
    /// last record.
    Incomplete,
}

/// One process of a capture (the program's, or a followed child's), as the profile saw it.
#[derive(Clone, Debug)]
pub struct Process {
    /// Its pid (from its capture's file name, or the program's metadata).
    pub pid: Option<u32>,
    /// What it did alone, and its metadata (`ppid`, `born`, `command`...; the program's is
    /// [`Profile::meta`]).
    pub figures: ProcessFigures,
}

impl Process {
    /// A metadata value of the process (made printable by the views).
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.figures.meta.get(key).map(String::as_str)
    }
}

/// A capture, aggregated.
pub struct Profile {
    /// Merged `key=value` pairs of the capture's Meta records (later records win), exact but
    /// bounded (see [`crate::analysis::aggregate`]): views make them printable.
    pub meta: BTreeMap<String, String>,
    /// Mean bytes between samples (the last rate announced; 1 when the capture has none).
    pub rate: u64,
    /// Whether a Meta record gave the rate.
    pub rate_known: bool,
    /// Alloc records in the capture.
    pub samples: u64,
    /// Records the agent dropped because the ring was full (from the last Stats record).
    pub dropped: u64,
    /// Seconds from the first timed record to the peak, if there was a peak.
    pub peak_seconds: Option<f64>,
    /// The peak RSS, if the capture has any reading: the highest reading (of all processes
    /// together), or the program's high-water mark from the kernel (`max_rss` in the
    /// metadata, written by `record`) if higher.
    pub max_rss: Option<u64>,
    /// Seconds from the first to the last timed record.
    pub duration_seconds: f64,
    /// The first timed record's clock (CLOCK_MONOTONIC ns), if there was one.
    pub start_ns: Option<u64>,
    /// Whether the capture ended cleanly.
    pub completeness: Completeness,
    /// Why reading stopped before the end of the file (a truncated or corrupt tail), if it did.
    pub damaged: Option<String>,
    /// Thread names, from Thread records (exact, cut to [`MAX_NAME`] bytes).
    pub threads: BTreeMap<u32, String>,
    totals: Figures,
    by_allocator: ByAllocator,
    /// The allocators the figures keep ([`Profile::select`]).
    selection: Allocators,
    names: Names,
    /// Figures per trie node; only nodes that end a sampled stack have samples.
    figures: Vec<Figures>,
    /// Figures per (stack, thread), sorted.
    sites: Vec<((StackId, u32), Figures)>,
    /// Which files are yours (see [`Profile::focus`]).
    focus: Focus,
    /// The processes whose records the figures add up: one, or the program and its followed
    /// children (see [`crate::capture::processes`]).
    pub processes: Vec<Process>,
    /// Whether the capture followed child processes (`--follow-children`), even when one
    /// process was picked.
    pub followed: bool,
    /// The processes asked for (`--pid`).
    pub pick: Pick,
    /// What the reader was told about the other processes' captures (unreadable, damaged).
    process_warnings: Vec<String>,
    /// Native modules that could not be symbolized, and why (one line each).
    symbol_warnings: Vec<String>,
    /// Where the capture's own process's RSS was (see [`crate::analysis::resident`]), if its
    /// mappings were read; and every breakdown kept, in time order.
    pub resident: Option<crate::analysis::resident::Where>,
    pub breakdowns: Vec<crate::analysis::resident::Parts>,
    /// The timeline's series ([`Profile::series`]).
    series: Option<series::Recorded>,
    /// Where the figures come from when they were read from interval profiles instead of a
    /// capture (see [`intervals`]).
    pub intervals: Option<intervals::FromIntervals>,
}

/// What a view reads, as its path names it: a capture (with its followed processes'), or
/// interval profiles: a directory of them (`--every --profiles-dir`), a time range of it
/// (`DIR@FROM..TO`), or one pprof file (see [`intervals`] and [`crate::capture::rolling`]).
pub enum Source {
    Captures(CaptureSet),
    Intervals {
        listing: Listing,
        range: Option<Range>,
        pick: Pick,
    },
}

impl Source {
    /// Opens what `path` names, the processes `pick` says.
    pub fn open(path: &Path, pick: Pick) -> Result<Source> {
        Ok(match Spec::of(path)? {
            None => Source::Captures(CaptureSet::open(path, pick)?),
            Some(spec) => Source::Intervals {
                listing: Listing::open(&spec)?,
                range: spec.range,
                pick,
            },
        })
    }

    /// The captures, when it is captures (to read them again, as the timeline may).
    pub fn captures(&self) -> Option<&CaptureSet> {
        match self {
            Source::Captures(set) => Some(set),
            Source::Intervals { .. } => None,
        }
    }

    /// The profile, and the warnings about it.
    pub fn read(&self) -> Result<(Profile, Vec<String>)> {
        self.read_keeping(Keep::Figures)
    }

    /// [`Source::read`] that keeps what `keep` says (interval profiles always carry their
    /// series: one point an interval).
    pub fn read_keeping(&self, keep: Keep) -> Result<(Profile, Vec<String>)> {
        match self {
            Source::Captures(set) => Profile::read_set_keeping(set, keep),
            Source::Intervals {
                listing,
                range,
                pick,
            } => intervals::read(listing, range.as_ref(), *pick),
        }
    }

    /// The profile; its warnings printed to stderr as `mprof: warning: ...` lines.
    pub fn load(&self) -> Result<Profile> {
        self.load_keeping(Keep::Figures)
    }

    /// [`Source::load`] that keeps what `keep` says.
    pub fn load_keeping(&self, keep: Keep) -> Result<Profile> {
        let (profile, warnings) = self.read_keeping(keep)?;
        for w in warnings {
            crate::say!("mprof: warning: {w}");
        }
        Ok(profile)
    }
}

impl Profile {
    /// Reads and aggregates a capture file, streaming it once through one descriptor and only as far as it reached when opened; prints its
    /// warnings ([`Profile::warnings`]) to stderr as `mprof: warning: ...` lines. A capture
    /// that changes while it is read, or that would take more memory than its allowance
    /// (see the module doc), is an error. A capture with
    /// followed children is read with theirs, merged (see [`crate::capture::processes`]). A
    /// directory of interval profiles, a time range of it or a pprof file is read as
    /// [`Source`] says.
    pub fn load(path: &Path) -> Result<Profile> {
        Source::open(path, Pick::All)?.load()
    }

    /// [`Profile::load`] of the processes `lens` picks, then seen through `lens`
    /// ([`Profile::set_focus`], [`Profile::select`]).
    pub fn load_with(path: &Path, lens: &Lens) -> Result<Profile> {
        let mut p = Source::open(path, lens.pick)?.load()?;
        p.set_focus(lens.focus);
        p.select(lens.allocators);
        Ok(p)
    }

    /// [`Profile::load`] of captures already open (to read them again afterwards, as the
    /// timeline does).
    pub fn load_set(set: &CaptureSet) -> Result<Profile> {
        Profile::load_set_keeping(set, Keep::Figures)
    }

    /// [`Profile::load_set`] that keeps what `keep` says.
    pub fn load_set_keeping(set: &CaptureSet, keep: Keep) -> Result<Profile> {
        let (profile, warnings) = Profile::read_set_keeping(set, keep)?;
        for w in warnings {
            crate::say!("mprof: warning: {w}");
        }
        Ok(profile)
    }

    /// [`Profile::load`] that returns its warnings instead of printing them.
    pub fn read(path: &Path) -> Result<(Profile, Vec<String>)> {
        Source::open(path, Pick::All)?.read()
    }

    /// [`Profile::load_set`] that returns its warnings instead of printing them.
    pub fn read_set(set: &CaptureSet) -> Result<(Profile, Vec<String>)> {
        Profile::read_set_keeping(set, Keep::Figures)
    }

    /// [`Profile::read_set`] that keeps what `keep` says.
    pub fn read_set_keeping(set: &CaptureSet, keep: Keep) -> Result<(Profile, Vec<String>)> {
        let context = || format!("cannot read {}", set.root().path().display());
        let mut first_rate = None;
        set.root().for_each(|r| {
            if let Record::Meta { text } = &r {
                first_rate = meta_rate(text);
            }
            first_rate.is_none()
        })?;
        let budget = Budget::new(Some(set.size()));
        let mut progress = Progress::new("reading", set.size());
        let mut builder = Builder::new(first_rate, keep);
        let mut failure = None;
        let passes = set
            .for_each(|event, at| {
                if let Some(addr) = at.records.upcoming() {
                    builder.prefetch(at.process, addr);
                }
                builder.feed(at.process, event, at.records.stacks());
                if let Some(declared) = at.records.live_declared() {
                    if builder.live_blocks() > declared as usize {
                        failure = Some(LoadError::LiveUndeclared { declared });
                        return false;
                    }
                }
                if builder.due() {
                    progress.update(at.read);
                    failure = budget.check(at.declared, builder.apart()).err();
                }
                failure.is_none()
            })
            .with_context(context)?;
        progress.finish();
        if let Some(e) = failure {
            return Err(anyhow::Error::new(e).context(context()));
        }
        if passes.iter().any(|p| p.changed) {
            return Err(anyhow::Error::new(LoadError::Changed).context(context()));
        }
        let mut profile = builder.finish();
        if let Some(p) = passes
            .first()
            .filter(|p| p.unreadable > 0 && profile.samples == 0)
        {
            if let Some(format) = p.newer {
                let e = LoadError::Newer {
                    format,
                    unreadable: p.unreadable,
                };
                return Err(anyhow::Error::new(e).context(context()));
            }
        }
        let mut passes = passes.into_iter().map(|p| p.warning);
        profile.damaged = passes.next().flatten();
        profile.followed = set.followed;
        profile.pick = set.pick;
        profile.process_warnings = set.warnings.clone();
        for (member, warning) in set.members.iter().skip(1).zip(passes) {
            if let Some(w) = warning {
                let name = member.file.path().file_name().unwrap_or_default();
                let name = name.to_string_lossy();
                profile.process_warnings.push(format!("{name}: {w}"));
            }
        }
        for (process, member) in profile.processes.iter_mut().zip(&set.members) {
            process.pid = member.pid;
        }
        let warnings = profile.warnings();
        Ok((profile, warnings))
    }

    /// What a reader of any view must be told about this capture, one line each: a damaged
    /// tail, an unknown rate, an incomplete capture.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(w) = &self.damaged {
            out.push(w.clone());
        }
        out.extend(
            self.process_warnings
                .iter()
                .take(MAX_PROCESS_WARNINGS)
                .cloned(),
        );
        if self.process_warnings.len() > MAX_PROCESS_WARNINGS {
            out.push(format!(
                "… and {} more warnings about the followed processes' captures",
                self.process_warnings.len() - MAX_PROCESS_WARNINGS
            ));
        }
        if !self.rate_known && self.samples > 0 {
            out.push(
                "the capture does not say its sampling rate; assuming every allocation was \
                 recorded"
                    .to_owned(),
            );
        }
        if let Some(w) = self.incomplete() {
            out.push(w);
        }
        out.extend(self.stopped_early());
        out.extend(self.symbol_warnings.iter().cloned());
        if let Some(from) = &self.intervals {
            out.extend(from.warnings.iter().cloned());
        }
        out
    }

    /// Whether the agent of some process switched itself off before the process ended (see
    /// [`Profile::stopped_early`]).
    pub fn sampling_stopped_early(&self) -> bool {
        self.processes
            .iter()
            .any(|p| p.figures.reader_gone_ns.is_some())
    }

    /// One sentence per process whose agent switched itself off before the process ended,
    /// because mprof's reader had gone silent: what came after is not in the figures.
    fn stopped_early(&self) -> Vec<String> {
        let several = self.processes.len() > 1;
        self.processes
            .iter()
            .filter_map(|p| {
                let at = p.figures.reader_gone_ns?;
                let seconds = at.saturating_sub(self.start_ns.unwrap_or(at)) as f64 / 1e9;
                let who = match (several, p.pid) {
                    (true, Some(pid)) => format!("PID {pid}: "),
                    _ => String::new(),
                };
                Some(format!(
                    "{who}sampling stopped at {seconds:.1} s, before the process ended: mprof's \
                     reader was silent for over 1.5 s (stopped, or starved of CPU), so the agent \
                     switched itself off; nothing after that is in the figures"
                ))
            })
            .collect()
    }

    /// Why the capture is incomplete, if it is: the sentence every view shows.
    pub fn incomplete(&self) -> Option<String> {
        (self.completeness == Completeness::Incomplete).then(|| {
            "incomplete capture: it has no END record (mprof was killed, or the capture is \
             still being written); figures stop at its last record"
                .to_owned()
        })
    }

    /// Aggregates decoded records, in file order (the in-memory form of [`Profile::load`]).
    pub fn from_records(records: &[Record]) -> Profile {
        let first_rate = records.iter().find_map(|r| match r {
            Record::Meta { text } => meta_rate(text),
            _ => None,
        });
        let mut builder = Builder::new(first_rate, Keep::Figures);
        for r in records {
            builder.feed_record(0, r);
        }
        builder.finish()
    }

    /// The timeline's series, recorded in the same pass as the figures when the read was
    /// asked to keep it ([`Keep::Series`]; None otherwise, and when there were too many lines
    /// changing too often to keep them: the timeline reads the capture again).
    pub fn series(&self) -> Option<&series::Recorded> {
        self.series.as_ref()
    }

    /// Sums the figures of the stacks into the totals, per allocator too.
    fn add_up(&mut self) {
        self.totals = Figures::default();
        self.by_allocator = ByAllocator::default();
        for (i, f) in self.figures.iter().enumerate() {
            self.totals.merge(f);
            self.by_allocator.add(self.names.allocator(i as u32), f);
        }
    }

    /// Keeps only the blocks of the allocators in `keep` (the `--allocator` option): every
    /// stack, site and total of the others is left out. The peak stays the moment the whole
    /// live heap was highest, so the allocators' shares of the peak add up to it.
    pub fn select(&mut self, keep: Allocators) {
        self.selection = keep;
        if keep.is_all() {
            return;
        }
        let names = &self.names;
        for (i, f) in self.figures.iter_mut().enumerate() {
            if !keep.contains(names.allocator(i as u32)) {
                *f = Figures::default();
            }
        }
        self.sites
            .retain(|((stack, _), _)| keep.contains(names.allocator(stack.0)));
        self.add_up();
    }

    /// The allocators the figures keep (all, unless [`Profile::select`] left some out).
    pub fn selection(&self) -> Allocators {
        self.selection
    }

    /// The allocator the blocks of a stack came from.
    pub fn allocator(&self, stack: StackId) -> Allocator {
        self.names.allocator(stack.0)
    }

    /// Totals per allocator (those left out by [`Profile::select`] are zero).
    pub fn by_allocator(&self) -> &ByAllocator {
        &self.by_allocator
    }

    /// Whether the agent hooked the C allocator family: `Some(false)` for a capture recorded
    /// with `--python-only`, `None` when the capture does not say (made before mprof saw
    /// native allocations, or by hand).
    pub fn native_recorded(&self) -> Option<bool> {
        match self.meta.get(NATIVE_META).map(String::as_str) {
            Some("off") => Some(false),
            Some("on") => Some(true),
            _ => None,
        }
    }

    /// Stacks with at least one sample ([`Figures::sampled`]), in a fixed order (first
    /// sampled first).
    pub fn stacks(&self) -> impl Iterator<Item = (StackId, &Figures)> + '_ {
        self.figures
            .iter()
            .enumerate()
            .filter(|(_, f)| f.sampled())
            .map(|(i, f)| (StackId(i as u32), f))
    }

    /// Stacks with their figures in one thread (`Some(tid)`) or in all threads (`None`), in the
    /// order of [`Profile::stacks`].
    pub fn stacks_of(&self, thread: Option<u32>) -> Vec<(StackId, Figures)> {
        match thread {
            None => self.stacks().map(|(id, f)| (id, *f)).collect(),
            Some(tid) => self
                .sites
                .iter()
                .filter(|((_, t), _)| *t == tid)
                .map(|((id, _), f)| (*id, *f))
                .collect(),
        }
    }

    /// Figures per (stack, thread), sorted by stack then thread.
    pub fn sites(&self) -> &[((StackId, u32), Figures)] {
        &self.sites
    }

    /// Threads that allocated, with their names when a Thread record gave one.
    pub fn thread_ids(&self) -> Vec<u32> {
        let mut tids: Vec<u32> = self.sites.iter().map(|((_, t), _)| *t).collect();
        tids.sort_unstable();
        tids.dedup();
        tids
    }

    /// `1234 MainThread`, or `1234` for a thread without a name; printable.
    pub fn thread_label(&self, tid: u32) -> String {
        match self.threads.get(&tid) {
            Some(name) if !name.is_empty() => {
                format!("{tid} {}", crate::base::text::printable(name))
            }
            _ => tid.to_string(),
        }
    }

    /// The frames of a stack, innermost first (a thread's own: see
    /// [`Profile::frames_with_origin`]).
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.names.frames(stack.0)
    }

    /// The frames of a stack, innermost first, then, when its thread's creation is known,
    /// `<new thread>` and the stack that created the thread (what your code's grouping and
    /// whole stacks show).
    pub fn frames_with_origin(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.names.frames_with_origin(stack.0)
    }

    /// The stack trie, for walks that share the work of stacks with the same callers.
    pub(crate) fn trie(&self) -> &Names {
        &self.names
    }

    /// The innermost frame of a stack.
    pub fn innermost(&self, stack: StackId) -> Location<'_> {
        self.names.innermost(stack.0)
    }

    /// Which files are your code, for [`crate::analysis::grouping::Grouping::YourCode`]: the
    /// capture's metadata (`cwd`, `program_dir`) and the paths given to [`Profile::set_focus`].
    pub fn focus(&self) -> &Focus {
        &self.focus
    }

    /// Adds the user's `--focus` paths to what counts as your code.
    pub fn set_focus(&mut self, paths: &[PathBuf]) {
        self.focus = Focus::new(&self.meta, paths);
    }

    /// Totals over all stacks, per view.
    pub fn totals(&self) -> &Figures {
        &self.totals
    }
}

mod build;
pub mod intervals;
pub mod series;
pub(crate) use build::Budget;
use build::Builder;
pub use build::{
    declared_memory, MEMORY_CEILING, MEMORY_ENV, MEMORY_PER_LIVE, MEMORY_PER_NODE,
    MEMORY_PER_STACK_BYTE, MEMORY_PER_TEXT,
};
#[cfg(any(test, fuzzing))]
pub use build::{last_limit, reset_last_limit};

#[cfg(test)]
mod tests;
