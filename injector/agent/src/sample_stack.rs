//! The allocating thread's Python stack as one interned node: walk the frame chain, keep the
//! part that has not changed since the thread's previous sample (its nodes are known), and
//! announce the rest — CODE records for new code objects, STACK records for new nodes.
//!
//! Between two samples of a thread usually only the innermost frame or two differ, so the
//! per-frame work (checking the code object, finding the line, interning) is paid for those
//! only; the other frames cost a few loads and a compare each.

use crate::lifecycle::{self, Caches, LineEntry};
use crate::pyframes::{
    self as frames, CodeKey, Cut, Found, RawFrame, FIRST, MAX_FRAMES, UNCOMPARABLE,
};
use crate::python::Api;
use crate::stacks::{Cached, FrameKey, Interned, Stacks, ThreadChain, END_MAX, LINK_CAP};
use mprof_common::layout::{PyLayout, ABSENT};
use mprof_common::record::{CODE_FIXED, KIND_CODE};
use mprof_common::ring::Ring;
use mprof_common::stacks::{write_stack, Node, KIND_STACK, STACK_BODY, STACK_ENTRY};
use std::ffi::c_void;
use std::hint::cold_path;
use std::mem::MaybeUninit;
use std::num::NonZeroU64;

/// How many frames, outermost first, run what they ran before: `now` and `before` are both
/// outermost first (see `pyframes::ats`). A deep chain is mostly unchanged: with AVX2, sixteen
/// frames a step while they agree, then eight, the last step overlapping the one before it
/// instead of ending one by one (about one instruction a frame, where the plain loop takes 5).
#[inline(always)]
fn unchanged(now: &[usize], before: &[usize]) -> usize {
    let n = now.len().min(before.len());
    let (now, before) = (&now[..n], &before[..n]);
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if n >= 8 && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; both slices hold `n` >= 8 words.
        return unsafe { first_difference_avx2(now, before) };
    }
    now.iter().zip(before).take_while(|(a, b)| a == b).count()
}

/// [`unchanged`] with AVX2, for slices of the same length of at least eight words: sixteen
/// words a step while all of them agree (four XORs, three ORs and one test, about one
/// instruction a word), then eight words a step, each step's 8-bit mask of equal words saying
/// where the first difference is. The last step is the last eight words, overlapping the step
/// before (whose words agreed).
///
/// Inline assembly, inlined into the sample path: as a function of its own (compiled for
/// AVX2, which the code around it is not) its call made the caller move the values it kept
/// in the registers a call may change, about twenty instructions a sample around thirty of
/// the compare's own. The assembly changes only the four vector registers it names (whose
/// upper halves no code of the agent's keeps anything in: it is not compiled for AVX) and
/// clears their upper halves as it ends (`vzeroupper`), as a function compiled for AVX2 does
/// before it returns.
///
/// # Safety
/// The CPU must have AVX2; `now.len() == before.len() >= 8`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn first_difference_avx2(now: &[usize], before: &[usize]) -> usize {
    let n = now.len();
    debug_assert!(n >= 8 && before.len() == n);
    let i: usize;
    // SAFETY: every load is of words inside both slices: a sixteen-word step only while
    // `i + 16 <= n`, an eight-word step at `min(i, n - 8)`, and `n >= 8`.
    unsafe {
        std::arch::asm!(
            "xor {i:e}, {i:e}",
            // Sixteen words a step while they all agree: from `i` while `i <= n - 16`, the
            // test at the loop's end.
            "lea {t}, [{n} - 16]",
            "cmp {n}, 16",
            "jb 3f",
            "2:",
            "vmovdqu ymm0, ymmword ptr [{a} + 8*{i}]",
            "vmovdqu ymm1, ymmword ptr [{a} + 8*{i} + 32]",
            "vmovdqu ymm2, ymmword ptr [{a} + 8*{i} + 64]",
            "vmovdqu ymm3, ymmword ptr [{a} + 8*{i} + 96]",
            "vpxor ymm0, ymm0, ymmword ptr [{b} + 8*{i}]",
            "vpxor ymm1, ymm1, ymmword ptr [{b} + 8*{i} + 32]",
            "vpxor ymm2, ymm2, ymmword ptr [{b} + 8*{i} + 64]",
            "vpxor ymm3, ymm3, ymmword ptr [{b} + 8*{i} + 96]",
            "vpor ymm0, ymm0, ymm1",
            "vpor ymm2, ymm2, ymm3",
            "vpor ymm0, ymm0, ymm2",
            "vptest ymm0, ymm0",
            "jnz 3f",
            "add {i}, 16",
            "cmp {i}, {t}",
            "jbe 2b",
            // Eight words a step from `i`, the last step the last eight words.
            "3:",
            "cmp {i}, {n}",
            "je 5f",
            "4:",
            "lea {t}, [{n} - 8]",
            "cmp {i}, {t}",
            "cmovb {t}, {i}",
            "vmovdqu ymm0, ymmword ptr [{a} + 8*{t}]",
            "vmovdqu ymm1, ymmword ptr [{a} + 8*{t} + 32]",
            "vpcmpeqq ymm0, ymm0, ymmword ptr [{b} + 8*{t}]",
            "vpcmpeqq ymm1, ymm1, ymmword ptr [{b} + 8*{t} + 32]",
            "vmovmskpd {m:e}, ymm0",
            "vmovmskpd {k:e}, ymm1",
            "shl {k:e}, 4",
            "or {m:e}, {k:e}",
            "cmp {m:e}, 0xff",
            "jne 6f",
            "lea {i}, [{t} + 8]",
            "cmp {i}, {n}",
            "jb 4b",
            "mov {i}, {n}",
            "jmp 5f",
            // The words before `i` agreed already, so the first difference is at `i` or
            // after it: the lowest clear bit of the mask (one is, below bit 8).
            "6:",
            "not {m:e}",
            "bsf {m:e}, {m:e}",
            "lea {i}, [{t} + {m}]",
            "5:",
            "vzeroupper",
            a = in(reg) now.as_ptr(),
            b = in(reg) before.as_ptr(),
            n = in(reg) n,
            i = out(reg) i,
            t = out(reg) _,
            m = out(reg) _,
            k = out(reg) _,
            out("xmm0") _,
            out("xmm1") _,
            out("xmm2") _,
            out("xmm3") _,
            options(nostack, readonly),
        );
    }
    i
}

/// The `outer` a thread's recent frames remember for the outermost frame of a cut stack: a
/// frame lies outside it (from 3.12 it is no entry frame, where the outermost frame of a whole
/// stack is one, whose `outer` is 0). No link's `at` is 1.
const CUT_OUTSIDE: usize = 1;

/// The `at` of the link outside link `i` of `ats` (outermost first); `outside` for the
/// outermost.
#[inline(always)]
fn outer_of(ats: &[usize], i: usize, outside: usize) -> usize {
    if i == 0 {
        outside
    } else {
        ats[i - 1]
    }
}

/// Frames of a sample whose sets of the frame cache are asked for ahead of their lookups.
const PREFETCHED: usize = 8;

/// Everything announcing frames needs, borrowed from the session.
pub struct Announcer<'a> {
    pub api: &'a Api,
    pub layout: &'a PyLayout,
    pub ring: &'a mut Ring,
    pub caches: &'a mut Caches,
    pub stacks: &'a mut Stacks,
    pub max_depth: usize,
    /// Nodes carry entry marks: only native stacks, merged with them, need them (see
    /// `pyframes::is_entry`); without, every node is no entry.
    pub entries: bool,
}

/// A sample's stack: its innermost node, how many Python frames it has, and whether it was
/// deeper than `max_depth` (cut: only the innermost frames are in it). One word that is never
/// zero (node, depth, a bit always set and the cut as the top bit), so that
/// `Option<Stack>` is one word too: the sample path's ways to return a stack meet in a
/// register, where a struct of two `u32` and a `bool` was copied through the stack frame.
#[derive(Clone, Copy)]
pub struct Stack(NonZeroU64);

impl Stack {
    const TRUNCATED: u64 = 1 << 63;
    const SET: u64 = 1 << 62;

    /// No Python frame.
    pub const NONE: Stack = Stack(NonZeroU64::new(Self::SET).unwrap());

    /// # Panics
    /// In debug builds, for a depth of 2^30 or more (stacks are at most `MAX_FRAMES` deep).
    #[inline(always)]
    pub fn new(node: u32, depth: u32, truncated: bool) -> Stack {
        debug_assert!(depth < 1 << 30);
        let cut = if truncated { Self::TRUNCATED } else { 0 };
        Stack(NonZeroU64::new(node as u64 | (depth as u64) << 32 | Self::SET | cut).unwrap())
    }

    #[inline(always)]
    pub fn node(self) -> u32 {
        self.0.get() as u32
    }

    #[inline(always)]
    pub fn depth(self) -> u32 {
        ((self.0.get() & !(Self::TRUNCATED | Self::SET)) >> 32) as u32
    }

    #[inline(always)]
    pub fn truncated(self) -> bool {
        self.0.get() & Self::TRUNCATED != 0
    }
}

/// What the thread's previous chain made of this one.
enum Through {
    Stack(Stack),
    /// Its links from `same` on changed, and not to the innermost alone the thread ran lately:
    /// for [`Announcer::changed`], with what the links outside them made (`parent`). Asked
    /// for by the caller, so that the common sample's result never shares memory with that
    /// call's.
    Changed {
        chain: *mut ThreadChain,
        same: usize,
        parent: Cached,
    },
    /// More Python frames than `max_depth`: the stack must be cut.
    Deeper,
    /// Not to be cached (a frame that cannot be read, no memory for the chain): walk it the
    /// plain way.
    Plain,
}

/// Why a stack could not be had.
pub enum Lost {
    /// The ring had no room for a record it needed.
    RingFull,
    /// The node table was full and started again: the nodes this walk had named are gone.
    TableFull,
}
use Lost::RingFull;

impl Announcer<'_> {
    /// The stack of the calling thread (`tid`), whose thread state is `tstate`; `None` when
    /// it could not be had (see [`Lost`]).
    ///
    /// # Safety
    /// `tstate` is the calling thread's own thread state.
    #[inline(always)]
    pub unsafe fn this_thread(&mut self, tid: u32, tstate: *const c_void) -> Option<Stack> {
        let mut ats = [const { MaybeUninit::<usize>::uninit() }; LINK_CAP];
        let mut first = [const { MaybeUninit::<usize>::uninit() }; FIRST];
        // SAFETY: `tstate` is the calling thread's own (contract) and `self.layout` the
        // session's, checked against this interpreter at its start.
        let (n, whole) =
            unsafe { frames::ats(self.layout, tstate, self.entries, &mut ats, &mut first) };
        // SAFETY: `ats` wrote the last `n`.
        let ats: &[usize] =
            unsafe { std::slice::from_raw_parts(ats.as_ptr().add(LINK_CAP - n).cast(), n) };
        if !whole || n > self.max_depth {
            cold_path();
            // SAFETY: the calling thread's own `tstate` (contract); `ats` and `first` as the
            // walk just wrote them.
            return unsafe { self.again().deep(tid, tstate, ats, whole, &first) }.ok();
        }
        // SAFETY: `ats` and `first` as the walk just wrote them.
        let through = match unsafe { self.cached(tid, ats, &first, false) } {
            Ok(Through::Stack(stack)) => return Some(stack),
            Ok(Through::Changed {
                chain,
                same,
                parent,
            }) => {
                // SAFETY: `chain` is the thread's chain `cached` found, mapped memory of
                // `stacks` that interning never touches (see there); `tstate` is the calling
                // thread's own.
                unsafe {
                    self.again()
                        .changed(&mut *chain, tstate, ats, &first, false, same, parent)
                }
            }
            other => other,
        };
        match through {
            Ok(Through::Stack(stack)) => Some(stack),
            Err(Lost::TableFull) => {
                cold_path();
                // SAFETY: the calling thread's own `tstate` (contract).
                unsafe { self.again().uncached(tid, tstate) }.ok()
            }
            Err(Lost::RingFull) => {
                cold_path();
                None
            }
            Ok(_) => {
                cold_path();
                // SAFETY: the calling thread's own `tstate` (contract).
                unsafe { self.again().plain(tid, tstate) }.ok()
            }
        }
    }

    /// A second announcer with the same borrows, for a call out of line from the sample
    /// path's common case: made where that call is, so that the common case keeps this one's
    /// parts in registers (a call given this one's address made every sample write them to
    /// memory).
    #[inline(always)]
    fn again(&mut self) -> Announcer<'_> {
        Announcer {
            api: self.api,
            layout: self.layout,
            ring: &mut *self.ring,
            caches: &mut *self.caches,
            stacks: &mut *self.stacks,
            max_depth: self.max_depth,
            entries: self.entries,
        }
    }

    /// [`Announcer::uncached`], once more with the emptied table when the table was full: a
    /// stack never needs more than a fraction of it.
    ///
    /// # Safety
    /// As for [`Announcer::this_thread`].
    unsafe fn plain(&mut self, tid: u32, tstate: *const c_void) -> Result<Stack, Lost> {
        // SAFETY: the calling thread's own `tstate` (contract), both times.
        unsafe {
            match self.uncached(tid, tstate) {
                Err(Lost::TableFull) => self.uncached(tid, tstate),
                other => other,
            }
        }
    }

    /// [`Announcer::this_thread`] for a chain of more links than `max_depth` (all of them in
    /// `ats`, or the innermost when not `whole`), which may have more Python frames (from 3.12
    /// the C-stack shims are links too): the stack is then its innermost `max_depth` Python
    /// frames, and the links that hold them are cached like any others (their nodes depend on
    /// them alone). Finding that cut reads every link it passes, so the whole chain is tried
    /// first, unless the thread's previous stack was cut. Out of line: the common sample is
    /// not so deep.
    ///
    /// # Safety
    /// As for [`Announcer::this_thread`]; `ats` and `first` as `frames::ats` wrote them for
    /// `tstate`.
    #[inline(never)]
    unsafe fn deep(
        &mut self,
        tid: u32,
        tstate: *const c_void,
        ats: &[usize],
        whole: bool,
        first: &[MaybeUninit<usize>; FIRST],
    ) -> Result<Stack, Lost> {
        let n = ats.len();
        let mut whole_first = whole && !self.stacks.chain_of(tid).is_some_and(|c| c.cut);
        loop {
            let (links, cut) = if whole_first {
                (n, false)
            } else {
                // SAFETY: the calling thread's own `tstate` (contract), whose chain has the
                // `n` links of `ats` at least.
                match unsafe {
                    frames::cut(self.api, self.layout, tstate, n, whole, self.max_depth)
                } {
                    Cut::At(links) => (links, true),
                    Cut::Whole => (n, false),
                    Cut::Unknown => break,
                }
            };
            // SAFETY: the calling thread's own `tstate`; the innermost `links` of `ats`, and
            // `first` as the walk kept it (contract).
            match unsafe { self.through(tid, tstate, &ats[n - links..], first, cut) } {
                Ok(Through::Stack(stack)) => return Ok(stack),
                Ok(Through::Deeper) if whole_first => whole_first = false,
                Ok(_) => break,
                // SAFETY: the calling thread's own `tstate` (contract).
                Err(Lost::TableFull) => return unsafe { self.uncached(tid, tstate) },
                Err(lost) => return Err(lost),
            }
        }
        // SAFETY: the calling thread's own `tstate` (contract).
        unsafe { self.plain(tid, tstate) }
    }

    /// [`Announcer::cached`], and [`Announcer::changed`] when it asks for it.
    ///
    /// # Safety
    /// As for [`Announcer::changed`].
    unsafe fn through(
        &mut self,
        tid: u32,
        tstate: *const c_void,
        ats: &[usize],
        first: &[MaybeUninit<usize>; FIRST],
        cut: bool,
    ) -> Result<Through, Lost> {
        // SAFETY: `ats` and `first` as the walk wrote them (contract).
        match unsafe { self.cached(tid, ats, first, cut) }? {
            Through::Changed {
                chain,
                same,
                parent,
            } => {
                // SAFETY: `chain` is the thread's chain `cached` found, mapped memory of
                // `stacks` that interning never touches (see there); the rest is this
                // function's contract.
                unsafe { self.changed(&mut *chain, tstate, ats, first, cut, same, parent) }
            }
            other => Ok(other),
        }
    }

    /// Through the thread's previous chain (`ats`: what its frames run now, outermost first;
    /// `first`: the addresses of the innermost of them, as `frames::ats` kept them; `cut`:
    /// the stack is cut outside them, at `max_depth` Python frames). Where links other than
    /// the innermost alone changed, [`Through::Changed`] says so, for the caller to call
    /// [`Announcer::changed`].
    ///
    /// # Safety
    /// `first` holds the addresses of the innermost `min(ats.len(), FIRST)` links of the
    /// calling thread's chain, live frames.
    #[inline(always)]
    unsafe fn cached(
        &mut self,
        tid: u32,
        ats: &[usize],
        first: &[MaybeUninit<usize>; FIRST],
        cut: bool,
    ) -> Result<Through, Lost> {
        let Some(chain) = self.stacks.chain_of(tid) else {
            cold_path();
            return Ok(Through::Plain);
        };
        let chain: *mut ThreadChain = chain;
        // SAFETY: the chain is mapped memory of `stacks` that interning never touches (node
        // ids live in another mapping), so it can be used beside `&mut self`.
        let chain = unsafe { &mut *chain };
        let n = ats.len();
        if chain.cut != cut {
            cold_path();
            // The outermost frame of a cut stack is no entry frame from 3.12 (a Python frame
            // lies right outside it): the same links make other nodes.
            chain.cut = cut;
            chain.len = 0;
        }
        let same = unchanged(ats, &chain.ats[..chain.len]);
        chain.len = same;
        let Cached { node, depth } = match same {
            0 => Cached::default(),
            k => chain.made[k - 1],
        };
        let outside = if cut { CUT_OUTSIDE } else { 0 };
        if same + 1 == n {
            // Only the innermost frame changed, most often to an allocation site of a loop
            // the thread ran lately: the loop below without its set-up.
            let at = ats[same];
            let outer = outer_of(ats, same, outside);
            // SAFETY: `n >= 1`: the walk wrote the first address (contract).
            let f = unsafe { first[0].assume_init() } as *const c_void;
            // SAFETY: `f` is the innermost link, a live frame of the calling thread.
            if let Some(made) = unsafe { self.recall(chain, at, outer, Cached { node, depth }, f) }
            {
                if made.depth as usize > self.max_depth {
                    cold_path();
                    return Ok(Through::Deeper);
                }
                chain.ats[same] = at;
                chain.made[same] = made;
                chain.len = n;
                return Ok(Through::Stack(Stack::new(made.node, made.depth, cut)));
            }
        }
        if same == n {
            // Nothing changed: the stack of the thread's previous sample.
            return Ok(Through::Stack(Stack::new(node, depth, cut)));
        }
        Ok(Through::Changed {
            chain,
            same,
            parent: Cached { node, depth },
        })
    }

    /// [`Announcer::cached`] for the links `same..` of `ats` that changed, when they are not
    /// the innermost alone run lately; `parent`: what the links outside them made. Out of
    /// line: a loop's samples change the innermost frame alone, and the code below took
    /// registers from theirs.
    ///
    /// # Safety
    /// As for [`Announcer::this_thread`]; `ats` (outermost first) and `first` as
    /// `frames::ats` wrote them for `tstate` (`ats` may be the innermost part of its output).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn changed(
        &mut self,
        chain: &mut ThreadChain,
        tstate: *const c_void,
        ats: &[usize],
        first: &[MaybeUninit<usize>; FIRST],
        cut: bool,
        same: usize,
        parent: Cached,
    ) -> Result<Through, Lost> {
        let n = ats.len();
        let outside = if cut { CUT_OUTSIDE } else { 0 };
        let Cached {
            mut node,
            mut depth,
        } = parent;
        // Several frames changed: most often to an end of the chain the thread ran lately,
        // recalled whole. Its innermost link is its deepest; an end deeper than `max_depth`
        // goes frame by frame below, which tells the caller to cut the stack.
        let end_outer = outer_of(ats, same, outside);
        let whole_end = (2..=END_MAX).contains(&(n - same))
            && same + END_MAX <= LINK_CAP
            && crate::code_dealloc::counting();
        if whole_end {
            if let Some(made) = chain.recall_end(same, end_outer, parent, &ats[same..]) {
                if made.depth as usize <= self.max_depth {
                    return Ok(Through::Stack(Stack::new(made.node, made.depth, cut)));
                }
                cold_path();
                chain.len = same;
            }
        }
        // The frames that changed, innermost first: most often among those the walk kept.
        let mut walked = [const { MaybeUninit::<usize>::uninit() }; LINK_CAP];
        let changed: &[MaybeUninit<usize>] = if n - same <= FIRST {
            first
        } else {
            // SAFETY: the calling thread's own `tstate` (contract), whose chain has the `n`
            // links of `ats` at least.
            unsafe { frames::innermost(self.layout, tstate, &mut walked[..n - same]) };
            &walked
        };
        let mut cacheable = true;
        let mut prefetched = false;
        for i in same..n {
            // SAFETY: the first `n - same` were written, by the walk or by `innermost`.
            let f = unsafe { changed[n - 1 - i].assume_init() } as *const c_void;
            let (at, outer) = (ats[i], outer_of(ats, i, outside));
            let parent = Cached { node, depth };
            // SAFETY: `f` is a link of the calling thread's chain: a live frame.
            if let Some(made) = unsafe { self.recall(chain, at, outer, parent, f) } {
                if made.depth as usize > self.max_depth {
                    cold_path();
                    return Ok(Through::Deeper);
                }
                Cached { node, depth } = made;
            } else {
                if !prefetched && n - i >= 2 {
                    // The first frame the thread did not run lately: from here on most are
                    // looked up in the frame cache, which at the default rate is cold at every
                    // sample. Their sets are asked for at once, so that their misses overlap.
                    prefetched = true;
                    // SAFETY: the `n - i` innermost links, written (above) and live.
                    unsafe { self.prefetch_frames(&changed[..n - i]) };
                }
                // SAFETY: `f` is a link of the calling thread's chain: a live frame.
                match unsafe { frames::code_and_offset(self.api, self.layout, f) } {
                    Found::Skip => {}
                    Found::Unstarted => {
                        cold_path();
                        cacheable = false;
                    }
                    Found::Broken => {
                        cold_path();
                        return Ok(Through::Plain);
                    }
                    Found::Code(code, offset) => {
                        depth += 1;
                        if depth as usize > self.max_depth {
                            cold_path();
                            return Ok(Through::Deeper);
                        }
                        // SAFETY: the same live frame.
                        let entry = self.entries && unsafe { frames::is_entry(self.layout, f) };
                        let raw = RawFrame {
                            code,
                            offset,
                            entry,
                        };
                        // SAFETY: `code` is the code object the live frame `f` holds.
                        node = unsafe { self.node_of(node, raw) }?;
                        if at != UNCOMPARABLE {
                            // SAFETY: as above.
                            let key = unsafe { frames::code_key(self.layout, code) };
                            chain.remember(at, outer, key, parent, Cached { node, depth });
                        }
                    }
                }
            }
            if cacheable {
                // The chain ends at an uncomparable or unstarted frame: what runs inside it
                // is worked out afresh next time.
                cacheable &= ats[i] != UNCOMPARABLE;
                chain.ats[i] = ats[i];
                chain.made[i] = Cached { node, depth };
                chain.len = i + cacheable as usize;
            }
        }
        if whole_end && chain.len == n {
            chain.remember_end(same, n - same, end_outer, parent);
        }
        Ok(Through::Stack(Stack::new(node, depth, cut)))
    }

    /// Asks for the frame cache's sets of `changed` (innermost first), in the order they are
    /// looked up (outermost first), and before 3.12 for the counts in their code keys. A frame
    /// recalled after all wastes its requests. Out of line: most samples recall every frame
    /// that changed.
    ///
    /// # Safety
    /// Every element of `changed` is written: the address of a live frame of the calling
    /// thread.
    #[inline(never)]
    unsafe fn prefetch_frames(&self, changed: &[MaybeUninit<usize>]) {
        let counted = self.layout.code_version == ABSENT;
        for f in changed.iter().rev().take(PREFETCHED) {
            // SAFETY: written (contract).
            let f = unsafe { f.assume_init() } as *const c_void;
            if let Found::Code(code, offset) =
                // SAFETY: a live frame of the calling thread (contract).
                unsafe { frames::code_and_offset(self.api, self.layout, f) }
            {
                self.stacks.prefetch_frame(code as usize, offset);
                if counted {
                    crate::code_dealloc::prefetch_freed_at(code as usize);
                }
            }
        }
    }

    /// What the frame `f`, running `at` inside a link running `outer`, made on top of `parent`
    /// when the thread ran it lately (see [`ThreadChain::recall`]); never for an
    /// [`UNCOMPARABLE`] frame.
    ///
    /// # Safety
    /// `f` is a live frame of the calling thread.
    #[inline(always)]
    unsafe fn recall(
        &self,
        chain: &ThreadChain,
        at: usize,
        outer: usize,
        parent: Cached,
        f: *const c_void,
    ) -> Option<Cached> {
        if at == UNCOMPARABLE {
            return None;
        }
        chain.recall(at, outer, parent, || {
            // SAFETY: `f` is a live frame of the calling thread (contract).
            unsafe { frames::live_code_key(self.api, self.layout, f) }
        })
    }

    /// The plain walk: innermost `max_depth` frames, interned from the outermost kept. The
    /// thread's cached chain is void after it. Rare (a chain too deep or broken, a full
    /// table): out of line, so that the common path's code stays together.
    ///
    /// # Safety
    /// As for [`Announcer::this_thread`].
    #[cold]
    #[inline(never)]
    unsafe fn uncached(&mut self, tid: u32, tstate: *const c_void) -> Result<Stack, Lost> {
        if let Some(chain) = self.stacks.chain_of(tid) {
            chain.len = 0;
        }
        let mut raw = [const { MaybeUninit::<RawFrame>::uninit() }; MAX_FRAMES];
        // SAFETY: the calling thread's own `tstate` (contract) and the session's layout.
        let (n, truncated) =
            unsafe { frames::walk(self.api, self.layout, tstate, &mut raw, self.max_depth) };
        let mut node = 0;
        for f in raw[..n].iter().rev() {
            // SAFETY: the walk wrote the first `n`, each a live code object of the calling
            // thread's frames or null.
            node = unsafe { self.node_of(node, f.assume_init()) }?;
        }
        Ok(Stack::new(node, n as u32, truncated))
    }

    /// The node of frame `f` on top of `parent`, announced if new.
    ///
    /// # Safety
    /// `f.code` is null or a live code object.
    unsafe fn node_of(&mut self, parent: u32, f: RawFrame) -> Result<u32, Lost> {
        if f.code.is_null() {
            // Where the walk stopped at something it could not read: `<unknown>`.
            let unknown = Node {
                parent,
                ..Node::default()
            };
            return self.intern(&unknown);
        }
        let f = RawFrame {
            entry: f.entry && self.entries,
            ..f
        };
        let key = FrameKey {
            parent,
            offset: f.offset,
            entry: f.entry,
            // SAFETY: a live code object (contract; not null here).
            code: unsafe { frames::code_key(self.layout, f.code) },
        };
        if let Some(node) = self.stacks.known_frame(&key) {
            return Ok(node);
        }
        // SAFETY: the key just read from the live code object.
        unsafe { self.announce(key.code) }?;
        let node = Node {
            parent,
            code: f.code as u64,
            // SAFETY: the same live code object.
            line: unsafe { self.line(key.code, f) },
            entry: f.entry,
        };
        let id = self.intern(&node)?;
        self.stacks.remember_frame(key, id);
        Ok(id)
    }

    fn intern(&mut self, node: &Node) -> Result<u32, Lost> {
        match self.stacks.intern(node) {
            Interned::Known(id) => Ok(id),
            Interned::New(id) => self.define(id, node),
            Interned::Full => {
                // Ids start again; the nodes this walk already named are gone with the rest,
                // so the caller walks again from scratch.
                self.stacks.reset();
                Err(Lost::TableFull)
            }
        }
    }

    fn define(&mut self, id: u32, node: &Node) -> Result<u32, Lost> {
        let aux = if node.entry { STACK_ENTRY } else { 0 };
        let written = self.ring.try_write(KIND_STACK, aux, STACK_BODY, |b| {
            write_stack(b, id, node);
        });
        if !written {
            return Err(RingFull);
        }
        self.stacks.commit(id, node);
        Ok(id)
    }

    /// Writes a CODE record for the code object of `key` unless it was announced already.
    ///
    /// # Safety
    /// `key` was read from a code object that is still live (its name and file name too).
    unsafe fn announce(&mut self, key: CodeKey) -> Result<(), Lost> {
        let (l, caches) = (self.layout, &mut *self.caches);
        let code = key.code as *const c_void;
        let slot = (key.code >> 4).wrapping_mul(0x9E37_79B9) % lifecycle::CODE_CACHE;
        if caches.codes[slot] == Some((caches.generation, key)) {
            return Ok(());
        }
        let mut filename = [0u8; 1024];
        let mut name = [0u8; 512];
        // SAFETY: the live code object's `co_filename` and `co_name` (or `co_qualname`),
        // `str` objects it holds alive (contract).
        let flen = unsafe { frames::read_str(l, key.filename as *const c_void, &mut filename) };
        // SAFETY: as above.
        let nlen = unsafe { frames::read_str(l, key.name as *const c_void, &mut name) };
        // SAFETY: a live code object (contract).
        let firstline = unsafe { frames::first_line(l, code) };
        let written = self
            .ring
            .try_write(KIND_CODE, 0, CODE_FIXED + flen + nlen, |b| {
                b[0..8].copy_from_slice(&(key.code as u64).to_le_bytes());
                b[8..12].copy_from_slice(&firstline.to_le_bytes());
                b[12..14].copy_from_slice(&(flen as u16).to_le_bytes());
                b[14..16].copy_from_slice(&(nlen as u16).to_le_bytes());
                b[CODE_FIXED..CODE_FIXED + flen].copy_from_slice(&filename[..flen]);
                b[CODE_FIXED + flen..CODE_FIXED + flen + nlen].copy_from_slice(&name[..nlen]);
            });
        if !written {
            return Err(RingFull);
        }
        caches.codes[slot] = Some((caches.generation, key));
        Ok(())
    }

    /// The line of a frame, through a direct-mapped cache: scanning line tables is the most
    /// expensive part of a new frame.
    ///
    /// # Safety
    /// `f.code` is a live code object, the one `key` was read from.
    unsafe fn line(&mut self, key: CodeKey, f: RawFrame) -> u32 {
        let s = &mut *self.caches;
        let h =
            (key.code as u64 >> 4 ^ (f.offset as u64) << 20).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = (h >> 40) as usize % lifecycle::LINE_CACHE;
        if let Some(e) = s.lines[slot] {
            if e.generation == s.generation && e.key == key && e.offset == f.offset {
                return e.line;
            }
        }
        // SAFETY: a live code object (contract).
        let line = unsafe { frames::line_of(self.api, self.layout, f.code, f.offset) };
        s.lines[slot] = Some(LineEntry {
            generation: s.generation,
            key,
            offset: f.offset,
            line,
        });
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length of either chain and every first difference, alone or followed by more
    /// (every word after it, or every other one), against a plain count.
    #[test]
    fn unchanged_counts_the_outermost_frames_that_agree() {
        // Under Miri (the plain loop only, and slowly): the lengths about one and two groups.
        let lens: Vec<usize> = if cfg!(miri) {
            vec![0, 1, 7, 8, 9, 15, 16, 17]
        } else {
            (0..40).collect()
        };
        for &len_now in &lens {
            for &len_before in &lens {
                for (differ_at, after) in
                    (0..=len_now.min(len_before)).flat_map(|d| (0..3).map(move |a| (d, a)))
                {
                    let now: Vec<usize> = (0..len_now).map(|i| 10 + i).collect();
                    let mut before: Vec<usize> = (0..len_before).map(|i| 10 + i).collect();
                    for (i, b) in before.iter_mut().enumerate().skip(differ_at) {
                        let differs = match after {
                            0 => i == differ_at,
                            1 => true,
                            _ => (i - differ_at) % 2 == 0,
                        };
                        if differs && differ_at < len_now {
                            *b = 1 << (i % 64);
                        }
                    }
                    let want = now.iter().zip(&before).take_while(|(a, b)| a == b).count();
                    assert_eq!(want, differ_at.min(len_now).min(len_before));
                    // With AVX2 (where the CPU has it), from eight words.
                    assert_eq!(unchanged(&now, &before), want);
                }
            }
        }
    }
}
