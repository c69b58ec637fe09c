//! The text report: a capture's allocation sites, grouped and sorted by one view (the rows come
//! from [`crate::analysis::sites`]), and the short summary `record` and `attach` print at the
//! end. The text report leaves out rows whose bytes in the view are zero; `--json` (see
//! [`crate::views::export::json`]) keeps them, at the end.

use crate::analysis::allocators::split_text;
use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Lens, Profile, View};
use crate::analysis::sites::{rows, whole, Row};
use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::views::about::{
    ending_notes, header_lines, members, peak_text, plus_minus, rate_text, view_title, NOT_NATIVE,
};
use crate::views::formats::write_stdout;
use anyhow::Result;
use std::fmt::Write as _;
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
/// [`crate::views::process_table`]).
pub fn run_per_process(path: &Path, json: bool, lens: &Lens) -> Result<()> {
    crate::views::process_table::run(path, json, lens)
}

/// The report as `mprof report` prints it: JSON (see [`crate::views::export::json`]) or text.
pub fn render(p: &Profile, view: View, by: Grouping, top: usize, json: bool) -> Result<String> {
    if json {
        crate::views::export::json::render(p, view, by, top)
    } else {
        Ok(text_report(p, view, by, top))
    }
}

/// Width of the columns before the location.
const COLUMNS: usize = 11 + 1 + 11 + 1 + 6 + 1 + 8 + 2;
/// Callers shown under a row of `--by stack`; the JSON has them all.
const MAX_CALLERS: usize = 16;

/// `total live: X ± Y`, then how the allocators shown share it (` = python A + native B +
/// mmap C`) unless only Python's were recorded or one allocator is shown.
pub fn total_text(p: &Profile, view: View) -> String {
    let total = p.totals().get(view);
    if p.samples == 0 {
        return format!("total {}: unknown (no sample)", view.name());
    }
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
/// [`crate::analysis::allocators::ByAllocator::tag`]).
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
    out.push_str(&crate::views::resident::section(p));
    out
}

/// Says the [`summary`] of the capture a session has just written, and returns its profile;
/// a capture that cannot be read (too dense for the reader's allowance) is said as a warning,
/// not an error: it is written all the same.
pub fn say_summary(capture: &Path) -> Option<Profile> {
    match Profile::load(capture) {
        Ok(profile) => {
            crate::say!("{}", summary(&profile));
            Some(profile)
        }
        Err(e) => {
            crate::say!("mprof: warning: no summary: {e:#}");
            None
        }
    }
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
        let (processes, who) = members(p);
        let _ = writeln!(
            out,
            "mprof: {processes} process(es) profiled: {who}, merged below (mprof report \
             --per-process lists them)"
        );
    }
    let notes = ending_notes(p);
    for note in &notes {
        let _ = writeln!(out, "mprof: {note}");
    }
    if p.samples == 0 {
        if notes.is_empty() {
            let _ = write!(out, "mprof: no allocation was sampled");
        }
        return out.trim_end().to_owned();
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
    if let Some(line) = crate::views::resident::summary_line(p) {
        let _ = writeln!(out, "{line}");
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
    use crate::views::export::json::json_report;
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
