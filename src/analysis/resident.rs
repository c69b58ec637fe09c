//! Where the RSS is: the process's resident memory shared out among what holds it, at each
//! reading of the allocators' figures and the RSS (HEAP records) — the live sampled blocks
//! (Python's and the C allocators', estimated, with their standard errors), the resident part
//! of the sampled anonymous mappings (measured), the free memory pymalloc's arenas and the C
//! library's `malloc` keep (their own statistics, HEAP records), live memory the allocators
//! hold that no sample saw (allocated before an attach, or by code mprof does not hook), and
//! the rest, named where the kernel names it (code, stacks, other mappings).
//!
//! ```text
//! rss = python_live + native_live + mmap_resident + live_unseen + pymalloc_free
//!       + malloc_free + unexplained
//! ```
//! `unexplained` is what is left; it is never negative: when the estimates exceed what the
//! process has resident (a sampled reservation, mostly not resident, or an estimate's noise),
//! the excess is said ([`Parts::over`]) and `unexplained` is 0.
//!
//! Only the capture's own process is accounted for (a followed child's mappings are not read).

use crate::analysis::estimate::{Estimate, Sample};
use mprof_common::record::{Allocator, HeapStats, Resident, MALLOC_GLIBC, MALLOC_JEMALLOC};
use std::collections::HashMap;

/// Most breakdowns kept over a capture (a day's worth at one a second is thinned to this).
const MAX_KEPT: usize = 4096;
/// A reading of the mappings shares out the RSS with the allocators' statistics read before it
/// only if at most this many of the program's sampled events came between them, and the RSS
/// they read differ by at most 5% or this many bytes.
const MAX_EVENTS_APART: u64 = 64;
const SAME_RSS_SLACK: u64 = 4 << 20;
/// Bytes of sampled mappings mapped but not resident below which the views say nothing of a
/// reservation.
pub const RESERVED_NOTE: f64 = 64.0 * 1024.0 * 1024.0;
/// Named mappings kept in a breakdown (the largest resident ones).
pub const NAMED_KEPT: usize = 8;

/// The resident memory of the process at one moment, shared out (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct Parts {
    pub time_ns: u64,
    pub rss: u64,
    pub python_live: Estimate,
    pub native_live: Estimate,
    /// The resident part of the live sampled anonymous mappings (an estimate: each sampled
    /// mapping stands for others), and what they map in all.
    pub mmap_resident: Estimate,
    pub mmap_mapped: f64,
    /// Live memory the allocators hold that the samples did not see.
    pub live_unseen: f64,
    /// Free memory in pymalloc's arenas (0 when pymalloc is not the allocator); `None` when
    /// not read yet (pymalloc is read on a thread that holds the GIL).
    pub pymalloc_free: Option<u64>,
    /// Free memory `malloc` keeps; `None` when the allocator's figures are not known.
    pub malloc_free: Option<u64>,
    /// What `malloc` is (`MALLOC_*` of the record).
    pub malloc_kind: u32,
    pub unexplained: f64,
    /// How much the parts above `unexplained` add up to more than `rss`.
    pub over: f64,
    /// The largest named mappings and their resident bytes.
    pub named: Vec<(String, u64)>,
}

impl Parts {
    /// The parts' names and bytes, largest first, without `rss` itself.
    pub fn ranked(&self) -> Vec<(&'static str, f64)> {
        let mut v = vec![
            ("python_live", self.python_live.bytes),
            ("native_live", self.native_live.bytes),
            ("mmap_resident", self.mmap_resident.bytes),
            ("live_unseen", self.live_unseen),
            ("pymalloc_free", self.pymalloc_free.unwrap_or(0) as f64),
            ("malloc_free", self.malloc_free.unwrap_or(0) as f64),
            ("unexplained", self.unexplained),
        ];
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// Bytes of sampled mappings that are mapped but not resident (a reservation).
    pub fn reserved(&self) -> f64 {
        (self.mmap_mapped - self.mmap_resident.bytes).max(0.0)
    }
}

/// What the samples and the mappings said at one moment: everything of a breakdown but the
/// allocators' statistics.
#[derive(Clone, Debug)]
struct Measured {
    time_ns: u64,
    rss: u64,
    python_live: Estimate,
    native_live: Estimate,
    mmap_resident: Estimate,
    mmap_mapped: f64,
    named: Vec<(String, u64)>,
}

/// Follows the live sampled blocks by allocator and the allocators' statistics, and shares out
/// the RSS at each reading of the statistics. Fed by the aggregate, in file order.
///
/// The agent reads the statistics and the RSS together (a HEAP record) a few times a second
/// while the program allocates or frees, and as a session ends: each such reading is a
/// breakdown, the live estimates taken at its place in the ring (the samples before it
/// happened before it). The resident part of the sampled mappings and the named mappings come
/// from mprof's latest reading of the mappings (RESIDENT, every 5 seconds and at the end). A reading of
/// the mappings while the program is quiet (no statistics since the one before) is a breakdown
/// of its own, with the latest statistics if nothing changed since them (see
/// [`MAX_EVENTS_APART`]), else with the allocators' free memory unknown.
#[derive(Default)]
pub struct ResidentTracker {
    /// Live sampled blocks of the capture's own process, by allocator.
    live: [Estimate; 3],
    /// Its live sampled anonymous mappings: address → (size, what the sample stands for).
    mmaps: HashMap<u64, (u64, Sample)>,
    heap: Option<HeapStats>,
    /// The process's own sampled events (allocations and frees of sampled blocks) after `heap`
    /// in the ring's order.
    events_since_heap: u64,
    /// The latest reading of the mappings, and whether statistics came after it.
    mappings: Option<Resident>,
    heap_since_mappings: bool,
    kept: Vec<Parts>,
    /// Every `stride`-th breakdown is kept once `MAX_KEPT` are (the largest RSS always).
    stride: usize,
    seen: usize,
}

impl ResidentTracker {
    /// A sample of the capture's own process.
    pub fn alloc(&mut self, addr: u64, size: u64, allocator: Allocator, sample: &Sample) {
        self.events_since_heap += 1;
        self.live[allocator as usize].add(sample);
        if allocator == Allocator::Mmap {
            self.mmaps.insert(addr, (size, *sample));
        }
    }

    /// A sampled block of the capture's own process freed (or replaced, `replaced`: the
    /// allocation that replaced it counts as the event).
    pub fn free(&mut self, addr: u64, allocator: Allocator, sample: &Sample, replaced: bool) {
        if !replaced {
            self.events_since_heap += 1;
        }
        self.live[allocator as usize].remove(sample);
        if allocator == Allocator::Mmap {
            self.mmaps.remove(&addr);
        }
    }

    /// The allocators' statistics and the RSS, read together: a breakdown (statistics without
    /// the RSS, which the agent could not read, only wait for a reading of the mappings).
    pub fn heap(&mut self, stats: &HeapStats) {
        self.events_since_heap = 0;
        self.heap = Some(*stats);
        if stats.rss == 0 {
            return;
        }
        self.heap_since_mappings = true;
        let parts = combine(&self.measure(stats.time_ns, stats.rss), Some(stats));
        self.keep(parts);
    }

    /// A reading of the mappings: kept for the breakdowns to come; a breakdown itself when
    /// the program was quiet since the one before.
    pub fn resident(&mut self, r: &Resident) {
        let quiet = !std::mem::replace(&mut self.heap_since_mappings, false);
        self.mappings = Some(r.clone());
        if !quiet {
            return;
        }
        let near = |a: u64, b: u64| a.abs_diff(b) <= (b / 20).max(SAME_RSS_SLACK);
        let heap = self
            .heap
            .filter(|_| self.events_since_heap <= MAX_EVENTS_APART)
            .filter(|h| h.rss == 0 || near(h.rss, r.rss));
        let parts = combine(&self.measure(r.time_ns, r.rss), heap.as_ref());
        self.keep(parts);
    }

    /// What the samples say now, with the RSS read at `time_ns` and the mappings as last read.
    fn measure(&self, time_ns: u64, rss: u64) -> Measured {
        let [python_live, native_live, _] = self.live;
        let mut mmap_resident = Estimate::default();
        let mut mmap_mapped = 0.0;
        for (&addr, (size, sample)) in &self.mmaps {
            // The sample stands for `weight` times its own bytes: its mapping's resident
            // share, scaled the same way.
            let weight = sample.bytes() / (*size).max(1) as f64;
            let resident = self
                .mappings
                .as_ref()
                .map_or(0, |r| r.resident_in(addr, addr.saturating_add(*size)))
                as f64;
            mmap_resident.add(&Sample::scaled(resident, weight));
            mmap_mapped += sample.bytes();
        }
        let named = self.mappings.as_ref().map_or(Vec::new(), |r| {
            r.named.iter().take(NAMED_KEPT).cloned().collect()
        });
        Measured {
            time_ns,
            rss,
            python_live,
            native_live,
            mmap_resident,
            mmap_mapped,
            named,
        }
    }

    /// Keeps a breakdown, thinning them out past [`MAX_KEPT`] (the largest RSS stays).
    fn keep(&mut self, parts: Parts) {
        self.seen += 1;
        if self.stride == 0 {
            self.stride = 1;
        }
        if self.kept.len() >= MAX_KEPT {
            let top = self.peak_index();
            let mut i = 0;
            self.kept.retain(|_| {
                i += 1;
                i % 2 == 0 || Some(i - 1) == top
            });
            self.stride *= 2;
        }
        let is_top = self.kept.iter().all(|p| parts.rss > p.rss);
        // The latest reading is always there (it may be the end): between two kept ones it
        // takes the place of the one before, unless that one is the largest.
        let last_is_top = !self.kept.is_empty() && Some(self.kept.len() - 1) == self.peak_index();
        if self.seen.is_multiple_of(self.stride) || is_top || last_is_top || self.kept.is_empty() {
            self.kept.push(parts);
        } else if let Some(last) = self.kept.last_mut() {
            *last = parts;
        }
    }

    fn peak_index(&self) -> Option<usize> {
        (0..self.kept.len()).max_by_key(|&i| self.kept[i].rss)
    }

    /// The latest breakdown, if any.
    pub fn latest(&self) -> Option<&Parts> {
        self.kept.last()
    }

    /// Every breakdown kept, in time order.
    pub fn breakdowns(&self) -> Vec<Parts> {
        self.kept.clone()
    }

    /// What the tracker says at the end: the latest breakdown, the one at the largest RSS, and
    /// the one nearest `heap_peak_ns` (the live heap's peak), if any were read.
    pub fn summary(&self, heap_peak_ns: Option<u64>) -> Option<Where> {
        let all = self.breakdowns();
        let end = all.last()?.clone();
        // The RSS at its height: the last reading within a tenth of the largest whose
        // allocators' figures are known (an RSS that stays high after the heap shrank is the
        // question; a reading paired with no figures names less), else the largest.
        let top = all.iter().map(|p| p.rss).max()?;
        let peak_rss = all
            .iter()
            .rfind(|p| p.malloc_free.is_some() && p.rss >= top - top / 10)
            .or_else(|| all.iter().max_by_key(|p| p.rss))?
            .clone();
        let peak_heap =
            heap_peak_ns.and_then(|t| all.iter().min_by_key(|p| p.time_ns.abs_diff(t)).cloned());
        Some(Where {
            end,
            peak_rss,
            peak_heap,
        })
    }
}

/// A reading shared out with the allocators' statistics `heap`.
fn combine(m: &Measured, heap: Option<&HeapStats>) -> Parts {
    let known_malloc =
        heap.filter(|h| h.malloc_kind == MALLOC_GLIBC || h.malloc_kind == MALLOC_JEMALLOC);
    let malloc_free = known_malloc.map(|h| h.malloc_free);
    // pymalloc's figures of the same reading only: those read last may be from before a
    // burst of frees (a reading made without the GIL has none).
    let pymalloc = heap.filter(|h| h.pymalloc_known == 1);
    let pymalloc_free = pymalloc.map(|h| h.pymalloc_arenas.saturating_sub(h.pymalloc_used));
    // What the allocators say is in use, beyond what the samples estimate there.
    let in_use =
        known_malloc.map_or(0, |h| h.malloc_used) + pymalloc.map_or(0, |h| h.pymalloc_used);
    let live_unseen = if known_malloc.is_some() || pymalloc.is_some() {
        (in_use as f64 - m.python_live.bytes - m.native_live.bytes).max(0.0)
    } else {
        0.0
    };
    let explained = m.python_live.bytes
        + m.native_live.bytes
        + m.mmap_resident.bytes
        + live_unseen
        + pymalloc_free.unwrap_or(0) as f64
        + malloc_free.unwrap_or(0) as f64;
    let rest = m.rss as f64 - explained;
    Parts {
        time_ns: m.time_ns,
        rss: m.rss,
        python_live: m.python_live,
        native_live: m.native_live,
        mmap_resident: m.mmap_resident,
        mmap_mapped: m.mmap_mapped,
        live_unseen,
        pymalloc_free,
        malloc_free,
        malloc_kind: heap.map_or(0, |h| h.malloc_kind),
        unexplained: rest.max(0.0),
        over: (-rest).max(0.0),
        named: m.named.clone(),
    }
}

/// The breakdowns a report shows.
#[derive(Clone, Debug)]
pub struct Where {
    pub end: Parts,
    pub peak_rss: Parts,
    pub peak_heap: Option<Parts>,
}
