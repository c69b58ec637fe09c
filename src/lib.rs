//! mprof as a library: the profiling sessions, the capture files they write, the analysis of a
//! capture and the views of it. The `mprof` binary (`src/main.rs`) is a thin command-line front
//! end over it; the integration tests build their captures with [`capture::testing`].
//!
//! The crate is laid out as its pipeline, one folder per stage. Data flows from a session to a
//! capture file, from the file through the analysis to a view:
//!
//! ```text
//!   sessions ──writes──► capture ──read by──► analysis ──shown by──► views
//!      └───────────── feeds the live view, prints the summary ──────────┘
//! ```
//!
//! Imports run one way only, from a stage to the stages under it in this list (a session
//! writes its capture, feeds the live view and prints a summary at the end; a view shows an
//! analysis; the analysis reads captures), and no module imports in a circle.
//! `tests/layers.rs` checks both:
//! - [`sessions`]: `record` and `attach`, the drain loop they share (`driver`), the ring
//!   reader, followed children and their rendezvous, what a stuck user is told (`hints`);
//! - [`views`]: the text report, flamegraph, timeline, HTML report, diff, exports and the
//!   live terminal view, and the formats and headings they share;
//! - [`analysis`]: estimates, allocators, interning of stacks and names, native symbols,
//!   which code is yours, grouping into rows, replaying a capture into a [`analysis::profile`];
//! - [`capture`]: the capture file format (writing and reading), its metadata, the set of
//!   captures of followed processes, and builders of captures for tests;
//! - [`base`]: what every stage may use: printable text, units, creating output files, the
//!   counting allocator, signals, clocks.
//!
//! `fuzzing` (the capture fuzzer, in tests and under `--cfg fuzzing`) runs every view over
//! hostile captures: it sits above the stages, beside `main.rs`.

#![warn(clippy::undocumented_unsafe_blocks)]

/// `eprintln!` that never panics: mprof's standard error may be a closed pipe (`mprof record
/// … 2>&1 | head -1`), and a line that cannot be shown must not end a session (`eprintln!`
/// panics when the write fails). Every message mprof prints goes through it, and every one is
/// made safe for a terminal first ([`base::text::terminal_safe`]): a message may quote what a
/// target or a capture said (a library's path, a thread's name), which must not reach root's
/// terminal as escape sequences.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", $crate::base::text::terminal_safe(&text));
    }};
}

pub mod analysis;
pub mod base;
pub mod capture;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
pub mod sessions;
pub mod views;
