//! mprof as a library: reading captures, estimating and aggregating, the views and exporters,
//! and the profiling sessions. The `mprof` binary (`src/main.rs`) is a thin command-line front
//! end over it; the integration tests build their captures with [`testing`].
//!
//! Layout, by what each module owns:
//! - capture files: [`capture`] (reading, writing), [`testing`] (building them by hand);
//! - analysis: [`estimate`] (what a sample stands for), [`allocators`] (which allocator the
//!   bytes came from), [`names`] (interning, stacks), [`aggregate`] (replaying records),
//!   [`profile`] (a whole capture, within its memory allowance), [`grouping`] and [`sites`]
//!   (rows), [`focus`] (which code is yours), [`frames`] (labels and kinds of code), [`text`]
//!   (making untrusted names printable, bounding them), [`units`], [`symbols`] (native
//!   stacks: modules, symbolization, the merge with Python frames);
//! - views: [`report`] (text), [`flamegraph`], [`timeline`], [`html`], [`diff`], [`export`]
//!   (pprof, speedscope, folded, JSON), [`live`] (the terminal view);
//! - sessions: [`record`], [`attach`], [`inprocess`] (a program's session on itself, pymprof),
//!   [`driver`] (the one drain loop record and attach use, with each command's stop
//!   conditions), [`session`] (the ring reader), [`signals`], [`hints`] (what a user who would
//!   otherwise be stuck is told);
//! - processes: [`children`] (following children: their rings and captures), [`rendezvous`]
//!   (how a child hands its ring over), [`processes`] and [`process_table`] (a capture set's
//!   processes, merged or picked with `--pid`);
//! - safety: [`output`] (creating every output file), [`memory`] (the counting allocator),
//!   `fuzzing` (the capture fuzzer, in tests and under `--cfg fuzzing`).

#![warn(clippy::undocumented_unsafe_blocks)]

/// `eprintln!` that never panics: mprof's standard error may be a closed pipe (`mprof record
/// … 2>&1 | head -1`), and a line that cannot be shown must not end a session (`eprintln!`
/// panics when the write fails). Every message mprof prints goes through it.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod aggregate;
pub mod allocators;
pub mod attach;
pub mod capture;
pub mod children;
pub mod diff;
pub mod driver;
pub mod estimate;
pub mod export;
pub mod flamegraph;
pub mod focus;
pub mod frames;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
pub mod grouping;
pub mod hints;
pub mod html;
pub mod inprocess;
pub mod live;
pub mod memory;
pub mod names;
pub mod output;
pub mod process_table;
pub mod processes;
pub mod profile;
pub mod record;
pub mod rendezvous;
pub mod report;
pub mod session;
pub mod signals;
pub mod sites;
pub mod symbols;
pub mod testing;
pub mod text;
pub mod timeline;
pub mod units;

/// The default `--rate`, for `--native` too. Chosen by wall time, measured as simultaneous
/// pinned pairs (README, "Why 128 KiB by default"): a sample costs the program about a
/// microsecond on the allocation-bound job and about three on the web server (docs/overhead.md),
/// most of it fetching the sample path's code and data again after the program's own work
/// evicted them, which instruction counts do not see. At 32 KiB (the default of
/// the releases before) the samples took 2.7 points of the allocation-bound job's time and 3.8
/// of the web server's; at 128 KiB the job is within its goal (1.03×) and the web server about
/// 0.4 points above its own (1.02×). A native unwind costs about 10,000 instructions more a
/// sample.
pub const DEFAULT_RATE: &str = "128KiB";

/// Settings shared by `record` and `attach`: sampling, and what counts as your code.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Mean bytes allocated between two samples (`512KiB`, `1MiB`, plain bytes); 1 records
    /// every allocation. Units are 1024-based whatever their spelling: `k`, `KB` and `KiB` are
    /// 1024 bytes, `MB` and `MiB` 1,048,576.
    #[arg(long, default_value = DEFAULT_RATE, value_parser = units::parse_size)]
    pub rate: u64,
    /// Deepest Python stack recorded, innermost frames kept.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_depth: u32,
    /// Seed for the sampling random numbers, for repeatable runs (0 picks one).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sample Python's allocators only: leave the C allocator family and mmap alone (native
    /// allocations are seen by default).
    #[arg(long)]
    pub python_only: bool,
    /// Record the native (C) stack of every sample too, for mixed C + Python stacks (costs a
    /// native unwind per sampled allocation, nothing per allocation).
    #[arg(long)]
    pub native: bool,
    /// Count the files under PATH as your code, library or not, in the summary, the live view
    /// and later reports (kept in the capture). Repeatable; a relative PATH also matches that
    /// run of directories anywhere (`--focus mypkg` matches `…/site-packages/mypkg/…`).
    #[arg(long = "focus", value_name = "PATH")]
    pub focus: Vec<std::path::PathBuf>,
}

impl SamplingArgs {
    /// The ring's `config_flags` for these settings.
    pub fn config_flags(&self) -> u32 {
        let mut flags = 0;
        if self.python_only {
            flags |= mprof_common::ring::CONFIG_PYTHON_ONLY;
        }
        if self.native {
            flags |= mprof_common::ring::CONFIG_NATIVE_STACKS;
        }
        flags
    }

    /// The capture's metadata about these settings: `rate=…`, `max_depth=…`, `seed=…` and
    /// `native=on|off`, one per line.
    pub fn meta(&self) -> String {
        format!(
            "rate={}\nmax_depth={}\nseed={}\n{}={}\nnative_stacks={}\n",
            self.rate,
            self.max_depth,
            self.seed,
            allocators::NATIVE_META,
            if self.python_only { "off" } else { "on" },
            if self.native { "on" } else { "off" }
        )
    }
}
