//! Sampling state: byte countdowns drawn from an exponential distribution whose mean is the
//! sampling rate (as tcmalloc and Go's heap profiler do). An allocation of `s` bytes is sampled
//! when it takes a countdown to zero or below, i.e. with probability `1 − exp(−s/rate)`.
//!
//! The MEM and OBJ domains are only ever called with the GIL held, so they share one countdown
//! that needs no thread-local lookup: their fast path is a load, a subtraction, a compare and a
//! store. The RAW domain may be called without the GIL, so each thread has its own countdown.
//! Because the exponential distribution is memoryless, both give every byte the same chance.
//!
//! From 3.12 an interpreter may have a GIL of its own (`_interpreters.create()`): the threads of
//! two such interpreters run MEM and OBJ calls at the same time, and a shared countdown loses
//! their updates (a thread's stale store after another drew afresh is a sample too many: the
//! estimates of such a program read 50% high). Once a sample comes from a thread of an
//! interpreter with a GIL of its own, the shared countdown is held at [`ALWAYS_SLOW`] for
//! the rest of the process: every MEM and OBJ call takes the slow path, which counts the
//! thread's own countdown (the RAW one) down instead. Slower, only in such processes.
//!
//! Each hook layer (see `chain`) has countdowns of its own, so that a layer that only passes
//! calls through never takes bytes from the sampling one. The MEM and OBJ countdown of each
//! layer sits beside the allocators it wraps, in `chain` (which arms it); here, everything
//! else.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Layers of hooks (see `chain`): how many times a session may find its hooks taken out of the
/// chain before the process has to be restarted to be profiled again.
pub const LAYERS: usize = 4;

/// Countdown while sampling is off: the slow path is visited once per this many bytes, to notice
/// a new session.
pub const IDLE_COUNTDOWN: i64 = 64 << 20;

/// The MEM and OBJ countdown once the process has interpreters with GILs of their own: far
/// below zero, so every call takes the slow path, and no thread's subtraction brings it back
/// above zero.
pub const ALWAYS_SLOW: i64 = i64::MIN / 4;

/// Set for the rest of the process once it runs an interpreter with a GIL of its own (3.12+;
/// see the module's doc).
static SEVERAL_GILS: AtomicBool = AtomicBool::new(false);

/// Whether MEM and OBJ calls count down per thread (see the module's doc).
#[inline]
pub fn several_gils() -> bool {
    SEVERAL_GILS.load(Ordering::Relaxed)
}

/// From now on MEM and OBJ calls count down per thread (see `chain::enter_several_gils`, which
/// holds their shared countdown down too). Only a change is written.
pub fn set_several_gils() {
    if !several_gils() {
        SEVERAL_GILS.store(true, Ordering::Relaxed);
    }
}

/// What the shared MEM and OBJ countdown starts a session at.
pub fn gil_start() -> i64 {
    if several_gils() {
        ALWAYS_SLOW
    } else {
        draw()
    }
}

/// Bumped at every session start and stop; a RAW countdown whose epoch differs is re-drawn.
pub static EPOCH: AtomicU32 = AtomicU32::new(0);
static RATE: AtomicU64 = AtomicU64::new(128 * 1024);
static RNG: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);

/// Per-thread state: the RAW countdowns and the reentrancy guard.
pub struct ThreadState {
    /// Bytes left before the next RAW sample, per layer (and MEM and OBJ sample, once the
    /// process has several GILs).
    pub countdown: [Cell<i64>; LAYERS],
    /// Set while the agent or a nested allocator call works on this thread: allocations made
    /// meanwhile pass straight through.
    pub busy: Cell<bool>,
    /// The session `countdown` was drawn in, per layer.
    pub epoch: [Cell<u32>; LAYERS],
    /// Bytes left before the next sample of the C allocator family and `mmap`, and the session
    /// it was drawn in.
    pub native_countdown: Cell<i64>,
    pub native_epoch: Cell<u32>,
    pub tid: Cell<u32>,
    /// The session ([`EPOCH`]) in which the thread wrote its HANDLE (see `spawns`).
    pub handle_epoch: Cell<u32>,
    /// Whether the thread may read the time-stamp counter (`sys::tsc_allowed`), found with its
    /// `tid`.
    pub tsc: Cell<bool>,
    /// The offset from the thread pointer at which this thread's value of the interpreter's
    /// key was found as the C library answered it (see `python::ThisThread::get`); 0 until
    /// then.
    pub key_slot: Cell<isize>,
    /// The thread's stack, `(lowest, top)`, once `--native` asked for it (see `unwind`).
    pub stack: Cell<(usize, usize)>,
}

thread_local! {
    pub static THREAD: ThreadState = const {
        ThreadState {
            countdown: [const { Cell::new(0) }; LAYERS],
            busy: Cell::new(false),
            epoch: [const { Cell::new(u32::MAX) }; LAYERS],
            native_countdown: Cell::new(0),
            native_epoch: Cell::new(u32::MAX),
            tid: Cell::new(0),
            handle_epoch: Cell::new(u32::MAX),
            tsc: Cell::new(false),
            key_slot: Cell::new(0),
            stack: Cell::new((0, 0)),
        }
    };
}

/// Takes `size` bytes off a thread's own countdown: false when they took it to zero or below.
/// Plain Rust (a load, a subtraction, a store and a test): the compiler addresses the cell
/// at the thread pointer, which an instruction written by hand could not (see
/// `chain::gil_take` for the countdown at a fixed address).
#[inline(always)]
pub fn take(c: &Cell<i64>, size: usize) -> bool {
    let left = c.get().wrapping_sub(size as i64);
    c.set(left);
    left > 0
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sets the rate and seed of a new session (0 = seed from the clock); the threads' own
/// countdowns are drawn afresh (`chain::arm_countdown` arms the sampling layer's shared one).
pub fn configure(rate: u64, seed: u64) {
    // At most 2⁶²: a draw multiplies it as a signed 64-bit integer.
    RATE.store(rate.clamp(1, 1 << 62), Ordering::Relaxed);
    let seed = if seed != 0 {
        seed
    } else {
        crate::sys::precise_ns() ^ (crate::sys::gettid() as u64) << 32
    };
    RNG.store(splitmix(seed) | 1, Ordering::Relaxed);
    next_epoch();
}

/// The session's sampling rate, in bytes.
pub fn rate() -> u64 {
    RATE.load(Ordering::Relaxed)
}

/// Every thread's own countdowns are drawn afresh, or set idle, at its next allocation (they
/// are of an older epoch then).
pub fn next_epoch() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

fn next_u64() -> u64 {
    // xorshift64*, shared by all threads; a CAS keeps concurrent draws distinct.
    let mut x = RNG.load(Ordering::Relaxed);
    loop {
        let mut y = x;
        y ^= y >> 12;
        y ^= y << 25;
        y ^= y >> 27;
        match RNG.compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return y.wrapping_mul(0x2545_F491_4F6C_DD1D),
            Err(now) => x = now,
        }
    }
}

/// Bytes until the next sample: Exp(rate), or 0 at rate 1 (record everything).
pub fn draw() -> i64 {
    let rate = RATE.load(Ordering::Relaxed);
    if rate <= 1 {
        return 0;
    }
    // u in (0, 1]; -ln(u) * rate is exponential with mean `rate` (at most 2⁶², so the signed
    // conversion, one instruction where an unsigned one took two and two constants).
    let u = ((next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
    // Rounded up as the truncation plus one (they differ only on a whole number, which a
    // draw almost never is): `f64::ceil` is a libm call on the target's baseline x86-64.
    let bytes = (minus_ln(u) * rate as i64 as f64).min(i64::MAX as f64 / 2.0);
    // SAFETY: in [0, 2⁶²], not NaN (u > 0): the plain conversion, without the saturating
    // cast's checks and their constants.
    unsafe { bytes.to_int_unchecked::<i64>() + 1 }
}

/// Minus the natural logarithm of `u` in [2⁻⁵³, 1], without calling the C library: at the default
/// rate every sample draws once, and libm's `log` was cold each time (measured with `perf` on
/// the web server: a sixth of a microsecond a draw, 0.15–0.2% of the server's time).
///
/// On x86-64 it is the x87 unit's `fyl2x` (−ln 2 · log₂ u, in extended precision, rounded
/// once to a double): five instructions in one line of code, no constants. The series below
/// took about 50 instructions, seven lines of code and four lines of constants a sample, all
/// of them fetched afresh at the default rate. The x87 stack is empty between functions (the
/// x86-64 ABI), and the asm leaves it so.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
fn minus_ln(u: f64) -> f64 {
    let mut x = u;
    // SAFETY: reads and writes `x` only; pushes two x87 registers and pops both.
    unsafe {
        std::arch::asm!(
            "fldln2",
            "fchs",
            "fld qword ptr [{x}]",
            "fyl2x",
            "fstp qword ptr [{x}]",
            x = in(reg) &mut x,
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            options(nostack),
        );
    }
    x
}

/// [`minus_ln`] elsewhere (and under Miri, which runs no asm), within a few units in the last
/// place of `f64::ln`.
///
/// `u = m · 2^e` with `m` in [√½, √2), and `ln m = 2 atanh(s)` with `s = (m − 1)/(m + 1)`,
/// `|s| < 0.172`: the odd series to `s²¹` leaves a truncation error below 10⁻¹⁸ of `ln m`.
#[cfg(any(not(target_arch = "x86_64"), miri, test))]
#[inline]
fn minus_ln_series(u: f64) -> f64 {
    const LN_2: f64 = std::f64::consts::LN_2;
    let bits = u.to_bits();
    // u is normal (at least 2⁻⁵³): a biased exponent and a 52-bit fraction.
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits(bits & ((1 << 52) - 1) | 1023 << 52);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    // Horner's rule from the innermost term, 1/21, out to 1: the same operations in the same
    // order as the nested expression (which rustfmt takes minutes to lay out).
    const TERMS: [f64; 10] = [
        1.0 / 19.0,
        1.0 / 17.0,
        1.0 / 15.0,
        1.0 / 13.0,
        1.0 / 11.0,
        1.0 / 9.0,
        1.0 / 7.0,
        1.0 / 5.0,
        1.0 / 3.0,
        1.0,
    ];
    let mut series = 1.0 / 21.0;
    for t in TERMS {
        series = t + z * series;
    }
    -(e as f64 * LN_2 + 2.0 * s * series)
}

/// [`minus_ln_series`] where there is no x87 unit.
#[cfg(any(not(target_arch = "x86_64"), miri))]
#[inline]
fn minus_ln(u: f64) -> f64 {
    minus_ln_series(u)
}

#[cfg(test)]
mod tests {
    use super::{minus_ln, minus_ln_series};

    /// Both logarithms against the C library's over the whole range a draw uses: every power
    /// of two and its neighbours, the ends, and a spread of values between.
    #[test]
    fn minus_ln_agrees_with_the_c_library() {
        let mut xs = vec![1.0, f64::from_bits(1.0f64.to_bits() - 1), 0.5f64.powi(53)];
        for k in 0..=53 {
            let p = 0.5f64.powi(k);
            xs.extend([p, p * std::f64::consts::SQRT_2, p * 0.75, p * 0.999_999]);
            xs.push(f64::from_bits(p.to_bits() + 1));
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..if cfg!(miri) { 500 } else { 200_000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            xs.push(((x >> 11) + 1) as f64 / (1u64 << 53) as f64);
        }
        // Miri gives `f64::ln` a few units of error of its own on purpose (libm's results
        // differ between platforms): the bound there is looser.
        let ulps = if cfg!(miri) { 32.0 } else { 4.0 };
        for u in xs.into_iter().filter(|u| *u > 0.0 && *u <= 1.0) {
            let want = -u.ln();
            for (name, got) in [("minus_ln", minus_ln(u)), ("series", minus_ln_series(u))] {
                let err = (got - want).abs();
                assert!(
                    err <= ulps * f64::EPSILON * want.abs().max(f64::MIN_POSITIVE),
                    "-ln({u:e}) = {want:e}, {name} gives {got:e}"
                );
            }
        }
    }

    /// The draws are exponential with mean `rate`: their mean, and the share of them beyond
    /// one, two and four times the rate (e⁻¹, e⁻², e⁻⁴), each within four standard errors.
    #[test]
    fn draws_are_exponential_with_the_rate_as_mean() {
        let rate = 131_072u64;
        super::RATE.store(rate, std::sync::atomic::Ordering::Relaxed);
        super::RNG.store(super::splitmix(7) | 1, std::sync::atomic::Ordering::Relaxed);
        let n = if cfg!(miri) { 2_000 } else { 400_000 };
        let draws: Vec<f64> = (0..n).map(|_| super::draw() as f64).collect();
        assert!(draws.iter().all(|&d| d >= 1.0));
        let mean = draws.iter().sum::<f64>() / n as f64;
        // The standard error of the mean of n exponentials is rate / sqrt(n).
        let se = rate as f64 / (n as f64).sqrt();
        assert!(
            (mean - rate as f64).abs() < 4.0 * se,
            "mean {mean}, rate {rate}"
        );
        for k in [1.0f64, 2.0, 4.0] {
            let p = (-k).exp();
            let share = draws.iter().filter(|&&d| d > k * rate as f64).count() as f64 / n as f64;
            let se = (p * (1.0 - p) / n as f64).sqrt();
            assert!(
                (share - p).abs() < 4.0 * se,
                "beyond {k}x: {share}, want {p}"
            );
        }
    }
}
