//! What a Python program that profiles itself (pymprof) asks about: the sampled blocks live
//! now, as `tracemalloc` keeps its traces, with the traced memory and its peak, and the
//! figures of an *epoch* (what was allocated since a mark: a test, for the pytest plugin).
//!
//! Records are applied one at a time, as they leave the ring. Each live sampled block keeps
//! its stack, its size, what it stands for ([`Sample`]) and its sequence number (the count of
//! samples before it, from 1), by which an epoch tells its own blocks from older ones.
//!
//! The epoch's peak: its blocks' live bytes at their highest, and the sites that held them
//! then. The sites are found when asked, without a copy of the heap at every new high:
//! the blocks live at the peak are the epoch's blocks sampled up to the peak's sequence
//! number and not freed before it, i.e. those still live now, plus those freed since the
//! peak, which are summed per stack as they go (a map bounded by the number of stacks).

use crate::analysis::estimate::{Estimate, Sample};
use crate::analysis::names::{FastMap, Location, StackId, StackResolver};
use mprof_common::record::{self, Allocator, EndReason, Record, ALLOC_TRUNCATED};
use mprof_common::stacks::{Expanded, Expander};

/// A live sampled block.
#[derive(Clone, Copy, Debug)]
pub struct Traced {
    pub stack: StackId,
    /// The block's own size.
    pub size: u64,
    /// Its sample's number, from 1.
    pub seq: u64,
    pub sample: Sample,
}

/// The figures of the blocks sampled since a mark.
#[derive(Default)]
struct Epoch {
    /// Samples numbered above this are the epoch's.
    mark: u64,
    allocated: Estimate,
    live: Estimate,
    /// `live` at its highest so far, and the sample that took it there.
    peak: Estimate,
    peak_seq: u64,
    /// The epoch's blocks sampled up to `peak_seq` and freed since, per stack.
    freed_since_peak: FastMap<StackId, Estimate>,
}

/// The live sampled blocks of a session and what is known about them (see the module doc).
pub struct Traces {
    resolver: StackResolver,
    expander: Expander,
    rate: u64,
    live: FastMap<u64, Traced>,
    /// Samples applied.
    seq: u64,
    /// The blocks in `live`, and their sum at its highest since the start or the last
    /// [`Traces::reset_peak`].
    current: Estimate,
    peak: Estimate,
    epoch: Epoch,
    /// The agent's END record, once it came: why sampling ended.
    pub ended: Option<u16>,
}

impl Traces {
    /// No block yet; samples are taken at mean distance `rate`.
    pub fn new(rate: u64) -> Traces {
        Traces {
            resolver: StackResolver::new(),
            expander: Expander::new(),
            rate,
            live: FastMap::default(),
            seq: 0,
            current: Estimate::default(),
            peak: Estimate::default(),
            epoch: Epoch::default(),
            ended: None,
        }
    }

    /// Applies an encoded record as it left the ring (undecodable bytes are skipped, as the
    /// capture reader skips them).
    pub fn observe(&mut self, bytes: &[u8]) {
        let decoded = match self.expander.feed(bytes) {
            Expanded::Pass(bytes) => record::decode(bytes),
            Expanded::Alloc(alloc) => record::decode(&alloc),
            Expanded::Consumed | Expanded::Bad(_) => return,
        };
        if let Ok((record, _)) = decoded {
            self.apply(record);
        }
    }

    /// Applies one record.
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Code {
                code,
                firstline,
                filename,
                name,
            } => self.resolver.announce(code, &filename, &name, firstline),
            Record::Module(module) => self.resolver.add_module(module),
            Record::Alloc {
                addr,
                size,
                frames,
                flags,
                native,
                ..
            } => {
                let allocator = Allocator::of_flags(flags);
                let truncated = flags & ALLOC_TRUNCATED != 0;
                let stack = self
                    .resolver
                    .stack(&frames, truncated, allocator, native.as_ref());
                self.seq += 1;
                let block = Traced {
                    stack: StackId(stack),
                    size,
                    seq: self.seq,
                    sample: Sample::new(size, self.rate),
                };
                if let Some(old) = self.live.insert(addr, block) {
                    self.gone(&old);
                }
                self.added(&block);
            }
            Record::Free { addr } => {
                if let Some(old) = self.live.remove(&addr) {
                    self.gone(&old);
                }
            }
            Record::End { reason, .. } => self.ended = Some(reason),
            _ => {}
        }
    }

    fn added(&mut self, block: &Traced) {
        self.current.add(&block.sample);
        if self.current.bytes > self.peak.bytes {
            self.peak = self.current;
        }
        let e = &mut self.epoch;
        if block.seq > e.mark {
            e.allocated.add(&block.sample);
            e.live.add(&block.sample);
            if e.live.bytes > e.peak.bytes {
                e.peak = e.live;
                e.peak_seq = block.seq;
                e.freed_since_peak.clear();
            }
        }
    }

    /// A live block was freed (or replaced: its free was lost).
    fn gone(&mut self, old: &Traced) {
        self.current.remove(&old.sample);
        let e = &mut self.epoch;
        if old.seq > e.mark {
            e.live.remove(&old.sample);
            if old.seq <= e.peak_seq {
                e.freed_since_peak
                    .entry(old.stack)
                    .or_default()
                    .add(&old.sample);
            }
        }
    }

    /// The live sampled blocks, by address.
    pub fn live(&self) -> impl Iterator<Item = (&u64, &Traced)> + '_ {
        self.live.iter()
    }

    /// The live block at `addr`, if it was sampled.
    pub fn block_at(&self, addr: u64) -> Option<&Traced> {
        self.live.get(&addr)
    }

    /// The traced memory now and at its highest (`tracemalloc.get_traced_memory`).
    pub fn memory(&self) -> (Estimate, Estimate) {
        (self.current, self.peak)
    }

    /// The peak is the traced memory now (`tracemalloc.reset_peak`).
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Forgets every live block (`tracemalloc.clear_traces`): their frees are ignored from now
    /// on, and the traced memory and its peak start again from zero. A running epoch ends.
    pub fn clear(&mut self) {
        self.live.clear();
        self.current = Estimate::default();
        self.peak = Estimate::default();
        self.mark();
    }

    /// Starts an epoch: the blocks sampled from now on.
    pub fn mark(&mut self) {
        self.epoch = Epoch {
            mark: self.seq,
            peak_seq: self.seq,
            ..Epoch::default()
        };
    }

    /// The epoch's figures: allocated, live now, and live at its peak.
    pub fn epoch(&self) -> (Estimate, Estimate, Estimate) {
        (self.epoch.allocated, self.epoch.live, self.epoch.peak)
    }

    /// Per stack, the epoch's blocks live now (`at_peak` false) or at its peak.
    pub fn epoch_stacks(&self, at_peak: bool) -> FastMap<StackId, Estimate> {
        let e = &self.epoch;
        let upto = if at_peak { e.peak_seq } else { u64::MAX };
        let mut out: FastMap<StackId, Estimate> = if at_peak {
            e.freed_since_peak.clone()
        } else {
            FastMap::default()
        };
        for b in self.live.values() {
            if b.seq > e.mark && b.seq <= upto {
                out.entry(b.stack).or_default().add(&b.sample);
            }
        }
        out
    }

    /// The frames of a stack, innermost first.
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.resolver.names.frames(stack.0)
    }

    /// The allocator the blocks of a stack came from.
    pub fn allocator(&self, stack: StackId) -> Allocator {
        self.resolver.names.allocator(stack.0)
    }

    /// Whether the agent ended the session by itself because the reader went silent.
    pub fn reader_gone(&self) -> bool {
        self.ended == Some(EndReason::ReaderGone as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::testing::alloc;

    fn free(addr: u64) -> Record {
        Record::Free { addr }
    }

    #[test]
    fn traced_memory_and_its_peak_follow_allocs_and_frees() {
        let mut t = Traces::new(1);
        t.apply(alloc(1, 0x10, 100, 1, &[]));
        t.apply(alloc(1, 0x20, 50, 2, &[]));
        t.apply(free(0x10));
        t.apply(free(0x999));
        let (now, peak) = t.memory();
        assert_eq!((now.bytes, now.count, peak.bytes), (50.0, 1.0, 150.0));
        t.reset_peak();
        assert_eq!(t.memory().1.bytes, 50.0);
        // An alloc at a live address replaces the block there (its free was lost).
        t.apply(alloc(1, 0x20, 70, 3, &[]));
        assert_eq!(t.memory().0.bytes, 70.0);
        t.clear();
        assert_eq!(t.live().count(), 0);
        t.apply(free(0x20));
        assert_eq!(t.memory().0.bytes, 0.0);
    }

    #[test]
    fn an_epoch_counts_its_own_blocks_and_the_sites_of_its_peak() {
        let mut t = Traces::new(1);
        t.apply(alloc(1, 0x10, 1000, 1, &[]));
        t.mark();
        t.apply(alloc(1, 0x20, 300, 2, &[]));
        t.apply(alloc(1, 0x30, 200, 3, &[]));
        // An older block freed: not the epoch's.
        t.apply(free(0x10));
        t.apply(free(0x20));
        t.apply(alloc(1, 0x40, 100, 4, &[]));
        let (allocated, live, peak) = t.epoch();
        assert_eq!(allocated.bytes, 600.0);
        assert_eq!(live.bytes, 300.0);
        assert_eq!(peak.bytes, 500.0);
        let sum = |m: FastMap<StackId, Estimate>| m.values().map(|e| e.bytes).sum::<f64>();
        // At the peak: the 300 freed since, and the 200 still live; not the 100 after it.
        assert_eq!(sum(t.epoch_stacks(true)), 500.0);
        assert_eq!(sum(t.epoch_stacks(false)), 300.0);
    }

    #[test]
    fn sampled_blocks_stand_for_more_than_themselves() {
        let mut t = Traces::new(1024);
        t.apply(alloc(1, 0x10, 512, 1, &[]));
        let (now, _) = t.memory();
        let p = 1.0 - (-0.5f64).exp();
        assert!((now.bytes - 512.0 / p).abs() < 1e-6);
        assert!((now.count - 1.0 / p).abs() < 1e-9);
        assert!(now.variance > 0.0);
    }
}
