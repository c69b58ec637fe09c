//! Aggregation: a capture's records turned into estimated bytes per stack, for every view.
//!
//! Stacks are interned in a trie (outermost frame at the root), so a stack is one node id and
//! shared prefixes are stored once. Per stack the profile keeps three estimates (see [`View`]):
//! bytes allocated over the whole capture, bytes still live at its end, and bytes live at the
//! moment the whole estimated live heap was highest.
//!
//! # Estimating bytes
//! A block of `s` bytes is sampled with probability `p = 1 − exp(−s/rate)`, so each sample stands
//! for `w = s/p` bytes and `1/p` allocations (a Horvitz–Thompson estimator, unbiased). Its
//! contribution to the variance of a sum is `(1 − p)·w²`, also unbiased; a standard error is the
//! square root of the summed contributions. With `rate <= 1` every allocation is recorded and
//! the figures are exact (`p = 1`). A zero-byte block holds no memory and stands for 0 bytes.
//!
//! # Replaying the records
//! Records are applied in file order. A `Free` of an address that is not live is ignored (most
//! frees are of unsampled blocks); a realloc arrives as `Free(old)`, `Alloc(new)`. An `Alloc` at
//! an address that is already live replaces the old block (its `Free` was lost). A `Code` record
//! applies to the allocations after it, so a reused code address gets its new meaning. Frames
//! whose code was never announced are `<unknown>`; an allocation with no frames at all is
//! attributed to the pseudo-frame `<no Python frame>`. A stack the agent cut at `max_depth`
//! gets the pseudo-frame `<truncated stack>` as its outermost frame, so it does not pass for a
//! whole stack.

use crate::capture::Digest;
use anyhow::{Context, Result};
use mprof_common::record::{Frame, Record, ALLOC_TRUNCATED};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

/// Which bytes a view counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// Every byte allocated during the capture, freed or not.
    Allocated,
    /// Bytes still live when the capture ended.
    Live,
    /// Bytes live at the moment the whole live heap was highest.
    Peak,
}

impl View {
    /// All views, in the order reports list them.
    pub const ALL: [View; 3] = [View::Allocated, View::Live, View::Peak];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            View::Allocated => "allocated",
            View::Live => "live",
            View::Peak => "peak",
        }
    }
}

/// File name of the pseudo-frame for allocations made while no Python code ran.
pub const NO_PYTHON_FRAME: &str = "<no Python frame>";
/// File and function name of a frame whose code object was never announced.
pub const UNKNOWN: &str = "<unknown>";
/// The outermost pseudo-frame of stacks the agent cut at `max_depth`.
pub const TRUNCATED: &str = "<truncated stack>";

/// Deepest stack kept (the agent records at most `--max-depth` 256 frames); a deeper stack in
/// a capture keeps its innermost frames and counts as truncated.
pub const MAX_DEPTH: usize = 256;
/// Longest name (file, function) kept, in bytes; a longer one keeps its start and its end
/// around an ellipsis.
pub const MAX_NAME: usize = 256;
/// Longest metadata value kept, in bytes (elided like names), and most keys kept.
pub const MAX_META_VALUE: usize = 4096;
const MAX_META_KEYS: usize = 64;
const MAX_META_KEY: usize = 64;
/// Raw stacks remembered for reuse at most (in frames); the memo is cleared beyond that.
const CACHE_FRAMES: usize = 1 << 20;
/// The reader's memory may reach this many times the capture's size, plus [`MEMORY_FIXED`].
pub const MEMORY_PER_BYTE: usize = 4;
/// The fixed part of the reader's memory allowance (buffers, one record of up to 4 MiB).
pub const MEMORY_FIXED: usize = 64 << 20;

/// What the reader may hold beyond what it held when it started, for a capture of `size`
/// bytes, checked record by record. A third of the allowance: a record can make a table grow,
/// which briefly holds the old and the new (twice as large) table, so a check passed before a
/// record keeps the peak within the whole allowance.
fn memory_limit(size: u64) -> usize {
    (MEMORY_PER_BYTE.saturating_mul(size as usize)).saturating_add(MEMORY_FIXED) / 3
}

/// `s` cut to at most `max` bytes (on character boundaries) by replacing its middle with `…`.
pub fn elide(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let keep = max.saturating_sub('…'.len_utf8()) / 2;
    let mut head = keep;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - keep;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    std::borrow::Cow::Owned(format!("{}…{}", &s[..head], &s[tail..]))
}

/// An estimate of bytes (and allocations) from a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Estimated bytes.
    pub bytes: f64,
    /// Estimated number of allocations.
    pub count: f64,
    /// Estimated variance of `bytes`.
    pub variance: f64,
    /// How many samples the estimate rests on.
    pub samples: u64,
}

impl Estimate {
    /// Standard error of `bytes`.
    pub fn stderr(&self) -> f64 {
        self.variance.sqrt()
    }

    /// Counts one more sample.
    pub(crate) fn add(&mut self, s: &Sample) {
        self.bytes += s.bytes;
        self.count += s.count;
        self.variance += s.variance;
        self.samples += 1;
    }

    /// Takes back a sample counted before (a live block that was freed). The sums are exactly
    /// zero again once the last sample is gone, so no rounding residue is left behind.
    pub(crate) fn remove(&mut self, s: &Sample) {
        self.samples = self.samples.saturating_sub(1);
        if self.samples == 0 {
            *self = Estimate::default();
            return;
        }
        self.bytes -= s.bytes;
        self.count -= s.count;
        self.variance -= s.variance;
    }

    /// Adds another estimate (of disjoint samples) to this one.
    pub fn merge(&mut self, other: &Estimate) {
        self.bytes += other.bytes;
        self.count += other.count;
        self.variance += other.variance;
        self.samples += other.samples;
    }
}

/// The figures of one stack, one estimate per view.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub allocated: Estimate,
    pub live: Estimate,
    pub peak: Estimate,
}

impl Figures {
    /// The estimate for one view.
    pub fn get(&self, view: View) -> &Estimate {
        match view {
            View::Allocated => &self.allocated,
            View::Live => &self.live,
            View::Peak => &self.peak,
        }
    }

    /// Adds another set of figures (of disjoint samples) to this one.
    pub fn merge(&mut self, other: &Figures) {
        self.allocated.merge(&other.allocated);
        self.live.merge(&other.live);
        self.peak.merge(&other.peak);
    }
}

/// A stack: a node of the trie, named by its innermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(u32);

/// One resolved frame of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location<'a> {
    pub file: &'a str,
    pub function: &'a str,
    /// The line running in this frame (0 for the pseudo-frame).
    pub line: u32,
    /// The first line of the function.
    pub firstline: u32,
}

impl fmt::Display for Location<'_> {
    /// `function (file:line)`; the pseudo-frames (`<unknown>`, `<no Python frame>`) show their
    /// name alone, with the line when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.file == self.function, self.line) {
            (true, 0) => write!(f, "{}", self.function),
            (true, line) => write!(f, "{}:{line}", self.function),
            (false, line) => write!(f, "{} ({}:{line})", self.function, self.file),
        }
    }
}

/// A capture, aggregated.
pub struct Profile {
    /// Merged `key=value` pairs of the capture's Meta records (later records win).
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
    /// The highest RSS reading, if the capture has any.
    pub max_rss: Option<u64>,
    totals: Figures,
    names: Names,
    /// Figures per trie node; only nodes that end a sampled stack have samples.
    figures: Vec<Figures>,
}

/// What one sample stands for (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sample {
    bytes: f64,
    count: f64,
    variance: f64,
}

impl Sample {
    /// The sample of a block of `size` bytes taken at mean distance `rate`.
    pub(crate) fn new(size: u64, rate: u64) -> Sample {
        if size == 0 {
            return Sample {
                bytes: 0.0,
                count: 1.0,
                variance: 0.0,
            };
        }
        if rate <= 1 {
            return Sample {
                bytes: size as f64,
                count: 1.0,
                variance: 0.0,
            };
        }
        let s = size as f64;
        let x = s / rate as f64;
        let p = -(-x).exp_m1();
        let w = s / p;
        Sample {
            bytes: w,
            count: 1.0 / p,
            variance: (-x).exp() * w * w,
        }
    }
}

/// A fast hasher for integer keys and frame slices (addresses are not attacker-chosen).
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl FastHasher {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.mix(n.into());
    }
    fn write_u32(&mut self, n: u32) {
        self.mix(n.into());
    }
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves its best bits at the top; hash tables index with the bottom ones.
        self.0.rotate_left(26)
    }
}

/// A hash map with [`FastHasher`], for integer keys.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Interned strings, code objects, frames and the stack trie.
#[derive(Default)]
struct Names {
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    /// (file, name, firstline) string ids.
    codes: Vec<(u32, u32, u32)>,
    code_ids: FastMap<(u32, u32, u32), u32>,
    /// (code id, line).
    frames: Vec<(u32, u32)>,
    frame_ids: FastMap<(u32, u32), u32>,
    /// Trie nodes: (parent node, frame id). Node 0 is the root and no stack.
    nodes: Vec<(u32, u32)>,
    node_ids: FastMap<(u32, u32), u32>,
}

impl Names {
    fn new() -> Names {
        let mut names = Names::default();
        names.nodes.push((0, u32::MAX));
        names
    }

    fn string(&mut self, s: &str) -> u32 {
        let s = &*elide(s, MAX_NAME);
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn code(&mut self, file: &str, name: &str, firstline: u32) -> u32 {
        let key = (self.string(file), self.string(name), firstline);
        let next = self.codes.len() as u32;
        let id = *self.code_ids.entry(key).or_insert(next);
        if id == next {
            self.codes.push(key);
        }
        id
    }

    fn frame(&mut self, code: u32, line: u32) -> u32 {
        let next = self.frames.len() as u32;
        let id = *self.frame_ids.entry((code, line)).or_insert(next);
        if id == next {
            self.frames.push((code, line));
        }
        id
    }

    /// The trie node for `frame` called from `parent`.
    fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry((parent, frame)).or_insert(next);
        if id == next {
            self.nodes.push((parent, frame));
        }
        id
    }

    /// The frames of the stack ending at `node`, innermost first.
    fn frames(&self, node: u32) -> impl Iterator<Item = Location<'_>> + '_ {
        let mut node = node;
        std::iter::from_fn(move || {
            if node == 0 {
                return None;
            }
            let (parent, frame) = self.nodes[node as usize];
            node = parent;
            Some(self.location(frame))
        })
    }

    /// The innermost frame of the stack ending at `node`.
    fn innermost(&self, node: u32) -> Location<'_> {
        self.location(self.nodes[node as usize].1)
    }

    fn location(&self, frame: u32) -> Location<'_> {
        let (code, line) = self.frames[frame as usize];
        let (file, name, firstline) = self.codes[code as usize];
        Location {
            file: &self.strings[file as usize],
            function: &self.strings[name as usize],
            line,
            firstline,
        }
    }
}

/// Turns raw frames (code addresses) into stacks, following the Code records seen so far.
struct StackResolver {
    names: Names,
    code_at: FastMap<u64, u32>,
    unknown_code: u32,
    empty_stack: u32,
    /// The pseudo-frame node under which stacks cut at `max_depth` start.
    truncated_root: u32,
    /// Raw frames → stack, for whole and for truncated stacks; valid until an address changes
    /// meaning.
    cache: [FastMap<Vec<Frame>, u32>; 2],
    cache_has_unknown: bool,
    /// Frames held by `cache`.
    cached_frames: usize,
}

impl StackResolver {
    fn new() -> StackResolver {
        let mut names = Names::new();
        let unknown_code = names.code(UNKNOWN, UNKNOWN, 0);
        let no_python = names.code(NO_PYTHON_FRAME, NO_PYTHON_FRAME, 0);
        let frame = names.frame(no_python, 0);
        let empty_stack = names.child(0, frame);
        let truncated = names.code(TRUNCATED, TRUNCATED, 0);
        let frame = names.frame(truncated, 0);
        let truncated_root = names.child(0, frame);
        StackResolver {
            names,
            code_at: FastMap::default(),
            unknown_code,
            empty_stack,
            truncated_root,
            cache: Default::default(),
            cache_has_unknown: false,
            cached_frames: 0,
        }
    }

    fn clear_cache(&mut self) {
        self.cache = Default::default();
        self.cache_has_unknown = false;
        self.cached_frames = 0;
    }

    fn announce(&mut self, addr: u64, file: &str, name: &str, firstline: u32) {
        let code = self.names.code(file, name, firstline);
        match self.code_at.insert(addr, code) {
            Some(old) if old == code => {}
            Some(_) => self.clear_cache(),
            None if self.cache_has_unknown => self.clear_cache(),
            None => {}
        }
    }

    /// The stack of `frames` (innermost first); `truncated` when the agent cut it. A stack
    /// deeper than [`MAX_DEPTH`] is cut here.
    fn stack(&mut self, frames: &[Frame], truncated: bool) -> u32 {
        if frames.is_empty() {
            return self.empty_stack;
        }
        let truncated = truncated || frames.len() > MAX_DEPTH;
        let frames = &frames[..frames.len().min(MAX_DEPTH)];
        if let Some(&node) = self.cache[truncated as usize].get(frames) {
            return node;
        }
        let mut node = if truncated { self.truncated_root } else { 0 };
        for f in frames.iter().rev() {
            let code = match self.code_at.get(&f.code) {
                Some(&code) => code,
                None => {
                    self.cache_has_unknown = true;
                    self.unknown_code
                }
            };
            let frame = self.names.frame(code, f.line);
            node = self.names.child(node, frame);
        }
        if self.cached_frames + frames.len() > CACHE_FRAMES {
            self.clear_cache();
        }
        self.cached_frames += frames.len();
        self.cache[truncated as usize].insert(frames.to_vec(), node);
        node
    }
}

/// The `rate` of a Meta record's text, if it has one.
fn meta_rate(text: &str) -> Option<u64> {
    meta_pairs(text)
        .filter(|(k, _)| *k == "rate")
        .filter_map(|(_, v)| v.trim().parse().ok())
        .last()
}

fn meta_pairs(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// A live sampled block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub stack: StackId,
    pub tid: u32,
    size: u64,
    rate: u64,
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
    resolver: StackResolver,
    live: FastMap<u64, Block>,
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
    /// Estimated bytes of the live sampled blocks.
    pub live_bytes: f64,
    /// The highest `live_bytes` so far, the index of the record that reached it, and its time.
    peak: Option<(usize, f64, u64)>,
    first_ns: Option<u64>,
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
            live_bytes: 0.0,
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
            } => {
                self.first_ns.get_or_insert(*time_ns);
                let stack = self.resolver.stack(frames, flags & ALLOC_TRUNCATED != 0);
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
                    self.live_bytes -= old.sample().bytes;
                }
                self.live_bytes += sample.bytes;
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
                    self.live_bytes -= old.sample().bytes;
                    return Change::Free(old);
                }
            }
            Record::Stats { dropped, .. } => self.dropped = *dropped,
            Record::Rss { time_ns, rss_bytes } => {
                self.first_ns.get_or_insert(*time_ns);
                self.max_rss = self.max_rss.max(Some(*rss_bytes));
                self.last_rss = Some(*rss_bytes);
            }
            Record::End { time_ns, .. } => {
                self.first_ns.get_or_insert(*time_ns);
            }
            Record::Thread { .. } | Record::Unknown { .. } => {}
        }
        Change::Other
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

/// One pass over the records: hands each, with the digest of the bytes up to it, to the
/// callback until it returns false. See [`Profile::build`].
type PassFn<'a> = dyn FnMut(&Record, Digest) -> bool + 'a;

/// Why a capture could not be aggregated (beyond not being readable at all).
#[derive(Debug)]
pub enum LoadError {
    /// The reader would need more memory than a real capture of this size could need.
    TooDense { size: u64, limit: usize },
    /// The file's records changed between the two passes over it.
    Changed,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::TooDense { size, limit } => write!(
                f,
                "corrupt or crafted capture: reading its {size} bytes would take more than \
                 {} MiB of memory",
                (limit * 3) >> 20
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

/// Checks the reader's memory against its allowance.
struct Budget {
    limit: Option<(usize, u64)>,
    base: isize,
}

impl Budget {
    fn new(size: Option<u64>) -> Budget {
        Budget {
            limit: size.map(|size| (memory_limit(size), size)),
            base: crate::memory::in_use(),
        }
    }

    fn check(&self) -> Result<(), LoadError> {
        match self.limit {
            Some((limit, size)) if crate::memory::in_use() - self.base > limit as isize => {
                Err(LoadError::TooDense { size, limit })
            }
            _ => Ok(()),
        }
    }
}

impl Profile {
    /// Reads and aggregates a capture file, streaming it (twice: once to aggregate, once up to
    /// the peak) through one descriptor and only as far as it reached when opened; prints its
    /// warnings (damaged tail, no rate) to stderr as `mprof: warning: ...` lines. A capture
    /// that changes between the passes, or that would take more memory than
    /// [`MEMORY_PER_BYTE`] times its size plus [`MEMORY_FIXED`], is an error.
    pub fn load(path: &Path) -> Result<Profile> {
        let (profile, warnings) = Profile::read(path)?;
        for w in warnings {
            eprintln!("mprof: warning: {w}");
        }
        Ok(profile)
    }

    /// [`Profile::load`] that returns its warnings instead of printing them.
    pub fn read(path: &Path) -> Result<(Profile, Vec<String>)> {
        let file = crate::capture::CaptureFile::open(path)?;
        let mut first_rate = None;
        file.for_each(|r, _| {
            if let Record::Meta { text } = &r {
                first_rate = meta_rate(text);
            }
            first_rate.is_none()
        })?;
        let mut warnings = Vec::new();
        let mut first_pass = true;
        let profile = Profile::build(first_rate, Some(file.size), |apply| {
            // The header read fine a moment ago: failing now means the file changed.
            let pass = file
                .for_each(|r, digest| apply(&r, digest))
                .map_err(|_| LoadError::Changed)?;
            if std::mem::take(&mut first_pass) {
                warnings.extend(pass.warning);
            }
            Ok(())
        })
        .with_context(|| format!("cannot read {}", path.display()))?;
        if !profile.rate_known && profile.samples > 0 {
            warnings.push(
                "the capture does not say its sampling rate; \
                 assuming every allocation was recorded"
                    .to_owned(),
            );
        }
        Ok((profile, warnings))
    }

    /// Aggregates decoded records, in file order (the in-memory form of `load`, for tests).
    #[cfg(test)]
    pub fn from_records(records: &[Record]) -> Profile {
        let first_rate = records.iter().find_map(|r| match r {
            Record::Meta { text } => meta_rate(text),
            _ => None,
        });
        Profile::build(first_rate, None, |apply| {
            for r in records {
                if !apply(r, Digest::default()) {
                    break;
                }
            }
            Ok(())
        })
        .expect("records in memory cannot fail to read")
    }

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
    fn build(
        first_rate: Option<u64>,
        size: Option<u64>,
        mut pass: impl FnMut(&mut PassFn) -> Result<()>,
    ) -> Result<Profile> {
        let budget = Budget::new(size);
        let mut failure = None;
        let mut agg = Aggregator::new(first_rate.unwrap_or(1));
        let mut stacks: Vec<u32> = Vec::new();
        let mut figures: Vec<Figures> = Vec::new();
        let mut peak_digest = Digest::default();
        pass(&mut |record, digest| {
            if let Change::Alloc { block, sample, .. } = agg.apply(record) {
                let stack = block.stack.0 as usize;
                stacks.push(block.stack.0);
                if figures.len() <= stack {
                    figures.resize(stack + 1, Figures::default());
                }
                figures[stack].allocated.add(&sample);
                if agg.peak.is_some_and(|(i, _, _)| i + 1 == agg.applied) {
                    peak_digest = digest;
                }
            }
            failure = budget.check().err();
            failure.is_none()
        })?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        let names = std::mem::take(&mut agg.resolver.names);
        agg.resolver = StackResolver::new();
        figures.resize(names.nodes.len(), Figures::default());
        for block in agg.live.values() {
            figures[block.stack.0 as usize].live.add(&block.sample());
        }
        agg.live = FastMap::default();
        let mut peak_seconds = None;
        if let Some((end, _, peak_ns)) = agg.peak {
            peak_seconds = agg
                .first_ns
                .map(|t0| peak_ns.saturating_sub(t0) as f64 / 1e9);
            let mut replay = Replay::new(&stacks, first_rate.unwrap_or(1));
            let mut index = 0;
            let mut reached = None;
            pass(&mut |record, digest| {
                if let Err(e) = replay.apply(record).and_then(|()| budget.check()) {
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
            for block in replay.live.values() {
                figures[block.stack.0 as usize].peak.add(&block.sample());
            }
        }
        let mut totals = Figures::default();
        for f in &figures {
            totals.merge(f);
        }
        Ok(Profile {
            meta: agg.meta,
            rate: agg.rate,
            rate_known: first_rate.is_some(),
            samples: agg.samples,
            dropped: agg.dropped,
            peak_seconds,
            max_rss: agg.max_rss,
            totals,
            names,
            figures,
        })
    }

    /// Stacks with at least one sample, in a fixed order (first sampled first).
    pub fn stacks(&self) -> impl Iterator<Item = (StackId, &Figures)> + '_ {
        self.figures
            .iter()
            .enumerate()
            .filter(|(_, f)| f.allocated.samples > 0)
            .map(|(i, f)| (StackId(i as u32), f))
    }

    /// The frames of a stack, innermost first.
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Location<'_>> + '_ {
        self.names.frames(stack.0)
    }

    /// The innermost frame of a stack.
    pub fn innermost(&self, stack: StackId) -> Location<'_> {
        self.names.innermost(stack.0)
    }

    /// Totals over all stacks, per view.
    pub fn totals(&self) -> &Figures {
        &self.totals
    }
}

/// The sampled blocks live after the last of `records`, replayed with the stacks found for the
/// allocations in the first pass (`stacks`, one per Alloc, in order).
/// Replays records to find which sampled blocks were live at a given point, reusing the stack
/// of each Alloc found by the first pass (`stacks`, one per Alloc, in order).
struct Replay<'a> {
    live: FastMap<u64, Block>,
    rate: u64,
    allocs: std::slice::Iter<'a, u32>,
}

impl<'a> Replay<'a> {
    fn new(stacks: &'a [u32], first_rate: u64) -> Replay<'a> {
        Replay {
            live: FastMap::default(),
            rate: first_rate,
            allocs: stacks.iter(),
        }
    }

    /// Applies the next record; an Alloc the first pass did not see means the file changed.
    fn apply(&mut self, record: &Record) -> Result<(), LoadError> {
        match record {
            Record::Meta { text } => self.rate = meta_rate(text).unwrap_or(self.rate),
            Record::Alloc {
                addr, size, tid, ..
            } => {
                let stack = *self.allocs.next().ok_or(LoadError::Changed)?;
                let block = Block {
                    stack: StackId(stack),
                    tid: *tid,
                    size: *size,
                    rate: self.rate,
                };
                self.live.insert(*addr, block);
            }
            Record::Free { addr } => {
                self.live.remove(addr);
            }
            _ => {}
        }
        Ok(())
    }
}

/// Record builders for the tests of the modules that aggregate (profile, live view).
#[cfg(test)]
pub(crate) mod test_records {
    use mprof_common::record::{Frame, Record};

    pub fn code(code: u64, file: &str, name: &str, firstline: u32) -> Record {
        Record::Code {
            code,
            firstline,
            filename: file.into(),
            name: name.into(),
        }
    }

    /// A sample of `size` bytes at `addr` by thread `tid`; `frames` are (code, line), innermost
    /// first.
    pub fn alloc(tid: u32, addr: u64, size: u64, time_ns: u64, frames: &[(u64, u32)]) -> Record {
        Record::Alloc {
            tid,
            flags: 0,
            addr,
            size,
            time_ns,
            frames: frames
                .iter()
                .map(|&(code, line)| Frame { code, line })
                .collect(),
        }
    }

    pub fn meta(text: &str) -> Record {
        Record::Meta { text: text.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::test_records::{code, meta};
    use super::*;

    /// A sample by thread 1, timed by its address (so later samples are later).
    fn alloc(addr: u64, size: u64, frames: &[(u64, u32)]) -> Record {
        super::test_records::alloc(1, addr, size, addr, frames)
    }

    /// (function, line of the innermost frame) → figures, for easy assertions.
    fn by_innermost(p: &Profile) -> BTreeMap<(String, u32), Figures> {
        let mut out: BTreeMap<(String, u32), Figures> = BTreeMap::new();
        for (id, f) in p.stacks() {
            let loc = p.innermost(id);
            out.entry((loc.function.to_owned(), loc.line))
                .or_default()
                .merge(f);
        }
        out
    }

    #[test]
    fn rate_one_is_exact() {
        let p = Profile::from_records(&[
            meta("rate=1\n"),
            code(0x10, "a.py", "f", 1),
            alloc(100, 1000, &[(0x10, 2)]),
            alloc(200, 24, &[(0x10, 3)]),
            Record::Free { addr: 100 },
        ]);
        let t = p.totals();
        assert_eq!(t.allocated.bytes, 1024.0);
        assert_eq!(t.allocated.count, 2.0);
        assert_eq!(t.allocated.stderr(), 0.0);
        assert_eq!(t.live.bytes, 24.0);
        assert_eq!(t.peak.bytes, 1024.0);
        assert_eq!(p.samples, 2);
        assert!(p.rate_known);
    }

    #[test]
    fn sampled_weights_follow_the_inclusion_probability() {
        let rate = 1000u64;
        let p = Profile::from_records(&[
            meta(&format!("rate={rate}")),
            code(0x10, "a.py", "f", 1),
            alloc(100, 500, &[(0x10, 2)]),
        ]);
        let prob = 1.0 - (-0.5f64).exp();
        let w = 500.0 / prob;
        let t = p.totals();
        assert!((t.allocated.bytes - w).abs() < 1e-9);
        assert!((t.allocated.count - 1.0 / prob).abs() < 1e-12);
        assert!((t.allocated.variance - (1.0 - prob) * w * w).abs() < 1e-6);
        // A block far larger than the rate is certain to be sampled: it stands for itself.
        let big = Sample::new(1 << 30, rate);
        assert_eq!(big.bytes, (1u64 << 30) as f64);
        assert_eq!(big.variance, 0.0);
    }

    #[test]
    fn estimator_is_unbiased_over_many_simulated_samplings() {
        // Simulate Poisson sampling of a known heap with a small deterministic RNG and check
        // the estimate lands within a few standard errors of the truth.
        let rate = 4096u64;
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut records = vec![meta(&format!("rate={rate}")), code(1, "a.py", "f", 1)];
        let mut truth = 0u64;
        for i in 0..200_000u64 {
            let size = 16 + (i * 37) % 2000;
            truth += size;
            if uniform() < 1.0 - (-(size as f64) / rate as f64).exp() {
                records.push(alloc(i + 1, size, &[(1, 1)]));
            }
        }
        let t = Profile::from_records(&records).totals().allocated;
        let err = (t.bytes - truth as f64).abs();
        assert!(err < 4.0 * t.stderr(), "err {err} stderr {}", t.stderr());
        assert!(t.stderr() / t.bytes < 0.01);
    }

    #[test]
    fn realloc_moves_the_block_and_unknown_frees_are_ignored() {
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(0x10, "a.py", "f", 1),
            alloc(100, 100, &[(0x10, 2)]),
            Record::Free { addr: 999 },
            Record::Free { addr: 100 },
            alloc(300, 400, &[(0x10, 5)]),
        ]);
        let rows = by_innermost(&p);
        assert_eq!(rows[&("f".into(), 2)].allocated.bytes, 100.0);
        assert_eq!(rows[&("f".into(), 2)].live.bytes, 0.0);
        assert_eq!(rows[&("f".into(), 5)].live.bytes, 400.0);
        assert_eq!(p.totals().allocated.bytes, 500.0);
        assert_eq!(p.totals().live.bytes, 400.0);
        assert_eq!(p.totals().peak.bytes, 400.0);
    }

    #[test]
    fn an_alloc_at_a_live_address_replaces_the_old_block() {
        let p = Profile::from_records(&[meta("rate=1"), alloc(100, 100, &[]), alloc(100, 30, &[])]);
        assert_eq!(p.totals().allocated.bytes, 130.0);
        assert_eq!(p.totals().live.bytes, 30.0);
        assert_eq!(p.totals().peak.bytes, 100.0);
    }

    #[test]
    fn code_address_reuse_applies_to_later_allocations_only() {
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(0x10, "a.py", "old", 1),
            alloc(1, 10, &[(0x10, 2)]),
            code(0x10, "b.py", "new", 7),
            alloc(2, 20, &[(0x10, 2)]),
        ]);
        let rows = by_innermost(&p);
        assert_eq!(rows[&("old".into(), 2)].allocated.bytes, 10.0);
        assert_eq!(rows[&("new".into(), 2)].allocated.bytes, 20.0);
        let new = p
            .stacks()
            .map(|(id, _)| p.innermost(id))
            .find(|l| l.function == "new")
            .unwrap();
        assert_eq!((new.file, new.firstline), ("b.py", 7));
    }

    #[test]
    fn unannounced_code_is_unknown_until_announced() {
        let p = Profile::from_records(&[
            meta("rate=1"),
            alloc(1, 10, &[(0x20, 3)]),
            code(0x20, "a.py", "g", 1),
            alloc(2, 20, &[(0x20, 3)]),
        ]);
        let rows = by_innermost(&p);
        assert_eq!(rows[&(UNKNOWN.into(), 3)].allocated.bytes, 10.0);
        assert_eq!(rows[&("g".into(), 3)].allocated.bytes, 20.0);
    }

    #[test]
    fn empty_stacks_get_the_pseudo_frame() {
        let p = Profile::from_records(&[meta("rate=1"), alloc(1, 64, &[])]);
        let (id, f) = p.stacks().next().unwrap();
        assert_eq!(p.innermost(id).file, NO_PYTHON_FRAME);
        assert_eq!(p.frames(id).count(), 1);
        assert_eq!(f.allocated.bytes, 64.0);
    }

    #[test]
    fn truncated_stacks_start_at_a_pseudo_frame() {
        let mut cut = alloc(2, 8, &[(1, 5)]);
        if let Record::Alloc { flags, .. } = &mut cut {
            *flags = ALLOC_TRUNCATED;
        }
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(1, "a.py", "f", 1),
            alloc(1, 8, &[(1, 5)]),
            cut,
        ]);
        let stacks: Vec<Vec<_>> = p
            .stacks()
            .map(|(id, _)| p.frames(id).map(|l| l.to_string()).collect())
            .collect();
        assert_eq!(stacks, [vec!["f (a.py:5)"], vec!["f (a.py:5)", TRUNCATED]]);
    }

    #[test]
    fn stacks_are_interned_and_listed_innermost_first() {
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(1, "m.py", "<module>", 1),
            code(2, "m.py", "main", 10),
            code(3, "m.py", "leaf", 20),
            alloc(1, 8, &[(3, 21), (2, 11), (1, 30)]),
            alloc(2, 8, &[(3, 21), (2, 11), (1, 30)]),
            alloc(3, 8, &[(2, 12), (1, 30)]),
        ]);
        assert_eq!(p.stacks().count(), 2);
        let (id, f) = p.stacks().next().unwrap();
        assert_eq!(f.allocated.samples, 2);
        let names: Vec<_> = p.frames(id).map(|l| (l.function, l.line)).collect();
        assert_eq!(names, [("leaf", 21), ("main", 11), ("<module>", 30)]);
    }

    #[test]
    fn peak_is_the_per_stack_live_heap_at_the_highest_total() {
        // a: 100 live, then b: 300 live (total 400 = peak), free b, c: 250 (total 350).
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(1, "a.py", "f", 1),
            alloc(1, 100, &[(1, 2)]),
            alloc(2, 300, &[(1, 3)]),
            Record::Free { addr: 2 },
            alloc(3, 250, &[(1, 4)]),
        ]);
        let rows = by_innermost(&p);
        assert_eq!(rows[&("f".into(), 2)].peak.bytes, 100.0);
        assert_eq!(rows[&("f".into(), 3)].peak.bytes, 300.0);
        assert_eq!(rows[&("f".into(), 4)].peak.bytes, 0.0);
        assert_eq!(rows[&("f".into(), 4)].live.bytes, 250.0);
        assert_eq!(p.totals().peak.bytes, 400.0);
        assert_eq!(p.totals().peak.samples, 2);
        assert_eq!(p.totals().live.bytes, 350.0);
        assert_eq!(p.peak_seconds, Some(1e-9)); // time_ns = addr in these records
    }

    #[test]
    fn the_first_peak_wins_a_tie() {
        let p = Profile::from_records(&[
            meta("rate=1"),
            code(1, "a.py", "f", 1),
            alloc(1, 100, &[(1, 2)]),
            Record::Free { addr: 1 },
            alloc(2, 100, &[(1, 3)]),
        ]);
        let rows = by_innermost(&p);
        assert_eq!(rows[&("f".into(), 2)].peak.bytes, 100.0);
        assert_eq!(rows[&("f".into(), 3)].peak.bytes, 0.0);
    }

    #[test]
    fn meta_is_merged_and_rate_changes_apply_forward() {
        let p = Profile::from_records(&[
            meta("mode=record\nrate=1\npid=42"),
            alloc(1, 100, &[]),
            meta("rate=1000\npython=3.12.1"),
            alloc(2, 100, &[]),
            Record::Stats {
                samples: 2,
                dropped: 3,
            },
            Record::Stats {
                samples: 2,
                dropped: 5,
            },
        ]);
        assert_eq!(p.rate, 1000);
        assert_eq!(p.meta["pid"], "42");
        assert_eq!(p.meta["python"], "3.12.1");
        assert_eq!(p.dropped, 5);
        let sampled = Sample::new(100, 1000).bytes;
        assert!((p.totals().allocated.bytes - (100.0 + sampled)).abs() < 1e-9);
        assert!((p.totals().peak.bytes - (100.0 + sampled)).abs() < 1e-9);
    }

    #[test]
    fn a_capture_without_rate_or_records_is_fine() {
        let p = Profile::from_records(&[alloc(1, 10, &[])]);
        assert!(!p.rate_known);
        assert_eq!(p.rate, 1);
        assert_eq!(p.totals().allocated.bytes, 10.0);
        let empty = Profile::from_records(&[]);
        assert_eq!(empty.samples, 0);
        assert_eq!(empty.stacks().count(), 0);
        assert_eq!(empty.totals().peak.bytes, 0.0);
        assert_eq!(empty.peak_seconds, None);
    }

    #[test]
    fn random_record_streams_keep_the_invariants() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..50 {
            let mut records = vec![meta(&format!("rate={}", [1, 64, 4096][round % 3]))];
            for _ in 0..2000 {
                let r = match next(10) {
                    0 => code(next(8), &format!("f{}.py", next(3)), "g", next(5) as u32),
                    1..=5 => {
                        let depth = next(4) as usize;
                        let frames: Vec<(u64, u32)> =
                            (0..depth).map(|_| (next(10), next(4) as u32)).collect();
                        alloc(next(64), next(10_000), &frames)
                    }
                    6 if round % 5 == 0 => meta(&format!("rate={}", 1 + next(9000))),
                    _ => Record::Free { addr: next(80) },
                };
                records.push(r);
            }
            let p = Profile::from_records(&records);
            let mut sum = Figures::default();
            for (_, f) in p.stacks() {
                sum.merge(f);
                assert!(f.live.bytes <= f.allocated.bytes + 1e-6);
                assert!(f.peak.samples <= f.allocated.samples);
            }
            let t = p.totals();
            for v in View::ALL {
                assert!((sum.get(v).bytes - t.get(v).bytes).abs() < 1e-6);
                assert_eq!(sum.get(v).samples, t.get(v).samples);
                assert!(t.get(v).stderr().is_finite());
            }
            assert!(t.peak.bytes >= t.live.bytes * (1.0 - 1e-12));
            assert!(t.allocated.bytes >= t.peak.bytes * (1.0 - 1e-12));
        }
    }

    #[test]
    fn zero_byte_blocks_stand_for_nothing() {
        let p = Profile::from_records(&[meta("rate=4096"), alloc(1, 0, &[])]);
        assert_eq!(p.totals().allocated.bytes, 0.0);
        assert_eq!(p.totals().allocated.samples, 1);
        assert!(p.totals().allocated.bytes.is_finite());
    }
}
