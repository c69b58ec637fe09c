//! The slow paths' own time, counted where the program runs: a diagnostic build only.
//!
//! Built with `MPROF_AGENT_CYCLES=1` in the environment (`injector/build.rs` then passes
//! `--cfg mprof_cycles`; `benches/sample_cycles.py` makes such a build in a target directory
//! of its own), the agent reads the processor's time-stamp counter around its slow paths and
//! sums the cycles and counts in `MPROF_CYCLES`, which the benchmark reads while the program
//! runs; as the process exits it writes the counter's frequency to a file named by its pid in
//! the directory `MPROF_CYCLES_OUT` of the process's environment. Instruction counts
//! (callgrind) cannot see what a sample waits for, and the wall time of the pairs moves by more
//! than a sample costs. In any other build every function here is empty and inlined away.

/// What a count is of.
#[derive(Clone, Copy)]
pub enum Part {
    /// A sampled allocation, from the slow path's start to the allocator's return: the
    /// decision, the draw, the allocator's own call.
    AllocCall = 0,
    /// A sampled allocation's record: its stack, its records, the set.
    AllocRecord = 1,
    /// A realloc that took the slow path (sampled, or of a sampled block), its call included.
    Realloc = 2,
    /// A free whose address passed the filter.
    Free = 3,
}

#[cfg(all(mprof_cycles, target_arch = "x86_64"))]
mod counting {
    use super::Part;
    use std::sync::atomic::{AtomicU64, Ordering};

    const PARTS: usize = 4;
    /// The count of each part, then its cycles: one array under a plain name, so that a
    /// benchmark can read it in the running process (`/proc/PID/mem`, at the address the
    /// library's symbol table gives).
    #[no_mangle]
    static MPROF_CYCLES: [AtomicU64; 2 * PARTS] = [const { AtomicU64::new(0) }; 2 * PARTS];
    const COUNTS: usize = 0;
    const CYCLES: usize = PARTS;
    /// The counter and the monotonic clock when the agent was loaded: with those at exit, the
    /// counter's frequency.
    static START: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

    #[inline(always)]
    pub fn now() -> u64 {
        // SAFETY: rdtsc has no preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[inline(always)]
    pub fn add(part: Part, since: u64) {
        let i = part as usize;
        MPROF_CYCLES[CYCLES + i].fetch_add(now().wrapping_sub(since), Ordering::Relaxed);
        MPROF_CYCLES[COUNTS + i].fetch_add(1, Ordering::Relaxed);
    }

    extern "C" fn started() {
        START[0].store(now(), Ordering::Relaxed);
        START[1].store(crate::sys::now_ns(), Ordering::Relaxed);
    }

    /// Writes the counter's ticks and the nanoseconds since [`started`]: its frequency.
    extern "C" fn write_out() {
        let Some(dir) = std::env::var_os("MPROF_CYCLES_OUT") else {
            return;
        };
        let text = format!(
            "tsc {} ns {}\n",
            now().wrapping_sub(START[0].load(Ordering::Relaxed)),
            crate::sys::now_ns().saturating_sub(START[1].load(Ordering::Relaxed))
        );
        let path = std::path::Path::new(&dir).join(std::process::id().to_string());
        let _ = std::fs::write(path, text);
    }

    #[used]
    #[link_section = ".init_array"]
    static STARTED: extern "C" fn() = started;
    #[used]
    #[link_section = ".fini_array"]
    static WRITE_OUT: extern "C" fn() = write_out;
}

#[cfg(not(all(mprof_cycles, target_arch = "x86_64")))]
mod counting {
    use super::Part;

    #[inline(always)]
    pub fn now() -> u64 {
        0
    }

    #[inline(always)]
    pub fn add(_part: Part, _since: u64) {}
}

pub use counting::{add, now};
