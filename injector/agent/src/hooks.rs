//! The PEP 445 allocator hooks for the RAW, MEM and OBJ domains.
//!
//! Each hook wraps the allocator that was installed before it (so blocks allocated before the
//! agent arrived are freed by their own allocator) and ignores its `ctx` argument: the pair
//! {function, ctx} can be read torn by another thread while it is being swapped, so the hooks
//! are installed with the previous allocator's `ctx` and always use the saved one.
//!
//! The fast path of an allocation is one thread-local subtraction and compare; of a free, one
//! hash and one byte load (see `addrset`). Everything else is in `crate::session`.

use crate::addrset::maybe_sampled;
use crate::python::{Allocator, Api};
use crate::sampler::{GIL_COUNTDOWN, THREAD};
use crate::session;
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

pub const RAW: usize = 0;
pub const MEM: usize = 1;
pub const OBJ: usize = 2;
/// pymalloc hands requests above this size to PyMem_RawMalloc: the nested RAW call must not be
/// counted twice.
const SMALL_MAX: usize = 512;

struct Prev(UnsafeCell<[Option<Allocator>; 3]>);
unsafe impl Sync for Prev {}

/// The allocators the hooks wrap, per domain. Written only while installing.
static PREV: Prev = Prev(UnsafeCell::new([None; 3]));

#[inline(always)]
fn prev(domain: usize) -> &'static Allocator {
    // Installed before the hooks could ever run.
    unsafe { (*PREV.0.get())[domain].as_ref().unwrap_unchecked() }
}

/// Calls `f` with the thread marked busy, so allocations it makes are not sampled again.
#[inline(always)]
fn nested<T>(f: impl FnOnce() -> T) -> T {
    THREAD.with(|t| {
        let was = t.busy.replace(true);
        let r = f();
        t.busy.set(was);
        r
    })
}

#[inline(always)]
fn passes_to_raw(domain: usize, size: usize) -> bool {
    domain != RAW && size > SMALL_MAX
}

/// The fast path of every allocation: counts the bytes down; false when the countdown ran out
/// (or the thread is busy in the agent, for RAW) and the slow path must decide.
#[inline(always)]
fn count_down<const D: usize>(size: usize) -> bool {
    if D == RAW {
        return THREAD.with(|t| {
            if t.busy.get() {
                return true;
            }
            let c = t.countdown.get() - size as i64;
            t.countdown.set(c);
            c > 0
        });
    }
    let c = GIL_COUNTDOWN.load(Ordering::Relaxed) - size as i64;
    GIL_COUNTDOWN.store(c, Ordering::Relaxed);
    c > 0
}

/// Runs an allocator call on the fast path, guarded when pymalloc will pass it to RAW.
#[inline(always)]
fn through<const D: usize>(size: usize, call: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if passes_to_raw(D, size) {
        nested(call)
    } else {
        call()
    }
}

#[inline(always)]
fn free_check(ptr: *mut c_void) {
    // No NULL test: NULL was never sampled, so it passes the filter only on a rare collision,
    // and the exact set then says no.
    if maybe_sampled(ptr as usize) {
        // Recorded before the block is released: once released, its address can be sampled
        // again by another thread, and that record must come after this one.
        session::sampled_free(ptr as usize);
    }
}

unsafe extern "C" fn hook_malloc<const D: usize>(_ctx: *mut c_void, size: usize) -> *mut c_void {
    if count_down::<D>(size) {
        let p = prev(D);
        return through::<D>(size, || (p.malloc)(p.ctx, size));
    }
    slow_malloc::<D>(size)
}

#[cold]
#[inline(never)]
unsafe fn slow_malloc<const D: usize>(size: usize) -> *mut c_void {
    let p = prev(D);
    session::sampled_alloc(D, size, || (p.malloc)(p.ctx, size))
}

unsafe extern "C" fn hook_calloc<const D: usize>(
    _ctx: *mut c_void,
    nelem: usize,
    elsize: usize,
) -> *mut c_void {
    let size = nelem.saturating_mul(elsize);
    let p = prev(D);
    if count_down::<D>(size) {
        return through::<D>(size, || (p.calloc)(p.ctx, nelem, elsize));
    }
    session::sampled_alloc(D, size, || (p.calloc)(p.ctx, nelem, elsize))
}

unsafe extern "C" fn hook_realloc<const D: usize>(
    _ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    free_check(ptr);
    let p = prev(D);
    // A realloc may move a block between pymalloc and the RAW domain whatever its size.
    let call = || {
        if D == RAW {
            (p.realloc)(p.ctx, ptr, size)
        } else {
            nested(|| (p.realloc)(p.ctx, ptr, size))
        }
    };
    if count_down::<D>(size) {
        return call();
    }
    session::sampled_alloc(D, size, call)
}

unsafe extern "C" fn hook_free<const D: usize>(_ctx: *mut c_void, ptr: *mut c_void) {
    free_check(ptr);
    let p = prev(D);
    (p.free)(p.ctx, ptr)
}

fn hooks_for(domain: usize, ctx: *mut c_void) -> Allocator {
    macro_rules! make {
        ($d:expr) => {
            Allocator {
                ctx,
                malloc: hook_malloc::<$d>,
                calloc: hook_calloc::<$d>,
                realloc: hook_realloc::<$d>,
                free: hook_free::<$d>,
            }
        };
    }
    match domain {
        RAW => make!(RAW),
        MEM => make!(MEM),
        _ => make!(OBJ),
    }
}

unsafe fn current_allocator(api: &Api, domain: usize) -> Allocator {
    let mut current = std::mem::MaybeUninit::<Allocator>::uninit();
    (api.get_allocator)(domain as i32, current.as_mut_ptr());
    current.assume_init()
}

fn is_ours(a: &Allocator, domain: usize) -> bool {
    a.malloc as usize == hooks_for(domain, std::ptr::null_mut()).malloc as usize
}

/// Whether the hooks of a domain are in its allocator chain: installed and not restored since
/// (they stay when another allocator was installed on top of them).
static IN_CHAIN: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];

/// Puts the hooks in front of the current allocators. A domain whose hooks are still in the
/// chain is left as it is: wrapping them again would make them call themselves.
///
/// # Safety
/// Call from one thread at a time (the agent's start path).
pub unsafe fn install(api: &Api) {
    let prev_table = &mut *PREV.0.get();
    for domain in [RAW, MEM, OBJ] {
        if IN_CHAIN[domain].load(Ordering::Relaxed) {
            continue;
        }
        let current = current_allocator(api, domain);
        prev_table[domain] = Some(current);
        (api.set_allocator)(domain as i32, &hooks_for(domain, current.ctx));
        IN_CHAIN[domain].store(true, Ordering::Relaxed);
    }
}

/// Restores the previous allocators where the hooks are still the installed ones. Where
/// another allocator was installed on top of them, the hooks stay in the chain, passing through.
///
/// # Safety
/// Call from one thread at a time (the agent's stop path).
pub unsafe fn uninstall(api: &Api) {
    let prev_table = &*PREV.0.get();
    for domain in [RAW, MEM, OBJ] {
        let Some(prev) = prev_table[domain] else {
            continue;
        };
        if is_ours(&current_allocator(api, domain), domain) {
            (api.set_allocator)(domain as i32, &prev);
            IN_CHAIN[domain].store(false, Ordering::Relaxed);
        }
    }
}
