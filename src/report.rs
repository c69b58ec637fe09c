//! The text report: a capture's allocation sites, grouped and sorted by one view (the rows come
//! from [`crate::sites`]), and the short summary `record` and `attach` print at the end. The
//! text report leaves out rows whose bytes in the view are zero; `--json` (see
//! [`crate::export::json`]) keeps them, at the end.

use crate::allocators::split_text;
use crate::grouping::Grouping;
use crate::profile::{Lens, Profile, View};
use crate::sites::{rows, whole, Row};
use crate::text::printable;
use crate::units::human_bytes;
use anyhow::Result;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// `mprof report`: prints the report of a capture to stdout, read through `lens` (the files
/// that count as your code, the allocators kept).
pub fn run(
    path: &Path,
    view: View,
    by: Grouping,
    top: usize,
    json: bool,
    lens: &Lens,
) -> Result<()> {
    let p = Profile::load_with(path, lens)?;
    let out = render(&p, view, by, top, json)?;
    write_stdout(out.as_bytes())
}

/// `mprof report --per-process`: prints the processes of a capture (see
/// [`crate::process_table`]).
pub fn run_per_process(path: &Path, json: bool, lens: &Lens) -> Result<()> {
    crate::process_table::run(path, json, lens)
}

/// The report as `mprof report` prints it: JSON (see [`crate::export::json`]) or text.
pub fn render(p: &Profile, view: View, by: Grouping, top: usize, json: bool) -> Result<String> {
    if json {
        crate::export::json::render(p, view, by, top)
    } else {
        Ok(text_report(p, view, by, top))
    }
}

/// Writes to stdout; a closed pipe (`mprof report x | head`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// How a view is named in headers and titles.
pub fn view_title(view: View) -> &'static str {
    match view {
        View::Allocated => "allocated bytes",
        View::Live => "live bytes at the end",
        View::Peak => "live bytes at the peak",
    }
}

/// The rate as reports show it. A capture that never announced its rate says so rather than
/// claim every allocation was recorded.
pub fn rate_text(p: &Profile) -> String {
    match (p.rate_known, p.rate <= 1) {
        (false, _) if p.samples == 0 => "rate unknown (no sample, no rate in the capture)".into(),
        (false, _) => "rate unknown (assumed 1: every allocation)".to_owned(),
        (true, true) => "rate 1 (every allocation recorded)".to_owned(),
        (true, false) => format!("rate {}", human_bytes(p.rate as f64)),
    }
}

/// `X ± Y` for an estimate's bytes.
pub fn plus_minus(bytes: f64, stderr: f64) -> String {
    format!("{} ± {}", human_bytes(bytes), human_bytes(stderr))
}

/// Who was profiled: `record PID 4242: python app.py` or `attach PID 1234: ...`, when the
/// capture says; made printable (the metadata is untrusted).
pub fn target_text(p: &Profile) -> Option<String> {
    let mode = p.meta.get("mode").map(String::as_str).unwrap_or("capture");
    let text = match (p.meta.get("pid"), p.meta.get("command")) {
        (Some(pid), Some(c)) => format!("{mode} PID {pid}: {c}"),
        (Some(pid), None) => format!("{mode} PID {pid} (command line not recorded)"),
        (None, Some(c)) => format!("{mode}: {c}"),
        (None, None) => return None,
    };
    Some(printable(&text).into_owned())
}

/// The Python version (the number only: `sys.version` goes on with build details).
pub fn python_version(p: &Profile) -> Option<&str> {
    p.meta
        .get("python")
        .and_then(|v| v.split_whitespace().next())
}

/// The peak line: `peak live heap X ± Y, 1.2 s in; peak RSS Z`.
pub fn peak_text(p: &Profile) -> String {
    let t = p.totals();
    let mut out = format!(
        "peak live heap {}",
        plus_minus(t.peak.bytes, t.peak.stderr())
    );
    if let Some(s) = p.peak_seconds {
        let _ = write!(out, " at {s:.3} s");
    }
    match p.max_rss {
        Some(rss) => {
            let _ = write!(out, "; peak RSS {}", human_bytes(rss as f64));
        }
        None => out.push_str("; no RSS reading"),
    }
    out
}

/// Width of the columns before the location.
const COLUMNS: usize = 11 + 1 + 11 + 1 + 6 + 1 + 8 + 2;
/// Callers shown under a row of `--by stack`; the JSON has them all.
const MAX_CALLERS: usize = 16;

/// The lines every text view starts with: the target, rate and counts, the warnings.
pub fn header_lines(p: &Profile) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(target) = target_text(p) {
        lines.push(target);
    }
    if let Some(processes) = crate::process_table::header_line(p) {
        lines.push(processes);
    }
    let mut about = vec![
        rate_text(p),
        format!("{} samples", p.samples),
        format!("{} dropped", p.dropped),
    ];
    if let Some(python) = python_version(p) {
        about.push(format!("python {}", printable(python)));
    }
    lines.push(about.join(", "));
    if p.native_recorded() == Some(false) {
        lines.push(NOT_NATIVE.to_owned());
    }
    if !p.selection().is_all() {
        lines.push(format!(
            "allocators shown: {} only (--allocator)",
            p.selection().names()
        ));
    }
    if let Some(w) = p.incomplete() {
        lines.push(format!("warning: {w}"));
    }
    if p.dropped > 0 {
        lines.push(format!(
            "warning: the agent dropped {} records (its buffer was full); the figures miss them",
            p.dropped
        ));
    }
    lines
}

/// What views say of a capture recorded with `--python-only`.
pub const NOT_NATIVE: &str =
    "native allocations were not recorded (--python-only): Python's allocators only";

/// `total live: X ± Y`, then how the allocators shown share it (` = python A + native B +
/// mmap C`) unless only Python's were recorded or one allocator is shown.
pub fn total_text(p: &Profile, view: View) -> String {
    let total = p.totals().get(view);
    let mut out = format!(
        "total {}: {}",
        view.name(),
        plus_minus(total.bytes, total.stderr())
    );
    let shown = p.selection();
    if p.native_recorded() != Some(false) && shown.iter().count() > 1 {
        let split = split_text(p.by_allocator(), view, shown);
        let _ = write!(out, " = {}", split.replace(", ", " + "));
    }
    out
}

/// `label  ← innermost  [native]`: the row's label, then the innermost frame beside it when
/// grouped by your code, then its allocator when its bytes are not all Python's (see
/// [`crate::allocators::ByAllocator::tag`]).
fn labelled(label: &str, row: &Row, view: View) -> String {
    let mut out = label.to_owned();
    for extra in [row.beside_text(), row.allocators.tag(view)] {
        if !extra.is_empty() {
            out.push_str("  ");
            out.push_str(&extra);
        }
    }
    out
}

/// The text report.
pub fn text_report(p: &Profile, view: View, by: Grouping, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "mprof report: {}, by {}", view_title(view), by.title());
    for line in header_lines(p) {
        let _ = writeln!(out, "{line}");
    }
    let total = p.totals().get(view);
    let _ = writeln!(out, "{}", total_text(p, view));
    let _ = writeln!(out, "{}", peak_text(p));
    out.push('\n');
    let rows = rows(p, view, by);
    let shown: Vec<&Row> = rows
        .iter()
        .filter(|r| whole(r.figures.get(view).bytes) > 0)
        .collect();
    if shown.is_empty() {
        let _ = writeln!(out, "no samples in this view");
        return out;
    }
    let limit = if top == 0 { shown.len() } else { top };
    let _ = writeln!(
        out,
        "{:>11} {:>11} {:>6} {:>8}  location",
        view.name(),
        "± stderr",
        "%",
        "samples"
    );
    for row in shown.iter().take(limit) {
        let e = row.figures.get(view);
        let share = if total.bytes > 0.0 {
            100.0 * e.bytes / total.bytes
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "{:>11} {:>11} {:>6} {:>8}  {}",
            human_bytes(e.bytes),
            human_bytes(e.stderr()),
            format!("{share:.1}%"),
            e.samples,
            printable(&labelled(&row.label_in(p), row, view))
        );
        let callers = row.stack.len().saturating_sub(1);
        for caller in row.stack.iter().skip(1).take(MAX_CALLERS) {
            let caller = caller.to_string();
            let _ = writeln!(out, "{:COLUMNS$}  <- {}", "", printable(&caller));
        }
        if callers > MAX_CALLERS {
            let more = callers - MAX_CALLERS;
            let _ = writeln!(out, "{:COLUMNS$}  <- ... {more} more (see --json)", "");
        }
    }
    if shown.len() > limit {
        let _ = writeln!(
            out,
            "... {} more locations (--top 0 shows all)",
            shown.len() - limit
        );
    }
    out
}

/// The few lines `mprof record` prints at the end: samples, totals and the top five sites
/// (no newline after the last line).
pub fn summary(p: &Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mprof: {} samples, {} dropped, {}",
        p.samples,
        p.dropped,
        rate_text(p)
    );
    if p.followed {
        let (processes, who) = crate::process_table::members(p);
        let _ = writeln!(
            out,
            "mprof: {processes} process(es) profiled: {who}, merged below (mprof report \
             --per-process lists them)"
        );
    }
    if p.samples == 0 {
        let _ = write!(out, "mprof: no allocation was sampled");
        return out;
    }
    let t = p.totals();
    // An attach sees only what was allocated after it came: its heap is not the process's.
    let attached = p.meta.get("mode").is_some_and(|m| m == "attach");
    let _ = writeln!(
        out,
        "mprof: allocated {}, peak live heap {}{}",
        plus_minus(t.allocated.bytes, t.allocated.stderr()),
        plus_minus(t.peak.bytes, t.peak.stderr()),
        if attached {
            " (of what was allocated while attached)"
        } else {
            ""
        }
    );
    if p.native_recorded() == Some(false) {
        let _ = writeln!(out, "mprof: {NOT_NATIVE}");
    } else {
        let split = split_text(p.by_allocator(), View::Peak, p.selection());
        let _ = writeln!(out, "mprof: peak live heap by allocator: {split}");
    }
    let by = Grouping::YourCode;
    let _ = write!(out, "mprof: top allocation sites, by {}:", by.title());
    for row in rows(p, View::Allocated, by).iter().take(5) {
        let e = &row.figures.allocated;
        let share = 100.0 * e.bytes / t.allocated.bytes.max(f64::MIN_POSITIVE);
        let _ = write!(
            out,
            "\n  {:>11} {:>6}  {}",
            human_bytes(e.bytes),
            format!("{share:.1}%"),
            printable(&labelled(&row.label(), row, View::Allocated))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::json::json_report;
    use mprof_common::record::{Frame, Record};

    fn records() -> Vec<Record> {
        let code = |code: u64, name: &str, firstline: u32| Record::Code {
            code,
            firstline,
            filename: "app.py".into(),
            name: name.into(),
        };
        let alloc = |addr: u64, size: u64, frames: &[(u64, u32)]| Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr,
            size,
            time_ns: 0,
            frames: frames
                .iter()
                .map(|&(code, line)| Frame { code, line })
                .collect(),
        };
        vec![
            Record::Meta {
                text: "rate=1\npython=3.12.1".into(),
            },
            code(1, "<module>", 1),
            code(2, "build", 10),
            code(3, "other", 1),
            alloc(1, 100, &[(2, 11), (1, 30)]),
            alloc(2, 50, &[(2, 12), (1, 31)]),
            alloc(3, 200, &[(3, 5), (1, 40)]),
            alloc(4, 150, &[(2, 11), (1, 32)]),
            Record::Free { addr: 3 },
        ]
    }

    fn keys(rows: &[Row]) -> Vec<(String, u32, u64)> {
        rows.iter()
            .map(|r| {
                (
                    r.function.to_owned(),
                    r.line,
                    whole(r.figures.allocated.bytes),
                )
            })
            .collect()
    }

    #[test]
    fn groups_by_line_function_and_file() {
        let p = Profile::from_records(&records());
        let by_line = rows(&p, View::Allocated, Grouping::Line);
        assert_eq!(
            keys(&by_line),
            [
                ("build".into(), 11, 250),
                ("other".into(), 5, 200),
                ("build".into(), 12, 50)
            ]
        );
        let by_function = rows(&p, View::Allocated, Grouping::Function);
        assert_eq!(
            keys(&by_function),
            [("build".into(), 10, 300), ("other".into(), 1, 200)]
        );
        let by_file = rows(&p, View::Allocated, Grouping::File);
        assert_eq!(keys(&by_file), [("".into(), 0, 500)]);
        assert_eq!(by_file[0].label(), "app.py");
        let by_stack = rows(&p, View::Allocated, Grouping::Stack);
        assert_eq!(by_stack.len(), 4);
        assert_eq!(by_stack[0].stack.len(), 2);
    }

    #[test]
    fn sorting_follows_the_view_with_stable_ties() {
        let p = Profile::from_records(&records());
        let live = rows(&p, View::Live, Grouping::Line);
        let order: Vec<_> = live.iter().map(|r| (r.function, r.line)).collect();
        // build:11 has 250 live; build:12 has 50; other:5 was freed (0) and goes last.
        assert_eq!(order, [("build", 11), ("build", 12), ("other", 5)]);
        // Everything was live at the peak.
        let by_stack = rows(&p, View::Peak, Grouping::Stack);
        let lines: Vec<_> = by_stack.iter().map(|r| r.stack[1].line).collect();
        assert_eq!(lines, [40, 32, 30, 31]);
    }

    #[test]
    fn ties_go_by_file_function_line_then_stack() {
        let mut recs = records();
        recs.truncate(4);
        let alloc = |addr: u64, code: u64, line: u32, caller: u32| Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr,
            size: 64,
            time_ns: 0,
            frames: vec![
                Frame { code, line },
                Frame {
                    code: 1,
                    line: caller,
                },
            ],
        };
        recs.extend([
            alloc(1, 3, 9, 2),
            alloc(2, 2, 20, 3),
            alloc(3, 2, 15, 4),
            alloc(4, 2, 15, 1),
        ]);
        let p = Profile::from_records(&recs);
        let order: Vec<_> = rows(&p, View::Allocated, Grouping::Stack)
            .iter()
            .map(|r| (r.function, r.line, r.stack[1].line))
            .collect();
        assert_eq!(
            order,
            [
                ("build", 15, 1),
                ("build", 15, 4),
                ("build", 20, 3),
                ("other", 9, 2)
            ]
        );
    }

    #[test]
    fn text_report_has_header_table_and_omits_empty_rows() {
        let p = Profile::from_records(&records());
        let text = text_report(&p, View::Live, Grouping::Line, 0);
        assert!(text.contains("total live: 300 B ± 0 B"), "{text}");
        assert!(text.contains("rate 1 (every allocation recorded)"));
        assert!(text.contains("build (app.py:11)"));
        assert!(!text.contains("other (app.py:5)"));
        let deep: Vec<Record> = [Record::Meta {
            text: "rate=1".into(),
        }]
        .into_iter()
        .chain([Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr: 1,
            size: 8,
            time_ns: 0,
            frames: (0..40).map(|line| Frame { code: 9, line }).collect(),
        }])
        .collect();
        let deep = text_report(
            &Profile::from_records(&deep),
            View::Live,
            Grouping::Stack,
            0,
        );
        assert_eq!(deep.matches("<- <unknown>").count(), MAX_CALLERS, "{deep}");
        assert!(deep.contains("<- ... 23 more (see --json)"), "{deep}");
        let top1 = text_report(&p, View::Allocated, Grouping::Line, 1);
        assert!(top1.contains("... 2 more locations"), "{top1}");
    }

    #[test]
    fn json_has_the_schema_fields() {
        let p = Profile::from_records(&records());
        let v = serde_json::to_value(json_report(&p, View::Allocated, Grouping::Stack, 2)).unwrap();
        assert_eq!(v["locations"].as_array().unwrap().len(), 2);
        assert_eq!(v["locations_total"], 4);
        assert_eq!(v["totals"]["allocated"]["bytes"], 500);
        assert_eq!(v["totals"]["live"]["bytes"], 300);
        assert_eq!(v["locations"][0]["stack"][1]["function"], "<module>");
        assert_eq!(v["meta"]["python"], "3.12.1");
        let line =
            serde_json::to_value(json_report(&p, View::Allocated, Grouping::Line, 0)).unwrap();
        assert!(line["locations"][0].get("stack").is_none());
    }

    #[test]
    fn summary_is_short() {
        let p = Profile::from_records(&records());
        let s = summary(&p);
        assert!(s.lines().count() <= 9, "{s}");
        assert!(
            s.contains("allocated 500 B ± 0 B, peak live heap 500 B ± 0 B"),
            "{s}"
        );
        assert!(s.contains("build (app.py:11)"));
        let empty = summary(&Profile::from_records(&[]));
        assert!(empty.contains("no allocation was sampled"));
    }
}
