//! The interpreter's allocator chain and mprof's place in it.
//!
//! The hooks wrap the allocators that were installed before them, and other code may wrap the
//! hooks in turn (`tracemalloc.start()`) or put back an allocator it saved before the hooks
//! arrived (`tracemalloc.stop()` after a `start()` made before the attach): the hooks then fall
//! out of the chain. A layer that may still be called from inside someone else's wrapper must
//! keep passing calls to the allocators it wrapped, which are therefore never rewritten; a new
//! session that finds the hooks gone installs another *layer* of the same hooks (const-generic
//! copies with their own saved allocators and countdowns). Only the active layer samples; the
//! others pass calls through.
//!
//! Frees left to pymalloc: when the MEM and OBJ domains a layer wraps are pymalloc itself, the
//! layer's MEM and OBJ `free` is pymalloc's own (no hook on the most frequent call there is). A
//! block the layer samples in those domains is then made a block pymalloc hands to the RAW
//! domain (at least [`SMALL_MAX`]` + 1` bytes, asked of pymalloc itself, which counts it as it
//! counts its other big blocks), so that its free reaches the RAW hook, which records it. So
//! does its realloc: pymalloc hands the realloc of a block not its own to the RAW domain, so
//! the layer's MEM and OBJ realloc hooks leave the "was it sampled?" check to the RAW hook.
//! Sampled small blocks grow to 513 bytes: at most `513 / rate` more memory, which is why this
//! is done only at rates of [`FREES_TO_PYMALLOC_MIN_RATE`] and above.

use crate::python::{Allocator, Api};
use crate::sampler::{self, ALWAYS_SLOW, IDLE_COUNTDOWN, LAYERS};
use std::cell::UnsafeCell;
use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicUsize, Ordering};

/// The RAW domain, called without the GIL (its countdowns are per thread); the interpreter's
/// numbers of its allocator domains (`PyMemAllocatorDomain`).
pub const RAW: usize = 0;
pub const MEM: usize = 1;
pub const OBJ: usize = 2;

/// pymalloc hands requests above this size to the RAW domain (3.8+).
pub const SMALL_MAX: usize = 512;
/// The lowest sampling rate at which MEM and OBJ frees are left to pymalloc: the sampled blocks'
/// growth then costs at most 1.6% more memory.
pub const FREES_TO_PYMALLOC_MIN_RATE: u64 = 32 << 10;

/// `ACTIVE` when no layer samples.
pub const NONE: usize = LAYERS;

/// An allocator's `free`.
pub type FreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

/// The hook functions of each layer and domain.
pub struct HookTable {
    /// The hooks (ctx unused: set at install time).
    pub hooks: [[Allocator; 3]; LAYERS],
    /// The MEM and OBJ hooks of a layer that wraps the allocators of its first installation
    /// (`Hot::first`, the usual case): they call those at a fixed address, three instructions
    /// where following the layer's pointer to them took five (see [`wrapped`]).
    pub over_first: [[Allocator; 2]; LAYERS],
    /// The frees of a session that samples every allocation, where every address passes the
    /// filter anyway (see [`Hot::every`]).
    pub free_every: [[FreeFn; 3]; LAYERS],
}

/// What a layer's MEM and OBJ hooks read at every call, in one block of two cache lines: the
/// countdown they share and the allocators they wrap. Spread over a table of pointers and
/// copies on the heap, that was three lines a call, which a program that clears big buffers
/// between its allocations (tornado's 64 KiB reads) finds evicted every time.
#[repr(C, align(128))]
pub struct Hot {
    /// The countdown of the MEM and OBJ domains (GIL held). Relaxed loads and stores only:
    /// plain moves on the hot path.
    pub countdown: AtomicI64,
    /// The allocator the layer wraps, per domain: never freed, published before the hooks can
    /// run and replaced only in a layer out of every chain.
    prev: [AtomicPtr<Allocator>; 3],
    /// Copies of the MEM and OBJ allocators the layer wraps, for its first installation. They
    /// are written once: an installation after that (the layer fell out of every chain and is
    /// taken again) leaks copies on the heap instead, so that a hook still running from before
    /// never reads a half-written one.
    first: [UnsafeCell<MaybeUninit<Allocator>>; 2],
    first_taken: AtomicBool,
    /// Whether the layer's MEM and OBJ frees are pymalloc's own (see the module's doc).
    frees_to_pymalloc: AtomicBool,
    /// Whether the layer's frees are `HookTable::free_every`: its session samples every
    /// allocation (`--rate 1`), so the filter would pass every free anyway.
    every: AtomicBool,
}

// SAFETY: `first` is written once, under the session lock, before the pointer to it is
// published (Release) in `prev`; afterwards only read.
unsafe impl Sync for Hot {}

const _: () = assert!(
    std::mem::size_of::<Hot>() == 128,
    "Hot fits its two cache lines"
);

/// Every layer's hot block.
pub static HOT: [Hot; LAYERS] = [const {
    Hot {
        countdown: AtomicI64::new(IDLE_COUNTDOWN),
        prev: [const { AtomicPtr::new(std::ptr::null_mut()) }; 3],
        first: [const { UnsafeCell::new(MaybeUninit::uninit()) }; 2],
        first_taken: AtomicBool::new(false),
        frees_to_pymalloc: AtomicBool::new(false),
        every: AtomicBool::new(false),
    }
}; LAYERS];

impl Hot {
    /// Where the allocators a new installation of this layer wraps are kept (see `first`).
    ///
    /// # Safety
    /// Under the session lock, with the layer in no chain.
    pub unsafe fn keep(&'static self, now: &[Allocator; 3]) -> [&'static Allocator; 3] {
        let leak = |a: &Allocator| -> &'static Allocator { Box::leak(Box::new(*a)) };
        if self.first_taken.swap(true, Ordering::Relaxed) {
            return [leak(&now[0]), leak(&now[1]), leak(&now[2])];
        }
        let [mem, obj] = &self.first;
        // SAFETY: the first copies are written here alone, once (`first_taken` was false),
        // under the session lock with the layer in no chain (contract): no hook reads them yet.
        unsafe {
            [
                leak(&now[0]),
                (*mem.get()).write(now[1]),
                (*obj.get()).write(now[2]),
            ]
        }
    }
}

/// The countdown of `layer`'s MEM and OBJ domains.
#[inline(always)]
pub fn gil_countdown(layer: usize) -> &'static AtomicI64 {
    &HOT[layer].countdown
}

/// Arms `layer`'s MEM and OBJ countdown for the session starting (see `sampler::gil_start`).
pub fn arm_countdown(layer: usize) {
    gil_countdown(layer).store(sampler::gil_start(), Ordering::Relaxed);
}

/// Arms the countdowns of `layer`, which takes over sampling within the running session.
pub fn arm_layer(layer: usize) {
    sampler::next_epoch();
    arm_countdown(layer);
}

/// Switches every countdown to idle.
pub fn idle() {
    sampler::next_epoch();
    for layer in 0..LAYERS {
        gil_countdown(layer).store(IDLE_COUNTDOWN, Ordering::Relaxed);
    }
}

/// The thread (by its thread pointer) inside a MEM or OBJ call that pymalloc may pass to the
/// RAW domain: the RAW hooks let that thread's calls through uncounted, as the outer hook
/// counted them (see `hooks::nested`). Only a thread holding the GIL sets it (MEM and OBJ need
/// the GIL), so a plain global does, and setting it costs no TLS lookup (the thread's busy
/// flag would); not with several GILs (see [`UNUSED`]).
pub static PASSING: AtomicUsize = AtomicUsize::new(0);

/// `PASSING` while the process has interpreters with GILs of their own: two threads may then
/// be inside MEM or OBJ calls at once, and one global cannot mark both. Every MEM and OBJ call
/// takes the slow path then, whose busy flag (thread-local) lets the nested RAW call through.
pub const UNUSED: usize = usize::MAX;

/// From now on `PASSING` is not used (see [`UNUSED`]). Stored again from the slow path (see
/// [`enter_several_gils`]): a call that was inside `hooks::nested` when it was first stored
/// puts back what it found.
fn leave_passing_unused() {
    if PASSING.load(Ordering::Relaxed) != UNUSED {
        PASSING.store(UNUSED, Ordering::Relaxed);
    }
}

/// From now on MEM and OBJ calls count down per thread: the sampling `layer`'s shared countdown
/// is held at [`ALWAYS_SLOW`] and `PASSING` is left unused. Called again from the slow path
/// of every MEM and OBJ call then, to undo another interpreter's thread storing over either:
/// only what changed is written.
pub fn enter_several_gils(layer: usize) {
    sampler::set_several_gils();
    if layer < LAYERS {
        gil_countdown(layer).store(ALWAYS_SLOW, Ordering::Relaxed);
    }
    leave_passing_unused();
}

/// Takes `size` bytes off `L`'s MEM and OBJ countdown (GIL held): false when they took it to
/// zero or below. On x86-64 one subtraction in memory at a fixed address and a branch on its
/// flags, where the compiler's load, subtraction, store and test took four instructions (the
/// MEM and OBJ hooks' fast path is little else). A thread's own countdowns stay plain Rust
/// (`sampler::take`): only the compiler can address them at the thread pointer.
#[inline(always)]
pub fn gil_take<const L: usize>(size: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the countdown is a word of `HOT`, written by the thread holding the GIL (and,
        // as a plain store, by the slow path: as the load and store this replaced were).
        unsafe {
            std::arch::asm!(
                "sub qword ptr [rip + {hot} + {at}], {size}",
                "jle {out}",
                hot = sym HOT,
                at = const L * std::mem::size_of::<Hot>() + std::mem::offset_of!(Hot, countdown),
                size = in(reg) size,
                out = label { return false },
                options(nostack),
            );
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let countdown = gil_countdown(L);
        let left = countdown.load(Ordering::Relaxed).wrapping_sub(size as i64);
        countdown.store(left, Ordering::Relaxed);
        left > 0
    }
}

/// Whether a layer may still be in a domain's chain: installed and not restored since.
static IN_CHAIN: [[AtomicBool; 3]; LAYERS] =
    [const { [const { AtomicBool::new(false) }; 3] }; LAYERS];
/// The layer that samples, or `NONE`.
static ACTIVE: AtomicUsize = AtomicUsize::new(NONE);
/// pymalloc's `malloc` and `free`, learnt when the interpreter first says its allocators are its
/// defaults; 0 while unknown.
static PYMALLOC: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// The allocator that `layer`'s hook of `domain` wraps, as the hook's kind reads it: with
/// `FIRST` (the MEM and OBJ hooks of `HookTable::over_first`) the layer's first copy, at an
/// address known when the agent is linked; otherwise through the layer's pointer.
#[inline(always)]
pub fn wrapped<const FIRST: bool>(layer: usize, domain: usize) -> &'static Allocator {
    if FIRST && domain != RAW {
        // SAFETY: these hooks are installed only over the first copy (`hook_over`), which is
        // written before that and never again (see `Hot::first`).
        return unsafe { (*HOT[layer].first[domain - 1].get()).assume_init_ref() };
    }
    prev(layer, domain)
}

/// The allocator that `layer`'s hook of `domain` wraps.
#[inline(always)]
pub fn prev(layer: usize, domain: usize) -> &'static Allocator {
    // SAFETY: set (to a copy never freed nor rewritten, in `HOT` or leaked) before the layer's
    // hooks were installed, so any call of those hooks sees a valid pointer.
    unsafe { &*HOT[layer].prev[domain].load(Ordering::Acquire) }
}

/// The layer that samples (`NONE` outside a session).
#[inline(always)]
pub fn active() -> usize {
    ACTIVE.load(Ordering::Relaxed)
}

/// The allocator installed now in `domain`.
///
/// # Safety
/// `domain` is 0 (RAW), 1 (MEM) or 2 (OBJ).
unsafe fn current(api: &Api, domain: usize) -> Allocator {
    let mut a = std::mem::MaybeUninit::<Allocator>::uninit();
    // SAFETY: `PyMem_GetAllocator` of a domain that exists (contract) fills `a`.
    unsafe { (api.get_allocator)(domain as i32, a.as_mut_ptr()) };
    // SAFETY: filled by the call just above.
    unsafe { a.assume_init() }
}

impl HookTable {
    /// The `malloc` of `layer`'s hook of `domain`, of both kinds (RAW's twice).
    fn mallocs(&self, layer: usize, domain: usize) -> [usize; 2] {
        let hook = self.hooks[layer][domain].malloc as usize;
        if domain == RAW {
            return [hook, hook];
        }
        [hook, self.over_first[layer][domain - 1].malloc as usize]
    }

    /// Whether `a` is `layer`'s hook of `domain` (either kind).
    pub fn is_hook(&self, layer: usize, domain: usize, a: &Allocator) -> bool {
        self.mallocs(layer, domain).contains(&(a.malloc as usize))
    }
}

/// Whether `layer`'s MEM and OBJ frees are pymalloc's own: its sampled blocks in those
/// domains must be made RAW blocks (see the module's doc).
#[inline]
pub fn frees_to_pymalloc(layer: usize) -> bool {
    layer < LAYERS && HOT[layer].frees_to_pymalloc.load(Ordering::Acquire)
}

/// Remembers pymalloc's functions if the current allocators are the interpreter's defaults.
///
/// # Safety
/// No condition of the caller's: it calls the interpreter's functions, each where it is
/// sound (see there).
unsafe fn learn_pymalloc(api: &Api, now: &[Allocator; 3]) {
    if PYMALLOC[0].load(Ordering::Relaxed) != 0 {
        return;
    }
    // SAFETY: `Py_IsInitialized` takes no argument and reads a runtime flag.
    let default = if api.minor == 12 && unsafe { (api.is_initialized)() } == 0 {
        // 3.12's `_PyMem_GetCurrentAllocatorName` takes a lock that the runtime may not have
        // made yet. Before initialization the allocators are the built-in defaults, whose
        // shape tells them apart: pymalloc is the same function set in MEM and OBJ with no
        // ctx, other than RAW's (the malloc defaults are RAW's, the debug ones have a ctx).
        let (raw, mem, obj) = (&now[0], &now[1], &now[2]);
        mem.ctx.is_null()
            && obj.ctx.is_null()
            && same_functions(mem, obj)
            && mem.malloc as usize != raw.malloc as usize
    } else {
        match api.allocator_name {
            Some(name) => {
                // SAFETY: `_PyMem_GetCurrentAllocatorName` takes no argument; the one version
                // whose lock may not exist yet (3.12 before initialization) took the branch
                // above.
                let name = unsafe { name() };
                // SAFETY: a non-null answer is a static NUL-terminated string.
                !name.is_null() && unsafe { CStr::from_ptr(name) } == c"pymalloc"
            }
            None => false,
        }
    };
    if default {
        PYMALLOC[1].store(now[2].free as usize, Ordering::Relaxed);
        PYMALLOC[0].store(now[2].malloc as usize, Ordering::Relaxed);
    }
}

fn same_functions(a: &Allocator, b: &Allocator) -> bool {
    a.malloc as usize == b.malloc as usize
        && a.calloc as usize == b.calloc as usize
        && a.realloc as usize == b.realloc as usize
        && a.free as usize == b.free as usize
}

/// Whether frees may be left to pymalloc over `wrapped` (a layer's MEM and OBJ allocators).
fn frees_may_go_to(fast_frees: bool, wrapped: [&Allocator; 2]) -> bool {
    fast_frees && wrapped.iter().all(|a| is_pymalloc(a))
}

fn is_pymalloc(a: &Allocator) -> bool {
    let malloc = PYMALLOC[0].load(Ordering::Relaxed);
    malloc != 0
        && a.malloc as usize == malloc
        && a.free as usize == PYMALLOC[1].load(Ordering::Relaxed)
}

/// The allocator that puts `layer`'s hook of `domain` in front of `prev`.
pub fn hook_over(table: &HookTable, layer: usize, domain: usize, prev: &Allocator) -> Allocator {
    let hot = &HOT[layer];
    let over_first =
        domain != RAW && std::ptr::eq(prev, hot.first[domain - 1].get().cast::<Allocator>());
    let hooks = if over_first {
        &table.over_first[layer][domain - 1]
    } else {
        &table.hooks[layer][domain]
    };
    let free = if domain != RAW && hot.frees_to_pymalloc.load(Ordering::Relaxed) {
        prev.free
    } else if hot.every.load(Ordering::Relaxed) {
        table.free_every[layer][domain]
    } else {
        hooks.free
    };
    Allocator {
        ctx: prev.ctx,
        free,
        ..*hooks
    }
}

/// Puts a layer of hooks in front of the current allocators and makes it the sampling one.
/// Reuses a layer that is still installed in every domain (a session that stopped without
/// restoring, or a re-attach); otherwise takes a layer that is in no chain. The session's
/// `rate` says how the layer frees: at [`FREES_TO_PYMALLOC_MIN_RATE`] and above MEM and OBJ
/// frees are left to pymalloc if those domains are pymalloc (see the module's doc); at 1 every
/// free is `HookTable::free_every`.
///
/// # Safety
/// Call with the session lock held (one caller at a time).
pub unsafe fn install(api: &Api, table: &HookTable, rate: u64) -> Result<usize, &'static str> {
    let fast_frees = rate >= FREES_TO_PYMALLOC_MIN_RATE;
    let every = rate <= 1;
    // SAFETY: the three domains.
    let now: [Allocator; 3] = unsafe { [current(api, 0), current(api, 1), current(api, 2)] };
    // SAFETY: `learn_pymalloc` asks nothing of its caller.
    unsafe { learn_pymalloc(api, &now) };
    let found = (0..LAYERS).find(|&l| (0..3).all(|d| table.is_hook(l, d, &now[d])));
    if let Some(layer) = found {
        let hot = &HOT[layer];
        let bypass = frees_may_go_to(fast_frees, [prev(layer, 1), prev(layer, 2)]);
        let every_changed = every != hot.every.load(Ordering::Relaxed);
        if bypass != hot.frees_to_pymalloc.load(Ordering::Relaxed) || every_changed {
            // The layer's hooks are the current allocators: swap their frees (RAW's too when
            // they are to be the other kind).
            hot.frees_to_pymalloc.store(bypass, Ordering::Release);
            hot.every.store(every, Ordering::Release);
            for d in if every_changed { 0 } else { 1 }..3 {
                // SAFETY: `PyMem_SetAllocator` copies the struct; its functions (the layer's
                // hooks, the allocator they wrap) live as long as the process, and the hooks
                // find the allocator they wrap in `HOT`, set at the layer's installation.
                unsafe {
                    (api.set_allocator)(d as i32, &hook_over(table, layer, d, prev(layer, d)))
                };
            }
        }
        ACTIVE.store(layer, Ordering::Release);
        return Ok(layer);
    }
    let layer = (0..LAYERS)
        .find(|&l| (0..3).all(|d| !IN_CHAIN[l][d].load(Ordering::Relaxed)))
        .ok_or(
            "the program replaced mprof's allocator hooks too many times (tracemalloc.stop()?); \
             restart it to profile it again",
        )?;
    let bypass = frees_may_go_to(fast_frees, [&now[1], &now[2]]);
    HOT[layer]
        .frees_to_pymalloc
        .store(bypass, Ordering::Release);
    HOT[layer].every.store(every, Ordering::Release);
    // SAFETY: under the session lock (contract), and the layer is in no chain (found so).
    let kept = unsafe { HOT[layer].keep(&now) };
    for (d, prev) in kept.into_iter().enumerate() {
        HOT[layer].prev[d].store(
            prev as *const Allocator as *mut Allocator,
            Ordering::Release,
        );
        // SAFETY: `PyMem_SetAllocator` copies the struct; its functions (the layer's hooks,
        // the allocator they wrap) live as long as the process, and the hooks find the
        // allocator they wrap in `HOT`, stored just above.
        unsafe { (api.set_allocator)(d as i32, &hook_over(table, layer, d, prev)) };
        IN_CHAIN[layer][d].store(true, Ordering::Relaxed);
    }
    ACTIVE.store(layer, Ordering::Release);
    Ok(layer)
}

/// Whether every domain's chain still calls the sampling layer's hooks (they are the current
/// allocators, or behind a wrapper that keeps them).
///
/// # Safety
/// Call with the session lock held.
pub unsafe fn still_reached(api: &Api, table: &HookTable) -> bool {
    let layer = active();
    if layer == NONE {
        return true;
    }
    (0..3).all(|d| {
        // SAFETY: one of the three domains.
        let now = unsafe { current(api, d) };
        table.is_hook(layer, d, &now) || reaches(&now, table.mallocs(layer, d))
    })
}

/// The domains whose chain no longer reaches the sampling layer, found when it is uninstalled.
#[derive(Clone, Copy, Default)]
pub struct Lost {
    pub domains: [bool; 3],
}

impl Lost {
    pub fn any(&self) -> bool {
        self.domains.iter().any(|&d| d)
    }
}

/// Stops the sampling layer and restores the allocators it wrapped where its hooks are still
/// the installed ones. Where another allocator was installed on top, the layer stays in the
/// chain, passing calls through; where the chain no longer reaches it, the hooks were lost
/// during the session, which the result reports.
///
/// # Safety
/// Call with the session lock held.
pub unsafe fn uninstall(api: &Api, table: &HookTable) -> Lost {
    let layer = ACTIVE.swap(NONE, Ordering::AcqRel);
    let mut lost = Lost::default();
    if layer == NONE {
        return lost;
    }
    for (d, in_chain) in IN_CHAIN[layer].iter().enumerate() {
        // SAFETY: one of the three domains.
        let now = unsafe { current(api, d) };
        if table.is_hook(layer, d, &now) {
            // SAFETY: `PyMem_SetAllocator` copies the struct: the allocator the layer's hook
            // wrapped, whose functions the blocks it made still need, and which is as it was.
            unsafe { (api.set_allocator)(d as i32, prev(layer, d)) };
            in_chain.store(false, Ordering::Relaxed);
        } else {
            lost.domains[d] = !reaches(&now, table.mallocs(layer, d));
        }
    }
    lost
}

/// Whether the chain that starts at `top` still calls the hook whose `malloc` is one of
/// `targets`, as far as can be told: PEP 445 wrappers (tracemalloc, the debug hooks) keep the
/// allocator they wrap in or behind their `ctx`. Memory is read with `process_vm_readv`, which
/// fails instead of faulting.
fn reaches(top: &Allocator, targets: [usize; 2]) -> bool {
    let mut ctx = top.ctx as usize;
    for _ in 0..4 {
        if ctx == 0 {
            return false;
        }
        let mut words = [0usize; 16];
        if !crate::sys::read_own(ctx, &mut words) {
            return false;
        }
        if words.iter().any(|w| targets.contains(w)) {
            return true;
        }
        // `{ctx, malloc, ...}` at the start (tracemalloc) or after a one-character word (the
        // debug hooks' `{api_id, alloc}`): follow the wrapped allocator's own ctx.
        ctx = if words[0] < 4096 { words[1] } else { words[0] };
    }
    false
}
