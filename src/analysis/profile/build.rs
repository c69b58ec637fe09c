//! Building a [`Profile`] from records: the first pass aggregates every record, the second
//! (up to the peak, see [`super::replay`]) finds the blocks live then, both within the reader's
//! memory allowance ([`Budget`]).

use super::replay::Replay;
use super::{Completeness, LoadError, Process, Profile, MEMORY_FIXED, MEMORY_PER_BYTE};
use crate::analysis::aggregate::{Aggregator, Block, Change};
use crate::analysis::allocators::{Allocators, ByAllocator};
use crate::analysis::estimate::Figures;
use crate::analysis::focus::Focus;
use crate::analysis::names::{FastMap, StackId, StackResolver};
use crate::capture::file::Digest;
use crate::capture::processes::Pick;
use anyhow::Result;
use mprof_common::record::Record;

/// What the reader may hold beyond what it held when it started, for a capture of `size`
/// bytes, checked record by record. A third of the allowance: a record can make a table grow,
/// which briefly holds the old and the new (twice as large) table, so a check passed before a
/// record keeps the peak within the whole allowance.
fn memory_limit(size: u64, allowed_by_user: usize) -> usize {
    let by_size = MEMORY_PER_BYTE
        .saturating_mul(size as usize)
        .saturating_add(MEMORY_FIXED);
    by_size.max(allowed_by_user) / 3
}

/// The environment variable that raises the reader's memory allowance, in MiB, for a real
/// capture denser than the allowance expects (millions of distinct stacks).
pub const MEMORY_ENV: &str = "MPROF_READ_MEMORY_MIB";

/// The allowance [`MEMORY_ENV`] asks for, in bytes (0 when unset or not a number).
fn allowed_by_user() -> usize {
    std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(0, |mib| mib.saturating_mul(1 << 20))
}

/// Checks the reader's memory against its allowance (none for records already in memory).
pub(crate) struct Budget {
    /// The capture's size, None for no allowance.
    size: Option<u64>,
    base: isize,
    /// [`crate::capture::file::expansion`] when the budget was made.
    unpacked: u64,
    /// What [`MEMORY_ENV`] allows, read once (the check runs at every record).
    allowed_by_user: usize,
}

impl Budget {
    /// The allowance for a capture of `size` bytes, from what the thread holds now.
    pub(crate) fn new(size: Option<u64>) -> Budget {
        Budget {
            size,
            base: crate::base::memory::in_use(),
            unpacked: crate::capture::file::expansion(),
            allowed_by_user: allowed_by_user(),
        }
    }

    /// An error once the reader holds more than its allowance.
    pub(crate) fn check(&self) -> Result<(), LoadError> {
        self.check_apart(0)
    }

    /// [`Budget::check`], not counting `apart` bytes the reader holds for something else than
    /// the capture (debug information of files on this machine, for native frames).
    pub(crate) fn check_apart(&self, apart: isize) -> Result<(), LoadError> {
        let Some(size) = self.size else {
            return Ok(());
        };
        // Packed records read so far count at the size of what they stand for (over both
        // passes, so up to twice that in the second).
        let limit = memory_limit(
            size + (crate::capture::file::expansion() - self.unpacked),
            self.allowed_by_user,
        );
        if crate::base::memory::in_use() - self.base - apart.max(0) > limit as isize {
            return Err(LoadError::TooDense { size, limit });
        }
        Ok(())
    }
}

/// One pass over the records: hands each, with its process (see [`crate::capture::processes`])
/// and the digest of the bytes up to it, to the callback until it returns false. See
/// [`Profile::build`].
pub(super) type PassFn<'a> = dyn FnMut(u32, &Record, Digest) -> bool + 'a;

impl Profile {
    /// [`Profile::build`] without a memory allowance, for tests that feed passes by hand.
    #[cfg(test)]
    pub(crate) fn build_for_test(
        first_rate: Option<u64>,
        pass: impl FnMut(&mut PassFn) -> Result<()>,
    ) -> Result<Profile> {
        Profile::build(first_rate, None, pass)
    }

    /// Aggregates the records that `pass` hands to its callback, in file order. `pass` is called
    /// twice (a second time up to the peak, when there is one) and must give the same records
    /// each time (checked with the digests); it stops when the callback returns false.
    /// `first_rate` is the first rate the records announce: it applies to samples that come
    /// before any announcement. `size`, the capture's size, sets the memory allowance.
    pub(super) fn build(
        first_rate: Option<u64>,
        size: Option<u64>,
        mut pass: impl FnMut(&mut PassFn) -> Result<()>,
    ) -> Result<Profile> {
        let budget = Budget::new(size);
        let mut failure = None;
        let mut peak_digest = Digest::default();
        let mut agg = Aggregator::new(first_rate.unwrap_or(1));
        let mut stacks: Vec<u32> = Vec::new();
        let mut figures: Vec<Figures> = Vec::new();
        let mut sites: FastMap<(StackId, u32), Figures> = FastMap::default();
        pass(&mut |process, record, digest| {
            agg.enter(process);
            if let Change::Alloc { block, sample, .. } = agg.apply(record) {
                let stack = block.stack.0 as usize;
                stacks.push(block.stack.0);
                if figures.len() <= stack {
                    figures.resize(stack + 1, Figures::default());
                }
                figures[stack].allocated.add(&sample);
                sites
                    .entry((block.stack, block.tid))
                    .or_default()
                    .allocated
                    .add(&sample);
                if agg.peak_is_latest() {
                    peak_digest = digest;
                }
            }
            failure = budget.check_apart(agg.resolver.symbol_memory()).err();
            failure.is_none()
        })?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        let symbol_warnings = agg.resolver.symbol_warnings();
        let names = std::mem::take(&mut agg.resolver.names);
        agg.resolver = StackResolver::new();
        figures.resize(names.nodes.len(), Figures::default());
        let mut add_live = |block: &Block, peak: bool| {
            let f = &mut figures[block.stack.0 as usize];
            let site = sites.entry((block.stack, block.tid)).or_default();
            let (a, b) = if peak {
                (&mut f.peak, &mut site.peak)
            } else {
                (&mut f.live, &mut site.live)
            };
            a.add(&block.sample());
            b.add(&block.sample());
        };
        for block in agg.live_blocks() {
            add_live(block, false);
        }
        agg.live = Vec::new();
        agg.ended = Vec::new();
        let mut peak_seconds = None;
        agg.resident.finish();
        let resident = agg.resident.summary(agg.peak().map(|(_, _, t)| t));
        let breakdowns = agg.resident.breakdowns();
        if let Some((end, _, peak_ns)) = agg.peak() {
            peak_seconds = agg
                .first_ns
                .map(|t0| peak_ns.saturating_sub(t0) as f64 / 1e9);
            let mut replay = Replay::new(&stacks, first_rate.unwrap_or(1));
            let mut index = 0;
            let mut reached = None;
            pass(&mut |process, record, digest| {
                if let Err(e) = replay.apply(process, record).and_then(|()| budget.check()) {
                    failure = Some(e);
                    return false;
                }
                index += 1;
                if index > end {
                    reached = Some(digest);
                }
                reached.is_none()
            })?;
            if let Some(e) = failure {
                return Err(e.into());
            }
            if reached != Some(peak_digest) {
                return Err(LoadError::Changed.into());
            }
            for block in replay.live.iter().flat_map(|m| m.values()) {
                add_live(block, true);
            }
        }
        let mut sites: Vec<_> = sites.into_iter().collect();
        sites.sort_by_key(|(k, _)| *k);
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
        let mut profile = Profile {
            focus: Focus::new(&agg.meta, &[]),
            processes,
            followed: false,
            pick: Pick::All,
            process_warnings: Vec::new(),
            meta: agg.meta,
            rate: agg.rate,
            rate_known: first_rate.is_some(),
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
            resident,
            breakdowns,
        };
        profile.add_up();
        Ok(profile)
    }
}
