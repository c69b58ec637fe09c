//! What the in-process reader answers, encoded: replies are framed, and a snapshot of the live
//! sampled blocks is a compact binary table that pymprof (`python/pymprof/_decode.py`) takes in
//! with a handful of Python objects, whatever the number of blocks (each Python allocation is a
//! sample at rate 1, which the program would pay for).
//!
//! A reply on standard output:
//! ```text
//!  0        8     9
//!  +--------+-----+---------------- ... --+
//!  | len:u64| kind| payload (len bytes)    |   kind: b'J' JSON, b'B' a snapshot
//!  +--------+-----+---------------- ... --+
//! ```
//! A snapshot (little-endian throughout):
//! ```text
//!  "PMSNAP02" rate:u64
//!  strings:    n:u32, then n × (len:u32, UTF-8 bytes)            file names
//!  frames:     n:u32, then n × (file:u32, line:u32)               file = a string's index
//!  tracebacks: n:u32, then n × (total:u32, k:u32, k × frame:u32)  innermost frame first;
//!                                                                  total u32::MAX = unknown
//!  groups:     n:u32, then n × 48 bytes: the traces of one (domain, traceback), in a row
//!              domain:u32 traceback:u32 traces:u32 0:u32
//!              bytes:f64 count:f64 variance:f64 count_variance:f64       their sums
//!  traces:     n:u32, then five columns of n, group after group:
//!              bytes:f64[n] count:f64[n] variance:f64[n] size:u64[n] seq:u64[n]
//! ```
//! A trace's `bytes` and `count` are what its sample stands for (the block's own `size` and 1
//! when every allocation is recorded), `variance` its share of a sum's variance (of the bytes;
//! of the count it is `count·(count − 1)`), `seq` the sample's number (a block in two
//! snapshots is the same sample).

use super::traces::{Traced, Traces};
use crate::analysis::estimate::Estimate;
use crate::analysis::names::{FastMap, Location, StackId, NO_PYTHON_FRAME, TRUNCATED, UNKNOWN};
use mprof_common::record::Allocator;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The domain (`tracemalloc.DomainFilter`) of blocks from the C allocator family; Python's
/// allocators are domain 0, as in tracemalloc.
pub const NATIVE_DOMAIN: u32 = 1;
/// The domain of anonymous memory mappings.
pub const MMAP_DOMAIN: u32 = 2;

/// Frames a traceback keeps at most, whatever is asked (the agent's deepest stack).
pub const MAX_FRAMES: usize = 256;

/// A reply, framed (see the module doc).
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 9);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// A JSON reply.
pub fn json_reply(value: &Value) -> Vec<u8> {
    frame(b'J', value.to_string().as_bytes())
}

/// An estimate as pymprof reads it.
pub fn estimate(e: &Estimate) -> Value {
    json!({"bytes": e.bytes, "count": e.count, "variance": e.variance, "samples": e.samples})
}

/// The domain of a stack's blocks.
fn domain(allocator: Allocator) -> u32 {
    match allocator {
        Allocator::Python => 0,
        Allocator::Native => NATIVE_DOMAIN,
        Allocator::Mmap => MMAP_DOMAIN,
    }
}

/// The tracemalloc traceback of a stack: its innermost `nframe` Python frames, innermost
/// first (as tracemalloc keeps them), as (file, line), and how many Python frames it had in
/// all (`None` when the agent cut the stack). A block allocated where no Python frame ran has
/// the frame `("<unknown>", 0)`, as in tracemalloc.
pub fn traceback<'a>(
    frames: impl Iterator<Item = Location<'a>>,
    nframe: usize,
) -> (Vec<(&'a str, u32)>, Option<usize>) {
    let mut kept = Vec::new();
    let mut total = 0;
    for f in frames {
        if f.is_native() {
            continue;
        }
        if f.file == TRUNCATED && f.function == TRUNCATED {
            return (nonempty(kept), None);
        }
        total += 1;
        let pseudo = f.file == f.function && (f.file == UNKNOWN || f.file == NO_PYTHON_FRAME);
        if kept.len() < nframe.min(MAX_FRAMES) {
            kept.push(if pseudo {
                (UNKNOWN, 0)
            } else {
                (f.file, f.line)
            });
        }
    }
    (nonempty(kept), Some(total.max(1)))
}

fn nonempty(mut frames: Vec<(&str, u32)>) -> Vec<(&str, u32)> {
    if frames.is_empty() {
        frames.push((UNKNOWN, 0));
    }
    frames
}

/// Interned names, frames and tracebacks of a snapshot being written.
#[derive(Default)]
struct Tables<'a> {
    strings: Vec<&'a str>,
    string_ids: HashMap<&'a str, u32>,
    frames: Vec<(u32, u32)>,
    frame_ids: FastMap<(u32, u32), u32>,
    tracebacks: Vec<(u32, Vec<u32>)>,
    traceback_ids: HashMap<(u32, Vec<u32>), u32>,
    of_stack: FastMap<StackId, (u32, u32)>,
}

impl<'a> Tables<'a> {
    fn string(&mut self, s: &'a str) -> u32 {
        let next = self.strings.len() as u32;
        *self.string_ids.entry(s).or_insert_with(|| {
            self.strings.push(s);
            next
        })
    }

    fn frame(&mut self, file: &'a str, line: u32) -> u32 {
        let key = (self.string(file), line);
        let next = self.frames.len() as u32;
        *self.frame_ids.entry(key).or_insert_with(|| {
            self.frames.push(key);
            next
        })
    }

    /// Writes the names, frames and tracebacks (see the module doc).
    fn write(&self, out: &mut Vec<u8>) {
        put_u32(out, self.strings.len() as u32);
        for s in &self.strings {
            put_u32(out, s.len() as u32);
            out.extend_from_slice(s.as_bytes());
        }
        put_u32(out, self.frames.len() as u32);
        for &(file, line) in &self.frames {
            put_u32(out, file);
            put_u32(out, line);
        }
        put_u32(out, self.tracebacks.len() as u32);
        for (total, ids) in &self.tracebacks {
            put_u32(out, *total);
            put_u32(out, ids.len() as u32);
            for &id in ids {
                put_u32(out, id);
            }
        }
    }

    /// The (domain, traceback) of a stack.
    fn stack(&mut self, traces: &'a Traces, stack: StackId, nframe: usize) -> (u32, u32) {
        if let Some(&known) = self.of_stack.get(&stack) {
            return known;
        }
        let (frames, total) = traceback(traces.frames(stack), nframe);
        let ids: Vec<u32> = frames.iter().map(|&(f, l)| self.frame(f, l)).collect();
        let key = (total.map_or(u32::MAX, |t| t as u32), ids);
        let next = self.tracebacks.len() as u32;
        let tb = match self.traceback_ids.get(&key) {
            Some(&id) => id,
            None => {
                self.tracebacks.push(key.clone());
                self.traceback_ids.insert(key, next);
                next
            }
        };
        let known = (domain(traces.allocator(stack)), tb);
        self.of_stack.insert(stack, known);
        known
    }
}

/// A live block with its (domain, traceback).
type Row<'a> = ((u32, u32), &'a Traced);

/// The snapshot of the live sampled blocks, each traceback cut to `nframe` frames.
pub fn snapshot(traces: &Traces, rate: u64, nframe: usize) -> Vec<u8> {
    let mut t = Tables::default();
    let mut rows: Vec<Row> = traces
        .live()
        .map(|(_, b)| (t.stack(traces, b.stack, nframe), b))
        .collect();
    rows.sort_by_key(|r| r.0);
    let mut out = b"PMSNAP02".to_vec();
    out.extend_from_slice(&rate.to_le_bytes());
    t.write(&mut out);
    write_groups(&mut out, &rows);
    put_u32(&mut out, rows.len() as u32);
    for column in 0..5 {
        for (_, b) in &rows {
            let value = match column {
                0 => b.sample.bytes.to_le_bytes(),
                1 => b.sample.count.to_le_bytes(),
                2 => b.sample.variance.to_le_bytes(),
                3 => b.size.to_le_bytes(),
                _ => b.seq.to_le_bytes(),
            };
            out.extend_from_slice(&value);
        }
    }
    out
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The groups of `rows` (sorted by group): each one's (domain, traceback), size and sums.
fn write_groups(out: &mut Vec<u8>, rows: &[Row]) {
    let groups: Vec<&[Row]> = rows.chunk_by(|a, b| a.0 == b.0).collect();
    put_u32(out, groups.len() as u32);
    for g in groups {
        let ((domain, tb), _) = g[0];
        for v in [domain, tb, g.len() as u32, 0] {
            put_u32(out, v);
        }
        let mut sums = [0.0f64; 4];
        for (_, b) in g {
            let s = &b.sample;
            sums[0] += s.bytes;
            sums[1] += s.count;
            sums[2] += s.variance;
            sums[3] += s.count * (s.count - 1.0);
        }
        for v in sums {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Where a stack's bytes are shown: its innermost Python frame under `root` (the user's
/// code, named relative to `root`) and, when the stack passes through the user's code further
/// out, the outermost such frame too (`helper.py:8 (make) ← test_x.py:15 (test_x)`); with
/// no frame under `root`, its innermost frame.
pub fn site(traces: &Traces, stack: StackId, root: &str) -> String {
    let frames: Vec<Location> = traces.frames(stack).collect();
    let label = |f: &Location| {
        if f.file == f.function {
            return f.function.to_string();
        }
        let file = match f.file.strip_prefix(root) {
            Some(rest) if !root.is_empty() && rest.starts_with('/') => &rest[1..],
            _ => f.file,
        };
        format!("{file}:{} ({})", f.line, f.function)
    };
    let mine: Vec<&Location> = frames
        .iter()
        .filter(|f| !f.is_native() && !root.is_empty() && f.file.starts_with(root))
        .collect();
    match (mine.first(), mine.last()) {
        (Some(inner), Some(outer)) if mine.len() > 1 && inner != outer => {
            format!("{} ← {}", label(inner), label(outer))
        }
        (Some(inner), _) => label(inner),
        _ => frames
            .iter()
            .find(|f| !f.is_native())
            .or(frames.first())
            .map_or(UNKNOWN.to_string(), label),
    }
}

/// The `top` sites of per-stack estimates, largest first, grouped by [`site`].
pub fn top_sites(
    traces: &Traces,
    stacks: FastMap<StackId, Estimate>,
    root: &str,
    top: usize,
) -> Value {
    let mut by_site: HashMap<String, Estimate> = HashMap::new();
    for (stack, e) in stacks {
        by_site
            .entry(site(traces, stack, root))
            .or_default()
            .merge(&e);
    }
    let mut rows: Vec<(String, Estimate)> = by_site.into_iter().collect();
    rows.sort_by(|a, b| b.1.bytes.total_cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    rows.truncate(top);
    Value::Array(
        rows.into_iter()
            .map(|(site, e)| json!({"site": site, "estimate": estimate(&e)}))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc<'a>(file: &'a str, function: &'a str, line: u32) -> Location<'a> {
        Location {
            file,
            function,
            line,
            firstline: 1,
            module: None,
        }
    }

    #[test]
    fn a_traceback_keeps_the_innermost_frames() {
        let frames = [
            loc("a.py", "f", 3),
            loc("b.py", "g", 7),
            loc("c.py", "h", 9),
        ];
        let (kept, total) = traceback(frames.into_iter(), 2);
        assert_eq!(kept, vec![("a.py", 3), ("b.py", 7)]);
        assert_eq!(total, Some(3));
        let cut = [loc("a.py", "f", 3), loc(TRUNCATED, TRUNCATED, 0)];
        assert_eq!(traceback(cut.into_iter(), 5), (vec![("a.py", 3)], None));
        let none = [loc(NO_PYTHON_FRAME, NO_PYTHON_FRAME, 0)];
        assert_eq!(
            traceback(none.into_iter(), 1),
            (vec![(UNKNOWN, 0)], Some(1))
        );
    }

    #[test]
    fn a_reply_says_its_length_and_kind() {
        let r = frame(b'J', b"{}");
        assert_eq!(&r[..8], &2u64.to_le_bytes());
        assert_eq!(r[8], b'J');
        assert_eq!(&r[9..], b"{}");
    }
}
