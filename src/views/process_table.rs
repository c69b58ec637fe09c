//! The processes of a capture recorded with `--follow-children`, one row each: `mprof report
//! --per-process` (text or JSON), the `processes` of the JSON report, and the line every view
//! adds about a merged capture. The figures of a row are the process's alone; its peak is its
//! own highest live heap, which need not be at the moment of the merged peak.

use crate::analysis::profile::{Completeness, Lens, Process, Profile};
use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::views::about::{header_lines, plus_minus};
use crate::views::formats::write_stdout;
use anyhow::Result;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Longest command line shown in the text table (the JSON has it whole).
const COMMAND_WIDTH: usize = 60;

/// One process, as the table and the JSON show it.
#[derive(Serialize, Debug, Clone)]
pub struct ProcessRow {
    pub pid: Option<u32>,
    /// Its parent, when its capture says (the program's parent is mprof under `record`).
    pub ppid: Option<u32>,
    /// `record`, `attach` (the program), `fork`, `exec` or `attach` (a child).
    pub born: String,
    pub command: String,
    pub samples: u64,
    pub dropped: u64,
    pub alloc_bytes: u64,
    pub alloc_stderr: u64,
    /// Its own highest estimated live heap.
    pub peak_bytes: u64,
    pub live_bytes: u64,
    pub live_stderr: u64,
    pub max_rss_bytes: Option<u64>,
    /// `ended`, `finished` or `incomplete`, as for a whole capture.
    pub completeness: &'static str,
    pub start_unix_ms: Option<u64>,
    pub exit_unix_ms: Option<u64>,
}

fn whole(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// The row of process `i` of `p`.
fn row(p: &Profile, i: usize, process: &Process) -> ProcessRow {
    let meta = |key: &str| match i {
        0 => p.meta.get(key).map(String::as_str),
        _ => process.meta(key),
    };
    let number = |key: &str| meta(key).and_then(|v| v.parse().ok());
    let f = &process.figures;
    let completeness = match (f.ended, f.finished) {
        (true, _) => "ended",
        (false, true) => "finished",
        (false, false) => "incomplete",
    };
    let born = match (i, meta("born"), meta("mode")) {
        (_, Some(born), _) => born,
        (0, None, Some(mode)) => mode,
        (_, None, Some("attach")) => "attach",
        _ => "?",
    };
    ProcessRow {
        pid: process.pid.or_else(|| number("pid").map(|p: u64| p as u32)),
        ppid: number("ppid").map(|p: u64| p as u32),
        born: born.to_owned(),
        command: meta("command").unwrap_or("").to_owned(),
        samples: f.allocated.samples,
        dropped: f.dropped,
        alloc_bytes: whole(f.allocated.bytes),
        alloc_stderr: whole(f.allocated.stderr()),
        peak_bytes: whole(f.peak_bytes),
        live_bytes: whole(f.live.bytes),
        live_stderr: whole(f.live.stderr()),
        max_rss_bytes: f.max_rss,
        completeness,
        start_unix_ms: number("start_unix_ms"),
        exit_unix_ms: number("exit_unix_ms"),
    }
}

/// One row per process of `p`, the program first, then the children by pid.
pub fn rows(p: &Profile) -> Vec<ProcessRow> {
    p.processes
        .iter()
        .enumerate()
        .map(|(i, process)| row(p, i, process))
        .collect()
}

/// The per-process table as text.
pub fn text(p: &Profile) -> String {
    let rows = rows(p);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mprof report: {} process(es), each one's own figures",
        rows.len()
    );
    for line in header_lines(p) {
        let _ = writeln!(out, "{line}");
    }
    let t = p.totals();
    let _ = writeln!(
        out,
        "merged: allocated {}, peak live heap {} (all processes at once), live at the end {}",
        plus_minus(t.allocated.bytes, t.allocated.stderr()),
        plus_minus(t.peak.bytes, t.peak.stderr()),
        plus_minus(t.live.bytes, t.live.stderr())
    );
    out.push('\n');
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:<7} {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}  command",
        "pid",
        "parent",
        "born",
        "samples",
        "dropped",
        "allocated",
        "own peak",
        "live end",
        "max RSS"
    );
    for r in &rows {
        let opt = |v: Option<u32>| v.map_or("?".to_owned(), |v| v.to_string());
        // Cut in the middle (`…`), so that the end, often the script, stays.
        let mut command =
            printable(&crate::base::text::elide(&r.command, COMMAND_WIDTH)).into_owned();
        if r.completeness == "incomplete" {
            command.push_str("  [incomplete]");
        }
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:<7} {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}  {}",
            opt(r.pid),
            opt(r.ppid),
            printable(&r.born).chars().take(7).collect::<String>(),
            r.samples,
            r.dropped,
            human_bytes(r.alloc_bytes as f64),
            human_bytes(r.peak_bytes as f64),
            human_bytes(r.live_bytes as f64),
            r.max_rss_bytes
                .map_or("-".to_owned(), |b| human_bytes(b as f64)),
            command
        );
    }
    out
}

#[derive(Serialize)]
struct JsonTable {
    processes: Vec<ProcessRow>,
    samples: u64,
    dropped: u64,
    completeness: &'static str,
    warnings: Vec<String>,
}

/// The per-process table as JSON (names exact, control characters as JSON escapes).
pub fn json(p: &Profile) -> Result<String> {
    let doc = JsonTable {
        processes: rows(p),
        samples: p.samples,
        dropped: p.dropped,
        completeness: match p.completeness {
            Completeness::Ended => "ended",
            Completeness::Finished => "finished",
            Completeness::Incomplete => "incomplete",
        },
        warnings: p.warnings(),
    };
    let mut s = crate::base::text::json_safe(serde_json::to_string_pretty(&doc)?);
    s.push('\n');
    Ok(s)
}

/// `mprof report --per-process`: prints the processes of the capture `path`.
pub fn run(path: &Path, as_json: bool, lens: &Lens) -> Result<()> {
    let p = Profile::load_with(path, lens)?;
    let out = if as_json { json(&p)? } else { text(&p) };
    write_stdout(out.as_bytes())
}
