//! Where the RSS is: the process's resident memory shared out among what holds it, at each
//! reading of its mappings (RESIDENT records, about once a second) — the live sampled blocks
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

/// A reading of the mappings, with what the samples said at that moment: everything of a
/// breakdown but the allocators' statistics.
#[derive(Clone, Debug)]
struct Measured {
    time_ns: u64,
    rss: u64,
    python_live: Estimate,
    native_live: Estimate,
    mmap_resident: Estimate,
    mmap_mapped: f64,
    named: Vec<(String, u64)>,
    /// The allocators' statistics read last before it, if any (mprof reads the mappings as
    /// soon as it sees new statistics, so these are from the same moment unless the program
    /// has been idle, when they have not changed), and pymalloc's figures read last (a reading
    /// at the interpreter's end has none: they stay as they were).
    heap_before: Option<HeapStats>,
    pymalloc_before: Option<HeapStats>,
}

/// Follows the live sampled blocks by allocator and the allocators' statistics, and shares out
/// each reading of the mappings. Fed by the aggregate, in file order.
#[derive(Default)]
pub struct ResidentTracker {
    /// Live sampled blocks of the capture's own process, by allocator.
    live: [Estimate; 3],
    /// Its live sampled anonymous mappings: address → (size, what the sample stands for).
    mmaps: HashMap<u64, (u64, Sample)>,
    heap: Option<HeapStats>,
    /// The latest statistics with pymalloc's figures.
    pymalloc: Option<HeapStats>,
    kept: Vec<Parts>,
    /// Every `stride`-th breakdown is kept once `MAX_KEPT` are (the largest RSS always).
    stride: usize,
    seen: usize,
}

impl ResidentTracker {
    /// A sample of the capture's own process.
    pub fn alloc(&mut self, addr: u64, size: u64, allocator: Allocator, sample: &Sample) {
        self.live[allocator as usize].add(sample);
        if allocator == Allocator::Mmap {
            self.mmaps.insert(addr, (size, *sample));
        }
    }

    /// A sampled block of the capture's own process freed (or replaced).
    pub fn free(&mut self, addr: u64, allocator: Allocator, sample: &Sample) {
        self.live[allocator as usize].remove(sample);
        if allocator == Allocator::Mmap {
            self.mmaps.remove(&addr);
        }
    }

    /// The allocators' statistics, for the readings of the mappings that follow.
    pub fn heap(&mut self, stats: &HeapStats) {
        if std::env::var_os("MPROF_DEBUG_HEAP").is_some() { eprintln!("HEAP {} used {} free {} py {}", stats.time_ns, stats.malloc_used, stats.malloc_free, stats.pymalloc_known); }
        self.heap = Some(*stats);
        if stats.pymalloc_known == 1 {
            self.pymalloc = Some(*stats);
        }
    }

    /// A reading of the mappings: shared out and kept.
    pub fn resident(&mut self, r: &Resident) {
        if std::env::var_os("MPROF_DEBUG_HEAP").is_some() { eprintln!("RES {} rss {}", r.time_ns, r.rss); }
        let m = self.measure(r);
        let parts = combine(&m, m.heap_before.as_ref());
        self.keep(parts);
    }

    fn measure(&self, r: &Resident) -> Measured {
        let [python_live, native_live, _] = self.live.clone();
        let mut mmap_resident = Estimate::default();
        let mut mmap_mapped = 0.0;
        for (&addr, (size, sample)) in &self.mmaps {
            // The sample stands for `weight` times its own bytes: its mapping's resident
            // share, scaled the same way.
            let weight = sample.bytes() / (*size).max(1) as f64;
            let resident = r.resident_in(addr, addr.saturating_add(*size)) as f64;
            mmap_resident.add(&Sample::scaled(resident, weight));
            mmap_mapped += sample.bytes();
        }
        Measured {
            time_ns: r.time_ns,
            rss: r.rss,
            python_live,
            native_live,
            mmap_resident,
            mmap_mapped,
            named: r.named.iter().take(NAMED_KEPT).cloned().collect(),
            heap_before: self.heap,
            pymalloc_before: self.pymalloc,
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
        if self.seen % self.stride == 0 || is_top || last_is_top || self.kept.is_empty() {
            self.kept.push(parts);
        } else if let Some(last) = self.kept.last_mut() {
            *last = parts;
        }
    }

    fn peak_index(&self) -> Option<usize> {
        (0..self.kept.len()).max_by_key(|&i| self.kept[i].rss)
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
        let peak_rss = all.iter().max_by_key(|p| p.rss)?.clone();
        let peak_heap = heap_peak_ns
            .and_then(|t| all.iter().min_by_key(|p| p.time_ns.abs_diff(t)).cloned());
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
    let pymalloc = heap
        .filter(|h| h.pymalloc_known == 1)
        .or(m.pymalloc_before.as_ref());
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
