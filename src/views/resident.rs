//! "Where the RSS is": the text section every report ends with, the line `record` and `attach`
//! print, and the JSON object (`report --json`'s `"rss"`), from the breakdowns of
//! [`crate::analysis::resident`].

use crate::analysis::estimate::Estimate;
use crate::analysis::profile::Profile;
use crate::analysis::resident::{Parts, Where};
use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::views::about::plus_minus;
use mprof_common::record::{MALLOC_GLIBC, MALLOC_JEMALLOC, MALLOC_OTHER};
use serde::Serialize;
use std::fmt::Write as _;

/// What a part is, in a few words, for the lines of the section.
fn label(part: &str) -> &'static str {
    match part {
        "python_live" => "live Python objects (sampled)",
        "native_live" => "live memory of C code, malloc (sampled)",
        "mmap_resident" => "resident anonymous mappings, mmap (sampled)",
        "live_unseen" => "live memory the samples did not see",
        "pymalloc_free" => "free space in pymalloc's arenas",
        "malloc_free" => "free memory malloc keeps",
        _ => "the rest: code, stacks, other mappings",
    }
}

/// One plain sentence on what the largest part means and what to do about it.
fn advice(part: &str, bytes: f64, parts: &Parts) -> String {
    let b = human_bytes(bytes);
    match part {
        "malloc_free" => format!(
            "{b} is free memory {} keeps: blocks the program freed that it cannot give back, \
             because live blocks sit above them (fragmentation). malloc_trim(0), jemalloc \
             (LD_PRELOAD=libjemalloc.so.2), or doing the burst of allocations in a subprocess \
             return it.",
            malloc_name(parts.malloc_kind)
        ),
        "pymalloc_free" => format!(
            "{b} is free space in pymalloc's arenas: an arena goes back to the system only when \
             every small object in it is gone, and a few survivors keep whole arenas. Freeing \
             those survivors, or making the short-lived small objects in a subprocess, returns \
             it."
        ),
        "python_live" => format!(
            "{b} is held by live Python objects: the sites that hold it are in `mprof report \
             --view live`."
        ),
        "native_live" => format!(
            "{b} is held by C code's live malloc blocks: `mprof report --view live --allocator \
             native` names the code that made them."
        ),
        "mmap_resident" => format!(
            "{b} is resident in anonymous mappings the program made (mmap): `mprof report \
             --view live --allocator mmap` names the code that made them."
        ),
        "live_unseen" => format!(
            "{b} is live memory the allocators hold that mprof's samples did not see: \
             allocated before mprof attached, or by code mprof does not hook."
        ),
        _ => {
            let named: Vec<String> = parts
                .named
                .iter()
                .take(3)
                .map(|(n, r)| format!("{} {}", printable(short_name(n)), human_bytes(*r as f64)))
                .collect();
            format!(
                "{b} is none of the heaps mprof reads: the interpreter's and libraries' code and \
                 data, thread stacks, other mappings{}.",
                if named.is_empty() {
                    String::new()
                } else {
                    format!(" (largest: {})", named.join(", "))
                }
            )
        }
    }
}

/// A mapping's name without its directories.
fn short_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn malloc_name(kind: u32) -> &'static str {
    match kind {
        MALLOC_GLIBC => "glibc's malloc",
        MALLOC_JEMALLOC => "jemalloc",
        _ => "malloc",
    }
}

/// The section's lines for one breakdown: each part largest first, with the one sentence.
fn parts_lines(title: &str, parts: &Parts) -> Vec<String> {
    let mut lines = vec![format!("{title}: RSS {}", human_bytes(parts.rss as f64))];
    let ranked = parts.ranked();
    for (name, bytes) in &ranked {
        let stderr = match *name {
            "python_live" => parts.python_live.stderr(),
            "native_live" => parts.native_live.stderr(),
            "mmap_resident" => parts.mmap_resident.stderr(),
            _ => 0.0,
        };
        let unknown = match *name {
            "malloc_free" if parts.malloc_free.is_none() => Some(match parts.malloc_kind {
                MALLOC_OTHER => "not known: malloc is not glibc's nor jemalloc",
                _ => "not read",
            }),
            "pymalloc_free" if parts.pymalloc_free.is_none() => Some("not read yet"),
            _ => None,
        };
        let figure = match unknown {
            Some(why) => why.to_string(),
            None if stderr > 0.0 => plus_minus(*bytes, stderr),
            None => human_bytes(*bytes),
        };
        let share = 100.0 * bytes / (parts.rss as f64).max(1.0);
        let share = if unknown.is_some() {
            String::new()
        } else {
            format!("{share:.0}%")
        };
        lines.push(format!("  {figure:>22} {share:>5}  {}", label(name)));
    }
    if parts.over > 0.0 {
        lines.push(format!(
            "  the parts above add up to {} more than RSS (estimates' noise, or memory counted \
             that is not resident)",
            human_bytes(parts.over)
        ));
    }
    if parts.reserved() >= crate::analysis::resident::RESERVED_NOTE {
        lines.push(format!(
            "  reserved: the sampled mappings map {} and hold {} of it resident; the live heap \
             counts what they map, RSS what is resident",
            human_bytes(parts.mmap_mapped),
            human_bytes(parts.mmap_resident.bytes)
        ));
    }
    if let Some((top, bytes)) = ranked.first() {
        if *bytes > 0.0 {
            lines.push(format!("  {}", advice(top, *bytes, parts)));
        }
    }
    lines
}

/// The "Where the RSS is" section of a text report (empty when the capture has no reading of
/// the mappings: a capture made before this release, or a followed child's).
pub fn section(p: &Profile) -> String {
    let Some(w) = &p.resident else {
        return String::new();
    };
    let mut out = String::from("\nWhere the RSS is\n");
    let start = p.start_ns;
    let mut add = |title: &str, parts: &Parts| {
        let title = match start {
            Some(t0) => format!(
                "{title} (read at {:.1} s)",
                parts.time_ns.saturating_sub(t0) as f64 / 1e9
            ),
            None => title.to_string(),
        };
        for line in parts_lines(&title, parts) {
            let _ = writeln!(out, "{line}");
        }
    };
    add("at the end", &w.end);
    if w.peak_rss.time_ns != w.end.time_ns {
        add("at the peak RSS", &w.peak_rss);
    }
    if let Some(heap) = &w.peak_heap {
        if heap.time_ns != w.end.time_ns && heap.time_ns != w.peak_rss.time_ns {
            add("at the live heap's peak", heap);
        }
    }
    out
}

/// One line for the summary `record` and `attach` print: the largest part at the end.
pub fn summary_line(p: &Profile) -> Option<String> {
    let w = p.resident.as_ref()?;
    let parts = &w.end;
    let (top, bytes) = *parts.ranked().first()?;
    Some(format!(
        "mprof: where the RSS is ({} at the end): {}; mprof report shows every part",
        human_bytes(parts.rss as f64),
        advice(top, bytes, parts)
    ))
}

/// `report --json`'s `"rss"`: the breakdowns at the end, at the live heap's peak and at the
/// peak RSS; every byte field a whole number, the sampled ones with their standard errors.
#[derive(Serialize, Clone, Debug)]
pub struct JsonWhere {
    pub end: JsonParts,
    pub peak_heap: Option<JsonParts>,
    pub peak_rss: JsonParts,
}

/// One breakdown (see [`crate::analysis::resident`]): `rss` is the sum of the parts from
/// `python_live` to `unexplained`.
#[derive(Serialize, Clone, Debug)]
pub struct JsonParts {
    pub time_ns: u64,
    pub rss: u64,
    pub python_live: u64,
    pub python_live_stderr: u64,
    pub native_live: u64,
    pub native_live_stderr: u64,
    pub mmap_resident: u64,
    pub mmap_resident_stderr: u64,
    pub live_unseen: u64,
    pub pymalloc_free: u64,
    pub malloc_free: u64,
    pub unexplained: u64,
    /// `glibc`, `jemalloc`, or `not known` (then `malloc_free` is 0, not measured).
    pub malloc: &'static str,
    /// Whether pymalloc's arenas were read (0 when pymalloc is not the allocator).
    pub pymalloc_read: bool,
    /// What the sampled mappings map, of which `mmap_resident` is resident.
    pub mmap_mapped: u64,
    /// How much the parts other than `unexplained` exceed `rss` (then `unexplained` is 0).
    pub over: u64,
    pub named: Vec<(String, u64)>,
}

fn whole(x: f64) -> u64 {
    x.max(0.0).round() as u64
}

/// A breakdown for JSON. The whole-byte parts are rounded so that they still add up to `rss`
/// exactly (the rounding goes to `unexplained`, or to `over`).
pub fn json_parts(parts: &Parts) -> JsonParts {
    let e = |x: &Estimate| (whole(x.bytes), whole(x.stderr()));
    let (python_live, python_live_stderr) = e(&parts.python_live);
    let (native_live, native_live_stderr) = e(&parts.native_live);
    let (mmap_resident, mmap_resident_stderr) = e(&parts.mmap_resident);
    let live_unseen = whole(parts.live_unseen);
    let pymalloc_free = parts.pymalloc_free.unwrap_or(0);
    let malloc_free = parts.malloc_free.unwrap_or(0);
    let known =
        python_live + native_live + mmap_resident + live_unseen + pymalloc_free + malloc_free;
    JsonParts {
        time_ns: parts.time_ns,
        rss: parts.rss,
        python_live,
        python_live_stderr,
        native_live,
        native_live_stderr,
        mmap_resident,
        mmap_resident_stderr,
        live_unseen,
        pymalloc_free,
        malloc_free,
        unexplained: parts.rss.saturating_sub(known),
        malloc: match parts.malloc_kind {
            MALLOC_GLIBC => "glibc",
            MALLOC_JEMALLOC => "jemalloc",
            _ => "not known",
        },
        pymalloc_read: parts.pymalloc_free.is_some(),
        mmap_mapped: whole(parts.mmap_mapped),
        over: known.saturating_sub(parts.rss),
        named: parts.named.clone(),
    }
}

/// `report --json`'s `"rss"`, if the capture read the mappings.
pub fn json_where(w: &Where) -> JsonWhere {
    JsonWhere {
        end: json_parts(&w.end),
        peak_heap: w.peak_heap.as_ref().map(json_parts),
        peak_rss: json_parts(&w.peak_rss),
    }
}
