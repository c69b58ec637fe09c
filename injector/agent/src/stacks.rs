//! The agent's half of interned stacks (see `mprof_common::stacks`): the table that gives each
//! distinct (parent, frame) a node id, and each thread's chain as of its previous sample, so a
//! sample only works on the frames that changed since.
//!
//! Both live in memory mapped straight from the kernel (never the target's allocator) and are
//! only touched under the session lock.

use crate::pyframes::CodeKey;
use crate::sys::{self, map_anon, munmap};
use mprof_common::stacks::{Node, MAX_STACK_ID};

/// Links a thread's chain may have for the cache to follow it (frames, plus the C-stack
/// shims of 3.12+ between them); a longer chain is walked without the cache.
pub const LINK_CAP: usize = 320;
/// Threads whose previous chain is remembered; a thread whose slot another took starts over.
const THREAD_SLOTS: usize = 16;
const FIRST_CAP: usize = 4096;
/// The table never holds more than this many slots (half of them used at most).
const MAX_CAP: usize = 2 * MAX_STACK_ID as usize;

/// One slot of the node table; `id` 0 = empty.
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    code: u64,
    parent: u32,
    /// line << 1 | entry
    line_entry: u32,
    id: u32,
    _pad: u32,
}

/// What a thread's previous sample made of a frame of its chain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cached {
    /// The node of this frame (0 if it is skipped and no frame outside it is a node).
    pub node: u32,
    /// Python frames up to and including this one.
    pub depth: u32,
}

/// The chain a thread had at its previous sample, outermost first: each frame's `at` (see
/// `pyframes::ats`; never [`crate::pyframes::UNCOMPARABLE`]) and what it was. Only the `at`s
/// are compared: two chains whose `at`s agree up to a frame have the same nodes up to it,
/// wherever their frames are.
pub struct ThreadChain {
    tid: u32,
    generation: u32,
    /// The count of freed code objects when the chain was made (see `code_dealloc`): a frame
    /// whose code object went may look unchanged in a new one that took its address.
    freed: u32,
    pub len: usize,
    /// The chain is of a stack cut at `max_depth` Python frames (see `sample_stack`).
    pub cut: bool,
    pub ats: [usize; LINK_CAP],
    pub made: [Cached; LINK_CAP],
    /// Frames this thread ran lately that changed between samples (a loop's allocation
    /// sites, the branches a server's stacks alternate between), direct-mapped by where they
    /// ran; see [`ThreadChain::recall`].
    recent: [Recent; RECENT],
    /// Which of `recent` were remembered since the chain was last voided (voiding clears
    /// these bits, not the kilobytes of the entries).
    recent_used: [u64; RECENT / 64],
    /// The changed ends of chains this thread ran lately, whole (see
    /// [`ThreadChain::recall_end`]), direct-mapped by what they run.
    ends: [End; ENDS],
    /// Which of `ends` were remembered since the chain was last voided.
    ends_used: [u64; ENDS / 64],
}

/// Changed ends a thread remembers (one bit each in `ends_used`). An end is two links or more:
/// one link is a frame of `recent`.
const ENDS: usize = 256;
/// The most links an end remembered whole may have; a longer one is recalled frame by frame.
pub const END_MAX: usize = 8;

/// The links of a chain from where it differed from the thread's chain before: the `at` of
/// the link outside them and what the links outside made, then each link's `at` and what it
/// made. Three cache lines: a lookup that misses reads the first (the key and the first five
/// `at`s), a recall all three.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct End {
    outer: usize,
    parent: Cached,
    len: usize,
    ats: [usize; END_MAX],
    made: [Cached; END_MAX],
}

/// Changed frames a thread remembers (64 bytes each). A web server whose samples alternate
/// between a few stacks changes about five frames a sample: with four, most recent last, most
/// of them were a frame cache lookup (2,070 instructions a sample in the agent, under
/// callgrind); with 128 slots about one and a half a sample still were (1,470); with 512
/// nearly none (1,290).
const RECENT: usize = 512;

/// A frame a thread ran: its `at` and its code, the `at` of the link outside it (0 for the
/// outermost) and what the frames outside it made, then what it made on top of them. One
/// cache line (unaligned, every lookup touched two).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Recent {
    at: usize,
    outer: usize,
    code: CodeKey,
    parent: Cached,
    made: Cached,
}

const _: () = assert!(std::mem::size_of::<Recent>() == 64);

impl ThreadChain {
    /// What a frame made last time it ran `at`, with the link outside it at `outer` and the
    /// frames outside it making `parent`, if it ran the same code object (`code`, read from
    /// the live frame: an address reused by another code object differs in its key). The same
    /// `at` and the same link outside it say the same instruction and the same entry mark
    /// (from 3.12 the link outside an entry frame is a C-stack shim, whose `at` is the
    /// shim's; 3.11's `at` carries the mark where nodes carry it); on top of the same parent
    /// that is the same node.
    ///
    /// While every code object freed is counted (`code_dealloc::counting`) the key is not read:
    /// the frames remembered were made at the count of freed code objects the chain has now
    /// (see [`Stacks::chain_of`]), so no code object at their addresses went since.
    #[inline(always)]
    pub fn recall(
        &self,
        at: usize,
        outer: usize,
        parent: Cached,
        code: impl FnOnce() -> CodeKey,
    ) -> Option<Cached> {
        let i = recent_slot(at, parent);
        let r = &self.recent[i];
        let used = self.recent_used[i / 64] >> (i % 64) & 1 != 0;
        if !(used && r.at == at && r.outer == outer && r.parent == parent) {
            return None;
        }
        (crate::code_dealloc::counting() || r.code == code()).then_some(r.made)
    }

    /// Remembers what a frame made (see [`ThreadChain::recall`]), in place of the frame
    /// remembered in its slot.
    pub fn remember(
        &mut self,
        at: usize,
        outer: usize,
        code: CodeKey,
        parent: Cached,
        made: Cached,
    ) {
        let i = recent_slot(at, parent);
        self.recent[i] = Recent {
            at,
            outer,
            code,
            parent,
            made,
        };
        self.recent_used[i / 64] |= 1 << (i % 64);
    }

    /// The links `from..` of the chain, whose `at`s are `ats`, when the thread ran that end
    /// whole lately on top of the same links (`outer`, `parent`: as for [`ThreadChain::recall`]
    /// of its first link): each link's `at` and what it made go into the chain, which is then
    /// `from + ats.len()` links long, and the innermost's is returned. A web server's samples
    /// alternate between a few stacks that differ in their last five frames or so: one
    /// lookup where each frame was one. Each link of an end depends on the links outside it
    /// alone, as in [`ThreadChain::recall`], so the same end on the same links made the same.
    /// Only while every code object freed is counted (`code_dealloc::counting`): no key is
    /// read. `from + END_MAX` must be within [`LINK_CAP`]: the end is copied whole, in
    /// sixteen-byte moves, where a copy of `ats.len()` links was a call to `memcpy`.
    #[inline(always)]
    pub fn recall_end(
        &mut self,
        from: usize,
        outer: usize,
        parent: Cached,
        ats: &[usize],
    ) -> Option<Cached> {
        let n = ats.len();
        debug_assert!((2..=END_MAX).contains(&n) && from + END_MAX <= LINK_CAP);
        let i = end_slot(outer, parent, ats);
        let e = &self.ends[i];
        if self.ends_used[i / 64] >> (i % 64) & 1 == 0
            || e.len != n
            || e.outer != outer
            || e.parent != parent
        {
            return None;
        }
        // Word by word: the slices' `!=` is a call to `memcmp`.
        if e.ats[..n].iter().zip(ats).any(|(a, b)| a != b) {
            return None;
        }
        // Past `n` the chain's words are stale either way (it is `from + n` long).
        self.ats[from..from + END_MAX].copy_from_slice(&e.ats);
        self.made[from..from + END_MAX].copy_from_slice(&e.made);
        self.len = from + n;
        Some(e.made[n - 1])
    }

    /// Remembers links `from..from + n` of the chain whole (see [`ThreadChain::recall_end`]),
    /// which the sample made on top of `parent` inside a link running `outer`.
    pub fn remember_end(&mut self, from: usize, n: usize, outer: usize, parent: Cached) {
        debug_assert!((2..=END_MAX).contains(&n) && from + END_MAX <= LINK_CAP);
        let i = end_slot(outer, parent, &self.ats[from..from + n]);
        let e = &mut self.ends[i];
        e.outer = outer;
        e.parent = parent;
        e.len = n;
        e.ats.copy_from_slice(&self.ats[from..from + END_MAX]);
        e.made.copy_from_slice(&self.made[from..from + END_MAX]);
        self.ends_used[i / 64] |= 1 << (i % 64);
    }
}

/// The slot of [`ThreadChain::ends`] of an end running `ats` inside a link running `outer`
/// on top of `parent`.
#[inline(always)]
fn end_slot(outer: usize, parent: Cached, ats: &[usize]) -> usize {
    let mut h = (outer as u64).rotate_left(23) ^ (parent.node as u64) << 7;
    for &a in ats {
        h = (h ^ a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    (h >> (64 - ENDS.trailing_zeros())) as usize
}

/// The slot of [`ThreadChain::recent`] of a frame running `at` on top of `parent`. The link
/// outside it is compared, not hashed: its frame is in `parent` already (its code and line),
/// and two links outside the same frame at two instructions of one line, running the same
/// instruction inside, are rare enough to share a slot.
#[inline(always)]
fn recent_slot(at: usize, parent: Cached) -> usize {
    let h = (at as u64 ^ (parent.node as u64) << 7).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - RECENT.trailing_zeros())) as usize
}

/// Sets of the frame cache, of [`FRAME_WAYS`] frames each.
const FRAME_SETS: usize = 1 << 11;
/// A set holds the frames of one instruction of one code object on up to this many parents
/// (a function called from two places).
const FRAME_WAYS: usize = 2;

/// What makes a frame the node it is, on top of a given parent: a frame cache key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FrameKey {
    pub parent: u32,
    pub offset: i32,
    pub entry: bool,
    /// The code object and the strings it names (an address reused by another code object
    /// differs in one of them).
    pub code: CodeKey,
}

#[derive(Clone, Copy)]
struct FrameEntry {
    generation: u32,
    key: FrameKey,
    node: u32,
}

/// One set of the frame cache, two cache lines: [`Stacks::prefetch_frame`] asks for both.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct FrameSet([Option<FrameEntry>; FRAME_WAYS]);

/// Node ids and thread chains of a session.
pub struct Stacks {
    table: *mut Slot,
    cap: usize,
    used: usize,
    next_id: u32,
    /// Bumped whenever ids start again: every thread chain made before is void.
    generation: u32,
    threads: [*mut ThreadChain; THREAD_SLOTS],
    /// Frames whose node is known, so the frames a thread keeps coming back to are one
    /// lookup instead of a line-table scan and a table probe. A frame's set depends on its
    /// code object and instruction only, not on its parent: the sets of all the frames a
    /// sample must look up are known before the first lookup, and are asked for at once.
    frames: [FrameSet; FRAME_SETS],
}

// SAFETY: the mappings are owned by the value and only used under the session lock.
unsafe impl Send for Stacks {}

fn hash(code: u64, parent: u32, line_entry: u32) -> u64 {
    (code ^ (parent as u64) << 40 ^ (line_entry as u64) << 8).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What `intern` found.
pub enum Interned {
    /// The node was defined before.
    Known(u32),
    /// A new id: its STACK record must be written before any sample names it.
    New(u32),
    /// No room (the table could not grow): start again with [`Stacks::reset`].
    Full,
}

impl Stacks {
    pub const fn new() -> Stacks {
        Stacks {
            table: std::ptr::null_mut(),
            cap: 0,
            used: 0,
            next_id: 1,
            generation: 0,
            threads: [std::ptr::null_mut(); THREAD_SLOTS],
            frames: [FrameSet([None; FRAME_WAYS]); FRAME_SETS],
        }
    }

    fn frame_set(code: usize, offset: i32) -> usize {
        let h =
            (code as u64 >> 4 ^ (offset as u32 as u64) << 20).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 53) as usize % FRAME_SETS
    }

    /// Starts loading the set of the frame running `code` at `offset`: at the default rate a
    /// sample's lookups miss the cache (about a quarter of a microsecond each, measured on a
    /// web server), and asked for together they overlap.
    #[inline]
    pub fn prefetch_frame(&self, code: usize, offset: i32) {
        let set: *const FrameSet = &self.frames[Self::frame_set(code, offset)];
        sys::prefetch(set);
        sys::prefetch(set.cast::<u8>().wrapping_add(64));
    }

    /// The node of a frame seen before in this generation, if the cache still has it.
    #[inline]
    pub fn known_frame(&self, key: &FrameKey) -> Option<u32> {
        let set = &self.frames[Self::frame_set(key.code.code, key.offset)];
        set.0.iter().find_map(|e| match e {
            Some(e) if e.generation == self.generation && e.key == *key => Some(e.node),
            _ => None,
        })
    }

    /// Remembers the node of a frame, in place of the one of its set remembered first.
    pub fn remember_frame(&mut self, key: FrameKey, node: u32) {
        let set = &mut self.frames[Self::frame_set(key.code.code, key.offset)].0;
        set.copy_within(..FRAME_WAYS - 1, 1);
        set[0] = Some(FrameEntry {
            generation: self.generation,
            key,
            node,
        });
    }

    /// Forgets every node (ids start again at 1) and voids every thread's chain. Memory is
    /// kept for the next ids.
    pub fn reset(&mut self) {
        if !self.table.is_null() {
            // SAFETY: the table maps `cap` slots; all-zero bytes are an empty slot.
            unsafe { std::ptr::write_bytes(self.table, 0, self.cap) };
        }
        self.used = 0;
        self.next_id = 1;
        self.generation = self.generation.wrapping_add(1);
    }

    /// Gives the memory back (the session ended).
    pub fn release(&mut self) {
        if !self.table.is_null() {
            // SAFETY: the table, forgotten right after.
            unsafe { munmap(self.table.cast(), self.cap * std::mem::size_of::<Slot>()) };
        }
        for t in &mut self.threads {
            if !t.is_null() {
                // SAFETY: a chain mapped by `chain_of`, forgotten right after.
                unsafe { munmap(t.cast(), std::mem::size_of::<ThreadChain>()) };
                *t = std::ptr::null_mut();
            }
        }
        self.table = std::ptr::null_mut();
        self.cap = 0;
        self.used = 0;
        self.next_id = 1;
        // Voids the frame cache and any chain mapped later.
        self.generation = self.generation.wrapping_add(1);
    }

    /// The id of `node`: known, or new (the caller writes its STACK record, then calls
    /// [`Stacks::commit`]; if it cannot, nothing is remembered).
    pub fn intern(&mut self, node: &Node) -> Interned {
        if (self.used + 1) * 2 > self.cap && !self.grow() {
            return Interned::Full;
        }
        if self.next_id > MAX_STACK_ID {
            return Interned::Full;
        }
        let line_entry = node.line << 1 | node.entry as u32;
        let mut i = self.home(node.code, node.parent, line_entry);
        loop {
            // SAFETY: `i < cap` (masked), and the table maps `cap` slots.
            let s = unsafe { &*self.table.add(i) };
            if s.id == 0 {
                return Interned::New(self.next_id);
            }
            if s.code == node.code && s.parent == node.parent && s.line_entry == line_entry {
                return Interned::Known(s.id);
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    /// Remembers `node` as `id` (the id [`Stacks::intern`] just gave, its record written).
    pub fn commit(&mut self, id: u32, node: &Node) {
        debug_assert_eq!(id, self.next_id);
        self.next_id += 1;
        self.place(Slot {
            code: node.code,
            parent: node.parent,
            line_entry: node.line << 1 | node.entry as u32,
            id,
            _pad: 0,
        });
    }

    /// The first slot to probe for a node: the top bits of its hash, which depend on every bit
    /// of the key. (The low bits of a product depend only on the key's low bits: the parent
    /// would not count, and the lines of one code object would crowd into a few slots.)
    fn home(&self, code: u64, parent: u32, line_entry: u32) -> usize {
        let bits = self.cap.trailing_zeros();
        (hash(code, parent, line_entry) >> (64 - bits)) as usize & (self.cap - 1)
    }

    fn place(&mut self, slot: Slot) {
        let mut i = self.home(slot.code, slot.parent, slot.line_entry);
        loop {
            // SAFETY: as in `intern`.
            let s = unsafe { &mut *self.table.add(i) };
            if s.id == 0 {
                *s = slot;
                self.used += 1;
                return;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    fn grow(&mut self) -> bool {
        let new_cap = (self.cap * 2).max(FIRST_CAP);
        if new_cap > MAX_CAP {
            return false;
        }
        let table = map_anon(new_cap * std::mem::size_of::<Slot>()) as *mut Slot;
        if table.is_null() {
            return false;
        }
        let (old, old_cap) = (self.table, self.cap);
        self.table = table;
        self.cap = new_cap;
        self.used = 0;
        for i in 0..old_cap {
            // SAFETY: the old table maps `old_cap` slots until it is unmapped below.
            let s = unsafe { *old.add(i) };
            if s.id != 0 {
                self.place(s);
            }
        }
        if !old.is_null() {
            // SAFETY: the old table, which nothing refers to any more.
            unsafe { munmap(old.cast(), old_cap * std::mem::size_of::<Slot>()) };
        }
        true
    }

    /// The chain `tid` had at its previous sample in this table's generation (empty if none),
    /// to be updated by the caller; `None` if no memory could be had for it.
    #[inline(always)]
    pub fn chain_of(&mut self, tid: u32) -> Option<&mut ThreadChain> {
        let slot = &mut self.threads[tid as usize % THREAD_SLOTS];
        if slot.is_null() {
            std::hint::cold_path();
            let p = map_anon(std::mem::size_of::<ThreadChain>()) as *mut ThreadChain;
            if p.is_null() {
                return None;
            }
            // Zeroed memory is an empty chain of tid 0, generation 0; made void below.
            *slot = p;
        }
        // SAFETY: a mapping of one ThreadChain (any bytes are a valid one), used only under
        // the session lock through this `&mut self`.
        let chain = unsafe { &mut **slot };
        let freed = crate::code_dealloc::freed();
        if chain.tid != tid || chain.generation != self.generation || chain.freed != freed {
            std::hint::cold_path();
            chain.tid = tid;
            chain.generation = self.generation;
            chain.freed = freed;
            chain.len = 0;
            chain.recent_used = [0; RECENT / 64];
            chain.ends_used = [0; ENDS / 64];
        }
        Some(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: u32, code: u64, line: u32) -> Node {
        Node {
            parent,
            code,
            line,
            entry: false,
        }
    }

    fn id_of(s: &mut Stacks, n: &Node) -> u32 {
        match s.intern(n) {
            Interned::Known(id) => id,
            Interned::New(id) => {
                s.commit(id, n);
                id
            }
            Interned::Full => panic!("full"),
        }
    }

    #[test]
    fn the_same_frame_on_the_same_parent_is_one_node() {
        let mut s = Stacks::new();
        let a = id_of(&mut s, &node(0, 0x100, 1));
        let b = id_of(&mut s, &node(a, 0x200, 2));
        assert_eq!((a, b), (1, 2));
        assert_eq!(id_of(&mut s, &node(0, 0x100, 1)), a);
        assert_eq!(id_of(&mut s, &node(a, 0x200, 2)), b);
        let mut entry = node(a, 0x200, 2);
        entry.entry = true;
        assert_eq!(id_of(&mut s, &entry), 3, "an entry frame is another node");
        // Enough nodes to grow the table a few times (twice under Miri, which is slow).
        let n = if cfg!(miri) { 6_000 } else { 20_000 };
        let ids: Vec<u32> = (0..n).map(|i| id_of(&mut s, &node(b, 0x300, i))).collect();
        let again: Vec<u32> = (0..n).map(|i| id_of(&mut s, &node(b, 0x300, i))).collect();
        assert_eq!(ids, again);
        s.reset();
        assert_eq!(id_of(&mut s, &node(0, 0x999, 1)), 1, "ids start again");
        s.release();
    }

    #[test]
    fn a_frame_is_known_on_each_of_two_parents_until_a_third_or_a_reset() {
        let mut s = Stacks::new();
        let code = CodeKey {
            code: 0x1000,
            name: 0x2000,
            filename: 0x3000,
            instance: 0x4000,
        };
        let key = |parent| FrameKey {
            parent,
            offset: 40,
            entry: false,
            code,
        };
        s.prefetch_frame(code.code, 40);
        assert_eq!(s.known_frame(&key(1)), None);
        s.remember_frame(key(1), 11);
        s.remember_frame(key(2), 12);
        assert_eq!(s.known_frame(&key(1)), Some(11));
        assert_eq!(s.known_frame(&key(2)), Some(12));
        let other_line = FrameKey {
            offset: 42,
            ..key(1)
        };
        let reused = FrameKey {
            code: CodeKey {
                name: 0x2100,
                ..code
            },
            ..key(1)
        };
        assert_eq!(s.known_frame(&other_line), None);
        assert_eq!(s.known_frame(&reused), None);
        // A third parent takes the place of the one remembered first.
        s.remember_frame(key(3), 13);
        assert_eq!(s.known_frame(&key(1)), None);
        assert_eq!(s.known_frame(&key(2)), Some(12));
        assert_eq!(s.known_frame(&key(3)), Some(13));
        s.reset();
        assert_eq!(s.known_frame(&key(3)), None);
    }

    #[test]
    fn a_thread_chain_is_voided_by_a_reset_or_another_thread() {
        let mut s = Stacks::new();
        s.chain_of(5).unwrap().len = 3;
        assert_eq!(s.chain_of(5).unwrap().len, 3);
        assert_eq!(s.chain_of(5 + THREAD_SLOTS as u32).unwrap().len, 0);
        s.chain_of(5).unwrap().len = 3;
        s.reset();
        assert_eq!(s.chain_of(5).unwrap().len, 0);
        s.release();
    }

    #[test]
    fn a_recent_frame_is_recalled_only_where_it_ran_and_until_a_reset() {
        let mut s = Stacks::new();
        let code = CodeKey {
            code: 0x1000,
            name: 0x2000,
            filename: 0x3000,
            instance: 0x4000,
        };
        let parent = Cached { node: 7, depth: 2 };
        let made = Cached { node: 9, depth: 3 };
        let chain = s.chain_of(5).unwrap();
        chain.remember(0x1040, 0x5000, code, parent, made);
        assert!(chain.recall(0x1040, 0x5000, parent, || code) == Some(made));
        // Another instruction, another link outside it (a C-stack shim: the entry mark), other
        // frames outside it, or another code object at the same address: not that frame.
        assert!(chain.recall(0x1042, 0x5000, parent, || code).is_none());
        assert!(chain.recall(0x1040, 0x5008, parent, || code).is_none());
        let other_parent = Cached { node: 8, depth: 2 };
        assert!(chain
            .recall(0x1040, 0x5000, other_parent, || code)
            .is_none());
        let reused = CodeKey {
            name: 0x2100,
            ..code
        };
        assert!(chain.recall(0x1040, 0x5000, parent, || reused).is_none());
        // Frames of other slots leave it alone, however many; the next one of its own slot
        // takes its place.
        let ats = (1..).map(|i| 0x1040 + 2 * i);
        let mine = recent_slot(0x1040, parent);
        let others: Vec<usize> = ats
            .clone()
            .filter(|&at| recent_slot(at, parent) != mine)
            .take(4 * RECENT)
            .collect();
        for &at in &others {
            chain.remember(at, 0x5000, code, parent, made);
        }
        assert!(chain.recall(0x1040, 0x5000, parent, || code) == Some(made));
        let rival = ats
            .clone()
            .find(|&at| recent_slot(at, parent) == mine)
            .unwrap();
        let other_made = Cached { node: 10, depth: 3 };
        chain.remember(rival, 0x5000, code, parent, other_made);
        assert!(chain.recall(0x1040, 0x5000, parent, || code).is_none());
        assert!(chain.recall(rival, 0x5000, parent, || code) == Some(other_made));
        // Voided (a reset, here): nothing is recalled until remembered again.
        s.reset();
        let chain = s.chain_of(5).unwrap();
        assert!(chain.recall(rival, 0x5000, parent, || code).is_none());
        assert!(chain.recall(others[0], 0x5000, parent, || code).is_none());
        chain.remember(others[0], 0x5000, code, parent, made);
        assert!(chain.recall(others[0], 0x5000, parent, || code) == Some(made));
        s.release();
    }

    /// The frames of a few stacks a thread alternates between spread over the slots: of 40,
    /// about one and a half pairs would share a slot if the slots were drawn at random.
    #[test]
    fn recent_frames_spread_over_the_slots() {
        let parent = Cached { node: 7, depth: 2 };
        let mut used = [0u32; RECENT];
        // Forty frames of one code object, two bytes apart, each inside the one before.
        for i in 0..40usize {
            let at = 0x7f12_3456_0000 + 2 * i;
            used[recent_slot(
                at,
                Cached {
                    node: i as u32,
                    ..parent
                },
            )] += 1;
        }
        let shared = used.iter().filter(|&&n| n > 1).count();
        assert!(shared <= 4, "{shared} slots hold two or more of 40 frames");
    }

    /// An end is recalled whole only on the same links outside it (the `at` of the link
    /// outside and what the links outside made) and with the same `at` in each of its links;
    /// a recall puts the end's links into the chain; voiding the chain forgets every end.
    #[test]
    fn an_end_is_recalled_whole_only_where_everything_it_depends_on_agrees() {
        let mut s = Stacks::new();
        let parent = Cached { node: 7, depth: 3 };
        let ats = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000];
        let made: Vec<Cached> = (0..5)
            .map(|k| Cached {
                node: 20 + k,
                depth: 4 + k,
            })
            .collect();
        let chain = s.chain_of(42).expect("a chain");
        let from = 6;
        chain.ats[from..from + 5].copy_from_slice(&ats);
        chain.made[from..from + 5].copy_from_slice(&made);
        assert_eq!(
            chain.recall_end(from, 0x900, parent, &ats),
            None,
            "nothing yet"
        );
        chain.remember_end(from, 5, 0x900, parent);
        chain.len = 0;
        chain.ats[from..from + 5].fill(0);
        chain.made[from..from + 5].fill(Cached::default());
        assert_eq!(chain.recall_end(from, 0x900, parent, &ats), Some(made[4]));
        assert_eq!(chain.len, from + 5);
        assert_eq!(chain.ats[from..from + 5], ats);
        assert!(chain.made[from..from + 5] == made[..]);
        // Elsewhere in a chain, the same end on the same links is the same.
        assert_eq!(chain.recall_end(2, 0x900, parent, &ats), Some(made[4]));
        let other_parent = Cached { node: 8, ..parent };
        let other_depth = Cached { depth: 2, ..parent };
        assert_eq!(chain.recall_end(from, 0x901, parent, &ats), None, "outer");
        assert_eq!(
            chain.recall_end(from, 0x900, other_parent, &ats),
            None,
            "parent"
        );
        assert_eq!(
            chain.recall_end(from, 0x900, other_depth, &ats),
            None,
            "depth"
        );
        assert_eq!(
            chain.recall_end(from, 0x900, parent, &ats[..4]),
            None,
            "shorter"
        );
        for k in 0..5 {
            let mut changed = ats;
            changed[k] += 2;
            assert_eq!(
                chain.recall_end(from, 0x900, parent, &changed),
                None,
                "link {k}"
            );
        }
        // Node ids starting again void the chain and what it remembers.
        s.reset();
        let chain = s.chain_of(42).expect("a chain");
        assert_eq!(chain.recall_end(from, 0x900, parent, &ats), None, "voided");
        s.release();
    }
}
