//! The interned stacks of one capture (STACK records, see `mprof_common::stacks`), as its
//! reader keeps them: samples that name a stack node are handed on as a [`Brief`] (the node,
//! not its frames), so that a reader which has seen the node before does not walk it again.
//!
//! A node id can be defined again (the agent starts its table again from 1 when it fills):
//! every redefinition of an id already defined moves the table's [`Stacks::epoch`] on, and
//! whatever was remembered about a node (here, which chains were checked; in the analysis,
//! which stack a node is) holds only within one epoch.

use mprof_common::record::{Frame, NativeStack, Record, ALLOC_NATIVE_STACK};
use mprof_common::stacks::{
    brief_depth, brief_flags, read_brief, read_context, read_sample, read_stack,
    sample_native_addrs, Node, MAX_STACK_DEPTH,
};

/// A sample whose stack is a node of the capture's [`Stacks`] (a BRIEF, or a SAMPLE without
/// a native section), checked: the node's chain is defined and exactly `depth` deep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Brief {
    pub tid: u32,
    /// ALLOC flags (the stack was cut, the allocator).
    pub flags: u32,
    pub addr: u64,
    pub size: u64,
    pub time_ns: u64,
    /// The innermost node (0: no Python frame).
    pub node: u32,
    /// The [`Stacks::epoch`] the node belongs to.
    pub epoch: u32,
}

/// What a stack record made.
pub enum Interned {
    /// A node or a context: nothing to hand on.
    Consumed,
    Sample(Brief),
    /// A SAMPLE with a native section, expanded into the ALLOC record it stands for; a SPAWN
    /// with the frames of the stack it names.
    Record(Record),
}

/// The stack nodes of a capture, and the thread and time of its last CONTEXT.
#[derive(Default)]
pub struct Stacks {
    /// Index = id; `None` = never defined. Index 0 is the root and is never defined.
    nodes: Vec<Option<Node>>,
    /// Per id, the epoch (plus 1) and depth of its last chain found whole.
    checked: Vec<(u32, u16)>,
    epoch: u32,
    context: Option<(u32, u64)>,
}

impl Stacks {
    /// Moves on whenever a node id already defined is defined again.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A STACK record's body.
    pub fn define(&mut self, body: &[u8], aux: u16) -> Result<(), &'static str> {
        let (id, node) = read_stack(body, aux, |parent| self.node(parent).is_some())?;
        let id = id as usize;
        if self.nodes.len() <= id {
            self.nodes.resize(id + 1, None);
            self.checked.resize(id + 1, (0, 0));
        }
        if self.nodes[id].replace(node).is_some() {
            self.epoch = self.epoch.wrapping_add(1);
        }
        Ok(())
    }

    /// A CONTEXT record's body.
    pub fn context(&mut self, body: &[u8]) -> Result<(), &'static str> {
        self.context = Some(read_context(body)?);
        Ok(())
    }

    fn node(&self, id: u32) -> Option<Node> {
        self.nodes.get(id as usize).copied().flatten()
    }

    /// Checks that the chain from `id` is defined and exactly `depth` deep (remembered per
    /// epoch, so a node seen before costs one look).
    #[inline]
    fn check(&mut self, id: u32, depth: usize) -> Result<(), &'static str> {
        if depth > MAX_STACK_DEPTH {
            return Err("a sample is deeper than any stack");
        }
        let stamp = (self.epoch.wrapping_add(1), depth as u16);
        if id != 0 && self.checked.get(id as usize) == Some(&stamp) {
            return Ok(());
        }
        self.walk(id, depth, stamp)
    }

    /// [`Stacks::check`] of a chain not checked in this epoch: walks it.
    #[inline(never)]
    fn walk(&mut self, id: u32, depth: usize, stamp: (u32, u16)) -> Result<(), &'static str> {
        let (mut at, mut n) = (id, 0);
        while at != 0 && n <= depth {
            at = self
                .node(at)
                .ok_or("a sample names a stack never defined")?
                .parent;
            n += 1;
        }
        if n != depth || at != 0 {
            return Err("a sample's stack is not as deep as it says");
        }
        if id != 0 {
            self.checked[id as usize] = stamp;
        }
        Ok(())
    }

    /// The frames of the chain from `id`, innermost first, into `out` (cleared first); the
    /// entry marks beside them in `entries` when asked.
    pub fn frames(&self, mut id: u32, out: &mut Vec<Frame>, mut entries: Option<&mut Vec<bool>>) {
        out.clear();
        if let Some(e) = entries.as_deref_mut() {
            e.clear();
        }
        while let Some(node) = self.node(id).filter(|_| out.len() < MAX_STACK_DEPTH) {
            out.push(Frame {
                code: node.code,
                line: node.line,
            });
            if let Some(e) = entries.as_deref_mut() {
                e.push(node.entry);
            }
            id = node.parent;
        }
    }

    /// A BRIEF record, with the thread and time of the last CONTEXT. `aux` is its aux (see
    /// `mprof_common::stacks`), `body` its 16 bytes or a packed entry's, rebuilt.
    #[inline]
    pub fn brief(
        &mut self,
        addr: u64,
        size: u32,
        node: u32,
        aux: u16,
    ) -> Result<Brief, &'static str> {
        let (tid, time_ns) = self.context.ok_or("a brief sample before any context")?;
        self.check(node, brief_depth(aux))?;
        Ok(Brief {
            tid,
            flags: brief_flags(aux),
            addr,
            size: size as u64,
            time_ns,
            node,
            epoch: self.epoch,
        })
    }

    /// A BRIEF record's body.
    pub fn brief_record(&mut self, body: &[u8], aux: u16) -> Result<Brief, &'static str> {
        let (addr, size, node) = read_brief(body)?;
        self.brief(addr, size, node, aux)
    }

    /// A SAMPLE record's body (`aux` is its depth).
    pub fn sample(&mut self, body: &[u8], aux: u16) -> Result<Interned, &'static str> {
        let fixed = read_sample(body)?;
        let (node, flags) = (fixed.stack, fixed.flags);
        self.check(node, aux as usize)?;
        let brief = Brief {
            tid: fixed.tid,
            flags,
            addr: fixed.addr,
            size: fixed.size,
            time_ns: fixed.time_ns,
            node,
            epoch: self.epoch,
        };
        if flags & ALLOC_NATIVE_STACK == 0 {
            return Ok(Interned::Sample(brief));
        }
        let addrs = sample_native_addrs(body).ok_or("a sample's native section is damaged")?;
        let (mut frames, mut marks) = (Vec::new(), Vec::new());
        self.frames(node, &mut frames, Some(&mut marks));
        let mut entries = vec![0u64; marks.len().div_ceil(64)];
        for (i, _) in marks.iter().enumerate().filter(|(_, &m)| m) {
            entries[i / 64] |= 1 << (i % 64);
        }
        Ok(Interned::Record(Record::Alloc {
            tid: brief.tid,
            flags,
            addr: brief.addr,
            size: brief.size,
            time_ns: brief.time_ns,
            frames,
            native: Some(NativeStack { addrs, entries }),
        }))
    }

    /// A SPAWN record (whole, its preamble first), with the frames of the creating thread's
    /// stack as the nodes define them at this point of the capture.
    pub fn spawn(&mut self, bytes: &[u8]) -> Result<Interned, &'static str> {
        let Ok((mut record, _)) = mprof_common::record::decode(bytes) else {
            return Err("a damaged SPAWN");
        };
        let Record::Spawn {
            node,
            depth,
            frames,
            ..
        } = &mut record
        else {
            return Err("a damaged SPAWN");
        };
        self.check(*node, *depth as usize)?;
        self.frames(*node, frames, None);
        Ok(Interned::Record(record))
    }
}
