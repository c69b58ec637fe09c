//! Native stacks (`--native`): the instruction addresses of the allocating thread, unwound
//! with libgcc's `_Unwind_Backtrace` (the agent's runtime links libgcc_s already), for sampled
//! allocations only, so the cost follows the sampling rate, not the allocation rate.
//!
//! It runs before the session lock is taken, allocates nothing, and takes no lock of its own:
//! with glibc 2.35+ and libgcc 12+ the unwinder finds a frame's object with the lock-free
//! `_dl_find_object` (older ones take the loader's lock in `dl_iterate_phdr`, which is why no
//! other lock of the agent may be held meanwhile). Frames of the agent itself are left out.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const URC_NO_REASON: c_int = 0;
const URC_END_OF_STACK: c_int = 5;

extern "C" {
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

static ON: AtomicBool = AtomicBool::new(false);
/// The agent's own code, whose frames are left out.
static AGENT_LO: AtomicUsize = AtomicUsize::new(0);
static AGENT_HI: AtomicUsize = AtomicUsize::new(0);

/// Whether samples carry native stacks in the running session.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Switches native stacks on or off for a session (at its start, outside any hook).
pub fn configure(enabled: bool) {
    if enabled && AGENT_HI.load(Ordering::Relaxed) == 0 {
        if let Some((lo, hi)) = own_text() {
            AGENT_LO.store(lo, Ordering::Relaxed);
            AGENT_HI.store(hi, Ordering::Relaxed);
        }
    }
    ON.store(enabled, Ordering::Release);
}

/// The executable mapping that holds this function, from /proc/self/maps.
fn own_text() -> Option<(usize, usize)> {
    let me = own_text as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        if !rest.starts_with("r-x") {
            return None;
        }
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        (lo <= me && me < hi).then_some((lo, hi))
    })
}

struct Walk<'a> {
    out: &'a mut [MaybeUninit<u64>],
    n: usize,
    lo: usize,
    hi: usize,
}

unsafe extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    let w = &mut *(arg as *mut Walk);
    let ip = _Unwind_GetIP(ctx);
    if ip == 0 {
        return URC_END_OF_STACK;
    }
    // The agent's own frames (the hook, the slow path, this walk) come first: leave them out.
    if w.n == 0 && w.lo <= ip && ip < w.hi {
        return URC_NO_REASON;
    }
    if w.n == w.out.len() {
        return URC_END_OF_STACK;
    }
    w.out[w.n].write(ip as u64);
    w.n += 1;
    URC_NO_REASON
}

/// Fills `out` with the calling thread's instruction addresses, innermost first, from the
/// first frame outside the agent; returns how many (the first that many are written).
pub fn unwind(out: &mut [MaybeUninit<u64>]) -> usize {
    let mut w = Walk {
        out,
        n: 0,
        lo: AGENT_LO.load(Ordering::Relaxed),
        hi: AGENT_HI.load(Ordering::Relaxed),
    };
    // SAFETY: `step` only writes into `w`, which outlives the call.
    unsafe { _Unwind_Backtrace(step, &mut w as *mut Walk as *mut c_void) };
    w.n
}
