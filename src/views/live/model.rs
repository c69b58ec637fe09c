//! The live view's data: the shared [`Aggregator`] fed one record at a time (the very records
//! that go to the capture file), plus what only a running view needs: figures per stack *and
//! thread*, the bytes allocated in the current interval, and the history behind the sparklines.
//!
//! Every refresh [`Model::roll`]s the interval over and takes a [`Snapshot`]; the screen is drawn
//! from snapshots only, so pausing the display is keeping an old one.

use crate::analysis::aggregate::{Aggregator, Change, MAX_PROCESSES};
use crate::analysis::focus::{Focus, Memo};
use crate::analysis::grouping::{Beside, Grouping, YourCodeGroups};
use crate::analysis::profile::{Estimate, FastMap, Location, StackId};
use mprof_common::record::{self, Record, KIND_ALLOC};
use mprof_common::stacks::{Expanded, Expander, KIND_BRIEF, KIND_SAMPLE};
use std::collections::{HashMap, VecDeque};

/// Points of history kept for the sparklines (one per refresh).
const HISTORY: usize = 256;
/// Longest command line kept per process, in bytes.
const MAX_COMMAND: usize = 512;

/// Thread names kept past [`Model::forget_idle`] for threads it forgot (their names come once,
/// when they start): beyond it, only the names of the threads still kept.
const MAX_IDLE_NAMES: usize = 4096;

/// Figures of one stack in one thread, or of a row of the table.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SiteFigures {
    /// Allocated since the view started.
    pub allocated: Estimate,
    /// Sampled blocks not freed yet.
    pub live: Estimate,
    /// Allocated during the current interval (in a snapshot: the last whole interval).
    pub recent: Estimate,
}

impl SiteFigures {
    /// Whether a sampled block of the site is live or one was allocated in the interval:
    /// what an interval's profile shows.
    pub fn in_interval(&self) -> bool {
        self.live.samples > 0 || self.recent.samples > 0
    }

    fn merge(&mut self, other: &SiteFigures) {
        self.allocated.merge(&other.allocated);
        self.live.merge(&other.live);
        self.recent.merge(&other.recent);
    }
}

/// A thread that allocated, with its name once a Thread record gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    pub tid: u32,
    pub name: Option<String>,
    /// The process it belongs to (0 when the view was never told).
    pub pid: u32,
}

/// A process whose records the view shows: the program, then each followed child
/// (`--follow-children`), in the order they started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Its command line (from /proc; untrusted text, shown through `printable`).
    pub command: String,
    /// Its records are over (it exited, or mprof let it go).
    pub ended: bool,
}

impl Thread {
    /// `1234 worker` or `1234`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} {name}", self.tid),
            None => self.tid.to_string(),
        }
    }
}

/// Everything the screen shows, at one refresh.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Seconds since the view started.
    pub elapsed_s: f64,
    /// Length of the interval that `recent`, `alloc_rate` and `sample_rate` cover.
    pub interval_s: f64,
    /// (stack, thread, figures) for every stack a thread has sampled.
    pub sites: Vec<(StackId, u32, SiteFigures)>,
    /// Threads in the order they first allocated.
    pub threads: Vec<Thread>,
    /// The processes seen, the program first.
    pub processes: Vec<Process>,
    pub rss: Option<u64>,
    /// Where the RSS was at the latest reading of the allocators' figures.
    pub rss_parts: Option<crate::analysis::resident::Parts>,
    /// Estimated bytes of the live heap, and its highest value so far.
    pub live_heap: f64,
    /// `live_heap` per allocator (python, native, mmap).
    pub live_split: [f64; 3],
    pub peak_heap: f64,
    /// Estimated bytes allocated per second, and samples per second, over the interval.
    pub alloc_rate: f64,
    pub sample_rate: f64,
    pub dropped: u64,
    /// Samples the view left out to keep up (the capture has them).
    pub skipped: u64,
    pub rate: u64,
    /// The interpreter's version (empty until the agent said).
    pub python: String,
    /// One point per refresh, oldest first.
    pub rss_history: Vec<f64>,
    pub heap_history: Vec<f64>,
}

/// The live view's aggregation, updated record by record.
pub struct Model {
    agg: Aggregator,
    sites: FastMap<(StackId, u32), SiteFigures>,
    threads: Vec<Thread>,
    /// Where each thread is in `threads`.
    thread_at: FastMap<u32, usize>,
    /// The processes seen (index = the aggregator's process), and the one records come from.
    processes: Vec<Process>,
    current: usize,
    skipped: u64,
    start_ns: u64,
    last_roll_ns: u64,
    dropped: u64,
    python: String,
    history: VecDeque<(f64, f64)>,
    focus: Focus,
    /// Turns interned samples back into whole ones, as the capture reader does: one per
    /// process (by index), since each process's stream has stack nodes of its own.
    stacks: Vec<Expander>,
}

impl Model {
    /// An empty model for a session sampling at `rate`, started at `start_ns` (monotonic).
    pub fn new(rate: u64, start_ns: u64) -> Model {
        Model {
            agg: Aggregator::new(rate),
            sites: FastMap::default(),
            threads: Vec::new(),
            thread_at: FastMap::default(),
            processes: Vec::new(),
            current: 0,
            skipped: 0,
            start_ns,
            last_roll_ns: start_ns,
            dropped: 0,
            python: String::new(),
            history: VecDeque::new(),
            focus: Focus::default(),
            stacks: vec![Expander::new()],
        }
    }

    /// Says which files are your code, for [`Grouping::YourCode`].
    pub fn set_focus(&mut self, focus: Focus) {
        self.focus = focus;
    }

    /// The records applied from now on come from process `pid` (the first process the model
    /// hears of is the program's). Past [`MAX_PROCESSES`] processes, the last one stands for
    /// the rest.
    pub fn enter(&mut self, pid: u32) {
        self.current = self.process(pid);
        self.agg.enter(self.current as u32);
    }

    /// The index of process `pid` (of the latest program it runs), a new one if it is not known
    /// yet.
    fn process(&mut self, pid: u32) -> usize {
        if let Some(at) = self.processes.iter().rposition(|p| p.pid == pid) {
            return at;
        }
        self.new_process(pid)
    }

    /// A new index for `pid` (the last one when there are [`MAX_PROCESSES`]).
    fn new_process(&mut self, pid: u32) -> usize {
        if self.processes.len() >= MAX_PROCESSES {
            return MAX_PROCESSES - 1;
        }
        self.processes.push(Process {
            pid,
            command: String::new(),
            ended: false,
        });
        if self.stacks.len() < self.processes.len() {
            self.stacks.push(Expander::new());
        }
        self.processes.len() - 1
    }

    /// A followed process started: `command` is its command line. A process that ended and
    /// starts again has run a new program by exec: that program's records are a process of
    /// their own (its addresses and code objects are its own).
    pub fn started(&mut self, pid: u32, command: &str) {
        let at = match self.processes.iter().rposition(|p| p.pid == pid) {
            Some(at) if !self.processes[at].ended => at,
            _ => self.new_process(pid),
        };
        let p = &mut self.processes[at];
        if p.pid == pid {
            p.command = crate::base::text::elide(command, MAX_COMMAND).into_owned();
        }
    }

    /// A followed process's records are over: its blocks leave the live heap.
    pub fn ended(&mut self, pid: u32) {
        let Some(at) = self.processes.iter().rposition(|p| p.pid == pid) else {
            return;
        };
        self.processes[at].ended = true;
        // Its stack nodes are of no further use.
        self.stacks[at] = Expander::new();
        let blocks = self.agg.leave(at as u32);
        self.forget(blocks);
    }

    fn current_pid(&self) -> u32 {
        self.processes.get(self.current).map_or(0, |p| p.pid)
    }

    /// Applies an encoded record (as the reader writes it to the capture); undecodable bytes
    /// are ignored, as the capture reader would skip them.
    pub fn observe(&mut self, bytes: &[u8]) {
        let decoded = match self.stacks[self.current].feed(bytes) {
            Expanded::Pass(bytes) => record::decode(bytes),
            Expanded::Alloc(alloc) => record::decode(&alloc),
            Expanded::Consumed | Expanded::Bad(_) => return,
        };
        if let Ok((mut record, _)) = decoded {
            if let Record::Spawn {
                node,
                depth,
                frames,
                ..
            } = &mut record
            {
                // The creating thread's stack, as the nodes define it now.
                match self.stacks[self.current].frames(*node, *depth as usize) {
                    Ok(stack) => *frames = stack,
                    Err(_) => return,
                }
            }
            self.apply(&record);
        }
    }

    /// [`Model::observe`] for a reader falling behind: an Alloc record is only counted as
    /// skipped, the others (frees, code objects, threads, RSS) are applied as usual, so that
    /// what is shown stays consistent.
    pub fn observe_but_skip_samples(&mut self, bytes: &[u8]) {
        match record::preamble(bytes) {
            Ok((_, KIND_ALLOC | KIND_SAMPLE | KIND_BRIEF, _)) => self.skipped += 1,
            _ => self.observe(bytes),
        }
    }

    /// Applies the next record.
    pub fn apply(&mut self, record: &Record) {
        if let Record::Thread { tid, name } = record {
            self.thread(*tid).name = Some(crate::base::text::printable(name).into_owned());
        }
        match self.agg.apply(record) {
            Change::Alloc { block, replaced } => {
                if let Some(old) = replaced {
                    self.site(old.stack, old.tid).live.remove(&old.sample());
                }
                self.thread(block.tid);
                let sample = block.sample();
                let site = self.site(block.stack, block.tid);
                site.allocated.add(&sample);
                site.live.add(&sample);
                site.recent.add(&sample);
            }
            Change::Free(old) => self.site(old.stack, old.tid).live.remove(&old.sample()),
            Change::Ended(blocks) => self.forget(blocks),
            Change::Other => {}
        }
    }

    /// The blocks `agg.ended[blocks]` are no longer live in their sites.
    fn forget(&mut self, blocks: std::ops::Range<usize>) {
        for old in &self.agg.ended[blocks] {
            let site = self.sites.entry((old.stack, old.tid)).or_default();
            site.live.remove(&old.sample());
        }
        // Nothing reads them again: a session that outlives many children (a pre-fork server
        // recycling its workers, `--every` for days) does not keep them.
        self.agg.ended.clear();
    }

    fn site(&mut self, stack: StackId, tid: u32) -> &mut SiteFigures {
        self.sites.entry((stack, tid)).or_default()
    }

    fn thread(&mut self, tid: u32) -> &mut Thread {
        let at = match self.thread_at.get(&tid) {
            Some(&at) => at,
            None => {
                let pid = self.current_pid();
                // A thread forgotten while idle has its name back.
                let name = (self.agg.threads.get(&tid))
                    .map(|n| crate::base::text::printable(n).into_owned());
                self.threads.push(Thread { tid, name, pid });
                self.thread_at.insert(tid, self.threads.len() - 1);
                self.threads.len() - 1
            }
        };
        &mut self.threads[at]
    }

    /// Forgets the sites with no live sampled block and nothing allocated in the interval under
    /// way, and the threads left with no site: what a continuous session (`--every`) holds then
    /// grows with distinct stacks and live blocks, not with the threads a server started and
    /// ended over days. A forgotten site's figures since the start are lost: call it only where
    /// they are not shown (intervals show the interval's allocations and the live blocks).
    pub fn forget_idle(&mut self) {
        self.sites.retain(|_, f| f.in_interval());
        let kept: FastMap<u32, ()> = self.sites.keys().map(|&(_, tid)| (tid, ())).collect();
        self.threads.retain(|t| kept.contains_key(&t.tid));
        self.thread_at = self
            .threads
            .iter()
            .enumerate()
            .map(|(at, t)| (t.tid, at))
            .collect();
        if self.agg.threads.len() > MAX_IDLE_NAMES {
            self.agg.threads.retain(|tid, _| kept.contains_key(tid));
        }
        self.sites.shrink_to(self.sites.len() * 2);
        self.threads.shrink_to(self.threads.len() * 2);
        self.thread_at.shrink_to(self.thread_at.len() * 2);
    }

    /// What the agent's ring says besides records: its drop counter and the Python version.
    pub fn set_ring_status(&mut self, dropped: u64, python: &str) {
        self.dropped = self.dropped.max(dropped).max(self.agg.dropped);
        if self.python.is_empty() {
            self.python = python.split_whitespace().next().unwrap_or("").to_owned();
        }
    }

    /// Whether the Python version is still unknown.
    pub fn wants_python(&self) -> bool {
        self.python.is_empty()
    }

    /// Ends the current interval at `now_ns` and returns what the screen shows of it.
    pub fn roll(&mut self, now_ns: u64) -> Snapshot {
        let interval_s = now_ns.saturating_sub(self.last_roll_ns).max(1) as f64 / 1e9;
        self.last_roll_ns = now_ns;
        let mut recent = Estimate::default();
        let sites = self
            .sites
            .iter_mut()
            .map(|(&(stack, tid), f)| {
                let figures = *f;
                recent.merge(&f.recent);
                f.recent = Estimate::default();
                (stack, tid, figures)
            })
            .collect();
        let rss = self.agg.last_rss;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history
            .push_back((rss.unwrap_or(0) as f64, self.agg.live_bytes.max(0.0)));
        Snapshot {
            elapsed_s: now_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            interval_s,
            sites,
            threads: self.threads.clone(),
            processes: self.processes.clone(),
            rss,
            rss_parts: self.agg.resident.latest().cloned(),
            live_heap: self.agg.live_bytes.max(0.0),
            live_split: self.agg.live_split.map(|b| b.max(0.0)),
            peak_heap: self.agg.peak_bytes(),
            alloc_rate: recent.bytes / interval_s,
            sample_rate: recent.samples as f64 / interval_s,
            dropped: self.dropped.max(self.agg.dropped),
            skipped: self.skipped,
            rate: self.agg.rate,
            python: self.python.clone(),
            rss_history: self.history.iter().map(|h| h.0).collect(),
            heap_history: self.history.iter().map(|h| h.1).collect(),
        }
    }

    /// The frames of a stack, innermost first.
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.agg.frames(stack)
    }

    /// The frames of a stack, then those of the stack that created its thread, if known.
    pub fn frames_with_origin(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.agg.frames_with_origin(stack)
    }

    /// The innermost frame of a stack.
    pub fn innermost(&self, stack: StackId) -> Location<'_> {
        self.agg.innermost(stack)
    }

    /// Which allocator a stack's blocks came from.
    pub fn allocator(&self, stack: StackId) -> crate::analysis::allocators::Allocator {
        self.agg.allocator(stack)
    }
}

/// A column the table can be sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// Bytes allocated per second over the last interval.
    Rate,
    Allocated,
    Live,
    Samples,
}

impl Column {
    /// The columns, left to right.
    pub const ALL: [Column; 4] = [
        Column::Rate,
        Column::Allocated,
        Column::Live,
        Column::Samples,
    ];

    /// The next column, in the order the `s` key cycles.
    pub fn next(self) -> Column {
        let at = Column::ALL.iter().position(|&c| c == self).unwrap_or(0);
        Column::ALL[(at + 1) % Column::ALL.len()]
    }

    /// The heading of the column.
    pub fn heading(self) -> &'static str {
        match self {
            Column::Rate => "ALLOC/s",
            Column::Allocated => "ALLOCATED",
            Column::Live => "LIVE",
            Column::Samples => "SAMPLES",
        }
    }

    /// The value a row sorts by (whole bytes, so rounding noise never reorders rows).
    fn key(self, f: &SiteFigures) -> u64 {
        let whole = |x: f64| x.round().max(0.0) as u64;
        match self {
            Column::Rate => whole(f.recent.bytes),
            Column::Allocated => whole(f.allocated.bytes),
            Column::Live => whole(f.live.bytes),
            Column::Samples => f.allocated.samples,
        }
    }
}

/// What the table shows: the user's choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub sort: Column,
    /// Your code, line, function or file (the live view cycles through these four).
    pub group: Grouping,
    /// Total (a site plus everything it calls) instead of own bytes.
    pub inclusive: bool,
    /// Only this thread's allocations, or all threads.
    pub thread: Option<u32>,
    /// Only this process's allocations (a PID), or all processes.
    pub process: Option<u32>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            sort: Column::Rate,
            group: Grouping::YourCode,
            inclusive: false,
            thread: None,
            process: None,
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row<'a> {
    pub file: &'a str,
    /// Empty when grouping by file.
    pub function: &'a str,
    /// The line (the function's first line by function, 0 by file or for a pseudo-frame).
    pub line: u32,
    pub figures: SiteFigures,
    /// By your code (own bytes): the innermost frame beside the row's.
    pub beside: Option<Beside<'a>>,
}

impl Row<'_> {
    /// Whether this is a pseudo-frame (`<no Python frame>`, `<unknown>`...): no real file.
    pub fn is_pseudo(&self) -> bool {
        self.file == self.function
    }
}

/// The table's rows for a snapshot, sorted by `settings.sort` (largest first; ties by the
/// allocated bytes, then file, function and line, so the order never flickers).
pub fn rows<'a>(model: &'a Model, snap: &Snapshot, settings: &Settings) -> Vec<Row<'a>> {
    let pid_of: HashMap<u32, u32> = match settings.process {
        Some(_) => snap.threads.iter().map(|t| (t.tid, t.pid)).collect(),
        None => HashMap::new(),
    };
    let sites = snap.sites.iter().filter(|(_, tid, _)| {
        settings.thread.is_none_or(|t| t == *tid)
            && settings
                .process
                .is_none_or(|p| pid_of.get(tid).is_some_and(|&q| q == p))
    });
    let mut rows = if settings.group == Grouping::YourCode && !settings.inclusive {
        let mut groups = YourCodeGroups::new(&model.focus);
        for (stack, _, figures) in sites {
            groups.add(
                model.frames_with_origin(*stack),
                figures,
                SiteFigures::merge,
            );
        }
        let sort = settings.sort;
        groups
            .groups(|f| sort.key(f))
            .into_iter()
            .map(|((file, function, line), figures, beside)| Row {
                file,
                function,
                line,
                figures,
                beside: Some(beside),
            })
            .collect()
    } else {
        frame_rows(model, sites, settings)
    };
    let sort = settings.sort;
    rows.sort_by(|a, b| {
        let k = |r: &Row| (sort.key(&r.figures), Column::Allocated.key(&r.figures));
        k(b).cmp(&k(a))
            .then_with(|| (a.file, a.function, a.line).cmp(&(b.file, b.function, b.line)))
    });
    rows
}

/// Rows keyed by one frame per stack (own bytes) or by every frame of it (total bytes; by
/// your code, every frame of yours, or the innermost when none is).
fn frame_rows<'a, 's>(
    model: &'a Model,
    sites: impl Iterator<Item = &'s (StackId, u32, SiteFigures)>,
    settings: &Settings,
) -> Vec<Row<'a>> {
    let mut groups: HashMap<(&str, &str, u32), SiteFigures> = HashMap::new();
    let mut keys = Vec::new();
    let mut memo = Memo::default();
    for (stack, _, figures) in sites {
        keys.clear();
        if settings.inclusive {
            // A recursive function counts once per stack, not once per frame.
            for loc in model.frames(*stack) {
                let k = settings.group.frame_key(&loc);
                let wanted =
                    settings.group != Grouping::YourCode || model.focus.is_yours(&loc, &mut memo);
                if wanted && !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        if keys.is_empty() {
            keys.push(settings.group.frame_key(&model.innermost(*stack)));
        }
        for k in &keys {
            groups.entry(*k).or_default().merge(figures);
        }
    }
    groups
        .into_iter()
        .map(|((file, function, line), figures)| Row {
            file,
            function,
            line,
            figures,
            beside: None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
