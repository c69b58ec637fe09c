//! Building a [`Profile`] in one pass over the records, within the reader's memory allowance
//! ([`Budget`]).
//!
//! The figures at the peak are kept without a second pass and without remembering anything
//! per sample: the builder keeps the live estimate of every site (stack and thread) as the
//! records come, and each time a sample raises the whole live heap to a new high, the sites
//! that changed since the last high are copied to the peak's figures. Every change is copied
//! at most once, so the cost is that of the changes themselves; the memory is that of the
//! sites. The same pass records the timeline's series ([`super::series`]).

use super::series::Series;
use super::{Completeness, Keep, LoadError, Process, Profile, MEMORY_FIXED, MEMORY_PER_BYTE};
use crate::analysis::aggregate::{Aggregator, Change};
use crate::analysis::allocators::{Allocators, ByAllocator};
use crate::analysis::estimate::{Estimate, Figures};
use crate::analysis::focus::Focus;
use crate::analysis::names::{FastMap, StackId};
use crate::capture::processes::Pick;
use crate::capture::records::{Event, Totals};
use crate::capture::stacks::Stacks;
use mprof_common::record::Record;

/// Memory the reader may take per stack node the capture's frames declare (the node, its
/// trie node, frames, the memos and the figures of its stack and site, their tables grown).
pub const MEMORY_PER_NODE: u64 = 640;
/// Memory per byte of names and text the frames declare (interned strings and their maps).
pub const MEMORY_PER_TEXT: u64 = 8;
/// Memory per live sampled block the frames declare (an entry of the live table, grown).
pub const MEMORY_PER_LIVE: u64 = 112;
/// Memory per byte of the distinct whole stacks the frames declare (native return addresses,
/// 8 bytes each, each a node of the trie or a few when the symbols inline calls; about 2 were
/// measured with the interpreter's frames shown).
pub const MEMORY_PER_STACK_BYTE: u64 = 16;
/// What a capture's frames may declare without the user's say-so: a real capture of any
/// length stays far below it (its stacks and live blocks do not grow with its length).
pub const MEMORY_CEILING: u64 = 2 << 30;

/// The environment variable that raises the reader's memory allowance, in MiB, for a real
/// capture denser than the allowance expects.
pub const MEMORY_ENV: &str = "MPROF_READ_MEMORY_MIB";

/// The allowance [`MEMORY_ENV`] asks for, in bytes (0 when unset or not a number).
pub(super) fn allowed_by_user() -> u64 {
    std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |mib| mib.saturating_mul(1 << 20))
}

/// What the declarations of a capture's frames allow the reader to hold.
pub fn declared_memory(d: &Totals) -> u64 {
    MEMORY_PER_NODE
        .saturating_mul(d.nodes)
        .saturating_add(MEMORY_PER_TEXT.saturating_mul(d.text))
        .saturating_add(MEMORY_PER_LIVE.saturating_mul(d.live))
        .saturating_add(MEMORY_PER_STACK_BYTE.saturating_mul(d.stacks))
}

/// The size-based part of the allowance (what plain records, outside frames, may take): a
/// third of [`MEMORY_PER_BYTE`] times the bytes (packed records at the size of what they stand
/// for) plus [`MEMORY_FIXED`]. A third: a record can make a table grow, which briefly holds
/// the old and the new (twice as large) table, so a check passed before a record keeps the
/// peak within the whole allowance.
fn size_memory(bytes: u64) -> u64 {
    (MEMORY_PER_BYTE as u64)
        .saturating_mul(bytes)
        .saturating_add(MEMORY_FIXED as u64)
        / 3
}

/// Checks the reader's memory against its allowance (none for records already in memory).
pub(crate) struct Budget {
    /// The captures' size, None for no allowance.
    size: Option<u64>,
    base: isize,
    /// [`crate::capture::file::expansion`] when the budget was made.
    unpacked: u64,
    /// What [`MEMORY_ENV`] allows, read once (the check runs often).
    allowed_by_user: u64,
}

#[cfg(any(test, fuzzing))]
thread_local! {
    static LAST_LIMIT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The largest limit the last budgets on this thread allowed (for the fuzzer's bound).
#[cfg(any(test, fuzzing))]
pub fn last_limit() -> u64 {
    LAST_LIMIT.with(|l| l.get())
}

/// Starts measuring [`last_limit`] anew.
#[cfg(any(test, fuzzing))]
pub fn reset_last_limit() {
    LAST_LIMIT.with(|l| l.set(0));
}

impl Budget {
    /// The allowance for captures of `size` bytes, from what the thread holds now.
    pub(crate) fn new(size: Option<u64>) -> Budget {
        Budget {
            size,
            base: crate::base::memory::in_use(),
            unpacked: crate::capture::file::expansion(),
            allowed_by_user: allowed_by_user(),
        }
    }

    /// An error once the reader holds more than its allowance, given what the frames read so
    /// far `declared`, not counting `apart` bytes the reader holds for something else than
    /// the capture (debug information of files on this machine, for native frames). A
    /// capture whose frames declare more than [`MEMORY_CEILING`] is refused there, before
    /// the memory is taken.
    pub(crate) fn check(&self, declared: &Totals, apart: isize) -> Result<(), LoadError> {
        let Some(size) = self.size else {
            return Ok(());
        };
        let declared_memory = declared_memory(declared);
        if declared_memory > MEMORY_CEILING.max(self.allowed_by_user) {
            return Err(LoadError::Declares {
                declared: *declared,
                memory: declared_memory,
            });
        }
        let unpacked = crate::capture::file::expansion() - self.unpacked;
        let limit = size_memory(size + unpacked)
            .saturating_add(declared_memory)
            .max(self.allowed_by_user / 3);
        #[cfg(any(test, fuzzing))]
        LAST_LIMIT.with(|l| l.set(l.get().max(limit + apart.max(0) as u64)));
        if crate::base::memory::in_use() - self.base - apart.max(0) > limit as isize {
            return Err(LoadError::TooDense { size, limit });
        }
        Ok(())
    }
}

/// Memory per site of the builder (its figures, key and place in the map, the map grown).
const MEMORY_PER_SITE: usize = 256;
/// Sites allowed per stack node past the first of each stack (a thread-per-request server's
/// capture at `--rate 1` has about 13).
const FURTHER_SITES_PER_NODE: usize = 64;

/// Threads whose figures are kept apart; the figures of threads seen after them are shown
/// together, as the pseudo-thread [`OTHER_THREADS`]: a server that started a thread per
/// request for hours is read within the memory of its stacks, not of its threads.
pub const MAX_THREADS_APART: usize = 4096;
/// The thread id that stands for the threads past [`MAX_THREADS_APART`] (no thread has id 0).
pub const OTHER_THREADS: u32 = 0;
/// Its name.
const OTHER_NAME: &str = "(other threads)";

/// Events between two checks of the memory.
const CHECK_EVERY: u32 = 256;

/// What the builder keeps per site (one place: every event updates several of them).
#[derive(Clone, Copy, Default)]
struct Site {
    allocated: Estimate,
    /// The live heap now.
    live: Estimate,
    /// Blocks of processes whose records ended: live at their end, out of the live heap.
    ended: Estimate,
    /// At the highest live heap so far.
    at_peak: Estimate,
    /// Whether `live` changed since the last high (the site is in [`Builder::dirty`]).
    dirty: bool,
}

/// Builds a [`Profile`] from events fed in file order.
pub(super) struct Builder {
    agg: Aggregator,
    first_rate: Option<u64>,
    /// Site of each (stack, thread), and its key; per stack, the thread and site it was
    /// last seen with (most stacks are one thread's).
    site_ids: FastMap<(StackId, u32), u32>,
    last_site: Vec<(u32, u32)>,
    keys: Vec<(StackId, u32)>,
    sites: Vec<Site>,
    /// The threads kept apart ([`MAX_THREADS_APART`]), and how many more were shown together.
    apart: FastMap<u32, ()>,
    together: FastMap<u32, ()>,
    /// Sites whose live estimate changed since the last high.
    dirty: Vec<u32>,
    series: Option<Series>,
    until_check: u32,
}

impl Builder {
    /// A builder; `first_rate` is the first rate the records announce (it applies to samples
    /// that come before any announcement); it records the series if `keep` says so.
    pub(super) fn new(first_rate: Option<u64>, keep: Keep) -> Builder {
        Builder {
            agg: Aggregator::new(first_rate.unwrap_or(1)),
            first_rate,
            site_ids: FastMap::default(),
            last_site: Vec::new(),
            keys: Vec::new(),
            apart: FastMap::default(),
            together: FastMap::default(),
            sites: Vec::new(),
            dirty: Vec::new(),
            series: (keep == Keep::Series).then(Series::default),
            until_check: 0,
        }
    }

    /// Feeds one event of `process`; `stacks` are its capture's nodes.
    #[inline(always)]
    pub(super) fn feed(&mut self, process: u32, event: &Event, stacks: &Stacks) {
        self.agg.enter(process);
        let change = match event {
            Event::Sample(b) => self.agg.apply_sample(b, stacks),
            Event::Free(addr) => self.agg.apply_free(*addr),
            Event::Record(r) => self.agg.apply(r),
        };
        self.apply(change);
        if let Some(series) = &mut self.series {
            series.observe(self.agg.live_bytes);
            if let Some(t) = event.time_ns() {
                if !series.at(t, &self.agg) {
                    self.series = None;
                }
            }
        }
    }

    /// Feeds one record of `process` (records in memory; samples as ALLOC records).
    pub(super) fn feed_record(&mut self, process: u32, record: &Record) {
        self.feed(
            process,
            &Event::Record(Box::new(record.clone())),
            &Stacks::default(),
        );
    }

    /// Whether it is time to check the memory (every [`CHECK_EVERY`] events).
    #[inline(always)]
    pub(super) fn due(&mut self) -> bool {
        if self.until_check == 0 {
            self.until_check = CHECK_EVERY;
            return true;
        }
        self.until_check -= 1;
        false
    }

    /// See [`Aggregator::prefetch`].
    #[inline(always)]
    pub(super) fn prefetch(&self, process: u32, addr: u64) {
        self.agg.prefetch(process, addr);
    }

    /// Live sampled blocks of the process fed last.
    #[inline(always)]
    pub(super) fn live_blocks(&self) -> usize {
        self.agg.live_here()
    }

    /// Memory held apart from the capture's allowance: native symbols, and the sites of a
    /// stack past its first, one per further thread that allocated there ([`MEMORY_PER_SITE`]
    /// each), which no frame declares. They are bounded by the samples that made them and by
    /// [`MAX_THREADS_APART`] threads per stack, and allowed for at most
    /// [`FURTHER_SITES_PER_NODE`] per stack node and a quarter of [`MEMORY_CEILING`]: a
    /// crafted capture gets no more.
    pub(super) fn apart(&self) -> isize {
        let nodes = self.agg.resolver.names.nodes.len();
        let further = (self.keys.len().saturating_sub(self.last_site.len()))
            .min(nodes.saturating_mul(FURTHER_SITES_PER_NODE))
            .min(MEMORY_CEILING as usize / 4 / MEMORY_PER_SITE);
        self.agg.resolver.symbol_memory() + (further * MEMORY_PER_SITE) as isize
    }

    #[inline(always)]
    fn site(&mut self, stack: StackId, tid: u32) -> usize {
        let s = stack.0 as usize;
        match self.last_site.get(s) {
            Some(&(t, site)) if t == tid && site != u32::MAX => return site as usize,
            Some(_) => {}
            None => self.last_site.resize(s + 1, (0, u32::MAX)),
        }
        let site = self.new_site(stack, tid);
        self.last_site[s] = (tid, site as u32);
        site
    }

    fn new_site(&mut self, stack: StackId, tid: u32) -> usize {
        let tid = self.kept_apart(tid);
        let next = self.keys.len() as u32;
        let id = *self.site_ids.entry((stack, tid)).or_insert(next);
        if id == next {
            self.keys.push((stack, tid));
            self.sites.push(Site::default());
        }
        id as usize
    }

    /// `tid`, or [`OTHER_THREADS`] when [`MAX_THREADS_APART`] threads came before it.
    fn kept_apart(&mut self, tid: u32) -> u32 {
        if self.apart.contains_key(&tid) {
            return tid;
        }
        if self.apart.len() < MAX_THREADS_APART && tid != OTHER_THREADS {
            self.apart.insert(tid, ());
            return tid;
        }
        // Counted up to a bound: a capture can name any number of threads.
        if self.together.len() < MAX_THREADS_APART * 16 {
            self.together.insert(tid, ());
        }
        OTHER_THREADS
    }

    #[inline(always)]
    fn touch(&mut self, site: usize) {
        if !self.sites[site].dirty {
            self.sites[site].dirty = true;
            self.dirty.push(site as u32);
        }
    }

    #[inline(always)]
    fn apply(&mut self, change: Change) {
        match change {
            Change::Alloc { block, replaced } => {
                let sample = block.sample();
                if let Some(old) = replaced {
                    let s = self.site(old.stack, old.tid);
                    self.sites[s].live.remove(&old.sample());
                    self.touch(s);
                    self.line_changed(old.stack, -old.sample().bytes());
                }
                let s = self.site(block.stack, block.tid);
                let site = &mut self.sites[s];
                site.allocated.add(&sample);
                site.live.add(&sample);
                self.touch(s);
                self.line_changed(block.stack, sample.bytes());
                if self.agg.peak_is_latest() {
                    for d in self.dirty.drain(..) {
                        let site = &mut self.sites[d as usize];
                        site.at_peak = site.live;
                        site.dirty = false;
                    }
                }
            }
            Change::Free(old) => {
                let s = self.site(old.stack, old.tid);
                self.sites[s].live.remove(&old.sample());
                self.touch(s);
                self.line_changed(old.stack, -old.sample().bytes());
            }
            Change::Ended(range) => {
                let blocks: Vec<_> = self.agg.ended.drain(range).collect();
                for old in blocks {
                    let s = self.site(old.stack, old.tid);
                    self.sites[s].live.remove(&old.sample());
                    self.sites[s].ended.add(&old.sample());
                    self.touch(s);
                    self.line_changed(old.stack, -old.sample().bytes());
                }
            }
            Change::Other => {}
        }
    }

    #[inline(always)]
    fn line_changed(&mut self, stack: StackId, bytes: f64) {
        if let Some(series) = &mut self.series {
            series.change(stack, bytes);
        }
    }

    /// The profile of what was fed.
    pub(super) fn finish(mut self) -> Profile {
        let agg = &mut self.agg;
        let mut symbol_warnings = agg.resolver.symbol_warnings();
        if !self.together.is_empty() {
            let more = self.together.len();
            let more = if more >= MAX_THREADS_APART * 16 {
                format!("{more} or more")
            } else {
                more.to_string()
            };
            symbol_warnings.push(format!(
                "{more} threads came after the first {MAX_THREADS_APART}: their figures are \
                 shown together, as thread {OTHER_THREADS} \"{OTHER_NAME}\""
            ));
            agg.threads.insert(OTHER_THREADS, OTHER_NAME.to_owned());
        }
        let names = std::mem::take(&mut agg.resolver.names);
        let mut figures = vec![Figures::default(); names.nodes.len()];
        let peaked = agg.peak().is_some();
        let mut sites = Vec::with_capacity(self.keys.len());
        for (i, &(stack, tid)) in self.keys.iter().enumerate() {
            let site = &self.sites[i];
            let mut live = site.live;
            live.merge(&site.ended);
            let f = Figures {
                allocated: site.allocated,
                live,
                peak: if peaked {
                    site.at_peak
                } else {
                    Estimate::default()
                },
            };
            figures[stack.0 as usize].merge(&f);
            sites.push(((stack, tid), f));
        }
        sites.sort_by_key(|(k, _)| *k);
        let peak_seconds = agg.peak().and_then(|(_, _, peak_ns)| {
            agg.first_ns
                .map(|t0| peak_ns.saturating_sub(t0) as f64 / 1e9)
        });
        let completeness = match (agg.end, agg.finished) {
            (Some(_), _) => Completeness::Ended,
            (None, true) => Completeness::Finished,
            (None, false) => Completeness::Incomplete,
        };
        let duration_seconds = match (agg.first_ns, agg.last_ns) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => 0.0,
        };
        let processes = agg
            .processes()
            .iter()
            .map(|figures| Process {
                pid: None,
                figures: figures.clone(),
            })
            .collect();
        let series = self.series.take().map(|s| s.finish(agg));
        let resident = agg.resident.summary(agg.peak().map(|(_, _, t)| t));
        let breakdowns = agg.resident.breakdowns();
        let agg = self.agg;
        let mut profile = Profile {
            focus: Focus::new(&agg.meta, &[]),
            processes,
            followed: false,
            pick: Pick::All,
            process_warnings: Vec::new(),
            meta: agg.meta,
            rate: agg.rate,
            rate_known: self.first_rate.is_some(),
            samples: agg.samples,
            dropped: agg.dropped,
            peak_seconds,
            max_rss: agg.max_rss,
            duration_seconds,
            start_ns: agg.first_ns,
            completeness,
            damaged: None,
            threads: agg.threads,
            totals: Figures::default(),
            by_allocator: ByAllocator::default(),
            selection: Allocators::ALL,
            names,
            figures,
            sites,
            symbol_warnings,
            series,
            resident,
            breakdowns,
            intervals: None,
        };
        profile.add_up();
        profile
    }
}
