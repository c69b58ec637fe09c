//! Per-thread sampling state: a byte countdown drawn from an exponential distribution whose mean
//! is the sampling rate (as tcmalloc and Go's heap profiler do). An allocation of `s` bytes is
//! sampled when it takes the countdown to zero or below, i.e. with probability `1 − exp(−s/rate)`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Countdown of a thread that saw sampling switched off: it comes back to the slow path only
/// after this many bytes, to notice a new session.
pub const IDLE_COUNTDOWN: i64 = 64 << 20;

/// Bumped at every session start and stop; a thread whose epoch differs re-draws its countdown.
pub static EPOCH: AtomicU32 = AtomicU32::new(0);
static RATE: AtomicU64 = AtomicU64::new(512 * 1024);
static SEED: AtomicU64 = AtomicU64::new(0);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(0);

pub struct ThreadState {
    /// Bytes left before the next sample.
    pub countdown: Cell<i64>,
    /// Set while the agent works on this thread: nested allocations pass straight through.
    pub busy: Cell<bool>,
    pub epoch: Cell<u32>,
    rng: Cell<u64>,
    pub tid: Cell<u32>,
}

thread_local! {
    pub static THREAD: ThreadState = const {
        ThreadState {
            countdown: Cell::new(0),
            busy: Cell::new(false),
            epoch: Cell::new(u32::MAX),
            rng: Cell::new(0),
            tid: Cell::new(0),
        }
    };
}

/// Sets the rate and seed of a new session.
pub fn configure(rate: u64, seed: u64) {
    RATE.store(rate.max(1), Ordering::Relaxed);
    SEED.store(seed, Ordering::Relaxed);
    NEXT_THREAD.store(0, Ordering::Relaxed);
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl ThreadState {
    /// Starts this thread's random sequence for the current session. With a fixed seed, the
    /// n-th thread to allocate gets the same sequence in every run.
    pub fn reseed(&self, epoch: u32) {
        let seed = SEED.load(Ordering::Relaxed);
        let ordinal = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        let base = if seed != 0 {
            seed
        } else {
            crate::sys::now_ns() ^ (self as *const _ as u64)
        };
        self.rng.set(splitmix(base ^ splitmix(ordinal)) | 1);
        self.epoch.set(epoch);
    }

    fn next_u64(&self) -> u64 {
        // xorshift64*
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Bytes until the next sample: Exp(rate), or 0 at rate 1 (record everything).
    pub fn draw(&self) -> i64 {
        let rate = RATE.load(Ordering::Relaxed);
        if rate <= 1 {
            return 0;
        }
        // u in (0, 1]; -ln(u) * rate is exponential with mean `rate`.
        let u = ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        (-u.ln() * rate as f64).ceil().min(i64::MAX as f64 / 2.0) as i64
    }
}
