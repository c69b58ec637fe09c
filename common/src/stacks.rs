//! Interned stacks: the agent announces each distinct stack once, as a chain of STACK nodes,
//! and a sample names its innermost node instead of carrying every frame.
//!
//! ```text
//!  STACK (kind 10), aux = flags (bit 0: the frame was an entry of the bytecode loop; set only
//!                                 in sessions with native stacks, which alone use it)
//!  0      4        8            16     20     24
//!  +------+--------+------------+------+------+
//!  | id   | parent | code u64   | line | pad  |
//!  +------+--------+------------+------+------+
//!
//!  SAMPLE (kind 11), aux = Python frames in the stack
//!  0      4       8          16         24          32      36     40
//!  +------+-------+----------+----------+-----------+-------+------+----------------+
//!  | tid  | flags | addr u64 | size u64 | time u64  | stack | pad  | native section |
//!  +------+-------+----------+----------+-----------+-------+------+----------------+
//!
//!  CONTEXT (kind 12): the thread and time of the BRIEF samples after it
//!  0      4      8           16
//!  +------+------+-----------+
//!  | tid  | pad  | time u64  |
//!  +------+------+-----------+
//!
//!  BRIEF (kind 13), aux = Python frames (bits 0–8) | ALLOC flags bits 0–2 (bits 12–14)
//!  0          8          12      16
//!  +----------+----------+-------+
//!  | addr u64 | size u32 | stack |
//!  +----------+----------+-------+
//! ```
//! A BRIEF is a SAMPLE in 24 bytes instead of 48, for the common case: no native section, a
//! block under 4 GiB, and the thread and time of the last CONTEXT (the agent writes one when
//! either changed; its clock moves in ticks of a few milliseconds). At `--rate 1` a sample
//! and its free take 40 bytes of ring and capture instead of 64. A BRIEF before any CONTEXT
//! is skipped as damaged.
//! A node is one frame (a code object, announced by CODE, and a line) on top of its `parent`
//! (0: the outermost frame). Ids are given out in increasing order, so a node's parent always
//! has a smaller id; the agent starts again from 1 when its table fills, and a later
//! definition of an id replaces the earlier one (records are read in order). SAMPLE flags are
//! ALLOC's. Its native section, when flag bit 3 says there is one, is ALLOC's with no entry
//! bitmap (`nwords` 0): the nodes carry the entry marks.
//!
//! Readers turn a SAMPLE or BRIEF back into the ALLOC record it stands for with [`Expander`],
//! so that everything after it sees one kind of sample.

use crate::record::{
    preamble, Frame, ALLOC_FIXED, ALLOC_NATIVE_STACK, FRAME_SIZE, KIND_ALLOC, MAX_NATIVE_FRAMES,
    PREAMBLE,
};

pub const KIND_STACK: u16 = 10;
pub const KIND_SAMPLE: u16 = 11;
/// Size of a STACK body.
pub const STACK_BODY: usize = 24;
/// Size of the fixed part of a SAMPLE body.
pub const SAMPLE_FIXED: usize = 40;
pub const KIND_CONTEXT: u16 = 12;
pub const KIND_BRIEF: u16 = 13;
/// Size of a CONTEXT body.
pub const CONTEXT_BODY: usize = 16;
/// Size of a BRIEF body.
pub const BRIEF_BODY: usize = 16;
/// The ALLOC flags a BRIEF can carry (the stack was cut, the allocator).
pub const BRIEF_FLAGS: u32 = 7;
const BRIEF_DEPTH: u16 = 0x1ff;
const BRIEF_FLAGS_SHIFT: u16 = 12;
/// STACK aux bit: the frame was the first one a C-level call of the bytecode loop ran.
pub const STACK_ENTRY: u16 = 1;
/// Largest node id a writer uses (the agent's table starts again below it).
pub const MAX_STACK_ID: u32 = 1 << 20;
/// Deepest stack a SAMPLE may name.
pub const MAX_STACK_DEPTH: usize = 256;

/// One node as the agent writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Node {
    pub parent: u32,
    pub code: u64,
    pub line: u32,
    pub entry: bool,
}

/// Writes the body of a STACK record into `b` (at least [`STACK_BODY`] bytes); returns its aux.
pub fn write_stack(b: &mut [u8], id: u32, node: &Node) -> u16 {
    b[0..4].copy_from_slice(&id.to_le_bytes());
    b[4..8].copy_from_slice(&node.parent.to_le_bytes());
    b[8..16].copy_from_slice(&node.code.to_le_bytes());
    b[16..20].copy_from_slice(&node.line.to_le_bytes());
    b[20..24].copy_from_slice(&0u32.to_le_bytes());
    if node.entry {
        STACK_ENTRY
    } else {
        0
    }
}

/// Writes the fixed part of a SAMPLE body into `b` (at least [`SAMPLE_FIXED`] bytes); the
/// record's aux is the stack's depth.
pub fn write_sample(b: &mut [u8], s: &Sample) {
    b[0..4].copy_from_slice(&s.tid.to_le_bytes());
    b[4..8].copy_from_slice(&s.flags.to_le_bytes());
    b[8..16].copy_from_slice(&s.addr.to_le_bytes());
    b[16..24].copy_from_slice(&s.size.to_le_bytes());
    b[24..32].copy_from_slice(&s.time_ns.to_le_bytes());
    b[32..36].copy_from_slice(&s.stack.to_le_bytes());
    b[36..40].copy_from_slice(&0u32.to_le_bytes());
}

/// Writes the body of a CONTEXT record into `b` (at least [`CONTEXT_BODY`] bytes).
pub fn write_context(b: &mut [u8], tid: u32, time_ns: u64) {
    b[0..4].copy_from_slice(&tid.to_le_bytes());
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    b[8..16].copy_from_slice(&time_ns.to_le_bytes());
}

/// The aux of a BRIEF for a stack `depth` frames deep and ALLOC `flags`, if a BRIEF can say
/// them (no native section: see [`BRIEF_FLAGS`]).
#[inline]
pub fn brief_aux(depth: u16, flags: u32) -> Option<u16> {
    (depth <= BRIEF_DEPTH && flags & !BRIEF_FLAGS == 0)
        .then_some(depth | (flags as u16) << BRIEF_FLAGS_SHIFT)
}

/// Writes the body of a BRIEF record into `b` (at least [`BRIEF_BODY`] bytes).
pub fn write_brief(b: &mut [u8], addr: u64, size: u32, stack: u32) {
    b[0..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&size.to_le_bytes());
    b[12..16].copy_from_slice(&stack.to_le_bytes());
}

/// The fixed part of a SAMPLE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub tid: u32,
    pub flags: u32,
    pub addr: u64,
    pub size: u64,
    pub time_ns: u64,
    /// The innermost node, 0 for a sample with no Python frame.
    pub stack: u32,
}

/// A whole STACK record (tests and tools; the agent writes into its ring).
pub fn encode_stack(id: u32, node: &Node) -> Vec<u8> {
    let mut body = [0u8; STACK_BODY];
    let aux = write_stack(&mut body, id, node);
    whole(KIND_STACK, aux, &body)
}

/// A whole SAMPLE record with `depth` frames and, if given, native return addresses.
pub fn encode_sample(s: &Sample, depth: u16, native: Option<&[u64]>) -> Vec<u8> {
    let mut body = vec![0u8; SAMPLE_FIXED];
    write_sample(&mut body, s);
    if let Some(addrs) = native {
        body.extend_from_slice(&(addrs.len() as u32).to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        for a in addrs {
            body.extend_from_slice(&a.to_le_bytes());
        }
    }
    whole(KIND_SAMPLE, depth, &body)
}

/// A whole CONTEXT record (tests and tools).
pub fn encode_context(tid: u32, time_ns: u64) -> Vec<u8> {
    let mut body = [0u8; CONTEXT_BODY];
    write_context(&mut body, tid, time_ns);
    whole(KIND_CONTEXT, 0, &body)
}

/// A whole BRIEF record (tests and tools); `aux` as [`brief_aux`] makes it.
pub fn encode_brief(addr: u64, size: u32, stack: u32, aux: u16) -> Vec<u8> {
    let mut body = [0u8; BRIEF_BODY];
    write_brief(&mut body, addr, size, stack);
    whole(KIND_BRIEF, aux, &body)
}

fn whole(kind: u16, aux: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREAMBLE + body.len());
    out.extend_from_slice(&((PREAMBLE + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&aux.to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// What [`Expander::feed`] made of a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Expanded<'a> {
    /// Not a stack record: use the bytes as they are.
    Pass(&'a [u8]),
    /// A STACK node, now known to the expander: nothing to show.
    Consumed,
    /// A SAMPLE or BRIEF, rewritten as the ALLOC record it stands for.
    Alloc(Vec<u8>),
    /// A stack record that cannot be right (a node or sample naming nodes never defined, or
    /// a depth that does not match): skip it.
    Bad(&'static str),
}

/// Rebuilds samples from interned stacks, reading records in order. Memory is bounded by
/// [`MAX_STACK_ID`] nodes, whatever the input.
#[derive(Default)]
pub struct Expander {
    /// Index = id; `None` = never defined. Index 0 is the root and is never defined.
    nodes: Vec<Option<Node>>,
    frames: Vec<Node>,
    /// The thread and time of the last CONTEXT.
    context: Option<(u32, u64)>,
}

impl Expander {
    pub fn new() -> Expander {
        Expander::default()
    }

    /// Takes one whole record (its preamble first). Bytes that are not a record pass.
    pub fn feed<'a>(&mut self, bytes: &'a [u8]) -> Expanded<'a> {
        let Ok((len, kind, aux)) = preamble(bytes) else {
            return Expanded::Pass(bytes);
        };
        let Some(body) = bytes.get(PREAMBLE..len) else {
            return Expanded::Pass(bytes);
        };
        match kind {
            KIND_STACK => self.define(body, aux),
            KIND_SAMPLE => self.expand(body, aux as usize),
            KIND_CONTEXT => match read_context(body) {
                Ok(context) => {
                    self.context = Some(context);
                    Expanded::Consumed
                }
                Err(why) => Expanded::Bad(why),
            },
            KIND_BRIEF => self.expand_brief(body, aux),
            _ => Expanded::Pass(bytes),
        }
    }

    fn define(&mut self, body: &[u8], aux: u16) -> Expanded<'static> {
        let (id, node) = match read_stack(body, aux, |parent| self.node(parent).is_some()) {
            Ok(defined) => defined,
            Err(why) => return Expanded::Bad(why),
        };
        let id = id as usize;
        if self.nodes.len() <= id {
            self.nodes.resize(id + 1, None);
        }
        self.nodes[id] = Some(node);
        Expanded::Consumed
    }

    fn node(&self, id: u32) -> Option<Node> {
        self.nodes.get(id as usize).copied().flatten()
    }

    fn expand(&mut self, body: &[u8], depth: usize) -> Expanded<'static> {
        if body.len() < SAMPLE_FIXED {
            return Expanded::Bad("a sample record is too short");
        }
        if let Err(why) = self.walk(u32_at(body, 32), depth) {
            return Expanded::Bad(why);
        }
        let flags = u32_at(body, 4);
        let native = if flags & ALLOC_NATIVE_STACK != 0 {
            match native_addresses(&body[SAMPLE_FIXED..]) {
                Some(addrs) => Some(addrs),
                None => return Expanded::Bad("a sample's native section is damaged"),
            }
        } else {
            None
        };
        Expanded::Alloc(self.alloc_bytes(&body[..ALLOC_FIXED], native))
    }

    fn expand_brief(&mut self, body: &[u8], aux: u16) -> Expanded<'static> {
        let (addr, size, node) = match read_brief(body) {
            Ok(brief) => brief,
            Err(why) => return Expanded::Bad(why),
        };
        let Some((tid, time_ns)) = self.context else {
            return Expanded::Bad("a brief sample before any context");
        };
        if let Err(why) = self.walk(node, brief_depth(aux)) {
            return Expanded::Bad(why);
        }
        // The fixed part of the ALLOC it stands for: tid, flags, addr, size, time.
        let mut fixed = [0u8; ALLOC_FIXED];
        fixed[0..4].copy_from_slice(&tid.to_le_bytes());
        fixed[4..8].copy_from_slice(&brief_flags(aux).to_le_bytes());
        fixed[8..16].copy_from_slice(&addr.to_le_bytes());
        fixed[16..24].copy_from_slice(&(size as u64).to_le_bytes());
        fixed[24..32].copy_from_slice(&time_ns.to_le_bytes());
        Expanded::Alloc(self.alloc_bytes(&fixed, None))
    }

    /// The frames (innermost first) of the stack whose innermost node is `id`, `depth` deep,
    /// as the nodes read so far define it: a SPAWN's (see `record::threads`).
    pub fn frames(&mut self, id: u32, depth: usize) -> Result<Vec<Frame>, &'static str> {
        self.walk(id, depth)?;
        Ok(self
            .frames
            .iter()
            .map(|n| Frame {
                code: n.code,
                line: n.line,
            })
            .collect())
    }

    /// Collects the `depth` frames of the stack whose innermost node is `id`.
    fn walk(&mut self, mut id: u32, depth: usize) -> Result<(), &'static str> {
        if depth > MAX_STACK_DEPTH {
            return Err("a sample is deeper than any stack");
        }
        self.frames.clear();
        while id != 0 && self.frames.len() <= depth {
            let Some(node) = self.node(id) else {
                return Err("a sample names a stack never defined");
            };
            self.frames.push(node);
            id = node.parent;
        }
        if self.frames.len() != depth || id != 0 {
            return Err("a sample's stack is not as deep as it says");
        }
        Ok(())
    }

    /// The ALLOC record (see `record`) a sample stands for: `fixed` is its fixed part.
    fn alloc_bytes(&self, fixed: &[u8], native: Option<&[u8]>) -> Vec<u8> {
        let depth = self.frames.len();
        let words = depth.div_ceil(64);
        let native_len = native.map_or(0, |a| 8 + 8 * words + a.len());
        let len = PREAMBLE + ALLOC_FIXED + depth * FRAME_SIZE + native_len;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&KIND_ALLOC.to_le_bytes());
        out.extend_from_slice(&(depth as u16).to_le_bytes());
        out.extend_from_slice(fixed);
        for f in &self.frames {
            out.extend_from_slice(&f.code.to_le_bytes());
            out.extend_from_slice(&f.line.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        if let Some(addrs) = native {
            let mut entries = vec![0u64; words];
            for (i, f) in self.frames.iter().enumerate() {
                if f.entry {
                    entries[i / 64] |= 1 << (i % 64);
                }
            }
            out.extend_from_slice(&((addrs.len() / 8) as u32).to_le_bytes());
            out.extend_from_slice(&(words as u32).to_le_bytes());
            for w in entries {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(addrs);
        }
        debug_assert_eq!(out.len(), len);
        out
    }
}

/// Reads a STACK record's body (`aux` its aux): the node's id and the node, checked (an id in
/// range, a parent before it and, unless 0, one that `defined` says is defined).
pub fn read_stack(
    body: &[u8],
    aux: u16,
    defined: impl Fn(u32) -> bool,
) -> Result<(u32, Node), &'static str> {
    if body.len() < STACK_BODY {
        return Err("a stack node record is too short");
    }
    let id = u32_at(body, 0);
    let node = Node {
        parent: u32_at(body, 4),
        code: u64_at(body, 8),
        line: u32_at(body, 16),
        entry: aux & STACK_ENTRY != 0,
    };
    if id == 0 || id > MAX_STACK_ID || node.parent >= id {
        return Err("a stack node has an impossible id");
    }
    if node.parent != 0 && !defined(node.parent) {
        return Err("a stack node names a parent never defined");
    }
    Ok((id, node))
}

/// Reads a CONTEXT record's body: the thread and time of the BRIEF samples after it.
pub fn read_context(body: &[u8]) -> Result<(u32, u64), &'static str> {
    let b = body
        .get(..CONTEXT_BODY)
        .ok_or("a context record is too short")?;
    Ok((u32_at(b, 0), u64_at(b, 8)))
}

/// Reads a BRIEF record's body: the block's address and size and the innermost node.
pub fn read_brief(body: &[u8]) -> Result<(u64, u32, u32), &'static str> {
    let b = body
        .get(..BRIEF_BODY)
        .ok_or("a brief sample record is too short")?;
    Ok((u64_at(b, 0), u32_at(b, 8), u32_at(b, 12)))
}

/// The Python frames a BRIEF's aux says its stack has.
#[inline]
pub fn brief_depth(aux: u16) -> usize {
    (aux & BRIEF_DEPTH) as usize
}

/// The ALLOC flags a BRIEF's aux carries.
#[inline]
pub fn brief_flags(aux: u16) -> u32 {
    (aux >> BRIEF_FLAGS_SHIFT) as u32
}

/// Reads the fixed part of a SAMPLE record's body.
pub fn read_sample(body: &[u8]) -> Result<Sample, &'static str> {
    let b = body
        .get(..SAMPLE_FIXED)
        .ok_or("a sample record is too short")?;
    Ok(Sample {
        tid: u32_at(b, 0),
        flags: u32_at(b, 4),
        addr: u64_at(b, 8),
        size: u64_at(b, 16),
        time_ns: u64_at(b, 24),
        stack: u32_at(b, 32),
    })
}

/// The native return addresses of a SAMPLE body, if its flags say it has a native section and
/// the section is whole.
pub fn sample_native_addrs(body: &[u8]) -> Option<Vec<u64>> {
    let flags = u32_at(body.get(..SAMPLE_FIXED)?, 4);
    if flags & ALLOC_NATIVE_STACK == 0 {
        return None;
    }
    let addrs = native_addresses(&body[SAMPLE_FIXED..])?;
    Some(addrs.chunks_exact(8).map(|c| u64_at(c, 0)).collect())
}

/// The return addresses of a SAMPLE's native section (`section` starts at its `nnative`).
fn native_addresses(section: &[u8]) -> Option<&[u8]> {
    let head = section.get(..8)?;
    let n = u32_at(head, 0) as usize;
    let words = u32_at(head, 4) as usize;
    if n > MAX_NATIVE_FRAMES || words != 0 {
        return None;
    }
    section.get(8..8 + 8 * n)
}

#[cfg(test)]
mod tests;
