//! Asking the reader to read this process's memory map now, and waiting for it, bounded: the
//! map handshake drawn in `mprof_common::ring`, for native stacks (`--native`) only.
//!
//! The reader symbolizes a native stack with the modules it saw in `/proc/PID/maps`. Samples
//! still in the ring when the process ends (or unloads a library) may name code that the map
//! no longer shows once the reader gets to them. So the process asks first, and waits until
//! the reader says it has read the map, at most [`WAIT_NS`], and not at all (or no longer)
//! once the reader's heartbeat is older than [`SILENT_NS`]: a killed or stopped mprof costs
//! the target at most that.
//!
//! Never called from an allocation hook itself: from the agent's destructor
//! (`lifecycle::at_exit`), from the `dlclose` hook, before the real `dlclose` (no loader lock
//! held), and as a session ends, once the session lock is released. The same request asks for
//! the process's mappings (their resident bytes) beside the allocators' last statistics.

use crate::sys::{now_ns, sleep_ns};
use mprof_common::ring::{RingHeader, CONFIG_NATIVE_STACKS};
use std::sync::atomic::Ordering;

/// The longest wait for the reader.
pub const WAIT_NS: u64 = 1_000_000_000;
/// A reader silent this long (no heartbeat) is not waited for: it is stopped, killed, or
/// stuck. It beats every few milliseconds while it drains.
pub const SILENT_NS: u64 = 250_000_000;
/// Sleep between two looks at the reader's answer.
const NAP_NS: u64 = 200_000;

/// Whether the ring's session records native stacks (then the map matters).
pub fn wanted(h: &RingHeader) -> bool {
    h.config_flags & CONFIG_NATIVE_STACKS != 0
}

/// Asks the reader to read the map; returns the request's number, for [`wait`].
pub fn ask(h: &RingHeader) -> u32 {
    h.maps_wanted.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
}

/// Whether request `n` (or a later one) is served.
fn served(h: &RingHeader, n: u32) -> bool {
    (h.maps_read.load(Ordering::Acquire).wrapping_sub(n) as i32) >= 0
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The reader read the map.
    Served,
    /// The reader's heartbeat is older than [`SILENT_NS`] (or it never beat).
    Silent,
    /// [`WAIT_NS`] passed.
    TimedOut,
}

/// Waits until the reader has served request `n`; see the module doc for the bounds.
pub fn wait(h: &RingHeader, n: u32) -> Answer {
    wait_at_most(h, n, WAIT_NS)
}

/// [`wait`], for at most `wait_ns` (and at most [`WAIT_NS`]).
pub fn wait_at_most(h: &RingHeader, n: u32, wait_ns: u64) -> Answer {
    wait_with(h, n, wait_ns.min(WAIT_NS), now_ns, || sleep_ns(NAP_NS))
}

/// [`wait`] with its clock and its nap given (for the tests).
fn wait_with(
    h: &RingHeader,
    n: u32,
    limit_ns: u64,
    now: impl Fn() -> u64,
    mut nap: impl FnMut(),
) -> Answer {
    let start = now();
    loop {
        if served(h, n) {
            return Answer::Served;
        }
        let t = now();
        let beat = h.reader_heartbeat_ns.load(Ordering::Acquire);
        if beat == 0 || t.saturating_sub(beat) > SILENT_NS {
            return Answer::Silent;
        }
        if t.saturating_sub(start) >= limit_ns {
            return Answer::TimedOut;
        }
        nap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::ring::{region_size, Ring};
    use std::cell::Cell;

    fn ring(mem: &mut [u64]) -> Ring {
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: a zeroed, aligned region of the right size that outlives the ring.
        unsafe {
            Ring::init(base, 4096, 1, 0, 64, CONFIG_NATIVE_STACKS);
            Ring::attach(base, region_size(4096)).unwrap()
        }
    }

    #[test]
    fn the_wait_ends_when_served_silent_or_after_its_bound() {
        let mut mem = vec![0u64; region_size(4096) / 8];
        let r = ring(&mut mem);
        let h = r.header();
        assert!(wanted(h));
        let clock = Cell::new(1_000_000_000u64);
        let now = || clock.get();
        let tick = || clock.set(clock.get() + NAP_NS);
        // Never beat: not waited for.
        let n = ask(h);
        assert_eq!(n, 1);
        assert_eq!(wait_with(h, n, WAIT_NS, now, tick), Answer::Silent);
        // A beating reader that answers after a few naps.
        h.reader_heartbeat_ns.store(clock.get(), Ordering::Release);
        let naps = Cell::new(0);
        let answer = wait_with(h, n, WAIT_NS, now, || {
            naps.set(naps.get() + 1);
            if naps.get() == 5 {
                h.maps_read.store(n, Ordering::Release);
            }
        });
        assert_eq!((answer, naps.get()), (Answer::Served, 5));
        // A reader that stops beating: given up SILENT_NS after its last beat.
        let n = ask(h);
        let beat = clock.get();
        h.reader_heartbeat_ns.store(beat, Ordering::Release);
        assert_eq!(wait_with(h, n, WAIT_NS, now, tick), Answer::Silent);
        assert!(clock.get() - beat <= SILENT_NS + NAP_NS);
        // A reader that beats but never answers: given up after WAIT_NS.
        let start = clock.get();
        h.reader_heartbeat_ns.store(start, Ordering::Release);
        let answer = wait_with(h, n, WAIT_NS, now, || {
            tick();
            h.reader_heartbeat_ns.store(clock.get(), Ordering::Release);
        });
        assert_eq!(answer, Answer::TimedOut);
        assert!(clock.get() - start <= WAIT_NS + NAP_NS);
        // A later request served covers the earlier ones, across the counter's wrap.
        h.maps_read.store(u32::MAX, Ordering::Release);
        assert!(served(h, u32::MAX - 3) && !served(h, 0));
    }
}
