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

use mprof_common::layout::PyLayout;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

type Dealloc = unsafe extern "C" fn(*mut c_void);

/// Code objects freed while the wrapper was in place (wrapping).
static FREED: AtomicU32 = AtomicU32::new(0);
/// The interpreter's own `tp_dealloc` of code objects, once the wrapper went in.
static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

/// How many code objects were freed: a chain made at another count is not trusted.
#[inline]
pub fn freed() -> u32 {
    FREED.load(Ordering::Relaxed)
}

unsafe extern "C" fn dealloc(op: *mut c_void) {
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
    if now == ours || now == 0 {
        return;
    }
    if ORIGINAL.load(Ordering::Relaxed) == 0 {
        ORIGINAL.store(now, Ordering::Release);
    } else if ORIGINAL.load(Ordering::Relaxed) != now {
        // Someone else changed the slot since a session before this one: not ours to wrap.
        return;
    }
    let _ = slot.compare_exchange(now, ours, Ordering::AcqRel, Ordering::Relaxed);
}

/// Takes the wrapper out of the slot, if it is still there (a wrapper put in after it stays,
/// and so does ours under it: [`dealloc`] never goes away).
pub fn unwrap(l: &PyLayout, code_type: *mut c_void) {
    let original = ORIGINAL.load(Ordering::Acquire);
    if code_type.is_null() || original == 0 {
        return;
    }
    let ours = dealloc as Dealloc as usize;
    let _ =
        slot(l, code_type).compare_exchange(ours, original, Ordering::AcqRel, Ordering::Relaxed);
}
