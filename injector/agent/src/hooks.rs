//! The PEP 445 allocator hooks for the RAW, MEM and OBJ domains: the fast path.
//!
//! Each hook wraps the allocator that was installed before it (so blocks allocated before the
//! agent arrived are freed by their own allocator) and ignores its `ctx` argument: the pair
//! {function, ctx} can be read torn by another thread while it is being swapped, so the hooks
//! always use the allocator `chain` saved for them. There are `sampler::LAYERS` copies of every
//! hook (const-generic `L`), each with its own saved allocator and countdowns.
//!
//! The fast path of an allocation is one subtraction and compare; of a free, one hash and one
//! byte load (see `addrset`). Everything else is in `sampling`.
//!
//! The hooks are called by the interpreter alone, as domain `D`'s allocator functions (and
//! only with the GIL held in MEM and OBJ): a pointer they are given is NULL or a block of that
//! domain's chain, which is what the allocator a hook passes it to (the one its layer wraps)
//! requires, and they run on the allocating thread, as a sample requires
//! (`sampling::sampled_alloc`).

use crate::addrset::maybe_sampled;
use crate::chain::{self, FreeFn, HookTable, MEM, OBJ, PASSING, RAW, SMALL_MAX, UNUSED};
use crate::python::Allocator;
use crate::sampler::{self, LAYERS, THREAD};
use crate::sampling;
use crate::sys;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// Calls `f` with the thread marked as passing a call to RAW, so the RAW hooks let it through
/// (see `chain::PASSING`).
#[inline(always)]
fn nested<T>(f: impl FnOnce() -> T) -> T {
    let was = PASSING.load(Ordering::Relaxed);
    if was == UNUSED {
        return f();
    }
    PASSING.store(sys::thread_pointer(), Ordering::Relaxed);
    let r = f();
    PASSING.store(was, Ordering::Relaxed);
    r
}

/// Whether this RAW call comes from pymalloc under a MEM or OBJ hook (see `chain::PASSING`).
#[inline(always)]
fn passed_from_above() -> bool {
    PASSING.load(Ordering::Relaxed) == sys::thread_pointer()
}

/// pymalloc hands requests above `SMALL_MAX` to PyMem_RawMalloc: the nested RAW call must not
/// be counted twice.
#[inline(always)]
fn passes_to_raw(domain: usize, size: usize) -> bool {
    domain != RAW && size > SMALL_MAX
}

/// The fast path of every allocation: counts the bytes down; false when the countdown ran out
/// (or the thread is busy in the agent, for RAW) and the slow path must decide.
#[inline(always)]
fn count_down<const D: usize, const L: usize>(size: usize) -> bool {
    if D == RAW {
        if passed_from_above() {
            return true;
        }
        return THREAD.with(|t| t.busy.get() || sampler::take(&t.countdown[L], size));
    }
    chain::gil_take::<L>(size)
}

/// A MEM or OBJ call that pymalloc will pass to RAW, guarded (see `chain::PASSING`). Out of line, with
/// the arguments by value: inlined, the call it makes (not a tail call) made every call of the
/// hook save a register, the small ones' too.
///
/// # Safety
/// `p` is the allocator the calling hook wraps; the hook's own arguments.
#[inline(never)]
unsafe fn malloc_passed(p: &Allocator, size: usize) -> *mut c_void {
    // SAFETY: the hook's call, passed on to the allocator it wraps (contract).
    nested(|| unsafe { (p.malloc)(p.ctx, size) })
}

/// [`malloc_passed`] for calloc.
///
/// # Safety
/// As for [`malloc_passed`].
#[inline(never)]
unsafe fn calloc_passed(p: &Allocator, nelem: usize, elsize: usize) -> *mut c_void {
    // SAFETY: the hook's call, passed on to the allocator it wraps (contract).
    nested(|| unsafe { (p.calloc)(p.ctx, nelem, elsize) })
}

unsafe extern "C" fn hook_malloc<const D: usize, const L: usize, const F: bool>(
    _ctx: *mut c_void,
    size: usize,
) -> *mut c_void {
    if count_down::<D, L>(size) {
        let p = chain::wrapped::<F>(L, D);
        if passes_to_raw(D, size) {
            // SAFETY: the allocator this hook wraps, with the interpreter's arguments.
            return unsafe { malloc_passed(p, size) };
        }
        // SAFETY: the interpreter's call, passed on to the allocator this hook wraps.
        return unsafe { (p.malloc)(p.ctx, size) };
    }
    // SAFETY: from this hook, on the allocating thread (see the module's doc).
    unsafe { slow_malloc::<D, L>(size) }
}

/// The slow path of malloc.
///
/// # Safety
/// From `hook_malloc::<D, L, _>`, with its argument.
#[cold]
#[inline(never)]
unsafe fn slow_malloc<const D: usize, const L: usize>(size: usize) -> *mut c_void {
    let p = chain::prev(L, D);
    // SAFETY: from a hook on the allocating thread (contract); the call asks the allocator
    // the layer wraps for `n` bytes, the hook's size or (a sampled block made bigger, see
    // `chain`) more.
    unsafe { sampling::sampled_alloc(D, L, size, |n| (p.malloc)(p.ctx, n)) }
}

unsafe extern "C" fn hook_calloc<const D: usize, const L: usize, const F: bool>(
    _ctx: *mut c_void,
    nelem: usize,
    elsize: usize,
) -> *mut c_void {
    let size = nelem.saturating_mul(elsize);
    let p = chain::wrapped::<F>(L, D);
    if count_down::<D, L>(size) {
        if passes_to_raw(D, size) {
            // SAFETY: the allocator this hook wraps, with the interpreter's arguments.
            return unsafe { calloc_passed(p, nelem, elsize) };
        }
        // SAFETY: the interpreter's call, passed on to the allocator this hook wraps.
        return unsafe { (p.calloc)(p.ctx, nelem, elsize) };
    }
    // SAFETY: from this hook, on the allocating thread (see the module's doc).
    unsafe { slow_calloc::<D, L>(nelem, elsize, size) }
}

/// The slow path of calloc, out of line as [`slow_malloc`] is: inlined, the closure's captures
/// went to the stack on every call.
///
/// # Safety
/// From `hook_calloc::<D, L, _>`, with its arguments (`size` their product, saturated).
#[cold]
#[inline(never)]
unsafe fn slow_calloc<const D: usize, const L: usize>(
    nelem: usize,
    elsize: usize,
    size: usize,
) -> *mut c_void {
    let p = chain::prev(L, D);
    // SAFETY: from a hook on the allocating thread (contract); the call is the hook's calloc
    // passed on to the allocator the layer wraps, or a malloc of `n > size` bytes from it of
    // which the first `size` are cleared.
    unsafe {
        sampling::sampled_alloc(D, L, size, |n| {
            if n == size {
                return (p.calloc)(p.ctx, nelem, elsize);
            }
            // A sampled small block made bigger (see `chain`): asked as a malloc and the caller's
            // `size` bytes cleared here. The C library's calloc takes no block from its per-thread
            // cache, so it would find one the slow way and leave the cache to fill with the ones
            // these samples free (about 350 instructions a sample on a calloc-heavy loop).
            let ptr = (p.malloc)(p.ctx, n);
            if !ptr.is_null() {
                ptr.cast::<u8>().write_bytes(0, size);
            }
            ptr
        })
    }
}

unsafe extern "C" fn hook_realloc<const D: usize, const L: usize, const F: bool>(
    _ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    let p = chain::wrapped::<F>(L, D);
    // A realloc may move a block between pymalloc and the RAW domain whatever its size.
    let call = |n| {
        if D == RAW {
            // SAFETY: the interpreter's realloc of `ptr`, a block of this domain's chain (or
            // NULL), passed on to the allocator this hook wraps.
            unsafe { (p.realloc)(p.ctx, ptr, n) }
        } else {
            // SAFETY: as above.
            nested(|| unsafe { (p.realloc)(p.ctx, ptr, n) })
        }
    };
    if D == RAW && passed_from_above() {
        // Counted by the MEM or OBJ hook above. A block that layer sampled may be this one
        // (see `may_hold_sampled`): its free is recorded here.
        if maybe_sampled(ptr as usize) {
            // SAFETY: from this hook, on the reallocating thread (see the module's doc).
            return unsafe { sampling::sampled_realloc(D, L, ptr as usize, size, false, call) };
        }
        return call(size);
    }
    let ran_out = !count_down::<D, L>(size);
    if ran_out || (may_hold_sampled::<D, L>() && maybe_sampled(ptr as usize)) {
        // SAFETY: from this hook, on the reallocating thread (see the module's doc).
        return unsafe { sampling::sampled_realloc(D, L, ptr as usize, size, ran_out, call) };
    }
    call(size)
}

/// Whether a block this layer's hook of `D` sees may be one it sampled. Not in MEM or OBJ when
/// their frees are pymalloc's own: the blocks sampled there are made RAW blocks (see `chain`),
/// which pymalloc's realloc hands to the RAW domain, whose hook looks them up. The filter's
/// summary is read at a random place for every address, a miss on most reallocs of a program
/// that clears big buffers between them (a fifth of the hooks' time in a tornado server).
#[inline(always)]
fn may_hold_sampled<const D: usize, const L: usize>() -> bool {
    D == RAW || !chain::frees_to_pymalloc(L)
}

unsafe extern "C" fn hook_free<const D: usize, const L: usize, const F: bool>(
    _ctx: *mut c_void,
    ptr: *mut c_void,
) {
    if D == RAW && escape::owns(ptr) {
        // SAFETY: `ptr` is the escaped block (`owns`).
        return unsafe { escape::free(ptr) };
    }
    // No NULL test: NULL was never sampled, so it passes the filter only on a rare collision,
    // and the exact set then says no.
    if maybe_sampled(ptr as usize) {
        // SAFETY: this hook's argument (see the module's doc).
        return unsafe { slow_free::<D, L>(ptr) };
    }
    let p = chain::wrapped::<F>(L, D);
    // SAFETY: the interpreter's free of a block of this domain's chain, passed on to the
    // allocator this hook wraps.
    unsafe { (p.free)(p.ctx, ptr) }
}

/// [`hook_free`] of a session that samples every allocation (`--rate 1`): every address
/// passes the filter then (`AddrSet::hold_everything`), so the free goes to the slow path
/// without reading it, after one flag that says so (a layer left in a chain after such a
/// session reads the filter again).
unsafe extern "C" fn hook_free_every<const D: usize, const L: usize>(
    ctx: *mut c_void,
    ptr: *mut c_void,
) {
    if !crate::addrset::holds_everything() {
        // SAFETY: the same call, to the layer's plain free hook (see the module's doc).
        return unsafe { hook_free::<D, L, false>(ctx, ptr) };
    }
    if D == RAW && escape::owns(ptr) {
        // SAFETY: `ptr` is the escaped block (`owns`).
        return unsafe { escape::free(ptr) };
    }
    // SAFETY: this hook's argument (see the module's doc).
    unsafe { slow_free::<D, L>(ptr) }
}

/// A free whose address passed the filter. Out of line, with the release in it too, so that
/// the fast path above keeps nothing across a call and saves no register; the common case
/// calls nothing either (`sampling::sampled_free_here`), and saves none.
///
/// # Safety
/// `ptr` is the argument of a call of layer `L`'s free hook of `D`.
#[cold]
#[inline(never)]
unsafe fn slow_free<const D: usize, const L: usize>(ptr: *mut c_void) {
    // Recorded before the block is released: once released, its address can be sampled
    // again by another thread, and that record must come after this one.
    if !sampling::sampled_free_here(ptr as usize) {
        // SAFETY: this function's contract.
        return unsafe { slow_free_rest::<D, L>(ptr) };
    }
    let p = chain::prev(L, D);
    // SAFETY: the hook's free of a block of this domain's chain (contract), passed on to the
    // allocator the layer wraps.
    unsafe { (p.free)(p.ctx, ptr) }
}

/// [`slow_free`] when its common case did not apply.
///
/// # Safety
/// As for [`slow_free`].
#[cold]
#[inline(never)]
unsafe fn slow_free_rest<const D: usize, const L: usize>(ptr: *mut c_void) {
    sampling::sampled_free(ptr as usize);
    let p = chain::prev(L, D);
    // SAFETY: the hook's free of a block of this domain's chain (contract), passed on to the
    // allocator the layer wraps.
    unsafe { (p.free)(p.ctx, ptr) }
}

/// The one RAW block the agent makes the interpreter allocate before it sets up its own
/// allocators (the entry of the agent's audit hook, see `watch_allocator_setup` in lib.rs):
/// freed with the allocator that made it, whatever the interpreter installed meanwhile.
pub mod escape {
    use crate::python::{Allocator, Api};
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

    /// The block, 0 if none.
    static BLOCK: AtomicUsize = AtomicUsize::new(0);
    /// The RAW allocator that made it (leaked: it must outlive every call).
    static MAKER: AtomicPtr<Allocator> = AtomicPtr::new(std::ptr::null_mut());

    /// The block's address, 0 if none (or freed).
    pub fn block() -> usize {
        BLOCK.load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub fn owns(ptr: *mut c_void) -> bool {
        ptr as usize == BLOCK.load(Ordering::Relaxed) && !ptr.is_null()
    }

    fn maker() -> &'static Allocator {
        // SAFETY: set (to a leaked Allocator) before any of these functions can run.
        unsafe { &*MAKER.load(Ordering::Acquire) }
    }

    /// Frees the block with the allocator that made it.
    ///
    /// # Safety
    /// `ptr` is the block (`owns(ptr)`).
    pub unsafe fn free(ptr: *mut c_void) {
        BLOCK.store(0, Ordering::Relaxed);
        // SAFETY: the block (contract), which the maker allocated; freed once (`BLOCK` is
        // cleared, so no hook owns it again).
        unsafe { (maker().free)(maker().ctx, ptr) }
    }

    // The capture allocator's functions, called by the interpreter as the RAW domain's while
    // `capture_raw` has it installed: each passes its call on to the maker, the RAW allocator
    // it replaced, which made every block they are given.

    unsafe extern "C" fn capture_malloc(_ctx: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: the interpreter's RAW call, passed on to the maker.
        let p = unsafe { (maker().malloc)(maker().ctx, size) };
        BLOCK.store(p as usize, Ordering::Relaxed);
        p
    }

    unsafe extern "C" fn pass_calloc(_ctx: *mut c_void, n: usize, size: usize) -> *mut c_void {
        // SAFETY: the interpreter's RAW call, passed on to the maker.
        unsafe { (maker().calloc)(maker().ctx, n, size) }
    }

    unsafe extern "C" fn pass_realloc(_: *mut c_void, p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: the interpreter's RAW call, passed on to the maker.
        unsafe { (maker().realloc)(maker().ctx, p, size) }
    }

    unsafe extern "C" fn pass_free(_ctx: *mut c_void, p: *mut c_void) {
        // SAFETY: the interpreter's RAW call, passed on to the maker.
        unsafe { (maker().free)(maker().ctx, p) }
    }

    /// Runs `f` with the RAW allocator swapped for one that remembers the block `f` makes.
    ///
    /// # Safety
    /// No other thread may use the RAW allocator meanwhile (call it from the constructor).
    pub unsafe fn capture_raw(api: &Api, f: impl FnOnce()) {
        let mut current = std::mem::MaybeUninit::<Allocator>::uninit();
        // SAFETY: `PyMem_GetAllocator` of the RAW domain fills `current`.
        unsafe { (api.get_allocator)(0, current.as_mut_ptr()) };
        // SAFETY: filled just above.
        let made: &'static mut Allocator = Box::leak(Box::new(unsafe { current.assume_init() }));
        MAKER.store(made, Ordering::Release);
        let capture = Allocator {
            ctx: std::ptr::null_mut(),
            malloc: capture_malloc,
            calloc: pass_calloc,
            realloc: pass_realloc,
            free: pass_free,
        };
        // SAFETY: no other thread uses the RAW allocator meanwhile (contract), so none is in
        // a call of the one replaced; the capture's functions pass every call on to it (the
        // maker, stored above).
        unsafe { (api.set_allocator)(0, &capture) };
        f();
        // SAFETY: the RAW allocator as it was: the blocks made meanwhile are its own.
        unsafe { (api.set_allocator)(0, maker()) };
    }
}

/// `F`: the kind that wraps the layer's first copy (see `chain::wrapped`).
const fn hooks<const D: usize, const L: usize, const F: bool>() -> Allocator {
    Allocator {
        ctx: std::ptr::null_mut(),
        malloc: hook_malloc::<D, L, F>,
        calloc: hook_calloc::<D, L, F>,
        realloc: hook_realloc::<D, L, F>,
        free: hook_free::<D, L, F>,
    }
}

const fn layer<const L: usize>() -> [Allocator; 3] {
    [
        hooks::<RAW, L, false>(),
        hooks::<MEM, L, false>(),
        hooks::<OBJ, L, false>(),
    ]
}

const fn over_first<const L: usize>() -> [Allocator; 2] {
    [hooks::<MEM, L, true>(), hooks::<OBJ, L, true>()]
}

const fn frees_every<const L: usize>() -> [FreeFn; 3] {
    [
        hook_free_every::<RAW, L>,
        hook_free_every::<MEM, L>,
        hook_free_every::<OBJ, L>,
    ]
}

/// Every hook, by layer and domain.
pub static TABLE: HookTable = HookTable {
    hooks: [layer::<0>(), layer::<1>(), layer::<2>(), layer::<3>()],
    over_first: [
        over_first::<0>(),
        over_first::<1>(),
        over_first::<2>(),
        over_first::<3>(),
    ],
    free_every: [
        frees_every::<0>(),
        frees_every::<1>(),
        frees_every::<2>(),
        frees_every::<3>(),
    ],
};

const _: () = assert!(LAYERS == 4, "TABLE lists one entry per layer");

#[cfg(test)]
mod tests {
    use super::TABLE;
    use crate::chain::{hook_over, wrapped, HOT, RAW};
    use crate::sampler::LAYERS;

    /// `chain` puts a layer's hooks over the allocators it wraps: over the layer's first copies
    /// of them, the kind of this table's hooks that reads those copies in place.
    #[test]
    fn hooks_over_the_first_copies_are_the_kind_that_reads_them_in_place() {
        // The last layer, which no other test installs. Its first installation keeps the MEM
        // and OBJ allocators in `Hot::first`; any later one in copies of its own.
        let layer = LAYERS - 1;
        let now = [TABLE.hooks[0][0], TABLE.hooks[0][1], TABLE.hooks[0][2]];
        // SAFETY: the layer is in no chain, and no other test touches it.
        let first = unsafe { HOT[layer].keep(&now) };
        // SAFETY: as above.
        let again = unsafe { HOT[layer].keep(&now) };
        for d in 0..3 {
            let over = hook_over(&TABLE, layer, d, first[d]);
            let expected = if d == RAW {
                &TABLE.hooks[layer][d]
            } else {
                assert!(std::ptr::eq(wrapped::<true>(layer, d), first[d]));
                &TABLE.over_first[layer][d - 1]
            };
            assert_eq!(over.malloc as usize, expected.malloc as usize, "domain {d}");
            assert_eq!(
                over.realloc as usize, expected.realloc as usize,
                "domain {d}"
            );
            assert!(TABLE.is_hook(layer, d, &over));
            assert!(!TABLE.is_hook(0, d, &over));
            // Copies elsewhere are wrapped by the hooks that follow the layer's pointer.
            let later = hook_over(&TABLE, layer, d, again[d]);
            assert_eq!(later.malloc as usize, TABLE.hooks[layer][d].malloc as usize);
            assert!(TABLE.is_hook(layer, d, &later));
        }
    }
}
