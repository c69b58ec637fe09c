//! One profiling session: the ring the agent writes into, the slow path of the hooks (record a
//! sample, record a sampled free), and starting and stopping.
//!
//! Everything here runs under `SHARED`'s lock, which is only taken by the slow path, so the ring,
//! the set of sampled addresses and the table of announced code objects see one writer at a time.

use crate::addrset::AddrSet;
use crate::frames::{self, CodeKey, RawFrame, MAX_FRAMES};
use crate::lock::SpinLock;
use crate::python::{self, Api};
use crate::sampler::{self, ThreadState, EPOCH, GIL_COUNTDOWN, IDLE_COUNTDOWN, THREAD};
use crate::sys::{self, now_ns};
use mprof_common::layout::{self, PyLayout};
use mprof_common::record::{
    EndReason, Frame, ALLOC_FIXED, ALLOC_TRUNCATED, CODE_FIXED, FRAME_SIZE, KIND_ALLOC, KIND_CODE,
    KIND_END, KIND_FREE,
};
use mprof_common::ring::{Ring, RingHeader, STATE_ACTIVE, STATE_STOPPED, STATE_STOP_REQUESTED};
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a session is running. Read by the slow path only.
pub static ENABLED: AtomicBool = AtomicBool::new(false);

const CODE_CACHE: usize = 1 << 14;
const LINE_CACHE: usize = 1 << 14;

/// A remembered line: the code object (with its name, so a reused address does not match),
/// the instruction offset, and its line; valid only in the session (`generation`) that made it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct LineEntry {
    generation: u32,
    code: usize,
    name: usize,
    offset: i32,
    line: u32,
}

pub struct Shared {
    ring: Option<(Ring, *mut u8, usize)>,
    layout: Option<&'static PyLayout>,
    max_depth: usize,
    set: AddrSet,
    /// Bumped at every session start: cache entries of older sessions no longer match. (Cheaper
    /// than clearing the caches, which would touch a megabyte of the target's memory.)
    generation: u32,
    codes: [Option<(u32, CodeKey)>; CODE_CACHE],
    lines: [Option<LineEntry>; LINE_CACHE],
}

unsafe impl Send for Shared {}

pub static SHARED: SpinLock<Shared> = SpinLock::new(Shared {
    ring: None,
    layout: None,
    max_depth: 0,
    set: AddrSet::new(),
    generation: 0,
    codes: [None; CODE_CACHE],
    lines: [None; LINE_CACHE],
});

/// Slow path of an allocation whose countdown ran out: allocate, then record the sample.
#[cold]
#[inline(never)]
pub unsafe fn sampled_alloc(
    domain: usize,
    size: usize,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    THREAD.with(|t| {
        let was_busy = t.busy.replace(true);
        let sample = !was_busy && decide(domain, t, size);
        let ptr = call();
        if sample && !ptr.is_null() {
            record_alloc(t, ptr as usize, size);
        }
        t.busy.set(was_busy);
        ptr
    })
}

/// Whether this allocation, whose countdown ran out, is sampled; re-arms the countdown.
fn decide(domain: usize, t: &ThreadState, size: usize) -> bool {
    let enabled = ENABLED.load(Ordering::Acquire);
    if domain != crate::hooks::RAW {
        let next = if enabled {
            sampler::draw()
        } else {
            IDLE_COUNTDOWN
        };
        GIL_COUNTDOWN.store(next, Ordering::Relaxed);
        return enabled;
    }
    if !enabled {
        t.countdown.set(IDLE_COUNTDOWN);
        return false;
    }
    let epoch = EPOCH.load(Ordering::Relaxed);
    if t.epoch.get() != epoch {
        // First RAW allocation of this thread in this session: its countdown starts here.
        t.epoch.set(epoch);
        let c = sampler::draw() - size as i64;
        if c > 0 {
            t.countdown.set(c);
            return false;
        }
    }
    t.countdown.set(sampler::draw());
    true
}

fn tid(t: &ThreadState) -> u32 {
    if t.tid.get() == 0 {
        t.tid.set(sys::gettid());
    }
    t.tid.get()
}

unsafe fn record_alloc(t: &ThreadState, addr: usize, size: usize) {
    // Uninitialised: zeroing 8 KiB per sample cost more than the walk itself.
    let mut raw = [const { MaybeUninit::<RawFrame>::uninit() }; MAX_FRAMES];
    let mut frames = [const { MaybeUninit::<Frame>::uninit() }; MAX_FRAMES];
    let mut shared = SHARED.lock();
    let Some(api) = python::api() else { return };
    let (Some((ring, _, _)), Some(layout)) = (shared.ring, shared.layout) else {
        return;
    };
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    if python::finalizing(api) {
        stop_locked(&mut shared, EndReason::Finalizing);
        return;
    }
    let (n, truncated) = walk_this_thread(api, layout, &mut raw, shared.max_depth);
    for (f, out) in raw[..n].iter().zip(frames.iter_mut()) {
        let f = f.assume_init();
        let key = announce(&mut shared, ring, layout, f.code);
        out.write(Frame {
            code: f.code as u64,
            line: shared.line(api, layout, key, f),
        });
    }
    let body = ALLOC_FIXED + n * FRAME_SIZE;
    let tid = tid(t);
    let flags = if truncated { ALLOC_TRUNCATED } else { 0 };
    let written = ring.try_write(KIND_ALLOC, n as u16, body, |b| {
        b[0..4].copy_from_slice(&tid.to_le_bytes());
        b[4..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&(addr as u64).to_le_bytes());
        b[16..24].copy_from_slice(&(size as u64).to_le_bytes());
        b[24..32].copy_from_slice(&now_ns().to_le_bytes());
        for (i, f) in frames[..n].iter().enumerate() {
            let f = unsafe { f.assume_init() };
            let at = ALLOC_FIXED + i * FRAME_SIZE;
            b[at..at + 8].copy_from_slice(&f.code.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&f.line.to_le_bytes());
        }
    });
    if written {
        ring.header().samples.fetch_add(1, Ordering::Relaxed);
        // Without room for it in the set, its free would go unrecorded: it stays live.
        shared.set.insert(addr);
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
unsafe fn announce(shared: &mut Shared, ring: Ring, l: &PyLayout, code: *mut c_void) -> CodeKey {
    let key = frames::code_key(l, code);
    let slot = (key.code >> 4).wrapping_mul(0x9E37_79B9) % CODE_CACHE;
    if shared.codes[slot] == Some((shared.generation, key)) {
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
        shared.codes[slot] = Some((shared.generation, key));
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
        let mut shared = SHARED.lock();
        if shared.set.remove(addr) {
            if let (Some((ring, _, _)), Some(api)) = (shared.ring, python::api()) {
                if python::finalizing(api) {
                    stop_locked(&mut shared, EndReason::Finalizing);
                } else {
                    ring.try_write(KIND_FREE, 0, 8, |b| {
                        b[..8].copy_from_slice(&(addr as u64).to_le_bytes())
                    });
                    ring.header().frees.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        drop(shared);
        t.busy.set(false);
    })
}

/// Why a session could not start.
pub enum StartError {
    NotPython,
    Unsupported(u8, u8),
    BadRing(&'static str),
    Busy,
}

/// Starts a session writing into the ring mapped at `base` (`len` bytes). The caller has
/// claimed the ring. Installs the hooks and marks the ring active.
pub unsafe fn start(base: *mut u8, len: usize) -> Result<(), StartError> {
    let api = python::api().ok_or(StartError::NotPython)?;
    let layout = layout::for_version(api.major, api.minor)
        .ok_or(StartError::Unsupported(api.major, api.minor))?;
    let ring = Ring::attach(base, len).map_err(StartError::BadRing)?;
    let h: &RingHeader = ring.header();
    {
        let mut shared = SHARED.lock();
        if shared.ring.is_some() {
            return Err(StartError::Busy);
        }
        shared.ring = Some((ring, base, len));
        shared.layout = Some(layout);
        shared.max_depth = (h.max_depth as usize).clamp(1, MAX_FRAMES);
        shared.generation = shared.generation.wrapping_add(1);
        sampler::configure(h.rate, h.seed);
        ENABLED.store(true, Ordering::Release);
    }
    crate::hooks::install(api);
    h.state.store(STATE_ACTIVE, Ordering::Release);
    Ok(())
}

/// Ends the session: no more records, the address set is dropped, the ring is unmapped.
pub fn stop_locked(shared: &mut Shared, reason: EndReason) {
    ENABLED.store(false, Ordering::Release);
    sampler::idle();
    if let Some((ring, base, len)) = shared.ring.take() {
        ring.try_write(KIND_END, reason as u16, 8, |b| {
            b[..8].copy_from_slice(&now_ns().to_le_bytes())
        });
        ring.header().state.store(STATE_STOPPED, Ordering::Release);
        unsafe { sys::munmap(base.cast(), len) };
    }
    shared.set.clear();
}

impl Shared {
    /// The line of a frame, through a direct-mapped cache: scanning line tables is the most
    /// expensive part of a sample.
    unsafe fn line(&mut self, api: &Api, l: &PyLayout, key: CodeKey, f: RawFrame) -> u32 {
        let h =
            (key.code as u64 >> 4 ^ (f.offset as u64) << 20).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = (h >> 40) as usize % LINE_CACHE;
        if let Some(e) = self.lines[slot] {
            if e.generation == self.generation
                && e.code == key.code
                && e.name == key.name
                && e.offset == f.offset
            {
                return e.line;
            }
        }
        let line = frames::line_of(api, l, f.code, f.offset);
        self.lines[slot] = Some(LineEntry {
            generation: self.generation,
            code: key.code,
            name: key.name,
            offset: f.offset,
            line,
        });
        line
    }

    /// Whether the session should end now, and why.
    pub fn stop_reason(&self, timeout_ns: u64) -> Option<EndReason> {
        let (ring, _, _) = self.ring.as_ref()?;
        reader_stopped(ring.header(), timeout_ns)
    }

    pub fn running(&self) -> bool {
        self.ring.is_some()
    }

    /// In a forked child: drop the session without touching the shared ring.
    pub fn forget_in_child(&mut self) {
        if let Some((_, base, len)) = self.ring.take() {
            unsafe { sys::munmap(base.cast(), len) };
        }
        self.set.clear();
    }
}

/// Why the reader ended the session, if it did: it asked for a detach, or its heartbeat is older
/// than `timeout_ns`.
fn reader_stopped(h: &RingHeader, timeout_ns: u64) -> Option<EndReason> {
    if h.state.load(Ordering::Acquire) == STATE_STOP_REQUESTED {
        return Some(EndReason::Detached);
    }
    let beat = h.reader_heartbeat_ns.load(Ordering::Acquire);
    (beat != 0 && now_ns().saturating_sub(beat) > timeout_ns).then_some(EndReason::ReaderGone)
}
