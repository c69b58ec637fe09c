//! A profile read from interval profiles instead of a capture: a directory of the pprof files
//! `--every --profiles-dir` writes (one per interval, see `crate::capture::rolling`), a time
//! range of it, or one pprof file mprof wrote.
//!
//! Per stack and thread:
//! - **allocated**: the sum of the selected intervals' `alloc_objects`/`alloc_space`;
//! - **live**: the `inuse_objects`/`inuse_space` of the last selected interval (at its end);
//! - **peak**: the `inuse_*` figures of the selected interval whose whole `inuse_space` was
//!   highest, at its end (a file with `peak_*` types, `mprof export`'s, has its own peak). The
//!   peak is only seen at the intervals' ends: a higher heap between two ends is not.
//!
//! Standard errors come from the `alloc_space_stderr`/`inuse_space_stderr` labels (variance =
//! stderr², the stderr rounded to whole bytes by the writer); a file without them (another
//! writer's pprof) gets `rate × bytes`, which bounds the variance from above (each sample of
//! `s` bytes adds `(1 − p)·w² ≤ rate·w`). The samples behind an estimate are not in the files:
//! they are derived as `min(objects, bytes² / variance)` at least 1, which is exact at `--rate
//! 1` and close for blocks much smaller than the rate (each sample then stands for about
//! `rate` bytes and adds `rate²` to the variance) or much larger (each is about one object);
//! for blocks of `s` bytes it is `min(e^(s/rate), 1/(1 − e^(−s/rate)))` times the samples, at
//! most 2 (at `s = rate·ln 2`). Threads' names come from the `thread_name` label, the allocator from the
//! `allocator` label (`python` when it has none), the metadata from the comments (`key=value`:
//! the resource, `mprof.interval`, `mprof.dropped`), the rate from the `period`. Native frames
//! come back as plain frames: the files do not say which frames are native.
//!
//! The files are untrusted. Each is read within a memory allowance: the bytes the whole read
//! holds may reach [`MEMORY_LIMIT`] (or what `MPROF_READ_MEMORY_MIB` allows), and a file whose
//! message would take more once built is refused before it is built
//! ([`crate::capture::pprof::decode_within`]). A file that is not a heap profile, or that
//! refers to a string, function or location it does not have, is skipped with a warning (an
//! error when no file could be read); names are cut to [`MAX_NAME`] and stacks to
//! [`MAX_DEPTH`] as for captures.

use super::build::allowed_by_user;
use super::series::{Recorded, SeriesPoint, MAX_LOG, POINTS};
use super::{Completeness, Process, Profile};
use crate::analysis::aggregate::{merge_meta, ProcessFigures};
use crate::analysis::allocators::{Allocator, Allocators, ByAllocator};
use crate::analysis::estimate::{Estimate, Figures};
use crate::analysis::focus::Focus;
use crate::analysis::names::{FastMap, Names, StackId, MAX_DEPTH, MAX_NAME, UNKNOWN};
use crate::base::text::elide;
use crate::capture::pprof::{decode_within, PprofProfile};
use crate::capture::processes::Pick;
use crate::capture::rolling::{Listing, Name, Range};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// What reading interval profiles may hold in memory (without `MPROF_READ_MEMORY_MIB`).
pub const MEMORY_LIMIT: u64 = 1 << 30;
/// Skipped files named one line each at most (then how many more).
const MAX_SKIPPED_LINES: usize = 8;
/// The longest interval believed (a longer duration in a file is taken as 0).
const MAX_DURATION_NS: i64 = 7 * 86_400 * 1_000_000_000;
/// Processes told apart at most (further pids are counted with the last one).
const MAX_PROCESSES: usize = 4096;

/// Where a profile read from interval profiles came from, and how.
#[derive(Clone, Debug)]
pub struct FromIntervals {
    /// The directory or file.
    pub path: PathBuf,
    /// The time range asked for, as written (`..1h`).
    pub range: Option<String>,
    /// The intervals read, the files selected, and the interval files listed (whatever the
    /// range).
    pub read: usize,
    pub selected: usize,
    pub listed: usize,
    /// The first read interval's start and the last one's end, in seconds from the start of
    /// the first interval listed.
    pub from_seconds: f64,
    pub to_seconds: f64,
    /// Whether every file read gave its standard errors (else some are upper bounds).
    pub stderr_known: bool,
    /// Files skipped, one line each, and what the listing said.
    pub warnings: Vec<String>,
}

impl FromIntervals {
    /// `2 of the 7 interval profiles in prof (@..1h): 0.0 s to 2.1 s`: where the figures
    /// come from, as every view says it.
    pub fn text(&self) -> String {
        let range = match &self.range {
            Some(r) => format!(" (@{r})"),
            None => String::new(),
        };
        let which = match (self.read, self.listed) {
            (1, 1) => "1 interval profile".to_owned(),
            (r, l) if r == l => format!("all {r} interval profiles"),
            (r, l) => format!("{r} of the {l} interval profiles"),
        };
        format!(
            "{which} in {}{range}: {:.1} s to {:.1} s",
            self.path.display(),
            self.from_seconds,
            self.to_seconds
        )
    }

    /// How the figures were made from the intervals, as views say it under [`Self::text`].
    pub fn how(&self) -> &'static str {
        if self.stderr_known {
            "live: at the end of the last interval; peak: at the end of the interval with the \
             highest live heap; samples: derived from the standard errors (approximate)"
        } else {
            "live: at the end of the last interval; peak: at the end of the interval with the \
             highest live heap; samples and standard errors: the files do not hold them, \
             bounded from the rate (approximate)"
        }
    }
}

/// Reads the intervals of `listing` that `range` selects (all without one), the samples of
/// the processes `pick` says; returns the profile and its warnings.
pub(super) fn read(
    listing: &Listing,
    range: Option<&Range>,
    pick: Pick,
) -> Result<(Profile, Vec<String>)> {
    let path = listing.path.display().to_string();
    if listing.files.is_empty() {
        bail!(
            "{path} is a directory, not a capture file, and holds no interval profiles (files \
             named mprof-<unix ms>-<pid>-<n>.pb.gz, written by --every --profiles-dir)"
        );
    }
    let mut reader = Reader::new(pick);
    let mut selection = Selection::of(listing, range, &reader)?;
    for i in selection.indices.clone() {
        let message = match selection.take(i) {
            Some(Ok(m)) => Ok(m),
            Some(Err(())) => continue,
            None => reader.decode(listing, i),
        };
        match message.and_then(|m| reader.add(&listing.files[i].1, &m)) {
            Ok(()) => reader.check_memory()?,
            Err(e) => selection.skipped.push((i, e)),
        }
    }
    let name = |i: usize| listing.files[i].0.as_str();
    if reader.intervals == 0 {
        if let Some((i, e)) = selection.skipped.first() {
            bail!(
                "{path}: no interval profile could be read: {}: {e:#}",
                name(*i)
            );
        }
    }
    if let Pick::Pid(pid) = pick {
        if reader.intervals == 0 {
            let seen: Vec<String> = reader.pids_seen.iter().map(u32::to_string).collect();
            bail!(
                "PID {pid} is not among the processes of {path}{}: {}",
                range.map_or(String::new(), |r| format!("@{}", r.text)),
                seen.join(", ")
            );
        }
    }
    let mut warnings = listing.warnings.clone();
    let skipped = &selection.skipped;
    for (i, e) in skipped.iter().take(MAX_SKIPPED_LINES) {
        warnings.push(format!("skipping {}: {e:#}", name(*i)));
    }
    if skipped.len() > MAX_SKIPPED_LINES {
        warnings.push(format!(
            "… and {} more interval profiles skipped",
            skipped.len() - MAX_SKIPPED_LINES
        ));
    }
    // Offsets are counted from the first interval listed (for one file not named as the
    // directory's are, from its own start).
    let first_ns = match listing.files[0].1 {
        Some(n) => n.start_ns(),
        None => reader.first_ns.unwrap_or(0),
    };
    let from = FromIntervals {
        path: listing.path.clone(),
        range: range.map(|r| r.text.clone()),
        read: reader.intervals,
        selected: selection.indices.len(),
        listed: listing.files.len(),
        from_seconds: reader.first_ns.unwrap_or(first_ns).saturating_sub(first_ns) as f64 / 1e9,
        to_seconds: reader.last_end_ns.saturating_sub(first_ns) as f64 / 1e9,
        stderr_known: reader.stderr_known,
        warnings,
    };
    let mut profile = reader.finish(pick);
    profile.intervals = Some(from);
    let warnings = profile.warnings();
    Ok((profile, warnings))
}

/// The files a range selects.
struct Selection {
    indices: std::ops::Range<usize>,
    /// The last file, when it was read first (a range counted back from its end), as read.
    last: Option<(usize, Result<PprofProfile, ()>)>,
    /// The files skipped, and why.
    skipped: Vec<(usize, anyhow::Error)>,
}

impl Selection {
    /// The files of `listing` that `range` selects, in time order: those that start in it
    /// (by their names' times); a range that selects none is an error.
    fn of(listing: &Listing, range: Option<&Range>, reader: &Reader) -> Result<Selection> {
        let n = listing.files.len();
        let mut selection = Selection {
            indices: 0..n,
            last: None,
            skipped: Vec::new(),
        };
        let Some(range) = range else {
            return Ok(selection);
        };
        let starts: Vec<u64> = listing
            .files
            .iter()
            .map(|(_, name)| start_of(name, None))
            .collect();
        let mut end_ns = starts[n - 1];
        if range.needs_end() {
            let last = reader.decode(listing, n - 1);
            if let Ok(m) = &last {
                end_ns = end_of(&listing.files[n - 1].1, m);
            }
            selection.last = Some((n - 1, last.map_err(|e| selection.skipped.push((n - 1, e)))));
        }
        selection.indices = range.select(&starts, end_ns);
        if selection.indices.is_empty() {
            let last = starts[n - 1].saturating_sub(starts[0]) as f64 / 1e9;
            bail!(
                "{}@{}: the range selects none of its {n} interval(s), which start from 0 s \
                 to {last:.1} s",
                listing.path.display(),
                range.text
            );
        }
        let indices = selection.indices.clone();
        selection.skipped.retain(|(i, _)| indices.contains(i));
        Ok(selection)
    }

    /// File `i`'s message if it was read already (`Err(())`: it could not be).
    fn take(&mut self, i: usize) -> Option<Result<PprofProfile, ()>> {
        match self.last.take() {
            Some((at, m)) if at == i => Some(m),
            other => {
                self.last = other;
                None
            }
        }
    }
}

/// When an interval started: its file name's time, else its message's.
fn start_of(name: &Option<Name>, m: Option<&PprofProfile>) -> u64 {
    match (name, m) {
        (Some(n), _) => n.start_ns(),
        (None, Some(m)) => m.time_nanos.max(0) as u64,
        (None, None) => 0,
    }
}

/// When an interval ended.
fn end_of(name: &Option<Name>, m: &PprofProfile) -> u64 {
    let duration = match m.duration_nanos {
        d if (0..=MAX_DURATION_NS).contains(&d) => d as u64,
        _ => 0,
    };
    start_of(name, Some(m)).saturating_add(duration)
}

/// The columns of a file's sample types that mprof reads.
#[derive(Default)]
struct Columns {
    alloc: Option<(usize, usize)>,
    inuse: Option<(usize, usize)>,
    peak: Option<(usize, usize)>,
}

/// One sample of an interval, read.
struct Entry<'m> {
    site: u32,
    pid: u32,
    stack: u32,
    figures: Figures,
    thread_name: Option<&'m str>,
}

/// The profile under construction.
struct Reader {
    pick: Pick,
    names: Names,
    site_ids: FastMap<(u32, u32), u32>,
    keys: Vec<(StackId, u32)>,
    allocated: Vec<Estimate>,
    /// The last interval's live figures, per site.
    live: Vec<(u32, Estimate)>,
    /// The candidate peak's figures, per site, and its live heap and end.
    peak: Vec<(u32, Estimate)>,
    peak_bytes: Option<f64>,
    peak_end_ns: Option<u64>,
    threads: BTreeMap<u32, String>,
    meta: BTreeMap<String, String>,
    rate: Option<u64>,
    stderr_known: bool,
    /// Per process: allocated, live in the last interval, highest live.
    processes: BTreeMap<u32, (Estimate, Estimate, f64)>,
    pids_seen: BTreeSet<u32>,
    /// Per session (file name's pid): the agent's drops so far, as its last interval says.
    dropped: BTreeMap<u32, u64>,
    intervals: usize,
    first_ns: Option<u64>,
    last_end_ns: u64,
    series: Option<Recorded>,
    /// Per stack: its live bytes in the series' last point.
    series_bytes: FastMap<u32, (u32, f64)>,
    /// The stacks whose live bytes were not 0 at the series' last point.
    series_live: Vec<u32>,
    memory_base: isize,
    memory_limit: u64,
}

impl Reader {
    fn new(pick: Pick) -> Reader {
        Reader {
            pick,
            names: Names::new(),
            site_ids: FastMap::default(),
            keys: Vec::new(),
            allocated: Vec::new(),
            live: Vec::new(),
            peak: Vec::new(),
            peak_bytes: None,
            peak_end_ns: None,
            threads: BTreeMap::new(),
            meta: BTreeMap::new(),
            rate: None,
            stderr_known: true,
            processes: BTreeMap::new(),
            pids_seen: BTreeSet::new(),
            dropped: BTreeMap::new(),
            intervals: 0,
            first_ns: None,
            last_end_ns: 0,
            series: Some(Recorded::default()),
            series_bytes: FastMap::default(),
            series_live: Vec::new(),
            memory_base: crate::base::memory::in_use(),
            memory_limit: MEMORY_LIMIT.max(allowed_by_user()),
        }
    }

    /// What the read holds now, in bytes.
    fn held(&self) -> u64 {
        (crate::base::memory::in_use() - self.memory_base).max(0) as u64
    }

    /// An error once the read holds more than its allowance.
    fn check_memory(&self) -> Result<()> {
        if self.held() > self.memory_limit {
            bail!(
                "reading these interval profiles would take more than {} MiB of memory, more \
                 than real ones need: they may be corrupt or crafted. To read them anyway, \
                 allow more memory with {}=<MiB>",
                self.memory_limit >> 20,
                super::MEMORY_ENV
            );
        }
        Ok(())
    }

    /// The message of file `i`, within what the allowance has left.
    fn decode(&self, listing: &Listing, i: usize) -> Result<PprofProfile> {
        let bytes = listing.read(i)?;
        let left = self
            .memory_limit
            .saturating_sub(self.held())
            .saturating_sub(bytes.len() as u64);
        decode_within(&bytes, left)
    }

    /// Adds one interval (its file's name, its message); a message that is not a heap profile
    /// or refers to what it does not have counts for nothing and is an error (the stacks it
    /// interned stay, without figures).
    fn add(&mut self, name: &Option<Name>, m: &PprofProfile) -> Result<()> {
        let strings = Strings(&m.string_table);
        let columns = columns(m, &strings)?;
        let (comments, file_pid) = self.comments(m, &strings, name)?;
        let rate = u64::try_from(m.period).ok().filter(|&r| r > 0);
        let entries = self.entries(m, &strings, &columns, file_pid, rate.unwrap_or(1))?;
        if matches!(self.pick, Pick::Pid(_)) && entries.is_empty() {
            // Not the picked process's: its live blocks are in the intervals that hold it.
            return Ok(());
        }
        // The interval is sound: it counts.
        merge_meta(
            &mut self.meta,
            comments.iter().filter_map(|c| c.split_once('=')),
        );
        if let Some(dropped) = comments
            .iter()
            .find_map(|c| c.strip_prefix("mprof.dropped="))
            .and_then(|v| v.parse().ok())
        {
            self.dropped.insert(file_pid, dropped);
        }
        self.rate = rate.or(self.rate);
        let start = start_of(name, Some(m));
        let end = end_of(name, m);
        self.first_ns.get_or_insert(start);
        self.last_end_ns = self.last_end_ns.max(end);
        self.intervals += 1;
        for e in &entries {
            if let Some(name) = e.thread_name {
                let tid = self.keys[e.site as usize].1;
                self.threads.insert(tid, elide(name, MAX_NAME).into_owned());
            }
        }
        self.merge(entries, columns.peak.is_some(), end);
        Ok(())
    }

    /// The comments, as text, and the session's pid (its file name's, else its resource's).
    fn comments<'m>(
        &self,
        m: &'m PprofProfile,
        strings: &Strings<'m>,
        name: &Option<Name>,
    ) -> Result<(Vec<&'m str>, u32)> {
        let comments = m
            .comment
            .iter()
            .map(|&c| strings.get(c))
            .collect::<Result<Vec<_>>>()?;
        let resource_pid = comments
            .iter()
            .find_map(|c| c.strip_prefix("process.pid="))
            .and_then(|p| p.parse().ok());
        let pid = name.map(|n| n.pid).or(resource_pid).unwrap_or(0);
        Ok((comments, pid))
    }

    /// The samples of `m` kept (the pick), each on its site.
    fn entries<'m>(
        &mut self,
        m: &'m PprofProfile,
        strings: &Strings<'m>,
        columns: &Columns,
        file_pid: u32,
        rate: u64,
    ) -> Result<Vec<Entry<'m>>> {
        let frames = Frames::of(m, strings, &mut self.names)?;
        let mut stack = Vec::new();
        let mut entries = Vec::with_capacity(m.sample.len());
        for sample in &m.sample {
            if sample.value.len() != m.sample_type.len() {
                bail!(
                    "a sample has {} values for {} sample types",
                    sample.value.len(),
                    m.sample_type.len()
                );
            }
            if sample.value.iter().any(|&v| v < 0) {
                bail!("a sample has a negative value");
            }
            let labels = Labels::of(sample, strings)?;
            let pid = labels.pid.unwrap_or(file_pid);
            if self.pids_seen.len() < MAX_PROCESSES {
                self.pids_seen.insert(pid);
            }
            if matches!(self.pick, Pick::Pid(p) if p != pid) {
                continue;
            }
            stack.clear();
            for &id in &sample.location_id {
                stack.extend_from_slice(frames.of_location(id)?);
                if stack.len() > MAX_DEPTH {
                    break;
                }
            }
            let stack = self.names.stack_of(labels.allocator, &stack);
            let figures = Figures {
                allocated: estimate(&sample.value, columns.alloc, labels.alloc_stderr, rate),
                live: estimate(&sample.value, columns.inuse, labels.inuse_stderr, rate),
                peak: estimate(&sample.value, columns.peak, labels.peak_stderr, rate),
            };
            if labels.inuse_stderr.is_none() && columns.inuse.is_some() {
                self.stderr_known = false;
            }
            entries.push(Entry {
                site: self.site(stack, labels.tid),
                pid,
                stack,
                figures,
                thread_name: labels.thread_name,
            });
        }
        Ok(entries)
    }

    /// The site of (stack, thread).
    fn site(&mut self, stack: u32, tid: u32) -> u32 {
        let next = self.keys.len() as u32;
        let id = *self.site_ids.entry((stack, tid)).or_insert(next);
        if id == next {
            self.keys.push((StackId(stack), tid));
            self.allocated.push(Estimate::default());
        }
        id
    }

    /// Counts one interval's entries: allocated added, live replaced, the peak candidate.
    fn merge(&mut self, mut entries: Vec<Entry>, own_peak: bool, end_ns: u64) {
        entries.sort_by_key(|e| e.site);
        let mut live: Vec<(u32, Estimate)> = Vec::with_capacity(entries.len());
        let mut peak: Vec<(u32, Estimate)> = Vec::new();
        for p in self.processes.values_mut() {
            p.1 = Estimate::default();
        }
        let mut by_pid: BTreeMap<u32, f64> = BTreeMap::new();
        for e in &entries {
            self.allocated[e.site as usize].merge(&e.figures.allocated);
            match live.last_mut() {
                Some((s, est)) if *s == e.site => est.merge(&e.figures.live),
                _ => live.push((e.site, e.figures.live)),
            }
            if own_peak {
                match peak.last_mut() {
                    Some((s, est)) if *s == e.site => est.merge(&e.figures.peak),
                    _ => peak.push((e.site, e.figures.peak)),
                }
            }
            let key = self.process_key(e.pid);
            let p = self.processes.entry(key).or_default();
            p.0.merge(&e.figures.allocated);
            p.1.merge(&e.figures.live);
            *by_pid.entry(key).or_default() += e.figures.live.bytes;
        }
        for (pid, bytes) in by_pid {
            let p = self.processes.entry(pid).or_default();
            p.2 = p.2.max(bytes);
        }
        let live_bytes: f64 = live.iter().map(|(_, e)| e.bytes).sum();
        let (candidate, bytes, at) = match own_peak {
            true => {
                let bytes = peak.iter().map(|(_, e)| e.bytes).sum();
                (peak, bytes, None)
            }
            false => (live.clone(), live_bytes, Some(end_ns)),
        };
        if self.peak_bytes.is_none_or(|best| bytes > best) {
            self.peak = candidate;
            self.peak_bytes = Some(bytes);
            self.peak_end_ns = at;
        }
        self.record_point(&entries, end_ns, live_bytes);
        self.live = live;
    }

    /// The process a sample of `pid` counts with: itself, unless too many were seen.
    fn process_key(&self, pid: u32) -> u32 {
        if self.processes.len() < MAX_PROCESSES || self.processes.contains_key(&pid) {
            return pid;
        }
        *self.processes.keys().next_back().unwrap_or(&pid)
    }

    /// The series' point at the end of an interval: its live heap, and the stacks whose live
    /// bytes changed since the point before.
    fn record_point(&mut self, entries: &[Entry], end_ns: u64, heap: f64) {
        let Some(series) = &mut self.series else {
            return;
        };
        let point = series.points.len() as u32;
        series.points.push(SeriesPoint {
            time_ns: end_ns,
            rss: None,
            heap,
            lo: heap,
            hi: heap,
            hi_first: false,
        });
        let mut now: FastMap<u32, f64> = FastMap::default();
        for e in entries {
            *now.entry(e.stack).or_default() += e.figures.live.bytes;
        }
        // The stacks live at the point before and not now: gone to 0.
        for stack in std::mem::take(&mut self.series_live) {
            if !now.contains_key(&stack) {
                if let Some((line, bytes)) = self.series_bytes.get_mut(&stack) {
                    *bytes = 0.0;
                    series.log.push((point, *line, 0.0));
                }
            }
        }
        for (stack, bytes) in now {
            let next = series.lines.len() as u32;
            let (line, was) = self.series_bytes.entry(stack).or_insert((next, 0.0));
            if *line == next {
                series.lines.push(StackId(stack));
            }
            if *was != bytes {
                *was = bytes;
                series.log.push((point, *line, bytes));
            }
            if bytes != 0.0 {
                self.series_live.push(stack);
            }
        }
        if series.log.len() > MAX_LOG {
            self.series = None;
        }
    }

    /// The profile.
    fn finish(self, pick: Pick) -> Profile {
        let n = self.keys.len();
        let mut site_figures = vec![Figures::default(); n];
        for (i, a) in self.allocated.iter().enumerate() {
            site_figures[i].allocated = *a;
        }
        for &(s, e) in &self.live {
            site_figures[s as usize].live = e;
        }
        for &(s, e) in &self.peak {
            site_figures[s as usize].peak = e;
        }
        let mut figures = vec![Figures::default(); self.names.nodes.len()];
        let mut sites = Vec::with_capacity(n);
        let mut samples = 0;
        for (&(stack, tid), f) in self.keys.iter().zip(&site_figures) {
            if !f.sampled() {
                // Only in an interval that was skipped.
                continue;
            }
            figures[stack.0 as usize].merge(f);
            samples += f.allocated.samples.max(f.live.samples).max(f.peak.samples);
            sites.push(((stack, tid), *f));
        }
        sites.sort_by_key(|(k, _)| *k);
        let first_ns = self.first_ns.unwrap_or(0);
        let mut meta = self.meta;
        for (from, to) in [
            ("process.pid", "pid"),
            ("process.runtime.version", "python"),
            ("service.name", "command"),
        ] {
            if let Some(v) = meta.get(from).cloned() {
                merge_meta(&mut meta, std::iter::once((to, v.as_str())));
            }
        }
        let start_unix_ms = (first_ns / 1_000_000).to_string();
        let intervals = self.intervals.to_string();
        merge_meta(
            &mut meta,
            [
                ("mode", "intervals"),
                ("start_unix_ms", start_unix_ms.as_str()),
                ("intervals", intervals.as_str()),
            ]
            .into_iter(),
        );
        let rate = self.rate.unwrap_or(1);
        let main_pid = meta.get("pid").and_then(|p| p.parse::<u32>().ok());
        let mut processes: Vec<Process> = self
            .processes
            .iter()
            .map(|(&pid, &(allocated, live, peak_bytes))| Process {
                pid: Some(pid),
                figures: ProcessFigures {
                    meta: BTreeMap::from([
                        ("pid".to_owned(), pid.to_string()),
                        ("born".to_owned(), "-".to_owned()),
                    ]),
                    rate,
                    allocated,
                    live,
                    peak_bytes,
                    ended: true,
                    finished: true,
                    ..ProcessFigures::default()
                },
            })
            .collect();
        processes.sort_by_key(|p| (p.pid != main_pid, p.pid));
        let series = self.series.map(|s| thin(s, POINTS));
        let mut profile = Profile {
            focus: Focus::new(&meta, &[]),
            processes,
            followed: false,
            pick,
            process_warnings: Vec::new(),
            rate,
            rate_known: self.rate.is_some(),
            samples,
            dropped: self.dropped.values().sum(),
            peak_seconds: self
                .peak_end_ns
                .map(|t| t.saturating_sub(first_ns) as f64 / 1e9),
            max_rss: None,
            duration_seconds: self.last_end_ns.saturating_sub(first_ns) as f64 / 1e9,
            start_ns: Some(first_ns),
            completeness: Completeness::Ended,
            damaged: None,
            threads: self.threads,
            totals: Figures::default(),
            by_allocator: ByAllocator::default(),
            selection: Allocators::ALL,
            names: self.names,
            figures,
            sites,
            symbol_warnings: Vec::new(),
            series,
            resident: None,
            breakdowns: Vec::new(),
            meta,
            intervals: None,
        };
        profile.add_up();
        profile
    }
}

/// A series of more than twice `points` points merged down to `points` or fewer: each kept
/// point stands for a run of them (the live heap's lowest and highest over the run).
fn thin(mut s: Recorded, points: usize) -> Recorded {
    if s.points.len() <= 2 * points {
        return s;
    }
    let k = s.points.len().div_ceil(points);
    let merged: Vec<SeriesPoint> = s
        .points
        .chunks(k)
        .map(|run| {
            let last = run[run.len() - 1];
            let (mut lo, mut hi) = ((0, f64::INFINITY), (0, f64::NEG_INFINITY));
            for (i, p) in run.iter().enumerate() {
                if p.heap < lo.1 {
                    lo = (i, p.heap);
                }
                if p.heap > hi.1 {
                    hi = (i, p.heap);
                }
            }
            SeriesPoint {
                lo: lo.1,
                hi: hi.1,
                hi_first: hi.0 < lo.0,
                ..last
            }
        })
        .collect();
    for entry in &mut s.log {
        entry.0 /= k as u32;
    }
    s.points = merged;
    s
}

/// An estimate of one figure: the (objects, bytes) columns of `values`, its standard error
/// (else the bound `rate × bytes` on its variance), and the samples derived (module doc).
fn estimate(
    values: &[i64],
    columns: Option<(usize, usize)>,
    stderr: Option<i64>,
    rate: u64,
) -> Estimate {
    let Some((objects, bytes)) = columns else {
        return Estimate::default();
    };
    let (count, bytes) = (values[objects] as f64, values[bytes] as f64);
    let variance = match stderr {
        Some(e) => (e.max(0) as f64).powi(2),
        None if rate > 1 => rate as f64 * bytes,
        None => 0.0,
    };
    Estimate {
        bytes,
        count,
        variance,
        samples: derived_samples(bytes, count, variance),
    }
}

/// The samples an estimate rests on, from its figures (see the module doc).
fn derived_samples(bytes: f64, count: f64, variance: f64) -> u64 {
    if bytes <= 0.0 && count <= 0.0 {
        return 0;
    }
    let n = match variance > 0.0 {
        true => (bytes * bytes / variance).min(count),
        false => count,
    };
    n.round().max(1.0) as u64
}

/// The string table of a message.
struct Strings<'m>(&'m [String]);

impl<'m> Strings<'m> {
    fn get(&self, i: i64) -> Result<&'m str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.0.get(i))
            .map(String::as_str)
            .ok_or_else(|| anyhow::anyhow!("a string index out of range ({i})"))
    }
}

/// The columns of the sample types mprof reads; a file with neither `alloc_space` nor
/// `inuse_space` is not a heap profile.
fn columns(m: &PprofProfile, strings: &Strings) -> Result<Columns> {
    let types = m
        .sample_type
        .iter()
        .map(|t| strings.get(t.r#type))
        .collect::<Result<Vec<_>>>()?;
    let pair = |what: &str| {
        let at = |t: String| types.iter().position(|&x| x == t);
        Some((at(format!("{what}_objects"))?, at(format!("{what}_space"))?))
    };
    let c = Columns {
        alloc: pair("alloc"),
        inuse: pair("inuse"),
        peak: pair("peak"),
    };
    if c.alloc.is_none() && c.inuse.is_none() {
        bail!("not a heap profile (no alloc_objects/alloc_space nor inuse_objects/inuse_space)");
    }
    Ok(c)
}

/// The labels of a sample that mprof reads.
struct Labels<'m> {
    tid: u32,
    pid: Option<u32>,
    allocator: Allocator,
    thread_name: Option<&'m str>,
    alloc_stderr: Option<i64>,
    inuse_stderr: Option<i64>,
    peak_stderr: Option<i64>,
}

impl<'m> Labels<'m> {
    fn of(sample: &crate::capture::pprof::Sample, strings: &Strings<'m>) -> Result<Labels<'m>> {
        let mut l = Labels {
            tid: 0,
            pid: None,
            allocator: Allocator::Python,
            thread_name: None,
            alloc_stderr: None,
            inuse_stderr: None,
            peak_stderr: None,
        };
        let number = |n: i64| u32::try_from(n).unwrap_or(0);
        for label in &sample.label {
            match strings.get(label.key)? {
                "thread" => l.tid = number(label.num),
                // A number in interval profiles, text in `mprof export`'s.
                "pid" if label.str != 0 => l.pid = strings.get(label.str)?.parse().ok(),
                "pid" => l.pid = Some(number(label.num)),
                "allocator" => {
                    let name = strings.get(label.str)?;
                    l.allocator = Allocator::ALL
                        .into_iter()
                        .find(|a| a.name() == name)
                        .unwrap_or(Allocator::Python);
                }
                "thread_name" => l.thread_name = Some(strings.get(label.str)?),
                "alloc_space_stderr" => l.alloc_stderr = Some(label.num),
                "inuse_space_stderr" => l.inuse_stderr = Some(label.num),
                "peak_space_stderr" => l.peak_stderr = Some(label.num),
                _ => {}
            }
        }
        Ok(l)
    }
}

/// The frames of a message's locations, interned (innermost first within a location, as
/// pprof lists inlined calls).
struct Frames {
    /// Location id → its frames' range in `frames`.
    ranges: FastMap<u64, (u32, u32)>,
    frames: Vec<u32>,
}

impl Frames {
    fn of(m: &PprofProfile, strings: &Strings, names: &mut Names) -> Result<Frames> {
        let mut functions = FastMap::default();
        for f in &m.function {
            let code = (
                strings.get(f.filename)?,
                strings.get(f.name)?,
                line_number(f.start_line),
            );
            functions.insert(f.id, code);
        }
        let mut out = Frames {
            ranges: FastMap::default(),
            frames: Vec::new(),
        };
        for loc in &m.location {
            let start = out.frames.len() as u32;
            for line in &loc.line {
                let Some(&(file, function, firstline)) = functions.get(&line.function_id) else {
                    bail!("a location refers to a function it does not have");
                };
                let line = line_number(line.line);
                let frame = names.python_frame(file, function, line, firstline);
                out.frames.push(frame);
            }
            if loc.line.is_empty() {
                out.frames.push(names.python_frame(UNKNOWN, UNKNOWN, 0, 0));
            }
            let len = out.frames.len() as u32 - start;
            out.ranges.insert(loc.id, (start, len));
        }
        Ok(out)
    }

    fn of_location(&self, id: u64) -> Result<&[u32]> {
        let Some(&(start, len)) = self.ranges.get(&id) else {
            bail!("a sample refers to a location it does not have");
        };
        Ok(&self.frames[start as usize..(start + len) as usize])
    }
}

/// A line number of a file, as mprof keeps it.
fn line_number(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
