//! The capture fuzzer: any bytes, given to the capture reader, the aggregation and every
//! rendering (reports, summary, folded stacks, flamegraphs, timeline, HTML, diff, pprof,
//! speedscope, JSON export), must give a profile or a clear error, never a panic, within
//! bounded memory and with bounded output, and no control character in what people read.
//!
//! [`check`] runs one input and asserts the bounds. Two drivers use it:
//! - `cargo test` (CI): [`tests::mutated_captures_keep_every_bound`], a deterministic loop of
//!   mutations of real and synthetic captures (every [`VIEWS_EVERY`]th input through the
//!   slower views too), plus crafted worst cases. `MPROF_FUZZ_ITERATIONS` makes the loop
//!   longer.
//! - cargo-fuzz (long runs, nightly): `fuzz/fuzz_targets/capture.rs` (see `fuzz/README.md`).

use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Keep, Profile, View, MEMORY_FIXED, MEMORY_PER_BYTE};
use crate::capture::processes::{CaptureSet, Pick};
use crate::views::export::folded;
use crate::views::report::render;
use std::path::Path;

/// The most a report limited to its default 20 rows may print, whatever the capture: 20 rows
/// of at most 257 frames of two names of at most 256 bytes (6 bytes each once escaped for
/// JSON), plus at most 64 metadata values of at most 4 KiB.
pub const TOP_20_OUTPUT: usize = 20 << 20;
/// A report of every row (`--top 0`) and the folded stacks grow with the capture: at most this
/// many bytes per byte of capture, plus [`TOP_20_OUTPUT`]. (A frame costs 16 bytes in the
/// capture and at most about 3.2 KB in the JSON, once per stack that holds it.)
pub const OUTPUT_PER_BYTE: usize = 200;

/// The bounded fuzz run in `cargo test` renders the views beyond the reports for one input in
/// this many (they take most of its time); cargo-fuzz renders them for every input.
pub const VIEWS_EVERY: usize = 8;

/// What one input cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cost {
    /// Whether the capture loaded (an error is a fine outcome for garbage).
    pub loaded: bool,
    /// Whether the reader refused it for the memory it would take
    /// ([`crate::analysis::profile::LoadError::TooDense`]).
    pub too_dense: bool,
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
    check_some(bytes, path, true)
}

/// [`check`], with the views beyond the reports (flamegraph, timeline, HTML, diff, exports:
/// slower) only if `views`.
pub fn check_some(bytes: &[u8], path: &Path, views: bool) -> Cost {
    std::fs::write(path, bytes).expect("writing the fuzz input");
    let base = crate::base::memory::in_use();
    crate::base::memory::reset_peak();
    let unpacked = crate::capture::file::expansion();
    crate::analysis::profile::reset_last_limit();
    // With the timeline's series, as `timeline` and `html` read (the other views read the
    // same figures without it).
    let loaded = CaptureSet::open(path, Pick::All)
        .and_then(|set| Profile::read_set_keeping(&set, Keep::Series))
        .map(|(p, _warnings)| p);
    let peak_memory = (crate::base::memory::peak() - base).max(0) as usize;
    // Packed records count at the size of what they stand for, and frames at what they
    // declare, as the reader's allowance does (whose checks keep a third of it, see
    // `analysis::profile::build`).
    let counted = bytes.len() + (crate::capture::file::expansion() - unpacked) as usize;
    let bound = memory_bound(counted).max(3 * crate::analysis::profile::last_limit() as usize);
    assert!(
        peak_memory <= bound,
        "the reader took {peak_memory} bytes for {} bytes of capture ({counted} counted, \
         {bound} allowed)",
        bytes.len()
    );
    let too_dense = loaded.as_ref().err().is_some_and(|e| {
        matches!(
            e.downcast_ref::<crate::analysis::profile::LoadError>(),
            Some(crate::analysis::profile::LoadError::TooDense { .. })
        )
    });
    let mut cost = Cost {
        loaded: loaded.is_ok(),
        too_dense,
        peak_memory,
        ..Cost::default()
    };
    let Ok(p) = loaded else {
        return cost;
    };
    for (view, by, json) in [
        (View::Allocated, Grouping::Line, false),
        (View::Live, Grouping::Stack, false),
        (View::Peak, Grouping::Function, true),
        (View::Allocated, Grouping::Stack, true),
        (View::Live, Grouping::YourCode, false),
        (View::Allocated, Grouping::YourCode, true),
    ] {
        let top = render(&p, view, by, 20, json).expect("rendering");
        cost.top_output = cost.top_output.max(top.len());
        let all = render(&p, view, by, 0, json).expect("rendering");
        cost.all_output = cost.all_output.max(all.len());
        if json {
            serde_json::from_str::<serde_json::Value>(&all).expect("the JSON report parses");
        } else {
            assert!(
                !top.contains('\x1b'),
                "a control character reached a text report"
            );
        }
    }
    let lines: usize = folded::lines(&p, View::Allocated)
        .iter()
        .map(|l| l.len() + 1)
        .sum();
    cost.all_output = cost.all_output.max(lines);
    let summary = crate::views::report::summary(&p);
    assert!(!summary.contains('\x1b'));
    if views {
        other_views(&p, path);
    }
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

/// Renders every other view of `p` (read from `path`), asserting that each succeeds and that no
/// control character reaches the ones people read.
fn other_views(p: &Profile, path: &Path) {
    use crate::views::export::{exporter, Options};
    use crate::views::formats::Format;
    let mut outputs: Vec<(&str, Vec<u8>)> = Vec::new();
    // The HTML report draws the plain flamegraph of every view (and the timeline): this one
    // takes the other paths (one thread, inverted, imports kept, a difference).
    let settings = crate::views::flamegraph::Settings {
        thread: p.thread_ids().first().copied(),
        keep_imports: true,
        inverted: true,
        by_allocator: true,
        ..crate::views::flamegraph::Settings::of(View::Allocated)
    };
    if settings.thread.is_some() {
        let svg = crate::views::flamegraph::svg(p, &settings, Some(p)).expect("flamegraph");
        outputs.push(("flamegraph", svg.into_bytes()));
    }
    let set = CaptureSet::open(path, Pick::All).expect("the input is still there");
    let timeline = crate::views::timeline::load(&set, p, 5, Grouping::YourCode).expect("timeline");
    outputs.push((
        "timeline",
        crate::views::timeline::svg(p, &timeline)
            .expect("timeline")
            .into_bytes(),
    ));
    let html = crate::views::html::page(p, &timeline, Grouping::YourCode).expect("html");
    outputs.push(("html", html.into_bytes()));
    let diff = crate::views::diff::text(p, p, View::Live, Grouping::Stack, 0);
    outputs.push(("diff", diff.into_bytes()));
    for format in [Format::Speedscope, Format::Json, Format::Pprof] {
        let options = Options {
            by_allocator: true,
            ..Options::of(View::Live)
        };
        let bytes = exporter(format)
            .expect("an exporter")
            .export(p, &options)
            .expect("export");
        if format != Format::Pprof {
            serde_json::from_slice::<serde_json::Value>(&bytes).expect("the export parses");
            outputs.push((format.name(), bytes));
        }
    }
    let strings = crate::views::export::pprof::profile(p)
        .string_table
        .join("\n");
    outputs.push(("pprof", strings.into_bytes()));
    for (what, bytes) in &outputs {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(['\x1b', '\x07', '\u{9b}']),
            "a control character reached the {what} output"
        );
    }
}

#[cfg(test)]
mod tests;
