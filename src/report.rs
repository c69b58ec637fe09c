//! Text and JSON reports: a capture's allocation sites, grouped and sorted by one view.
//!
//! Rows are sorted by the view's bytes (rounded to whole bytes), largest first; ties go by file,
//! function, line and then the stack, so the same capture always prints the same report. Every
//! location that has at least one sample is a row, in every view; the text report leaves out
//! rows whose bytes in the view are zero (the JSON keeps them, at the end).

use crate::profile::{Figures, Location, Profile, View};
use crate::text::escape_control;
use crate::units::human_bytes;
use anyhow::Result;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// How rows are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The innermost frame's file, function and line.
    Line,
    /// The innermost frame's function (its line is the function's first line).
    Function,
    /// The innermost frame's file (line 0, function empty).
    File,
    /// The whole stack.
    Stack,
}

impl By {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            By::Line => "line",
            By::Function => "function",
            By::File => "file",
            By::Stack => "stack",
        }
    }
}

/// One row of a report: a location and its figures.
#[derive(Debug)]
pub struct Row<'a> {
    pub file: &'a str,
    /// Empty when grouping by file.
    pub function: &'a str,
    /// The line (the function's first line when grouping by function, 0 by file).
    pub line: u32,
    pub figures: Figures,
    /// When grouping by stack: the frames, innermost first. Empty otherwise.
    pub stack: Vec<Location<'a>>,
}

impl Row<'_> {
    /// The location as the text report shows it.
    pub fn label(&self) -> String {
        if self.function.is_empty() {
            return self.file.to_owned();
        }
        let loc = Location {
            file: self.file,
            function: self.function,
            line: self.line,
            firstline: self.line,
        };
        loc.to_string()
    }
}

/// Whole bytes, as reports and JSON show them.
fn whole(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// The profile's rows for `by`, sorted by `view` (see the module doc for the order).
pub fn rows(p: &Profile, view: View, by: By) -> Vec<Row<'_>> {
    let mut rows: Vec<Row> = if by == By::Stack {
        p.stacks()
            .map(|(id, f)| {
                let loc = p.innermost(id);
                Row {
                    file: loc.file,
                    function: loc.function,
                    line: loc.line,
                    figures: *f,
                    stack: p.frames(id).collect(),
                }
            })
            .collect()
    } else {
        let mut groups: HashMap<(&str, &str, u32), Figures> = HashMap::new();
        for (id, f) in p.stacks() {
            let loc = p.innermost(id);
            let key = match by {
                By::Line => (loc.file, loc.function, loc.line),
                By::Function => (loc.file, loc.function, loc.firstline),
                _ => (loc.file, "", 0),
            };
            groups.entry(key).or_default().merge(f);
        }
        groups
            .into_iter()
            .map(|((file, function, line), figures)| Row {
                file,
                function,
                line,
                figures,
                stack: Vec::new(),
            })
            .collect()
    };
    rows.sort_by(|a, b| {
        let bytes = |r: &Row| Reverse(whole(r.figures.get(view).bytes));
        bytes(a)
            .cmp(&bytes(b))
            .then_with(|| (a.file, a.function, a.line).cmp(&(b.file, b.function, b.line)))
            .then_with(|| a.stack.cmp(&b.stack))
    });
    rows
}

/// `mprof report`: prints the report of a capture to stdout.
pub fn run(path: &Path, view: View, by: By, top: usize, json: bool) -> Result<()> {
    let p = Profile::load(path)?;
    let out = render(&p, view, by, top, json)?;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // `mprof report x | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// The report as `mprof report` prints it: JSON or text.
pub fn render(p: &Profile, view: View, by: By, top: usize, json: bool) -> Result<String> {
    if json {
        let mut s = serde_json::to_string_pretty(&json_report(p, view, by, top))?;
        s.push('\n');
        Ok(s)
    } else {
        Ok(text_report(p, view, by, top))
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

/// The rate as reports show it.
pub fn rate_text(p: &Profile) -> String {
    if p.rate <= 1 {
        "rate 1 (every allocation recorded)".to_owned()
    } else {
        format!("rate {}", human_bytes(p.rate as f64))
    }
}

/// `X ± Y` for an estimate's bytes.
fn plus_minus(bytes: f64, stderr: f64) -> String {
    format!("{} ± {}", human_bytes(bytes), human_bytes(stderr))
}

/// Width of the columns before the location.
const COLUMNS: usize = 11 + 1 + 11 + 1 + 6 + 1 + 8 + 2;
/// Callers shown under a row of `--by stack`; the JSON has them all.
const MAX_CALLERS: usize = 16;

/// The text report.
pub fn text_report(p: &Profile, view: View, by: By, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "mprof report: {}, by {}", view_title(view), by.name());
    let mut about = vec![
        rate_text(p),
        format!("{} samples", p.samples),
        format!("{} dropped", p.dropped),
    ];
    // `sys.version` goes on with build details: the version number is enough here.
    if let Some(python) = p
        .meta
        .get("python")
        .and_then(|v| v.split_whitespace().next())
    {
        about.push(format!("python {}", escape_control(python)));
    }
    let _ = writeln!(out, "{}", about.join(", "));
    if let Some(command) = p.meta.get("command") {
        let _ = writeln!(out, "command: {}", escape_control(command));
    }
    let total = p.totals().get(view);
    let _ = write!(
        out,
        "total {}: {}",
        view.name(),
        plus_minus(total.bytes, total.stderr())
    );
    match (view, p.peak_seconds) {
        (View::Peak, Some(s)) => {
            let _ = writeln!(out, ", {s:.3} s into the capture");
        }
        _ => out.push('\n'),
    }
    if p.dropped > 0 {
        let _ = writeln!(
            out,
            "warning: the agent dropped {} records (its buffer was full); the figures miss them",
            p.dropped
        );
    }
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
            escape_control(&row.label())
        );
        let callers = row.stack.len().saturating_sub(1);
        for caller in row.stack.iter().skip(1).take(MAX_CALLERS) {
            let caller = caller.to_string();
            let _ = writeln!(out, "{:COLUMNS$}  <- {}", "", escape_control(&caller));
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

#[derive(Serialize)]
struct JsonReport<'a> {
    view: &'static str,
    by: &'static str,
    rate: u64,
    rate_known: bool,
    samples: u64,
    dropped: u64,
    peak_seconds: Option<f64>,
    max_rss_bytes: Option<u64>,
    meta: &'a BTreeMap<String, String>,
    totals: BTreeMap<&'static str, JsonEstimate>,
    locations_total: usize,
    locations: Vec<JsonLocation<'a>>,
}

#[derive(Serialize)]
struct JsonEstimate {
    bytes: u64,
    stderr: u64,
    count: u64,
    samples: u64,
}

impl From<&crate::profile::Estimate> for JsonEstimate {
    fn from(e: &crate::profile::Estimate) -> JsonEstimate {
        JsonEstimate {
            bytes: whole(e.bytes),
            stderr: whole(e.stderr()),
            count: whole(e.count),
            samples: e.samples,
        }
    }
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    file: &'a str,
    function: &'a str,
    line: u32,
}

#[derive(Serialize)]
struct JsonLocation<'a> {
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
    #[serde(skip_serializing_if = "Option::is_none")]
    stack: Option<Vec<JsonFrame<'a>>>,
}

fn json_location<'a>(row: &Row<'a>, view: View, by: By) -> JsonLocation<'a> {
    let (a, l, k) = (
        JsonEstimate::from(&row.figures.allocated),
        JsonEstimate::from(&row.figures.live),
        JsonEstimate::from(&row.figures.peak),
    );
    JsonLocation {
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
        stack: (by == By::Stack).then(|| {
            row.stack
                .iter()
                .map(|f| JsonFrame {
                    file: f.file,
                    function: f.function,
                    line: f.line,
                })
                .collect()
        }),
    }
}

fn json_report(p: &Profile, view: View, by: By, top: usize) -> JsonReport<'_> {
    let rows = rows(p, view, by);
    let limit = if top == 0 { rows.len() } else { top };
    let totals = View::ALL
        .iter()
        .map(|&v| (v.name(), JsonEstimate::from(p.totals().get(v))))
        .collect();
    JsonReport {
        view: view.name(),
        by: by.name(),
        rate: p.rate,
        rate_known: p.rate_known,
        samples: p.samples,
        dropped: p.dropped,
        peak_seconds: p.peak_seconds,
        max_rss_bytes: p.max_rss,
        meta: &p.meta,
        totals,
        locations_total: rows.len(),
        locations: rows
            .iter()
            .take(limit)
            .map(|r| json_location(r, view, by))
            .collect(),
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
    if p.samples == 0 {
        let _ = write!(out, "mprof: no allocation was sampled");
        return out;
    }
    let t = p.totals();
    let _ = writeln!(
        out,
        "mprof: allocated {}, peak live heap {}",
        plus_minus(t.allocated.bytes, t.allocated.stderr()),
        plus_minus(t.peak.bytes, t.peak.stderr())
    );
    let _ = write!(out, "mprof: top allocation sites:");
    for row in rows(p, View::Allocated, By::Line).iter().take(5) {
        let e = &row.figures.allocated;
        let share = 100.0 * e.bytes / t.allocated.bytes.max(f64::MIN_POSITIVE);
        let _ = write!(
            out,
            "\n  {:>11} {:>6}  {}",
            human_bytes(e.bytes),
            format!("{share:.1}%"),
            escape_control(&row.label())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::record::{Frame, Record};

    fn records() -> Vec<Record> {
        let code = |code: u64, name: &str, firstline: u32| Record::Code {
            code,
            firstline,
            filename: "app.py".into(),
            name: name.into(),
        };
        let alloc = |addr: u64, size: u64, frames: &[(u64, u32)]| Record::Alloc {
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
        let by_line = rows(&p, View::Allocated, By::Line);
        assert_eq!(
            keys(&by_line),
            [
                ("build".into(), 11, 250),
                ("other".into(), 5, 200),
                ("build".into(), 12, 50)
            ]
        );
        let by_function = rows(&p, View::Allocated, By::Function);
        assert_eq!(
            keys(&by_function),
            [("build".into(), 10, 300), ("other".into(), 1, 200)]
        );
        let by_file = rows(&p, View::Allocated, By::File);
        assert_eq!(keys(&by_file), [("".into(), 0, 500)]);
        assert_eq!(by_file[0].label(), "app.py");
        let by_stack = rows(&p, View::Allocated, By::Stack);
        assert_eq!(by_stack.len(), 4);
        assert_eq!(by_stack[0].stack.len(), 2);
    }

    #[test]
    fn sorting_follows_the_view_with_stable_ties() {
        let p = Profile::from_records(&records());
        let live = rows(&p, View::Live, By::Line);
        let order: Vec<_> = live.iter().map(|r| (r.function, r.line)).collect();
        // build:11 has 250 live; build:12 has 50; other:5 was freed (0) and goes last.
        assert_eq!(order, [("build", 11), ("build", 12), ("other", 5)]);
        // Everything was live at the peak.
        let by_stack = rows(&p, View::Peak, By::Stack);
        let lines: Vec<_> = by_stack.iter().map(|r| r.stack[1].line).collect();
        assert_eq!(lines, [40, 32, 30, 31]);
    }

    #[test]
    fn ties_go_by_file_function_line_then_stack() {
        let mut recs = records();
        recs.truncate(4);
        let alloc = |addr: u64, code: u64, line: u32, caller: u32| Record::Alloc {
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
        let order: Vec<_> = rows(&p, View::Allocated, By::Stack)
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
        let text = text_report(&p, View::Live, By::Line, 0);
        assert!(text.contains("total live: 300 B ± 0 B"), "{text}");
        assert!(text.contains("rate 1 (every allocation recorded)"));
        assert!(text.contains("build (app.py:11)"));
        assert!(!text.contains("other (app.py:5)"));
        let deep: Vec<Record> = [Record::Meta {
            text: "rate=1".into(),
        }]
        .into_iter()
        .chain([Record::Alloc {
            tid: 1,
            flags: 0,
            addr: 1,
            size: 8,
            time_ns: 0,
            frames: (0..40).map(|line| Frame { code: 9, line }).collect(),
        }])
        .collect();
        let deep = text_report(&Profile::from_records(&deep), View::Live, By::Stack, 0);
        assert_eq!(deep.matches("<- <unknown>").count(), MAX_CALLERS, "{deep}");
        assert!(deep.contains("<- ... 23 more (see --json)"), "{deep}");
        let top1 = text_report(&p, View::Allocated, By::Line, 1);
        assert!(top1.contains("... 2 more locations"), "{top1}");
    }

    #[test]
    fn json_has_the_schema_fields() {
        let p = Profile::from_records(&records());
        let v = serde_json::to_value(json_report(&p, View::Allocated, By::Stack, 2)).unwrap();
        assert_eq!(v["locations"].as_array().unwrap().len(), 2);
        assert_eq!(v["locations_total"], 4);
        assert_eq!(v["totals"]["allocated"]["bytes"], 500);
        assert_eq!(v["totals"]["live"]["bytes"], 300);
        assert_eq!(v["locations"][0]["stack"][1]["function"], "<module>");
        assert_eq!(v["meta"]["python"], "3.12.1");
        let line = serde_json::to_value(json_report(&p, View::Allocated, By::Line, 0)).unwrap();
        assert!(line["locations"][0].get("stack").is_none());
    }

    #[test]
    fn summary_is_short() {
        let p = Profile::from_records(&records());
        let s = summary(&p);
        assert!(s.lines().count() <= 8, "{s}");
        assert!(
            s.contains("allocated 500 B ± 0 B, peak live heap 500 B ± 0 B"),
            "{s}"
        );
        assert!(s.contains("build (app.py:11)"));
        let empty = summary(&Profile::from_records(&[]));
        assert!(empty.contains("no allocation was sampled"));
    }
}
