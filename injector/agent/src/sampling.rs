//! The slow path of the hooks: an allocation whose countdown ran out is sampled (its stack
//! walked, a record written), and a free whose address passed the filter is recorded if the
//! block was sampled. Runs under the session lock (`lifecycle::SESSION`); notices there when
//! the session must end.

use crate::chain;
use crate::frames::{self, CodeKey, RawFrame, MAX_FRAMES};
use crate::lifecycle::{self, Caches, LineEntry, Session, ENABLED, LINE_CACHE, SESSION};
use crate::python::{self, Api};
use crate::sampler::{self, ThreadState, EPOCH, GIL_COUNTDOWN, IDLE_COUNTDOWN, THREAD};
use crate::sys::{self, now_ns};
use mprof_common::layout::PyLayout;
use mprof_common::record::{
    Allocator, Frame, ALLOC_FIXED, ALLOC_NATIVE_STACK, ALLOC_TRUNCATED, CODE_FIXED, FRAME_SIZE,
    KIND_ALLOC, KIND_CODE, KIND_FREE, MAX_NATIVE_FRAMES,
};
use mprof_common::ring::Ring;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

/// The RAW domain, called without the GIL (its countdowns are per thread).
pub const RAW: usize = 0;
pub const MEM: usize = 1;
pub const OBJ: usize = 2;
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

/// Slow path of an allocation whose countdown ran out: allocate, then record the sample.
#[cold]
#[inline(never)]
pub unsafe fn sampled_alloc(
    domain: usize,
    layer: usize,
    size: usize,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    THREAD.with(|t| {
        let was_busy = t.busy.replace(true);
        let sample = !was_busy && decide(domain, layer, t, size);
        let ptr = call();
        if sample && !ptr.is_null() {
            let mut native = [0u64; MAX_NATIVE_FRAMES];
            let n = native_stack(&mut native);
            record_alloc(t, ptr as usize, size, allocator_of(domain), &native[..n]);
        }
        t.busy.set(was_busy);
        ptr
    })
}

/// The native stack of this sample (`--native`), unwound before the session lock is taken.
fn native_stack(out: &mut [u64]) -> usize {
    if crate::unwind::on() {
        crate::unwind::unwind(out)
    } else {
        0
    }
}

/// Whether this allocation, whose countdown in `layer` ran out, is sampled; re-arms the
/// countdown. Only the active layer samples: the others go idle.
fn decide(domain: usize, layer: usize, t: &ThreadState, size: usize) -> bool {
    if domain >= NATIVE {
        let enabled = ENABLED.load(Ordering::Acquire) && crate::native::on();
        return decide_per_thread(enabled, &t.native_countdown, &t.native_epoch, size);
    }
    let enabled = ENABLED.load(Ordering::Acquire) && chain::active() == layer;
    if domain != RAW {
        let next = if enabled {
            sampler::draw()
        } else {
            IDLE_COUNTDOWN
        };
        GIL_COUNTDOWN[layer].store(next, Ordering::Relaxed);
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

fn tid(t: &ThreadState) -> u32 {
    if t.tid.get() == 0 {
        t.tid.set(sys::gettid());
    }
    t.tid.get()
}

unsafe fn record_alloc(
    t: &ThreadState,
    addr: usize,
    size: usize,
    allocator: Allocator,
    native: &[u64],
) {
    record_alloc_locked(&mut SESSION.lock(), t, addr, size, allocator, native)
}

/// Slow path of a realloc that may free a sampled block, or whose countdown ran out. The call
/// runs under the session lock: the old block's FREE is recorded only if the realloc
/// succeeded (a failed one leaves the block live), and still before any other thread can
/// record an allocation at the released address.
pub unsafe fn sampled_realloc(
    domain: usize,
    layer: usize,
    old: usize,
    size: usize,
    countdown_ran_out: bool,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    THREAD.with(|t| {
        let was_busy = t.busy.replace(true);
        if was_busy {
            let ptr = call();
            t.busy.set(was_busy);
            return ptr;
        }
        let sample = countdown_ran_out && decide(domain, layer, t, size);
        let mut native = [0u64; MAX_NATIVE_FRAMES];
        let n = if sample { native_stack(&mut native) } else { 0 };
        let mut shared = SESSION.lock();
        let was_sampled = shared.set.contains(old);
        let ptr = call();
        if was_sampled && (!ptr.is_null() || size == 0) {
            shared.set.remove(old);
            record_free_locked(&mut shared, old);
        }
        if sample && !ptr.is_null() {
            let native = &native[..n];
            record_alloc_locked(
                &mut shared,
                t,
                ptr as usize,
                size,
                allocator_of(domain),
                native,
            );
        }
        drop(shared);
        t.busy.set(was_busy);
        ptr
    })
}

unsafe fn record_alloc_locked(
    shared: &mut Session,
    t: &ThreadState,
    addr: usize,
    size: usize,
    allocator: Allocator,
    native: &[u64],
) {
    // Uninitialised: zeroing 8 KiB per sample cost more than the walk itself.
    let mut raw = [const { MaybeUninit::<RawFrame>::uninit() }; MAX_FRAMES];
    let mut frames = [const { MaybeUninit::<Frame>::uninit() }; MAX_FRAMES];
    let Some(api) = python::api() else { return };
    let Some(layout) = shared.layout else { return };
    if shared.mapped.is_none() || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    if let Some(reason) = lifecycle::stop_reason(shared, api) {
        lifecycle::stop_locked(shared, reason);
        return;
    }
    let (n, truncated) = walk_this_thread(api, layout, &mut raw, shared.max_depth);
    let Session {
        mapped: Some(mapped),
        caches,
        set,
        ..
    } = shared
    else {
        return;
    };
    let ring = &mut mapped.ring;
    for (f, out) in raw[..n].iter().zip(frames.iter_mut()) {
        let f = f.assume_init();
        if f.code.is_null() {
            // Never announced: the reader shows it as `<unknown>`.
            out.write(Frame { code: 0, line: 0 });
            continue;
        }
        let key = announce(caches, ring, layout, f.code);
        out.write(Frame {
            code: f.code as u64,
            line: line(caches, api, layout, key, f),
        });
    }
    // The native section: which Python frames were entries of the bytecode loop, then the
    // native addresses (see mprof_common::record).
    let with_native = crate::unwind::on();
    let mut entries = [0u64; MAX_FRAMES / 64];
    for (i, f) in raw[..n].iter().enumerate() {
        if f.assume_init().entry {
            entries[i / 64] |= 1 << (i % 64);
        }
    }
    let words = n.div_ceil(64);
    let native_len = if with_native {
        8 + 8 * (words + native.len())
    } else {
        0
    };
    let body = ALLOC_FIXED + n * FRAME_SIZE + native_len;
    let tid = tid(t);
    let flags = allocator.flags()
        | if truncated { ALLOC_TRUNCATED } else { 0 }
        | if with_native { ALLOC_NATIVE_STACK } else { 0 };
    let written = ring.try_write(KIND_ALLOC, n as u16, body, |b| {
        b[0..4].copy_from_slice(&tid.to_le_bytes());
        b[4..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&(addr as u64).to_le_bytes());
        b[16..24].copy_from_slice(&(size as u64).to_le_bytes());
        b[24..32].copy_from_slice(&now_ns().to_le_bytes());
        for (i, f) in frames[..n].iter().enumerate() {
            // SAFETY: the first `n` frames were written by the loop above.
            let f = unsafe { f.assume_init() };
            let at = ALLOC_FIXED + i * FRAME_SIZE;
            b[at..at + 8].copy_from_slice(&f.code.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&f.line.to_le_bytes());
        }
        if with_native {
            let mut at = ALLOC_FIXED + n * FRAME_SIZE;
            b[at..at + 4].copy_from_slice(&(native.len() as u32).to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&(words as u32).to_le_bytes());
            at += 8;
            for w in entries[..words].iter().chain(native) {
                b[at..at + 8].copy_from_slice(&w.to_le_bytes());
                at += 8;
            }
        }
    });
    if written {
        ring.header().samples.fetch_add(1, Ordering::Relaxed);
        // Without room for it in the set, its free would go unrecorded: it stays live.
        set.insert(addr);
    }
}

unsafe fn walk_this_thread(
    api: &Api,
    layout: &PyLayout,
    out: &mut [MaybeUninit<RawFrame>],
    max_depth: usize,
) -> (usize, bool) {
    if (api.is_initialized)() == 0 {
        return (0, false);
    }
    let tstate = (api.this_thread_state)();
    if tstate.is_null() {
        return (0, false);
    }
    frames::walk(api, layout, tstate, out, max_depth)
}

/// Writes a CODE record for `code` unless the same code object was announced already.
unsafe fn announce(
    caches: &mut Caches,
    ring: &mut Ring,
    l: &PyLayout,
    code: *mut c_void,
) -> CodeKey {
    let key = frames::code_key(l, code);
    let slot = (key.code >> 4).wrapping_mul(0x9E37_79B9) % lifecycle::CODE_CACHE;
    if caches.codes[slot] == Some((caches.generation, key)) {
        return key;
    }
    let mut filename = [0u8; 1024];
    let mut name = [0u8; 512];
    let flen = frames::read_str(l, key.filename as *const c_void, &mut filename);
    let nlen = frames::read_str(l, key.name as *const c_void, &mut name);
    let firstline = frames::first_line(l, code);
    let written = ring.try_write(KIND_CODE, 0, CODE_FIXED + flen + nlen, |b| {
        b[0..8].copy_from_slice(&(key.code as u64).to_le_bytes());
        b[8..12].copy_from_slice(&firstline.to_le_bytes());
        b[12..14].copy_from_slice(&(flen as u16).to_le_bytes());
        b[14..16].copy_from_slice(&(nlen as u16).to_le_bytes());
        b[CODE_FIXED..CODE_FIXED + flen].copy_from_slice(&filename[..flen]);
        b[CODE_FIXED + flen..CODE_FIXED + flen + nlen].copy_from_slice(&name[..nlen]);
    });
    if written {
        caches.codes[slot] = Some((caches.generation, key));
    }
    key
}

/// Slow path of a free whose address passed the filter: record it if it was sampled.
pub fn sampled_free(addr: usize) {
    THREAD.with(|t| {
        if t.busy.get() {
            return;
        }
        t.busy.set(true);
        let mut shared = SESSION.lock();
        if shared.set.remove(addr) {
            record_free_locked(&mut shared, addr);
        }
        drop(shared);
        t.busy.set(false);
    })
}

/// Writes the FREE record of a sampled block (or ends the session, if it must end).
fn record_free_locked(shared: &mut Session, addr: usize) {
    let Some(api) = python::api() else { return };
    if let Some(reason) = lifecycle::stop_reason(shared, api) {
        lifecycle::stop_locked(shared, reason);
        return;
    }
    let Some(mapped) = shared.mapped.as_mut() else {
        return;
    };
    mapped.ring.try_write(KIND_FREE, 0, 8, |b| {
        b[..8].copy_from_slice(&(addr as u64).to_le_bytes())
    });
    mapped.ring.header().frees.fetch_add(1, Ordering::Relaxed);
}

/// The line of a frame, through a direct-mapped cache: scanning line tables is the most
/// expensive part of a sample.
unsafe fn line(s: &mut Caches, api: &Api, l: &PyLayout, key: CodeKey, f: RawFrame) -> u32 {
    let h = (key.code as u64 >> 4 ^ (f.offset as u64) << 20).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let slot = (h >> 40) as usize % LINE_CACHE;
    if let Some(e) = s.lines[slot] {
        if e.generation == s.generation
            && e.code == key.code
            && e.name == key.name
            && e.offset == f.offset
        {
            return e.line;
        }
    }
    let line = frames::line_of(api, l, f.code, f.offset);
    s.lines[slot] = Some(LineEntry {
        generation: s.generation,
        code: key.code,
        name: key.name,
        offset: f.offset,
        line,
    });
    line
}
