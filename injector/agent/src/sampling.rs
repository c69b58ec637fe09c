//! The slow path of the hooks: an allocation whose countdown ran out is sampled (its stack
//! walked, a record written), and a free whose address passed the filter is recorded if the
//! block was sampled. Runs under the session lock (`lifecycle::SESSION`); notices there when
//! the session must end.

use crate::chain::{self, MEM, OBJ, RAW};
use crate::cycles::{self, Part};
use crate::lifecycle::{self, Session, ENABLED, SESSION};
use crate::python::{Api, ThisThread};
use crate::sample_stack::{Announcer, Stack};
use crate::sampler::{self, ThreadState, EPOCH, IDLE_COUNTDOWN, THREAD};
use crate::sys;
use mprof_common::layout::PyLayout;
use mprof_common::record::threads;
use mprof_common::record::{
    Allocator, ALLOC_NATIVE_STACK, ALLOC_TRUNCATED, KIND_FREE, MAX_NATIVE_FRAMES,
};
use mprof_common::ring::Ring;
use mprof_common::stacks::{
    brief_aux, write_brief, write_context, write_sample, Sample, BRIEF_BODY, CONTEXT_BODY,
    KIND_BRIEF, KIND_CONTEXT, KIND_SAMPLE, SAMPLE_FIXED,
};
use std::ffi::c_void;
use std::hint::cold_path;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

// The domains a sample comes from: the interpreter's three (`chain::RAW`, `MEM`, `OBJ`), then
// the agent's own two.
/// The C allocator family and anonymous `mmap`, seen through the GOT hooks (`native`): any
/// thread, any moment; one per-thread countdown for both.
pub const NATIVE: usize = 3;
pub const MMAP: usize = 4;

/// The allocator an allocation of `domain` is recorded as.
fn allocator_of(domain: usize) -> Allocator {
    match domain {
        NATIVE => Allocator::Native,
        MMAP => Allocator::Mmap,
        _ => Allocator::Python,
    }
}

/// How many bytes to ask of the allocator for a block of `size` bytes that is sampled (`sample`)
/// or not: a sampled MEM or OBJ block of a layer whose frees are pymalloc's is made big enough
/// for pymalloc to hand it to the RAW domain, where its free is seen (see `chain`).
#[inline]
fn asked(domain: usize, layer: usize, size: usize, sample: bool) -> usize {
    if sample && (domain == MEM || domain == OBJ) && chain::frees_to_pymalloc(layer) {
        size.max(chain::SMALL_MAX + 1)
    } else {
        size
    }
}

/// Slow path of an allocation whose countdown ran out: allocate (`call` with the size to ask
/// for), then record the sample. Inlined into the hooks' own out-of-line slow paths (each
/// has a closure of its own, so a copy of this each either way): called, the closure's
/// captures went through memory.
///
/// # Safety
/// From one of the agent's allocator hooks, on the thread that allocates: a sample walks that
/// thread's own Python frames with plain loads (`sample_stack`), which only that thread
/// changes, and it is inside this call.
#[inline(always)]
pub unsafe fn sampled_alloc(
    domain: usize,
    layer: usize,
    size: usize,
    call: impl FnOnce(usize) -> *mut c_void,
) -> *mut c_void {
    THREAD.with(|t| {
        let start = cycles::now();
        let was_busy = t.busy.replace(true);
        let sample = !was_busy && decide(domain, layer, t, size);
        let ptr = call(asked(domain, layer, size, sample));
        if sample && !ptr.is_null() {
            cycles::add(Part::AllocCall, start);
            let start = cycles::now();
            let mut native = [const { MaybeUninit::<u64>::uninit() }; MAX_NATIVE_FRAMES];
            let native = native_stack(t, &mut native);
            // SAFETY: on the allocating thread, from its hook (contract).
            unsafe { record_alloc(t, ptr as usize, size, allocator_of(domain), native) };
            cycles::add(Part::AllocRecord, start);
        }
        t.busy.set(was_busy);
        ptr
    })
}

/// The native stack of this sample (`--native`), unwound before the session lock is taken.
/// Inlined, so that a sample without `--native` pays for the test only: the unwind saves
/// every register and reserves a few KiB of stack, out of line.
#[inline(always)]
fn native_stack<'a>(t: &ThreadState, out: &'a mut [MaybeUninit<u64>]) -> &'a [u64] {
    let n = if crate::unwind::on() {
        crate::unwind::unwind(out, &t.stack)
    } else {
        0
    };
    // SAFETY: `unwind` wrote the first `n`.
    unsafe { std::slice::from_raw_parts(out.as_ptr().cast(), n) }
}

/// Whether this allocation, whose countdown in `layer` ran out, is sampled; re-arms the
/// countdown. Only the active layer samples: the others go idle. Inlined into each slow
/// path: called, it was fifteen instructions more a sample at `--rate 1`.
#[inline(always)]
fn decide(domain: usize, layer: usize, t: &ThreadState, size: usize) -> bool {
    if domain >= NATIVE {
        let enabled = ENABLED.load(Ordering::Acquire) && lifecycle::native_on();
        return decide_per_thread(enabled, &t.native_countdown, &t.native_epoch, size);
    }
    let enabled = ENABLED.load(Ordering::Acquire) && chain::active() == layer;
    if domain != RAW && enabled && sampler::several_gils() {
        // Another interpreter's thread may have stored over the shared countdown: held down
        // again, and this thread's own countdown decides (see `sampler`).
        chain::enter_several_gils(layer);
        let (countdown, drawn_in) = (&t.countdown[layer], &t.epoch[layer]);
        if drawn_in.get() == EPOCH.load(Ordering::Relaxed) {
            let c = countdown.get() - size as i64;
            if c > 0 {
                countdown.set(c);
                return false;
            }
        }
        return decide_per_thread(true, countdown, drawn_in, size);
    }
    if domain != RAW {
        let next = if enabled {
            sampler::draw()
        } else {
            IDLE_COUNTDOWN
        };
        chain::gil_countdown(layer).store(next, Ordering::Relaxed);
        return enabled;
    }
    decide_per_thread(enabled, &t.countdown[layer], &t.epoch[layer], size)
}

/// `decide` for a per-thread countdown (RAW, native).
fn decide_per_thread(
    enabled: bool,
    countdown: &std::cell::Cell<i64>,
    drawn_in: &std::cell::Cell<u32>,
    size: usize,
) -> bool {
    if !enabled {
        countdown.set(IDLE_COUNTDOWN);
        return false;
    }
    let epoch = EPOCH.load(Ordering::Relaxed);
    if drawn_in.get() != epoch {
        // This thread's first allocation of the kind in this session: its countdown starts
        // here.
        drawn_in.set(epoch);
        let c = sampler::draw() - size as i64;
        if c > 0 {
            countdown.set(c);
            return false;
        }
    }
    countdown.set(sampler::draw());
    true
}

/// The thread's kernel id, and with it whether it may read the time-stamp counter: asked of
/// the kernel at its first sample (and again in a forked child).
pub(crate) fn tid(t: &ThreadState) -> u32 {
    if t.tid.get() == 0 {
        t.tid.set(sys::gettid());
        t.tsc.set(sys::tsc_allowed());
    }
    t.tid.get()
}

/// Records a sampled block, unless this thread holds the session lock already.
///
/// # Safety
/// As for [`sampled_alloc`].
unsafe fn record_alloc(
    t: &ThreadState,
    addr: usize,
    size: usize,
    allocator: Allocator,
    native: &[u64],
) {
    // Not when this thread holds the lock already (a fork handler allocating between the
    // agent's and the fork): the block goes unsampled, its free unrecorded.
    if let Some(mut shared) = SESSION.lock_unless_mine() {
        let block = Sampled {
            t,
            addr,
            size,
            allocator,
            native,
        };
        // SAFETY: on the allocating thread, from its hook (contract).
        unsafe { record_alloc_locked(&mut shared, block) }
    }
}

/// Slow path of a realloc that may free a sampled block, or whose countdown ran out. `call`
/// reallocates to the size it is given, with no lock of the agent's held (the real allocator
/// never runs under one: see `locks`). A sampled old block is taken out of the set and noted
/// as moving (`lifecycle::Moving`) before the call; after it, its FREE is written if the
/// realloc released it, and it goes back into the set if the realloc failed (the block is
/// live as it was). Should another thread sample an allocation at its address meanwhile (the
/// realloc released it), that thread writes the FREE first, so the records keep their order.
///
/// # Safety
/// As for [`sampled_alloc`].
#[cold]
#[inline(never)]
pub unsafe fn sampled_realloc(
    domain: usize,
    layer: usize,
    old: usize,
    size: usize,
    countdown_ran_out: bool,
    call: impl FnOnce(usize) -> *mut c_void,
) -> *mut c_void {
    THREAD.with(|t| {
        let was_busy = t.busy.replace(true);
        // Inside the agent, or on the thread that holds the lock (a fork handler between the
        // agent's and the fork): passed through, unrecorded.
        if was_busy || SESSION.held_by_me() {
            let ptr = call(size);
            t.busy.set(was_busy);
            return ptr;
        }
        let start = cycles::now();
        let sample = countdown_ran_out && decide(domain, layer, t, size);
        let mut native = [const { MaybeUninit::<u64>::uninit() }; MAX_NATIVE_FRAMES];
        let native = if sample {
            native_stack(t, &mut native)
        } else {
            &[]
        };
        // A realloc of NULL allocates (how a `bytearray` gets its first buffer: most of a
        // tornado server's samples): no block to look up, whose slot is a line the cache
        // no longer has.
        let mut moving = false;
        if old != 0 {
            let mut shared = SESSION.lock();
            if shared.set.remove(old) {
                moving = shared.moving.add(old);
                if !moving {
                    // No room to note it: the call is made under the lock, as a last resort.
                    cold_path();
                    let ptr = call(asked(domain, layer, size, sample));
                    // SAFETY: on the reallocating thread, from its hook (contract).
                    unsafe {
                        finish_realloc(&mut shared, t, old, true, ptr, size, domain, native, sample)
                    };
                    drop(shared);
                    t.busy.set(was_busy);
                    return ptr;
                }
            }
        }
        let ptr = call(asked(domain, layer, size, sample));
        if moving || (sample && !ptr.is_null()) {
            let mut shared = SESSION.lock();
            let still_moving = moving && shared.moving.take(old);
            // SAFETY: on the reallocating thread, from its hook (contract).
            unsafe {
                finish_realloc(
                    &mut shared,
                    t,
                    old,
                    still_moving,
                    ptr,
                    size,
                    domain,
                    native,
                    sample,
                )
            };
        }
        cycles::add(Part::Realloc, start);
        t.busy.set(was_busy);
        ptr
    })
}

/// After a sampled realloc's call, under the lock: the old block (`sampled`: out of the set,
/// its FREE not written by another thread) freed or live again, and the new block recorded.
///
/// # Safety
/// As for [`sampled_alloc`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish_realloc(
    shared: &mut Session,
    t: &ThreadState,
    old: usize,
    sampled: bool,
    ptr: *mut c_void,
    size: usize,
    domain: usize,
    native: &[u64],
    sample: bool,
) {
    if sampled {
        if ptr.is_null() && size != 0 {
            shared.set.insert(old); // the realloc failed: the block is live as it was
        } else {
            record_free_locked(shared, old);
        }
    }
    if sample && !ptr.is_null() {
        let block = Sampled {
            t,
            addr: ptr as usize,
            size,
            allocator: allocator_of(domain),
            native,
        };
        // SAFETY: on the reallocating thread, from its hook (contract).
        unsafe { record_alloc_locked(shared, block) };
    }
}

/// A sampled block to record: the allocating thread, the block and its allocator, and the
/// native stack unwound for it (empty without `--native`).
struct Sampled<'a> {
    t: &'a ThreadState,
    addr: usize,
    size: usize,
    allocator: Allocator,
    native: &'a [u64],
}

/// Records a sample under the session lock. Whether samples carry native stacks is read
/// once, and each case has code of its own: without them (the common session) no test of
/// the flag is left in the sample's path, where it was tested four times.
///
/// # Safety
/// As for [`sampled_alloc`].
#[inline(always)]
unsafe fn record_alloc_locked(shared: &mut Session, block: Sampled) {
    if crate::unwind::on() {
        cold_path();
        // SAFETY: this function's contract.
        unsafe { record_alloc_native(shared, block) };
    } else {
        // SAFETY: this function's contract.
        unsafe { record_alloc_with::<false>(shared, block) };
    }
}

/// [`record_alloc_locked`] with native stacks (`--native`). Out of line: the unwind that
/// comes with it costs far more than the call.
///
/// # Safety
/// As for [`sampled_alloc`].
#[inline(never)]
unsafe fn record_alloc_native(shared: &mut Session, block: Sampled) {
    // SAFETY: this function's contract.
    unsafe { record_alloc_with::<true>(shared, block) };
}

/// [`record_alloc_locked`] for sessions with native stacks (`WITH_NATIVE`) or without.
///
/// # Safety
/// As for [`sampled_alloc`].
#[inline(always)]
unsafe fn record_alloc_with<const WITH_NATIVE: bool>(shared: &mut Session, block: Sampled) {
    let Sampled {
        t,
        addr,
        size,
        allocator,
        native,
    } = block;
    // The rare ways out are marked cold (`cold_path`), so that the compiler lays their code
    // after the common sample's: at the default rate a sample's code is fetched afresh. The
    // session's parts are taken once, then each is checked once.
    // A block reallocated right now by another thread was at this address: the realloc has
    // released it, and its FREE comes first.
    if shared.moving.any() && shared.moving.take(addr) {
        cold_path();
        record_free_locked(shared, addr);
    }
    let Session {
        mapped: Some(mapped),
        finalizing_flag,
        caches,
        set,
        stacks,
        max_depth,
        native_samples,
        this_thread,
        ..
    } = shared
    else {
        cold_path();
        return;
    };
    if !ENABLED.load(Ordering::Relaxed) {
        cold_path();
        return;
    }
    let (layout, api) = (mapped.layout, mapped.api);
    let tid = tid(t);
    // The thread's HANDLE comes before its first sample of the session.
    if !announced(t) && !announce_thread(&mut mapped.ring, t, tid) {
        cold_path();
        return;
    }
    let now = mapped.clock.now(t.tsc.get());
    if let Some(reason) = lifecycle::stop_reason_at(*finalizing_flag, api, mapped, now) {
        cold_path();
        lifecycle::stop_soon(shared, reason);
        return;
    }
    let with_native = WITH_NATIVE;
    let mut announcer = Announcer {
        api,
        layout,
        ring: &mut mapped.ring,
        caches,
        stacks,
        max_depth: *max_depth,
        entries: with_native,
    };
    // SAFETY: the session's `api` and `this_thread` were made for this interpreter at its
    // start; `t` is the calling thread's own.
    let stack = match unsafe { this_thread_state(api, this_thread.as_ref(), &t.key_slot) } {
        None => {
            cold_path();
            Stack::NONE
        }
        Some(tstate) => {
            // SAFETY: `this_thread_state` answered the calling thread's own thread state.
            unsafe { notice_other_interpreter(api, layout, tstate) };
            // SAFETY: the calling thread's own thread state, whose frames only this thread
            // changes, and it is in an allocator call (this function's contract).
            match unsafe { announcer.this_thread(tid, tstate) } {
                Some(stack) => stack,
                None => {
                    cold_path();
                    return;
                }
            }
        }
    };
    let flags = allocator.flags()
        | if stack.truncated() {
            ALLOC_TRUNCATED
        } else {
            0
        }
        | if with_native { ALLOC_NATIVE_STACK } else { 0 };
    let brief = match u32::try_from(size) {
        Ok(size) => brief_aux(stack.depth() as u16, flags).map(|aux| (aux, size)),
        Err(_) => None,
    };
    let written = match brief {
        // The common case, in 24 bytes (see mprof_common::stacks): its thread and time go in
        // a CONTEXT when they are not the last one's.
        Some((aux, size)) => {
            if mapped.context != (tid, now) {
                let ring = &mut mapped.ring;
                if !ring.try_write(KIND_CONTEXT, 0, CONTEXT_BODY, |b| {
                    write_context(b, tid, now)
                }) {
                    cold_path();
                    return;
                }
                mapped.context = (tid, now);
            }
            mapped.ring.try_write(KIND_BRIEF, aux, BRIEF_BODY, |b| {
                write_brief(b, addr as u64, size, stack.node())
            })
        }
        None => write_full_sample(
            &mut mapped.ring,
            &Sample {
                tid,
                flags,
                addr: addr as u64,
                size: size as u64,
                time_ns: now,
                stack: stack.node(),
            },
            stack.depth(),
            with_native.then_some(native),
        ),
    };
    if written {
        // Only the holder of the session lock writes the counters: no read-modify-write.
        let samples = &mapped.ring.header().samples;
        let n = samples.load(Ordering::Relaxed) + 1;
        samples.store(n, Ordering::Relaxed);
        *native_samples += with_native as u64;
        // Every so many samples, whether the allocators' statistics are due (read once the
        // lock is released).
        if n % crate::heap_stats::SAMPLES_BETWEEN_CHECKS == 0 {
            cold_path();
            heap_stats_check(now, crate::heap_stats::SAMPLES_BETWEEN_CHECKS);
        }
        // Without room for it in the set, its free would go unrecorded: it stays live.
        set.insert(addr);
    }
}

/// A sample in the full SAMPLE record (a block of 4 GiB or more, a stack of more than 511
/// frames, or a native stack), with the native frames when they were unwound. Out of line:
/// the common sample is a BRIEF.
#[cold]
#[inline(never)]
fn write_full_sample(ring: &mut Ring, sample: &Sample, depth: u32, native: Option<&[u64]>) -> bool {
    let native_len = native.map_or(0, |n| 8 + 8 * n.len());
    ring.try_write(KIND_SAMPLE, depth as u16, SAMPLE_FIXED + native_len, |b| {
        write_sample(b, sample);
        if let Some(native) = native {
            // The native section (see mprof_common::stacks): no entry bitmap, the nodes carry
            // the entry marks.
            let mut at = SAMPLE_FIXED;
            b[at..at + 4].copy_from_slice(&(native.len() as u32).to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes());
            at += 8;
            for w in native {
                b[at..at + 8].copy_from_slice(&w.to_le_bytes());
                at += 8;
            }
        }
    })
}

/// From 3.12, a thread of an interpreter with a GIL of its own: MEM and OBJ calls count down
/// per thread from now on (see `sampler`). Until then, two loads and a compare a sample (and
/// one more in an interpreter that shares the main one's GIL).
///
/// # Safety
/// `tstate` is the calling thread's own thread state.
#[inline(always)]
unsafe fn notice_other_interpreter(api: &Api, layout: &PyLayout, tstate: *const c_void) {
    /// The main interpreter while threads are watched for another; [`UNKNOWN`] before the first
    /// look, [`NOT_WATCHED`] before 3.12 and once the process has several GILs.
    static WATCHED: AtomicUsize = AtomicUsize::new(UNKNOWN);
    const UNKNOWN: usize = 0;
    const NOT_WATCHED: usize = 1;
    let mut main = WATCHED.load(Ordering::Relaxed);
    if main == NOT_WATCHED {
        return;
    }
    if main == UNKNOWN {
        main = match api.main_interpreter {
            // SAFETY: `PyInterpreterState_Main` takes no argument and reads a runtime field.
            Some(main_interpreter) if layout.minor >= 12 => unsafe { main_interpreter() as usize },
            _ => NOT_WATCHED,
        };
        if main == UNKNOWN {
            return;
        }
        WATCHED.store(main, Ordering::Relaxed);
        if main == NOT_WATCHED {
            return;
        }
    }
    // SAFETY: `tstate` is the calling thread's live thread state (contract); `interp` is its
    // pointer field at `tstate_interp` in this interpreter's layout.
    let interp: usize = unsafe {
        std::ptr::read_unaligned(
            (tstate as *const u8).add(layout.tstate_interp as usize) as *const usize
        )
    };
    // SAFETY: the calling thread's interpreter, read just above.
    if interp != main && unsafe { has_own_gil(layout, interp) } {
        WATCHED.store(NOT_WATCHED, Ordering::Relaxed);
        chain::enter_several_gils(chain::active());
    }
}

/// Whether interpreter `interp` has a GIL of its own (an interpreter made the old way, as
/// mod_wsgi makes them, shares the main one's: one GIL still guards every MEM and OBJ call).
///
/// # Safety
/// `interp` is the calling thread's interpreter.
unsafe fn has_own_gil(layout: &PyLayout, interp: usize) -> bool {
    layout.interp_own_gil != mprof_common::layout::ABSENT
        // SAFETY: `interp` is a live `PyInterpreterState` (contract) and, from 3.12 (the
        // offset is not ABSENT), `ceval.own_gil` is its int at that offset.
        && unsafe {
            std::ptr::read_unaligned((interp + layout.interp_own_gil as usize) as *const i32) != 0
        }
}

/// The calling thread's thread state, if the thread has one: read from the runtime's words
/// (`read`, see `python::ThisThread`) once they are trusted, else asked of
/// `PyGILState_GetThisThreadState`. No `Py_IsInitialized` first: both answer NULL before the
/// interpreter sets up its thread states and after it tears them down (3.8–3.13), and a
/// session ends when finalization starts, before anything is torn down.
///
/// # Safety
/// `api` and `read` were made for the running interpreter; `verified` is the calling thread's
/// own word (`ThreadState::key_slot`).
pub(crate) unsafe fn this_thread_state(
    api: &Api,
    read: Option<&ThisThread>,
    verified: &std::cell::Cell<isize>,
) -> Option<*const c_void> {
    let tstate = match read {
        Some(read) => read.get(api, verified),
        // SAFETY: PyGILState_GetThisThreadState has no preconditions.
        None => unsafe { (api.this_thread_state)() },
    };
    (!tstate.is_null()).then_some(tstate as *const c_void)
}

/// Slow path of a free whose address passed the filter: record it if it was sampled. Inlined
/// into the hooks' own out-of-line slow paths only (inlined into a free hook's fast path, it
/// cost every free five pushes and five pops; called from the slow path, a call and five
/// pushes a sampled free). No thread-local state: a free nested in the agent's own work
/// under the lock (an allocator call the slow path makes) is told by the lock's holder and
/// left out; any other is recorded.
#[inline(always)]
pub fn sampled_free(addr: usize) {
    let start = cycles::now();
    if let Some(mut shared) = SESSION.lock_unless_mine() {
        if shared.set.remove(addr) {
            record_free_locked(&mut shared, addr);
        }
    }
    cycles::add(Part::Free, start);
}

/// [`sampled_free`] in the common case alone, whole: the lock free at once, a session that
/// goes on (its runtime's finalizing word read in place, no detach asked) and room for the
/// FREE before the ring's window ends. Returns false, having done nothing, in any other case:
/// the caller then calls [`sampled_free`]. Calls nothing, so that a free hook's slow path
/// keeps no register across a call (it saved and restored five at every sampled free).
#[inline(always)]
pub fn sampled_free_here(addr: usize) -> bool {
    let start = cycles::now();
    let Some(mut shared) = SESSION.try_lock() else {
        return false;
    };
    let Session {
        mapped: Some(mapped),
        finalizing_flag: Some(finalizing),
        set,
        ..
    } = &mut *shared
    else {
        return false;
    };
    if lifecycle::must_end_by_word(finalizing, mapped).is_some() {
        return false;
    }
    let Some(here) = mapped.ring.room_here(FREE_BODY) else {
        return false;
    };
    if set.remove(addr) {
        // SAFETY: found just now, nothing written since.
        unsafe {
            mapped
                .ring
                .write_here(here, KIND_FREE, 0, |b| write_free(b, addr))
        };
        count_free(&mapped.ring);
    }
    drop(shared);
    cycles::add(Part::Free, start);
    true
}

/// The FREE record's body: the block's address.
const FREE_BODY: usize = 8;

#[inline(always)]
fn write_free(b: &mut [u8], addr: usize) {
    b[..FREE_BODY].copy_from_slice(&(addr as u64).to_le_bytes())
}

/// Counts a FREE written (only the holder of the session lock writes the counters: no
/// read-modify-write).
#[inline(always)]
fn count_free(ring: &Ring) {
    let frees = &ring.header().frees;
    let n = frees.load(Ordering::Relaxed) + 1;
    frees.store(n, Ordering::Relaxed);
    // At a sampling rate, at every sampled free (rare, and each stands for many bytes); at
    // `--rate 1` every so many: a program that frees much and allocates little would
    // otherwise leave the allocators' statistics unread, and a burst of frees should be seen
    // to its end.
    let every = if ring.header().rate >= crate::heap_stats::SPARSE_RATE {
        1
    } else {
        crate::heap_stats::FREES_BETWEEN_CHECKS
    };
    if n.is_multiple_of(every) {
        cold_path();
        heap_stats_check(sys::now_ns(), every);
    }
}

/// Whether the allocators' statistics are due, `events` sampled events after the last look;
/// if they are, they are read once the session lock is released. Out of line.
#[cold]
#[inline(never)]
fn heap_stats_check(now: u64, events: u64) {
    if crate::heap_stats::due(now, events) {
        SESSION.defer(lifecycle::read_and_write_heap_stats);
    }
}

/// Writes the FREE record of a sampled block (or ends the session, if it must end). The clock
/// is not read here: a reader gone silent is noticed by the next sampled allocation (the
/// clock read and the heartbeat check cost about 27 instructions per sample at `--rate 1`).
/// Inlined into its two callers: a call, three saved registers and the session's words
/// loaded again were a tenth of a sampled free.
#[inline(always)]
fn record_free_locked(shared: &mut Session, addr: usize) {
    if let Some(reason) = lifecycle::must_end(shared) {
        cold_path();
        lifecycle::stop_soon(shared, reason);
        return;
    }
    let Some(mapped) = shared.mapped.as_mut() else {
        cold_path();
        return;
    };
    mapped
        .ring
        .try_write(KIND_FREE, 0, FREE_BODY, |b| write_free(b, addr));
    count_free(&mapped.ring);
}

/// Whether the calling thread has written its HANDLE (`mprof_common::record::threads`) in
/// this session; asked by each sample under the session lock, before its record.
#[inline(always)]
fn announced(t: &ThreadState) -> bool {
    t.handle_epoch.get() == EPOCH.load(Ordering::Relaxed)
}

/// Writes the calling thread's HANDLE into `ring` (under the session lock); false when the
/// ring had no room (it is tried again at the next sample). It names the creation under way
/// whose caller's `pthread_t` word holds the thread's handle already (glibc stores it before
/// the thread starts), when exactly one does: a thread that samples before its creator
/// returned is paired at once.
#[cold]
#[inline(never)]
fn announce_thread(ring: &mut Ring, t: &ThreadState, tid: u32) -> bool {
    // SAFETY: pthread_self has no preconditions.
    let handle = unsafe { sys::pthread_self() } as u64;
    let serial = UNDER_WAY.creation_of(handle as usize);
    let written = ring.try_write(threads::KIND_HANDLE, 0, threads::THREAD_BODY, |b| {
        threads::write_handle(b, tid, handle);
        b[4..8].copy_from_slice(&serial.to_le_bytes());
    });
    if written {
        t.handle_epoch.set(EPOCH.load(Ordering::Relaxed));
    }
    written
}

/// The thread creations under way (`spawns`): each one's serial and the address of its
/// caller's `pthread_t` word, in a few slots (a creation that finds none free goes without).
/// Changed and read under the session lock only, hence relaxed atomics.
pub(crate) struct UnderWay {
    serial: [AtomicU32; UNDER_WAY_SLOTS],
    word: [AtomicUsize; UNDER_WAY_SLOTS],
}

const UNDER_WAY_SLOTS: usize = 16;

pub(crate) static UNDER_WAY: UnderWay = UnderWay {
    serial: [const { AtomicU32::new(0) }; UNDER_WAY_SLOTS],
    word: [const { AtomicUsize::new(0) }; UNDER_WAY_SLOTS],
};

impl UnderWay {
    /// Creation `serial` (not 0) writes the new thread's handle at `word`. Under the session
    /// lock.
    pub(crate) fn add(&self, serial: u32, word: usize) {
        if let Some(i) = (0..UNDER_WAY_SLOTS).find(|&i| self.serial[i].load(Ordering::Relaxed) == 0)
        {
            self.word[i].store(word, Ordering::Relaxed);
            self.serial[i].store(serial, Ordering::Relaxed);
        }
    }

    /// Creation `serial` returned: its caller may use its word again. Under the session lock.
    pub(crate) fn remove(&self, serial: u32) {
        for s in &self.serial {
            if s.load(Ordering::Relaxed) == serial {
                s.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The one creation under way whose word holds `handle`, or 0 (none, or more than one).
    /// The words are read without a fault (a caller's word may be gone if the new thread
    /// freed it). Under the session lock.
    fn creation_of(&self, handle: usize) -> u32 {
        let mut found = 0;
        for i in 0..UNDER_WAY_SLOTS {
            let serial = self.serial[i].load(Ordering::Relaxed);
            if serial == 0 {
                continue;
            }
            let mut value = [0usize];
            if sys::read_own(self.word[i].load(Ordering::Relaxed), &mut value) && value[0] == handle
            {
                if found != 0 {
                    return 0;
                }
                found = serial;
            }
        }
        found
    }
}
