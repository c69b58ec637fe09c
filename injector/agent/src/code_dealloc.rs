//! Counts the code objects the interpreter frees, so that a thread's cached chain (see
//! `stacks::ThreadChain`) is not trusted across one.
//!
//! The chain compares what each frame runs by address (`pyframes::ats`). A module's code object
//! is freed once its import is done, and the next module's often takes its address: a frame of
//! the new one at the same instruction offset looked unchanged, and its samples went to the
//! module before (on 3.12, one module of twelve imported in a row lost its bytes to the one
//! before, run after run). For the session, `PyCode_Type.tp_dealloc` is wrapped by
//! [`dealloc`], which counts and calls the interpreter's own; a chain made before the count
//! moved is walked afresh.
//!
//! It also counts them by address ([`freed_at`]): before 3.12 a code object has no serial
//! number of its own, and what tells a code object from the one that had its address before
//! (`pyframes::CodeKey`) is how many code objects were freed at that address.

use mprof_common::layout::PyLayout;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

type Dealloc = unsafe extern "C" fn(*mut c_void);

/// Code objects freed while the wrapper was in place (wrapping).
static FREED: AtomicU32 = AtomicU32::new(0);
/// The same, by a hash of their address (see [`freed_at`]).
static FREED_AT: [AtomicU32; AT_SLOTS] = [const { AtomicU32::new(0) }; AT_SLOTS];
const AT_BITS: u32 = 12;
const AT_SLOTS: usize = 1 << AT_BITS;
/// Whether [`dealloc`] sees every code object freed: set once the wrapper is in the slot, for
/// the sessions until it is taken out again.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// The interpreter's own `tp_dealloc` of code objects, once the wrapper went in.
static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

/// How many code objects were freed: a chain made at another count is not trusted. Also moved
/// whenever counting starts or stops, so that nothing made at one count was made partly
/// while the frees went uncounted.
#[inline]
pub fn freed() -> u32 {
    FREED.load(Ordering::Relaxed)
}

/// Whether every code object freed now moves [`freed`] (the wrapper is in place).
#[inline]
pub fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// Sets [`COUNTING`], moving [`FREED`] when it changes (see [`freed`]).
fn set_counting(on: bool) {
    if COUNTING.swap(on, Ordering::Relaxed) != on {
        FREED.fetch_add(1, Ordering::Relaxed);
    }
}

fn at_slot(code: usize) -> usize {
    // Fibonacci hashing, as the agent's other address tables: objects are 16-byte aligned.
    ((code as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - AT_BITS)) as usize
}

/// How many code objects were freed at the address `code` (or at another address of its slot
/// of the table) while the wrapper counted them; `None` when it does not (it is not in the
/// slot). A code object that takes the address of one freed before it is told apart by this
/// count, which moved when the one before it went: one load, where reading what the code
/// object holds missed the cache (a print of its line table, a quarter of the agent's time
/// on a 3.11 web server). The count of a live code object moves when another of its slot
/// goes: its frames are then looked up afresh, as if it were new.
#[inline]
pub fn freed_at(code: usize) -> Option<u32> {
    COUNTING
        .load(Ordering::Relaxed)
        .then(|| FREED_AT[at_slot(code)].load(Ordering::Relaxed))
}

/// Starts loading the count [`freed_at`] reads for `code`: a sample asks it of each frame it
/// looks up, at a random place of a table that the default rate finds cold.
#[inline]
pub fn prefetch_freed_at(code: usize) {
    crate::sys::prefetch(&FREED_AT[at_slot(code)]);
}

unsafe extern "C" fn dealloc(op: *mut c_void) {
    // Counted before the memory goes: a code object that takes its address finds the new count.
    FREED_AT[at_slot(op as usize)].fetch_add(1, Ordering::Relaxed);
    FREED.fetch_add(1, Ordering::Relaxed);
    let original = ORIGINAL.load(Ordering::Relaxed);
    // SAFETY: set (to the interpreter's own, never to this function) before the wrapper was
    // put in the slot, and never unset.
    let original: Dealloc = unsafe { std::mem::transmute::<usize, Dealloc>(original) };
    // SAFETY: called for a code object whose reference count reached zero, as the slot is.
    unsafe { original(op) }
}

/// The `tp_dealloc` slot of `PyCode_Type` (`code_type`).
fn slot(l: &PyLayout, code_type: *mut c_void) -> &'static AtomicUsize {
    // SAFETY: `PyCode_Type` is a static type object of the interpreter, mapped for the life of
    // the process; its `tp_dealloc` is an aligned pointer-sized field at this offset (from the
    // generated layout, checked against the interpreter at the session's start). Every store
    // to it here is atomic, and the interpreter reads it with one load per call.
    unsafe { &*((code_type as *mut u8).add(l.type_dealloc as usize) as *const AtomicUsize) }
}

/// Puts the wrapper in `PyCode_Type.tp_dealloc` (once per process: it stays in place if a
/// session before this one left it).
pub fn wrap(l: &PyLayout, code_type: *mut c_void) {
    if code_type.is_null() {
        return;
    }
    let slot = slot(l, code_type);
    let ours = dealloc as Dealloc as usize;
    let now = slot.load(Ordering::Acquire);
    if now == ours {
        set_counting(true);
        return;
    }
    if now == 0 {
        return;
    }
    if ORIGINAL.load(Ordering::Relaxed) == 0 {
        ORIGINAL.store(now, Ordering::Release);
    } else if ORIGINAL.load(Ordering::Relaxed) != now {
        // Someone else changed the slot since a session before this one: not ours to wrap.
        return;
    }
    if slot
        .compare_exchange(now, ours, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        set_counting(true);
    }
}

/// Takes the wrapper out of the slot, if it is still there (a wrapper put in after it stays,
/// and so does ours under it: [`dealloc`] never goes away).
pub fn unwrap(l: &PyLayout, code_type: *mut c_void) {
    let original = ORIGINAL.load(Ordering::Acquire);
    if code_type.is_null() || original == 0 {
        return;
    }
    let ours = dealloc as Dealloc as usize;
    if slot(l, code_type)
        .compare_exchange(ours, original, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        set_counting(false);
    }
}
