//! What `mprof record` and `mprof attach` sample with: the settings they share, and the
//! metadata and ring flags those settings become.

use crate::analysis::allocators;
use crate::base::units;

/// The default `--rate`, for `--native` too. Chosen by wall time, measured as simultaneous
/// pinned pairs (docs/sampling.md, "Why 128 KiB by default"): a sample costs the program about a
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
