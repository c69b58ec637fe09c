//! The incremental core of aggregation: records applied one at a time, in file order.
//!
//! A `Free` of an address that is not live is ignored (most frees are of unsampled blocks); a
//! realloc arrives as `Free(old)`, `Alloc(new)`. An `Alloc` at an address that is already live
//! replaces the old block (its `Free` was lost).
//!
//! Metadata and thread names are kept exact but bounded (a capture is untrusted input): at
//! most [`MAX_META_KEYS`] keys of `MAX_META_KEY` bytes, values and thread names elided to
//! [`MAX_META_VALUE`] and [`MAX_NAME`] bytes.

use crate::estimate::Sample;
use crate::names::{FastMap, Location, StackId, StackResolver, MAX_NAME};
use crate::text::elide;
use mprof_common::record::{Allocator, Record, ALLOC_TRUNCATED};
use std::collections::BTreeMap;

/// Longest metadata value kept, in bytes (elided like names).
pub const MAX_META_VALUE: usize = 4096;
/// Most metadata keys kept (later values of a known key still replace it).
pub const MAX_META_KEYS: usize = 64;
/// Longest metadata key kept, in bytes; longer keys are dropped.
const MAX_META_KEY: usize = 64;

/// The `rate` of a Meta record's text, if it has one.
pub(crate) fn meta_rate(text: &str) -> Option<u64> {
    meta_pairs(text)
        .filter(|(k, _)| *k == "rate")
        .filter_map(|(_, v)| v.trim().parse().ok())
        .last()
}

pub(crate) fn meta_pairs(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// A live sampled block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub stack: StackId,
    pub tid: u32,
    pub(crate) size: u64,
    pub(crate) rate: u64,
}

impl Block {
    /// What the block stands for.
    pub fn sample(&self) -> Sample {
        Sample::new(self.size, self.rate)
    }
}

/// What applying one record changed, for callers that keep their own tables.
pub(crate) enum Change {
    /// A sampled allocation; `replaced` is the live block it overwrote (its free was lost).
    Alloc {
        block: Block,
        sample: Sample,
        replaced: Option<Block>,
    },
    /// A sampled block was freed.
    Free(Block),
    /// Nothing per stack changed.
    Other,
}

/// The incremental core of aggregation: it applies records one at a time, in file order, and
/// keeps the stacks, the live sampled blocks and the whole live heap with its high-water mark.
/// [`Profile::load`] runs a capture through it; the live view feeds it the same records
/// as they go to the capture file.
pub(crate) struct Aggregator {
    pub(crate) resolver: StackResolver,
    pub(crate) live: FastMap<u64, Block>,
    /// Merged `key=value` pairs of the Meta records (later records win).
    pub meta: BTreeMap<String, String>,
    /// Mean bytes between samples, as last announced.
    pub rate: u64,
    /// Alloc records applied.
    pub samples: u64,
    /// Dropped records, from the last Stats record.
    pub dropped: u64,
    /// The highest RSS reading, and the last one.
    pub max_rss: Option<u64>,
    pub last_rss: Option<u64>,
    /// Names of the threads, from Thread records (elided to [`MAX_NAME`]).
    pub threads: BTreeMap<u32, String>,
    /// The END record, if the agent wrote one: (reason, time).
    pub end: Option<(u16, u64)>,
    /// Whether mprof wrote its closing Stats record (it finished the file).
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
}

impl Aggregator {
    /// An empty aggregator; `rate` applies until a Meta record announces another.
    pub fn new(rate: u64) -> Aggregator {
        Aggregator {
            resolver: StackResolver::new(),
            live: FastMap::default(),
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
        }
    }

    /// Applies the next record.
    pub fn apply(&mut self, record: &Record) -> Change {
        let index = self.applied;
        self.applied += 1;
        match record {
            Record::Meta { text } => {
                for (key, value) in meta_pairs(text) {
                    let known = self.meta.contains_key(key);
                    if key.len() > MAX_META_KEY || (!known && self.meta.len() >= MAX_META_KEYS) {
                        continue;
                    }
                    let value = elide(value, MAX_META_VALUE).into_owned();
                    self.meta.insert(key.to_owned(), value);
                }
                self.rate = meta_rate(text).unwrap_or(self.rate);
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
                self.saw_time(*time_ns);
                let allocator = Allocator::of_flags(*flags);
                let truncated = flags & ALLOC_TRUNCATED != 0;
                let stack = self
                    .resolver
                    .stack(frames, truncated, allocator, native.as_ref());
                self.samples += 1;
                let block = Block {
                    stack: StackId(stack),
                    tid: *tid,
                    size: *size,
                    rate: self.rate,
                };
                let sample = block.sample();
                let replaced = self.live.insert(*addr, block);
                if let Some(old) = &replaced {
                    self.take_live(old);
                }
                self.live_bytes += sample.bytes;
                self.live_split[allocator as usize] += sample.bytes;
                if self.peak.is_none_or(|(_, best, _)| self.live_bytes > best) {
                    self.peak = Some((index, self.live_bytes, *time_ns));
                }
                return Change::Alloc {
                    block,
                    sample,
                    replaced,
                };
            }
            Record::Free { addr } => {
                if let Some(old) = self.live.remove(addr) {
                    self.take_live(&old);
                    return Change::Free(old);
                }
            }
            Record::Stats { dropped, .. } => {
                self.dropped = *dropped;
                self.finished = true;
            }
            Record::Rss { time_ns, rss_bytes } => {
                self.saw_time(*time_ns);
                self.max_rss = self.max_rss.max(Some(*rss_bytes));
                self.last_rss = Some(*rss_bytes);
            }
            Record::End { reason, time_ns } => {
                self.saw_time(*time_ns);
                self.end = Some((*reason, *time_ns));
            }
            Record::Thread { tid, name } => {
                self.threads
                    .insert(*tid, elide(name, MAX_NAME).into_owned());
            }
            Record::Module(module) => self.resolver.add_module(module.clone()),
            Record::Unknown { .. } => {}
        }
        Change::Other
    }

    /// Takes a block that is no longer live out of the live heap.
    fn take_live(&mut self, old: &Block) {
        let bytes = old.sample().bytes;
        self.live_bytes -= bytes;
        self.live_split[self.allocator(old.stack) as usize] -= bytes;
    }

    /// The allocator the blocks of a stack came from.
    pub fn allocator(&self, stack: StackId) -> Allocator {
        self.resolver.names.allocator(stack.0)
    }

    /// Notes the time of a timed record.
    fn saw_time(&mut self, time_ns: u64) {
        self.first_ns.get_or_insert(time_ns);
        self.last_ns = self.last_ns.max(Some(time_ns));
    }

    /// The peak so far: (index of the record that reached it, bytes, time).
    pub(crate) fn peak(&self) -> Option<(usize, f64, u64)> {
        self.peak
    }

    /// Whether the record applied last reached the peak.
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

    /// The innermost frame of a stack.
    pub fn innermost(&self, stack: StackId) -> Location<'_> {
        self.resolver.names.innermost(stack.0)
    }
}
