//! The clocks mprof reads: the monotonic clock of records and heartbeats, and the wall clock
//! of the captures' metadata.

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The clock records are stamped with, the agent's too: CLOCK_MONOTONIC to the kernel's tick
/// (a few milliseconds), which a sample can read for almost nothing.
pub fn record_time_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a live local; both clocks used
    // here exist on every Linux mprof runs on (2.6.32+).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The UTC time in milliseconds, for the captures' metadata.
pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
