//! What every view says about a capture before its figures: who was profiled, at which rate,
//! with which Python, the peak, the processes merged, and the warnings (an incomplete capture,
//! dropped records, allocators left out).

use crate::analysis::profile::{Profile, View};
use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::capture::processes::Pick;
use std::fmt::Write as _;

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
    let mut out = match p.samples {
        0 => "peak live heap unknown (no sample)".to_owned(),
        _ => format!(
            "peak live heap {}",
            plus_minus(t.peak.bytes, t.peak.stderr())
        ),
    };
    if let Some(s) = p.peak_seconds {
        let _ = write!(out, " at {s:.3} s");
    }
    match p.max_rss {
        Some(rss) => {
            let _ = write!(out, "; peak RSS {}", human_bytes(rss as f64));
        }
        None => out.push_str("; no RSS reading"),
    }
    if let Some(note) = reservation_note(p) {
        let _ = write!(out, " ({note})");
    }
    out
}

/// How the program ended when it did not end by itself: `the program was killed by signal 9
/// (SIGKILL)…`, from the `exit_signal` that `record` writes.
pub fn ending_text(p: &Profile) -> Option<String> {
    let sig: i32 = p.meta.get("exit_signal")?.parse().ok()?;
    Some(format!(
        "the program was killed by signal {sig} ({}): the capture ends there, and its live \
         bytes are what it held when it died",
        crate::base::signals::name(sig)
    ))
}

/// What a capture without a sample says instead of `0 B ± 0 B`: that no sample was taken at
/// its rate, and a rate that would take some (a hundredth of the peak RSS, about 100
/// samples, when the capture has an RSS reading); or, for a program recorded to its end that
/// started no Python (no version in the capture), that.
pub fn no_sample_text(p: &Profile) -> Option<String> {
    if p.samples > 0 {
        return None;
    }
    if python_version(p).is_none() && p.meta.contains_key("exit_code") {
        return Some(
            "the program started no Python that mprof can profile (the agent never ran in \
             it): nothing was sampled"
                .to_owned(),
        );
    }
    if !p.rate_known || p.rate <= 1 {
        return None;
    }
    let rate = human_bytes(p.rate as f64);
    let mut out = format!(
        "no sample was taken at rate {rate}: the program allocated too little for this rate \
         (a block of s bytes is sampled with probability 1 - exp(-s/rate))"
    );
    let suggest = |bytes: u64| {
        // The largest power of two at most `bytes`.
        let r = 1u64 << (63 - bytes.max(1).leading_zeros());
        match r {
            r if r >= 1 << 20 => format!("{}MiB", r >> 20),
            r if r >= 1 << 10 => format!("{}KiB", r >> 10),
            r => format!("{}", r.max(1)),
        }
    };
    match p.max_rss.filter(|&rss| rss / 100 < p.rate) {
        Some(rss) => {
            let _ = write!(
                out,
                "; --rate {} (about a hundredth of its peak RSS, {}) would take about 100 samples",
                suggest(rss / 100),
                human_bytes(rss as f64)
            );
        }
        None => {
            let _ = write!(out, "; --rate {} would take some", suggest(p.rate / 1024));
        }
    }
    Some(out)
}

/// What views say about how the capture ended, beside its figures: the signal that killed the
/// program ([`ending_text`]), the rate that took no sample ([`no_sample_text`]).
pub fn ending_notes(p: &Profile) -> Vec<String> {
    [ending_text(p), no_sample_text(p)]
        .into_iter()
        .flatten()
        .collect()
}

/// Whether a heap figure above the peak RSS is explained by a reservation (for the views that
/// show both: the note they add).
fn reservation_note(p: &Profile) -> Option<String> {
    reserved_above_rss(p).map(|reserved| {
        format!(
            "the live heap is above RSS: {} of sampled mappings is reserved (mapped, not \
             resident)",
            human_bytes(reserved)
        )
    })
}

/// The bytes of sampled mappings that are mapped but not resident, when the peak live heap is
/// above the peak RSS and they are enough to say so.
pub fn reserved_above_rss(p: &Profile) -> Option<f64> {
    let w = p.resident.as_ref()?;
    let rss = p.max_rss? as f64;
    let peak = p.totals().peak.bytes;
    let reserved = w.peak_rss.reserved().max(w.end.reserved());
    (peak > rss && reserved >= crate::analysis::resident::RESERVED_NOTE).then_some(reserved)
}

/// The lines every text view starts with: the target, rate and counts, the warnings.
pub fn header_lines(p: &Profile) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(target) = target_text(p) {
        lines.push(target);
    }
    if let Some(processes) = header_line(p) {
        lines.push(processes);
    }
    if let Some(from) = &p.intervals {
        lines.push(printable(&from.text()).into_owned());
        lines.push(from.how().to_owned());
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
    for note in ending_notes(p) {
        lines.push(format!("warning: {note}"));
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

/// How many processes the figures of a followed capture come from, and who they are in words:
/// `the program and 16 followed child process(es)`, and when some of them ran a new Python by
/// exec (one capture per program, see `crate::capture::processes`), `…; they ran 2 more
/// program(s) by exec`.
pub fn members(p: &Profile) -> (usize, String) {
    let programs = p.processes.len();
    let mut pids: Vec<Option<u32>> = p.processes.iter().map(|m| m.pid).collect();
    pids.sort_unstable();
    pids.dedup_by(|a, b| a.is_some() && a == b);
    let processes = pids.len();
    let mut text = format!(
        "the program and {} followed child process(es)",
        processes.saturating_sub(1)
    );
    if programs > processes {
        let _ = write!(
            text,
            "; they ran {} more program(s) by exec",
            programs - processes
        );
    }
    (processes, text)
}

/// What a view says about the processes behind its figures: `17 processes merged (the
/// program and 16 followed children; --pid PID shows one)`, or for one picked process of a
/// followed capture `process 4250 alone (--pid)`; nothing for a capture of one process.
pub fn header_line(p: &Profile) -> Option<String> {
    match (p.pick, p.processes.len()) {
        (Pick::Pid(pid), _) if p.followed => Some(format!(
            "process {pid} alone (--pid); without --pid, all the processes of the capture merged"
        )),
        (_, n) if n > 1 => {
            let (processes, who) = members(p);
            Some(format!(
                "{processes} processes merged: {who} (--pid PID shows one; report \
                 --per-process lists them)"
            ))
        }
        (_, _) if p.followed => Some(
            "1 process: the program followed children, but none of their captures was read"
                .to_owned(),
        ),
        _ => None,
    }
}
