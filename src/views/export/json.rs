//! The JSON report (`report --json`, `export --format json`): totals, meta and every
//! location with its three estimates. The schema is in docs/json.md; fields are only added.
//! Names, threads and metadata are exact, with control characters written as JSON escapes
//! ([`crate::base::text::json_safe`]).

use crate::analysis::allocators::{Allocator, Allocators, ByAllocator};
use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Completeness, Figures, Profile, View};
use crate::analysis::sites::{rows, whole, Row};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;

/// The JSON report as text (pretty-printed, with a final newline).
pub fn render(p: &Profile, view: View, by: Grouping, top: usize) -> Result<String> {
    let mut s = crate::base::text::json_safe(serde_json::to_string_pretty(&json_report(
        p, view, by, top,
    ))?);
    s.push('\n');
    Ok(s)
}

/// The JSON export: the report by stack, every location, sorted by allocated bytes.
pub struct Json;

impl super::Exporter for Json {
    fn format(&self) -> super::Format {
        super::Format::Json
    }

    fn export(&self, p: &Profile, options: &super::Options) -> Result<Vec<u8>> {
        Ok(render(p, options.view, Grouping::Stack, 0)?.into_bytes())
    }
}

/// The serialised report.
#[derive(Serialize)]
pub struct JsonReport<'a> {
    view: &'static str,
    by: &'static str,
    rate: u64,
    rate_known: bool,
    samples: u64,
    dropped: u64,
    peak_seconds: Option<f64>,
    max_rss_bytes: Option<u64>,
    duration_seconds: f64,
    /// `ended` (END record), `finished` (mprof closed the file, no END) or `incomplete`.
    completeness: &'static str,
    /// The program's exit code, when `record` saw it exit (null otherwise).
    exit_code: Option<i64>,
    /// The signal that killed the program, when one did (null otherwise).
    exit_signal: Option<i64>,
    warnings: Vec<String>,
    meta: &'a BTreeMap<String, String>,
    threads: &'a BTreeMap<u32, String>,
    /// Whether the agent hooked the C allocator family (null: the capture does not say).
    native_recorded: Option<bool>,
    /// The allocators the figures keep (`--allocator`; all three without it).
    allocators: Vec<&'static str>,
    totals: BTreeMap<&'static str, JsonEstimate>,
    totals_by_allocator: JsonSplit,
    /// A capture recorded with `--follow-children`: its processes, each one's own figures
    /// (the figures above are theirs merged, or one process's with `--pid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    processes: Option<Vec<crate::views::process_table::ProcessRow>>,
    locations_total: usize,
    locations: Vec<JsonLocation<'a>>,
    /// Where the RSS is (see `crate::views::resident`), when the capture read the mappings.
    #[serde(skip_serializing_if = "Option::is_none")]
    rss: Option<crate::views::resident::JsonWhere>,
}

#[derive(Serialize)]
struct JsonEstimate {
    bytes: u64,
    stderr: u64,
    count: u64,
    samples: u64,
}

impl From<&crate::analysis::profile::Estimate> for JsonEstimate {
    fn from(e: &crate::analysis::profile::Estimate) -> JsonEstimate {
        JsonEstimate {
            bytes: whole(e.bytes),
            stderr: whole(e.stderr()),
            count: whole(e.count),
            samples: e.samples,
        }
    }
}

/// The three views' estimates (the shape of `totals`).
type JsonViews = BTreeMap<&'static str, JsonEstimate>;

fn json_views(f: &Figures) -> JsonViews {
    View::ALL
        .iter()
        .map(|&v| (v.name(), JsonEstimate::from(f.get(v))))
        .collect()
}

/// Figures per allocator, in the order views list the allocators; an allocator left out is
/// not written.
#[derive(Serialize, Default)]
struct JsonSplit {
    #[serde(skip_serializing_if = "Option::is_none")]
    python: Option<JsonViews>,
    #[serde(skip_serializing_if = "Option::is_none")]
    native: Option<JsonViews>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mmap: Option<JsonViews>,
}

impl JsonSplit {
    /// The allocators of `split` that `keep` says, with their figures.
    fn of(split: &ByAllocator, keep: impl Fn(Allocator, &Figures) -> bool) -> JsonSplit {
        let one = |a: Allocator| {
            let f = split.get(a);
            keep(a, f).then(|| json_views(f))
        };
        JsonSplit {
            python: one(Allocator::Python),
            native: one(Allocator::Native),
            mmap: one(Allocator::Mmap),
        }
    }
}

/// `python`, `native` or `mmap` when a location's samples all come from one allocator, else
/// `mixed`.
fn allocator_name(split: &ByAllocator) -> &'static str {
    let mut present = split.present().map(|(a, _)| a.name());
    match (present.next(), present.next()) {
        (Some(one), None) => one,
        _ => "mixed",
    }
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    file: &'a str,
    function: &'a str,
    line: u32,
    /// `python` or `native` (`--native` captures mix them).
    kind: &'static str,
    /// A native frame's module (executable or library); null for Python frames.
    module: Option<&'a str>,
}

#[derive(Serialize)]
struct JsonLocation<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    thread: Option<u32>,
    file: &'a str,
    function: &'a str,
    line: u32,
    samples: u64,
    alloc_bytes: u64,
    alloc_stderr: u64,
    alloc_count: u64,
    alloc_samples: u64,
    live_bytes: u64,
    live_stderr: u64,
    live_count: u64,
    live_samples: u64,
    peak_bytes: u64,
    peak_stderr: u64,
    peak_count: u64,
    peak_samples: u64,
    allocator: &'static str,
    /// Only when `allocator` is `mixed`: the figures of each allocator.
    #[serde(skip_serializing_if = "Option::is_none")]
    allocators: Option<JsonSplit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stack: Option<Vec<JsonFrame<'a>>>,
    /// `--by your-code` only: whether `file`… is a frame of your code.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_your_code: Option<bool>,
    /// `--by your-code` only: the innermost frame below it with the most bytes (null when
    /// the location allocated directly).
    #[serde(skip_serializing_if = "Option::is_none")]
    innermost: Option<Option<JsonFrame<'a>>>,
    /// `--by your-code` only: how many other innermost frames there are below it.
    #[serde(skip_serializing_if = "Option::is_none")]
    innermost_others: Option<usize>,
}

fn json_frame<'a>(f: &crate::analysis::profile::Location<'a>) -> JsonFrame<'a> {
    JsonFrame {
        file: f.file,
        function: f.function,
        line: f.line,
        kind: if f.is_native() { "native" } else { "python" },
        module: f.module,
    }
}

fn json_location<'a>(row: &Row<'a>, view: View, by: Grouping) -> JsonLocation<'a> {
    let (a, l, k) = (
        JsonEstimate::from(&row.figures.allocated),
        JsonEstimate::from(&row.figures.live),
        JsonEstimate::from(&row.figures.peak),
    );
    JsonLocation {
        thread: row.thread,
        file: row.file,
        function: row.function,
        line: row.line,
        samples: row.figures.get(view).samples,
        alloc_bytes: a.bytes,
        alloc_stderr: a.stderr,
        alloc_count: a.count,
        alloc_samples: a.samples,
        live_bytes: l.bytes,
        live_stderr: l.stderr,
        live_count: l.count,
        live_samples: l.samples,
        peak_bytes: k.bytes,
        peak_stderr: k.stderr,
        peak_count: k.count,
        peak_samples: k.samples,
        allocator: allocator_name(&row.allocators),
        allocators: (allocator_name(&row.allocators) == "mixed")
            .then(|| JsonSplit::of(&row.allocators, |_, f| f.allocated.samples > 0)),
        stack: (by == Grouping::Stack).then(|| row.stack.iter().map(json_frame).collect()),
        in_your_code: row.beside.map(|b| b.yours),
        innermost: row.beside.map(|b| b.innermost.as_ref().map(json_frame)),
        innermost_others: row.beside.map(|b| b.more),
    }
}

/// The report of `p` as the JSON document serialises it.
pub fn json_report(p: &Profile, view: View, by: Grouping, top: usize) -> JsonReport<'_> {
    let rows = rows(p, view, by);
    let limit = if top == 0 { rows.len() } else { top };
    let shown: Allocators = p.selection();
    JsonReport {
        view: view.name(),
        by: by.name(),
        rate: p.rate,
        rate_known: p.rate_known,
        samples: p.samples,
        dropped: p.dropped,
        peak_seconds: p.peak_seconds,
        max_rss_bytes: p.max_rss,
        duration_seconds: p.duration_seconds,
        completeness: match p.completeness {
            Completeness::Ended => "ended",
            Completeness::Finished => "finished",
            Completeness::Incomplete => "incomplete",
        },
        exit_code: p.meta.get("exit_code").and_then(|v| v.parse().ok()),
        exit_signal: p.meta.get("exit_signal").and_then(|v| v.parse().ok()),
        warnings: {
            let mut w = p.warnings();
            w.extend(crate::views::about::ending_notes(p));
            w
        },
        meta: &p.meta,
        threads: &p.threads,
        native_recorded: p.native_recorded(),
        allocators: shown.iter().map(Allocator::name).collect(),
        totals: json_views(p.totals()),
        totals_by_allocator: JsonSplit::of(p.by_allocator(), |a, _| shown.contains(a)),
        processes: p.followed.then(|| crate::views::process_table::rows(p)),
        locations_total: rows.len(),
        locations: rows
            .iter()
            .take(limit)
            .map(|r| json_location(r, view, by))
            .collect(),
        rss: p.resident.as_ref().map(crate::views::resident::json_where),
    }
}
