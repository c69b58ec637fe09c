//! The incremental core of aggregation: records applied one at a time, in file order.
//!
//! A `Free` of an address that is not live is ignored (most frees are of unsampled blocks); a
//! realloc arrives as `Free(old)`, `Alloc(new)`. An `Alloc` at an address that is already live
//! replaces the old block (its `Free` was lost).
//!
//! Records can come from several processes (a capture with followed children, merged by
//! `crate::capture::processes`): [`Aggregator::enter`] says which process the next records
//! belong to. Each process has its own addresses, code objects, rate and metadata; the stacks,
//! the live heap and its peak are those of all processes together, and [`ProcessFigures`] keeps
//! what each process did alone. Process 0 is the capture's own (the root): its metadata is the
//! capture's.
//!
//! Metadata and thread names are kept exact but bounded (a capture is untrusted input): at
//! most [`MAX_META_KEYS`] keys of `MAX_META_KEY` bytes, values and thread names elided to
//! [`MAX_META_VALUE`] and [`MAX_NAME`] bytes.

use crate::analysis::estimate::Estimate;
pub(crate) use crate::analysis::live::Block;
use crate::analysis::live::LiveTable;
use crate::analysis::names::{Location, StackId, StackResolver, MAX_NAME};
use crate::analysis::origins::Pairing;
use crate::base::text::elide;
use crate::capture::meta::{ended_by_exec, meta_pairs, meta_rate, meta_u64};
use crate::capture::stacks::{Brief, Stacks};
use mprof_common::record::{Allocator, EndReason, Frame, Record, ALLOC_TRUNCATED};
use std::collections::BTreeMap;

/// Longest metadata value kept, in bytes (elided like names).
pub const MAX_META_VALUE: usize = 4096;
/// Most metadata keys kept (later values of a known key still replace it).
pub const MAX_META_KEYS: usize = 64;
/// Longest metadata key kept, in bytes; longer keys are dropped.
const MAX_META_KEY: usize = 64;

/// Adds `key=value` pairs to `meta`, later values replacing earlier ones, within the bounds of
/// the module doc (keys, their length, the values' length).
pub(crate) fn merge_meta<'a>(
    meta: &mut BTreeMap<String, String>,
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
) {
    for (key, value) in pairs {
        let known = meta.contains_key(key);
        if key.len() > MAX_META_KEY || (!known && meta.len() >= MAX_META_KEYS) {
            continue;
        }
        let value = elide(value, MAX_META_VALUE).into_owned();
        meta.insert(key.to_owned(), value);
    }
}

/// What one process of a capture did on its own (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct ProcessFigures {
    /// Its metadata (for process 0, the capture's: [`Aggregator::meta`]).
    pub meta: BTreeMap<String, String>,
    /// Mean bytes between its samples, as last announced.
    pub rate: u64,
    /// Its sampled allocations, and the estimate of all its allocations.
    pub allocated: Estimate,
    /// Its sampled blocks not freed (yet).
    pub live: Estimate,
    /// The highest estimated live heap of the process alone.
    pub peak_bytes: f64,
    /// Dropped records, from its last Stats record.
    pub dropped: u64,
    /// Its highest RSS (a reading, or its high-water mark from its metadata if higher) and
    /// its last reading.
    pub max_rss: Option<u64>,
    pub last_rss: Option<u64>,
    /// Whether the agent wrote its END record, and whether mprof finished its capture.
    pub ended: bool,
    pub finished: bool,
    /// When the agent switched itself off because mprof's reader had gone silent (an END
    /// record saying so: the process went on unprofiled), if it did.
    pub reader_gone_ns: Option<u64>,
    /// Whether its records are over ([`Aggregator::leave`]): its RSS no longer counts, unless
    /// it was `still_running`.
    pub gone: bool,
    /// Its END record said the session was over for it while it went on running (a detach):
    /// when its records end, its last RSS reading and its live blocks still count, as the
    /// process still holds them.
    pub still_running: bool,
}

/// What applying one record changed, for callers that keep their own tables.
pub(crate) enum Change {
    /// A sampled allocation (what it stands for: `block.sample()`); `replaced` is the live
    /// block it overwrote (its free was lost).
    Alloc {
        block: Block,
        replaced: Option<Block>,
    },
    /// A sampled block was freed.
    Free(Block),
    /// A process's records ended (it exited, or its capture ended): its blocks still live,
    /// `Aggregator::ended[range]`, are no longer part of the live heap.
    Ended(std::ops::Range<usize>),
    /// Nothing per stack changed.
    Other,
}

/// The incremental core of aggregation: it applies records one at a time, in file order, and
/// keeps the stacks, the live sampled blocks and the whole live heap with its high-water mark.
/// [`Profile::load`] runs a capture through it; the live view feeds it the same records
/// as they go to the capture file.
pub(crate) struct Aggregator {
    pub(crate) resolver: StackResolver,
    /// Live sampled blocks, per process by address.
    pub(crate) live: Vec<LiveTable>,
    /// Blocks still live when their process's records ended ([`Aggregator::leave`]): live at
    /// its end, but no longer in the live heap.
    pub(crate) ended: Vec<Block>,
    /// Merged `key=value` pairs of the Meta records (later records win).
    pub meta: BTreeMap<String, String>,
    /// Mean bytes between samples, as last announced (process 0's).
    pub rate: u64,
    /// Alloc records applied.
    pub samples: u64,
    /// Dropped records, from the last Stats record of each process, summed.
    pub dropped: u64,
    /// The highest RSS reading, and the last one (with several processes: the sum of the last
    /// readings of those whose records are not over, and its highest value; a process's
    /// high-water mark from its metadata if higher).
    pub max_rss: Option<u64>,
    pub last_rss: Option<u64>,
    /// Names of the threads, from Thread records (elided to [`MAX_NAME`]).
    pub threads: BTreeMap<u32, String>,
    /// The END record of process 0, if its agent wrote one: (reason, time).
    pub end: Option<(u16, u64)>,
    /// Whether mprof wrote process 0's closing Stats record (it finished the file).
    pub finished: bool,
    /// The time of the first and of the latest timed record.
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Estimated bytes of the live sampled blocks.
    pub live_bytes: f64,
    /// [`Aggregator::live_bytes`] per allocator (indexed by its wire value).
    pub live_split: [f64; 3],
    /// The highest `live_bytes` so far, the index of the record that reached it, and its time.
    peak: Option<(usize, f64, u64)>,
    applied: usize,
    /// The process the records belong to, and every process seen.
    process: u32,
    procs: Vec<ProcessFigures>,
    /// Where the capture's own process's RSS is (see [`crate::analysis::resident`]).
    pub(crate) resident: crate::analysis::resident::ResidentTracker,
    /// Per process, which stack each interned stack node of its capture is (see
    /// [`Aggregator::apply_sample`]).
    node_stacks: Vec<NodeStacks>,
    /// Frames of a node being resolved.
    scratch: Vec<Frame>,
    /// Per process, the stack each thread was created by, if known (see
    /// [`crate::analysis::origins`]): its samples are grafted onto it.
    origins: Vec<Pairing<Option<u32>>>,
}

/// Which stack each stack node of one capture is, per allocator and truncation (the slots of
/// the resolver's memo): valid while neither the capture's nodes (its epoch) nor the meaning
/// of its code addresses (the resolver's generation) change. An entry holds the stamp it was
/// made under and the stack.
#[derive(Default)]
struct NodeStacks {
    stamp: u32,
    under: (u32, u64),
    slots: [Vec<(u32, u32)>; 6],
}

impl NodeStacks {
    /// The stack of `node` in `slot`, if known under (`epoch`, `generation`).
    fn get(&mut self, slot: usize, node: u32, epoch: u32, generation: u64) -> Option<u32> {
        if self.under != (epoch, generation) {
            self.under = (epoch, generation);
            self.stamp = self.stamp.wrapping_add(1);
        }
        match self.slots[slot].get(node as usize) {
            Some(&(stamp, stack)) if stamp == self.stamp && stamp != 0 => Some(stack),
            _ => None,
        }
    }

    fn set(&mut self, slot: usize, node: u32, stack: u32) {
        let slot = &mut self.slots[slot];
        if slot.len() <= node as usize {
            slot.resize(node as usize + 1, (0, 0));
        }
        slot[node as usize] = (self.stamp, stack);
    }
}

/// Most processes one aggregator tells apart (the processes of a capture are bounded before).
pub const MAX_PROCESSES: usize = 8192;

impl Aggregator {
    /// An empty aggregator; `rate` applies until a Meta record announces another.
    pub fn new(rate: u64) -> Aggregator {
        Aggregator {
            resolver: StackResolver::new(),
            live: vec![LiveTable::default()],
            ended: Vec::new(),
            meta: BTreeMap::new(),
            rate,
            samples: 0,
            dropped: 0,
            max_rss: None,
            last_rss: None,
            threads: BTreeMap::new(),
            end: None,
            finished: false,
            last_ns: None,
            live_bytes: 0.0,
            live_split: [0.0; 3],
            peak: None,
            first_ns: None,
            applied: 0,
            process: 0,
            procs: vec![ProcessFigures {
                rate,
                ..ProcessFigures::default()
            }],
            resident: Default::default(),
            node_stacks: vec![NodeStacks {
                stamp: 1,
                ..NodeStacks::default()
            }],
            scratch: Vec::new(),
            origins: vec![Pairing::default()],
        }
    }

    /// The records applied from now on belong to process `process` (0 at first); see the
    /// module doc. An index beyond [`MAX_PROCESSES`] counts as the last one.
    #[inline(always)]
    pub fn enter(&mut self, process: u32) {
        if process == self.process {
            return;
        }
        self.enter_another(process);
    }

    fn enter_another(&mut self, process: u32) {
        let process = process.min(MAX_PROCESSES as u32 - 1);
        if process as usize >= self.procs.len() {
            let rate = self.procs[0].rate;
            self.procs
                .resize_with(process as usize + 1, || ProcessFigures {
                    rate,
                    ..ProcessFigures::default()
                });
            self.live
                .resize_with(process as usize + 1, LiveTable::default);
            self.node_stacks
                .resize_with(process as usize + 1, || NodeStacks {
                    stamp: 1,
                    ..NodeStacks::default()
                });
            self.origins
                .resize_with(process as usize + 1, Pairing::default);
        }
        if process != self.process {
            self.resolver.switch_process(process);
            self.process = process;
        }
    }

    /// The records of `process` are over (it exited, or its capture ended): its blocks still
    /// live leave the live heap for [`Aggregator::ended`] (they stay live at its end), and its
    /// last RSS reading no longer counts in [`Aggregator::last_rss`]. Returns where its blocks
    /// went in `ended`. Not for a process whose session ended while it went on running
    /// ([`ProcessFigures::still_running`]), unless its address space is `gone` (it ran another
    /// program): its blocks stay in the live heap and its reading in the sum, so that a merged
    /// timeline of `attach --follow-children` does not drop at its end to the parent alone.
    pub fn leave(&mut self, process: u32) -> std::ops::Range<usize> {
        self.leave_process(process, false)
    }

    fn leave_process(&mut self, process: u32, gone: bool) -> std::ops::Range<usize> {
        let start = self.ended.len();
        let Some(p) = self.procs.get_mut(process as usize) else {
            return start..start;
        };
        p.gone = true;
        if p.still_running && !gone {
            return start..start;
        }
        p.last_rss = None;
        self.last_rss = self.rss_sum();
        let blocks = std::mem::take(&mut self.live[process as usize]);
        for block in blocks.into_values() {
            let bytes = block.sample().bytes;
            self.live_bytes -= bytes;
            self.live_split[self.allocator(block.stack) as usize] -= bytes;
            self.ended.push(block);
        }
        start..self.ended.len()
    }

    /// Every block live at the end of its process: those of processes still running, then
    /// those of processes whose records ended.
    #[cfg(test)]
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.live
            .iter()
            .flat_map(|m| m.values())
            .chain(self.ended.iter().copied())
    }

    /// What each process did, by index.
    pub fn processes(&self) -> &[ProcessFigures] {
        &self.procs
    }

    /// The current process's figures.
    #[inline(always)]
    fn proc(&mut self) -> &mut ProcessFigures {
        &mut self.procs[self.process as usize]
    }

    /// The sum of the last RSS readings that count (see [`Aggregator::leave`]); none while a
    /// process that was there when an attach began has no reading yet: their first readings
    /// come one by one just after the attach, and a sum of those in so far would climb from
    /// the parent's alone. (A process born later is left out of the sum until its first
    /// reading: a program that starts children all the time would otherwise have none.)
    fn rss_sum(&self) -> Option<u64> {
        let mut sum = None;
        for p in &self.procs {
            match p.last_rss {
                Some(r) => sum = Some(sum.unwrap_or(0u64).saturating_add(r)),
                None if !p.gone && p.meta.get("mode").is_some_and(|m| m == "attach") => {
                    return None
                }
                None => {}
            }
        }
        sum
    }

    /// Applies the next record.
    pub fn apply(&mut self, record: &Record) -> Change {
        let index = self.applied;
        self.applied += 1;
        match record {
            Record::Meta { text } => {
                self.meta(text);
                // A process attached to: no sum until its first reading (see `rss_sum`).
                self.last_rss = self.rss_sum();
                if ended_by_exec(text) {
                    // The process ran a new program by exec (a capture of its own): this one's
                    // blocks are gone with its address space.
                    return Change::Ended(self.leave_process(self.process, true));
                }
            }
            Record::Code {
                code,
                firstline,
                filename,
                name,
            } => self.resolver.announce(*code, filename, name, *firstline),
            Record::Alloc {
                tid,
                addr,
                size,
                frames,
                time_ns,
                flags,
                native,
            } => {
                let allocator = Allocator::of_flags(*flags);
                let truncated = flags & ALLOC_TRUNCATED != 0;
                let stack = self
                    .resolver
                    .stack(frames, truncated, allocator, native.as_ref());
                return self.alloc(index, *tid, *addr, *size, *time_ns, StackId(stack));
            }
            Record::Free { addr } => return self.free(*addr),
            Record::Heap(stats) if self.process == 0 => self.resident.heap(stats),
            Record::Resident(r) if self.process == 0 => {
                self.saw_time(r.time_ns);
                self.resident.resident(r);
            }
            Record::Heap(_) | Record::Resident(_) => {}
            Record::Stats { dropped, .. } => {
                let before = std::mem::replace(&mut self.proc().dropped, *dropped);
                self.dropped = self.dropped.saturating_sub(before).saturating_add(*dropped);
                self.proc().finished = true;
                if self.process == 0 {
                    self.finished = true;
                } else {
                    // A child's capture ends with it (mprof writes Stats last).
                    return Change::Ended(self.leave(self.process));
                }
            }
            Record::Rss { time_ns, rss_bytes } => {
                self.saw_time(*time_ns);
                let p = self.proc();
                p.max_rss = p.max_rss.max(Some(*rss_bytes));
                p.last_rss = Some(*rss_bytes);
                self.last_rss = self.rss_sum();
                self.max_rss = self.max_rss.max(self.last_rss);
            }
            Record::End { reason, time_ns } => {
                self.saw_time(*time_ns);
                let why = EndReason::from_u16(*reason);
                self.proc().ended = true;
                self.proc().still_running = why == Some(EndReason::Detached);
                if why == Some(EndReason::ReaderGone) {
                    self.proc().reader_gone_ns = Some(*time_ns);
                }
                if self.process == 0 {
                    self.end = Some((*reason, *time_ns));
                }
            }
            Record::Thread { tid, name } => {
                self.threads
                    .insert(*tid, elide(name, MAX_NAME).into_owned());
            }
            Record::Module(module) => self.resolver.add_module(module.clone()),
            Record::Spawn {
                serial,
                tid,
                truncated,
                frames,
                ..
            } => {
                let origin = self.origin_of_spawn(*tid, frames, *truncated);
                self.origins[self.process as usize].spawn(*serial, origin);
            }
            Record::Spawned { serial, handle } => {
                self.origins[self.process as usize].spawned(*serial, *handle)
            }
            Record::Handle {
                tid,
                handle,
                serial,
            } => self.origins[self.process as usize].handle(*tid, *handle, *serial),
            Record::Unknown { .. } => {}
        }
        Change::Other
    }

    /// Applies a sample that names a stack node of the current process's capture: the
    /// node's stack is resolved once per epoch (see [`NodeStacks`]), not for every sample.
    #[inline(always)]
    pub(crate) fn apply_sample(&mut self, b: &Brief, stacks: &Stacks) -> Change {
        let index = self.applied;
        self.applied += 1;
        let allocator = Allocator::of_flags(b.flags);
        let truncated = b.flags & ALLOC_TRUNCATED != 0;
        let slot = 2 * allocator as usize + truncated as usize;
        let generation = self.resolver.generation();
        let cache = &mut self.node_stacks[self.process as usize];
        let stack = match cache.get(slot, b.node, b.epoch, generation) {
            Some(stack) => stack,
            None => {
                stacks.frames(b.node, &mut self.scratch, None);
                let stack = self
                    .resolver
                    .stack(&self.scratch, truncated, allocator, None);
                // Resolving may have changed the generation (the memo of raw stacks was full).
                let generation = self.resolver.generation();
                let cache = &mut self.node_stacks[self.process as usize];
                if cache.get(slot, b.node, b.epoch, generation).is_none() {
                    cache.set(slot, b.node, stack);
                }
                stack
            }
        };
        self.alloc(index, b.tid, b.addr, b.size, b.time_ns, StackId(stack))
    }

    /// The stack a thread created by `tid` from `frames` comes from: those frames, grafted
    /// onto `tid`'s own origin when it has one (a thread started by a thread that was started
    /// from the user's code); `tid`'s origin alone when `frames` is empty (a native thread
    /// starting another). None when neither is known.
    fn origin_of_spawn(&mut self, tid: u32, frames: &[Frame], truncated: bool) -> Option<u32> {
        let creator = self.origins[self.process as usize].origin(tid).flatten();
        if frames.is_empty() {
            return creator;
        }
        let own = self
            .resolver
            .stack(frames, truncated, Allocator::Python, None);
        Some(match creator {
            Some(origin) => self.resolver.graft(own, origin),
            None => own,
        })
    }

    /// A sampled allocation (the `index`-th record applied) of `stack`.
    fn alloc(
        &mut self,
        index: usize,
        tid: u32,
        addr: u64,
        size: u64,
        time_ns: u64,
        stack: StackId,
    ) -> Change {
        self.saw_time(time_ns);
        self.samples += 1;
        let stack = match self.origins[self.process as usize].origin(tid).flatten() {
            Some(origin) => StackId(self.resolver.graft(stack.0, origin)),
            None => stack,
        };
        let block = Block::new(stack, tid, size, self.procs[self.process as usize].rate);
        let allocator = self.allocator(stack);
        let sample = block.sample();
        let replaced = self.live[self.process as usize].insert(addr, block);
        if let Some(old) = &replaced {
            self.take_live(old);
        }
        if self.process == 0 {
            if let Some(old) = &replaced {
                let was = self.allocator(old.stack);
                self.resident.free(addr, was, &old.sample(), true);
            }
            self.resident.alloc(addr, size, allocator, &sample);
        }
        self.live_bytes += sample.bytes;
        self.live_split[allocator as usize] += sample.bytes;
        let p = self.proc();
        p.allocated.add(&sample);
        p.live.add(&sample);
        p.peak_bytes = p.peak_bytes.max(p.live.bytes);
        if self.peak.is_none_or(|(_, best, _)| self.live_bytes > best) {
            self.peak = Some((index, self.live_bytes, time_ns));
        }
        Change::Alloc { block, replaced }
    }

    /// Applies a free (of a packed run: see [`crate::capture::records::Event::Free`]).
    #[inline(always)]
    pub(crate) fn apply_free(&mut self, addr: u64) -> Change {
        self.applied += 1;
        self.free(addr)
    }

    #[inline(always)]
    fn free(&mut self, addr: u64) -> Change {
        match self.live[self.process as usize].remove(addr) {
            Some(old) => {
                self.take_live(&old);
                if self.process == 0 {
                    let was = self.allocator(old.stack);
                    self.resident.free(addr, was, &old.sample(), false);
                }
                Change::Free(old)
            }
            None => Change::Other,
        }
    }

    /// Brings where the live blocks of `process` would keep `addr` into the cache, for a
    /// sample or free to come (see [`LiveTable::prefetch`]).
    #[inline(always)]
    pub(crate) fn prefetch(&self, process: u32, addr: u64) {
        if let Some(live) = self.live.get(process as usize) {
            live.prefetch(addr);
        }
    }

    /// Live sampled blocks of the current process.
    #[inline(always)]
    pub(crate) fn live_here(&self) -> usize {
        self.live[self.process as usize].len()
    }

    /// Applies a Meta record: process 0's is the capture's metadata, another process's its
    /// own; either may announce the rate of the samples that follow.
    fn meta(&mut self, text: &str) {
        let process = self.process as usize;
        let meta = if process == 0 {
            &mut self.meta
        } else {
            &mut self.procs[process].meta
        };
        merge_meta(meta, meta_pairs(text));
        let p = &mut self.procs[process];
        p.rate = meta_rate(text).unwrap_or(p.rate);
        if process == 0 {
            self.rate = p.rate;
        }
        if let Some(hwm) = meta_u64(text, "max_rss") {
            // The kernel's high-water mark (see `crate::sessions::record`): at least the process's
            // highest reading, and a floor under all the processes' highest sum.
            p.max_rss = p.max_rss.max(Some(hwm));
            self.max_rss = self.max_rss.max(Some(hwm));
        }
    }

    /// Takes a block that is no longer live out of the live heap.
    #[inline(always)]
    fn take_live(&mut self, old: &Block) {
        let sample = old.sample();
        self.live_bytes -= sample.bytes;
        self.live_split[self.allocator(old.stack) as usize] -= sample.bytes;
        self.proc().live.remove(&sample);
    }

    /// The allocator the blocks of a stack came from.
    #[inline(always)]
    pub fn allocator(&self, stack: StackId) -> Allocator {
        self.resolver.names.allocator(stack.0)
    }

    /// Notes the time of a timed record.
    #[inline(always)]
    fn saw_time(&mut self, time_ns: u64) {
        self.first_ns.get_or_insert(time_ns);
        self.last_ns = self.last_ns.max(Some(time_ns));
    }

    /// The peak so far: (index of the record that reached it, bytes, time).
    pub(crate) fn peak(&self) -> Option<(usize, f64, u64)> {
        self.peak
    }

    /// Whether the record applied last reached the peak.
    #[inline(always)]
    pub(crate) fn peak_is_latest(&self) -> bool {
        self.peak.is_some_and(|(i, _, _)| i + 1 == self.applied)
    }

    /// The highest estimated live heap so far (0 before the first sample).
    pub fn peak_bytes(&self) -> f64 {
        self.peak.map_or(0.0, |(_, bytes, _)| bytes)
    }

    /// The frames of a stack, innermost first.
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.resolver.names.frames(stack.0)
    }

    /// The frames of a stack, innermost first, then those of the stack that created its
    /// thread, if known (see [`crate::analysis::profile::Profile::frames_with_origin`]).
    pub fn frames_with_origin(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.resolver.names.frames_with_origin(stack.0)
    }

    /// The innermost frame of a stack.
    pub fn innermost(&self, stack: StackId) -> Location<'_> {
        self.resolver.names.innermost(stack.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::testing::{alloc, meta};

    /// Process 0 and a child, each with a reading and a block; the child's records then end
    /// after an END record saying `reason`, and with its Stats.
    fn child_ends(reason: EndReason) -> Aggregator {
        let mut agg = Aggregator::new(1);
        agg.apply(&meta("mode=attach\npid=10"));
        agg.apply(&Record::Rss {
            time_ns: 1,
            rss_bytes: 100,
        });
        assert_eq!(agg.last_rss, Some(100));
        agg.enter(1);
        agg.apply(&meta("mode=attach\npid=11"));
        // The parent's reading alone is not the sum of the two.
        assert_eq!(agg.last_rss, None);
        agg.apply(&alloc(1, 0x1000, 64, 2, &[]));
        agg.apply(&Record::Rss {
            time_ns: 3,
            rss_bytes: 1000,
        });
        assert_eq!(agg.last_rss, Some(1100));
        assert_eq!(agg.live_bytes, 64.0);
        agg.apply(&Record::End {
            reason: reason as u16,
            time_ns: 4,
        });
        agg.apply(&Record::Stats {
            samples: 1,
            dropped: 0,
        });
        agg.enter(0);
        agg
    }

    #[test]
    fn a_child_still_running_when_its_session_ended_keeps_its_memory() {
        let agg = child_ends(EndReason::Detached);
        assert_eq!(agg.last_rss, Some(1100));
        assert_eq!(agg.live_bytes, 64.0);
        assert_eq!(agg.live_blocks().count(), 1);
    }

    /// A process born after the attach is in the sum from its first reading on.
    #[test]
    fn a_child_born_later_counts_from_its_first_reading() {
        let mut agg = Aggregator::new(1);
        agg.apply(&meta("mode=attach\npid=10"));
        agg.apply(&Record::Rss {
            time_ns: 1,
            rss_bytes: 100,
        });
        agg.enter(1);
        agg.apply(&meta("mode=child\npid=11\nborn=fork"));
        assert_eq!(agg.last_rss, Some(100));
        agg.apply(&Record::Rss {
            time_ns: 2,
            rss_bytes: 50,
        });
        assert_eq!(agg.last_rss, Some(150));
    }

    #[test]
    fn a_child_that_exited_leaves_the_sums() {
        let agg = child_ends(EndReason::Finalizing);
        assert_eq!(agg.last_rss, Some(100));
        assert_eq!(agg.live_bytes, 0.0);
        // Live at its end, all the same.
        assert_eq!(agg.live_blocks().count(), 1);
    }
}
