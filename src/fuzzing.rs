//! The capture fuzzer: any bytes, given to the capture reader, the aggregation and every
//! rendering, must give a profile or a clear error, never a panic, within bounded memory and
//! with bounded output.
//!
//! [`check`] runs one input and asserts the bounds. Two drivers use it:
//! - `cargo test` (CI): [`tests::mutated_captures_keep_every_bound`], a deterministic loop of
//!   mutations of real and synthetic captures, plus crafted worst cases. `MPROF_FUZZ_ITERATIONS`
//!   makes the loop longer.
//! - cargo-fuzz (long runs, nightly): `fuzz/fuzz_targets/capture.rs` (see `fuzz/README.md`).

use crate::flamegraph::folded;
use crate::profile::{Profile, View, MEMORY_FIXED, MEMORY_PER_BYTE};
use crate::report::{render, By};
use std::path::Path;

/// The most a report limited to its default 20 rows may print, whatever the capture: 20 rows
/// of at most 257 frames of two names of at most 256 bytes (6 bytes each once escaped for
/// JSON), plus at most 64 metadata values of at most 4 KiB.
pub const TOP_20_OUTPUT: usize = 20 << 20;
/// A report of every row (`--top 0`) and the folded stacks grow with the capture: at most this
/// many bytes per byte of capture, plus [`TOP_20_OUTPUT`]. (A frame costs 16 bytes in the
/// capture and at most about 3.2 KB in the JSON, once per stack that holds it.)
pub const OUTPUT_PER_BYTE: usize = 200;

/// What one input cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cost {
    /// Whether the capture loaded (an error is a fine outcome for garbage).
    pub loaded: bool,
    /// Most memory the reader held beyond what the thread held before, in bytes (the warnings
    /// it returns included).
    pub peak_memory: usize,
    /// Longest output of the default reports (20 rows).
    pub top_output: usize,
    /// Longest output of the unlimited reports and of the folded stacks.
    pub all_output: usize,
}

/// The memory the reader may take for a capture of `len` bytes.
pub fn memory_bound(len: usize) -> usize {
    MEMORY_PER_BYTE * len + MEMORY_FIXED
}

/// Runs the capture `bytes` (written to `path`) through the reader and every rendering; panics
/// (the fuzz failure) if a bound is broken. The caller has the thread to itself.
pub fn check(bytes: &[u8], path: &Path) -> Cost {
    std::fs::write(path, bytes).expect("writing the fuzz input");
    let base = crate::memory::in_use();
    crate::memory::reset_peak();
    let loaded = Profile::read(path).map(|(p, _warnings)| p);
    let peak_memory = (crate::memory::peak() - base).max(0) as usize;
    assert!(
        peak_memory <= memory_bound(bytes.len()),
        "the reader took {peak_memory} bytes for {} bytes of capture",
        bytes.len()
    );
    let mut cost = Cost {
        loaded: loaded.is_ok(),
        peak_memory,
        ..Cost::default()
    };
    let Ok(p) = loaded else {
        return cost;
    };
    for (view, by, json) in [
        (View::Allocated, By::Line, false),
        (View::Live, By::Stack, false),
        (View::Peak, By::Function, true),
        (View::Allocated, By::Stack, true),
    ] {
        let top = render(&p, view, by, 20, json).expect("rendering");
        cost.top_output = cost.top_output.max(top.len());
        let all = render(&p, view, by, 0, json).expect("rendering");
        cost.all_output = cost.all_output.max(all.len());
        if !json {
            assert!(
                !top.contains('\x1b'),
                "a control character reached a text report"
            );
        }
    }
    let lines: usize = folded(&p, View::Allocated)
        .iter()
        .map(|l| l.len() + 1)
        .sum();
    cost.all_output = cost.all_output.max(lines);
    let summary = crate::report::summary(&p);
    assert!(!summary.contains('\x1b'));
    assert!(
        cost.top_output <= TOP_20_OUTPUT,
        "a 20-row report of {} bytes of capture printed {} bytes",
        bytes.len(),
        cost.top_output
    );
    assert!(
        cost.all_output <= OUTPUT_PER_BYTE * bytes.len() + TOP_20_OUTPUT,
        "{} bytes of capture printed {} bytes",
        bytes.len(),
        cost.all_output
    );
    cost
}

#[cfg(test)]
mod tests;
