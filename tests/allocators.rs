//! Which allocator the bytes came from, in every view, on a fixed sampled capture built with
//! `mprof::capture::testing` (golden files in `tests/golden/`, `MPROF_BLESS=1` rewrites them): the
//! per-allocator totals and row tags of the text report, the JSON split, `--allocator`, the
//! flamegraph's tooltips and `--by-allocator`, pprof's `allocator` label, the diff, and what a
//! `--python-only` capture says.

mod common;

use common::views::{golden, json, mprof, ok, stderr, stdout};
use mprof::capture::testing::CaptureBuilder as Capture;
use mprof::views::export::pprof::PprofProfile;
use mprof_common::record::{Allocator, Record};
use prost::Message;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

const MODULE: u64 = 0x1000;
const BUILD: u64 = 0x2000;
const LOAD: u64 = 0x3000;
const MAP: u64 = 0x4000;
const WORKER: u32 = 7;

/// A numpy-like program sampled at 4 KiB: Python objects in `build_index`, arrays allocated
/// with malloc in `load_rows` (which also makes Python objects on the same line), a file read
/// into an anonymous mapping in `map_file`, and a worker thread with no Python frame that
/// mallocs a buffer (an OpenBLAS thread). Part of the arrays is freed after the peak.
fn fixture(native: &str) -> Capture {
    use Allocator::{Mmap, Native, Python};
    let mut c = Capture::new();
    c.meta(&format!(
        "mode=record\ncommand=python app.py\npid=4242\nrate=4096\nmax_depth=128\nseed=7\n\
         native={native}\npython=3.12.1\n"
    ))
    .push(Record::Thread {
        tid: 1,
        name: "MainThread".into(),
    })
    .code(MODULE, "app.py", "<module>", 1)
    .code(BUILD, "app.py", "build_index", 10)
    .code(LOAD, "app.py", "load_rows", 30)
    .code(MAP, "app.py", "map_file", 40)
    .alloc_by(
        Python,
        0x100,
        8192,
        1_000_000_000,
        &[(BUILD, 12), (MODULE, 50)],
    )
    .alloc_by(
        Python,
        0x200,
        2048,
        2_000_000_000,
        &[(BUILD, 12), (MODULE, 50)],
    )
    .alloc_by(
        Native,
        0x300,
        800_000,
        3_000_000_000,
        &[(LOAD, 33), (MODULE, 51)],
    )
    .alloc_by(
        Native,
        0x400,
        400_000,
        4_000_000_000,
        &[(LOAD, 33), (MODULE, 51)],
    )
    .alloc_by(
        Python,
        0x500,
        1024,
        5_000_000_000,
        &[(LOAD, 33), (MODULE, 51)],
    )
    .alloc_by(
        Mmap,
        0x600,
        1 << 20,
        6_000_000_000,
        &[(MAP, 41), (MODULE, 52)],
    )
    .push(mprof::capture::testing::alloc_from(
        Native,
        WORKER,
        0x700,
        65_536,
        7_000_000_000,
        &[],
    ))
    .free(0x400)
    .free(0x200)
    .alloc_by(
        Python,
        0x800,
        512,
        8_000_000_000,
        &[(BUILD, 13), (MODULE, 50)],
    )
    .push(Record::End {
        reason: 1,
        time_ns: 9_000_000_000,
    });
    c
}

fn capture(dir: &Path, native: &str) -> PathBuf {
    fixture(native).write(dir, &format!("native-{native}.mprof"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn text_and_json_reports_split_by_allocator_match_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture(dir.path(), "on");
    let f = s(&file);
    let by_line = stdout(&ok(&["report", f, "--by", "line", "--top", "0"]));
    golden("report-allocators-allocated-line.txt", &by_line);
    assert!(by_line.contains("= python 23.11 KiB + native 1.21 MiB + mmap 1.00 MiB"));
    assert!(by_line.contains("<no Python frame>  [native]"), "{by_line}");
    assert!(
        by_line.contains("map_file (app.py:41)  [mmap]"),
        "{by_line}"
    );
    assert!(by_line.contains("load_rows (app.py:33)  [native 100%, python <1%]"));
    let function = stdout(&ok(&[
        "report",
        f,
        "--view",
        "live",
        "--by",
        "function",
        "--allocator",
        "native,mmap",
    ]));
    golden("report-allocators-live-function-native-mmap.txt", &function);
    assert!(function.contains("allocators shown: native and mmap only"));
    let json = stdout(&ok(&[
        "report", f, "--view", "live", "--by", "line", "--json", "--top", "0",
    ]));
    golden("report-allocators-live-line.json", &json);
}

/// `x.allocated.bytes`-style figures of a totals-shaped JSON object.
fn bytes(v: &Value, view: &str) -> u64 {
    v[view]["bytes"].as_u64().unwrap_or(0)
}

#[test]
fn json_splits_add_up_and_name_the_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture(dir.path(), "on");
    let v = json(&["report", s(&file), "--top", "0"]);
    assert_eq!(v["native_recorded"], true);
    assert_eq!(
        v["allocators"],
        serde_json::json!(["python", "native", "mmap"])
    );
    for view in ["allocated", "live", "peak"] {
        let split = &v["totals_by_allocator"];
        let sum: u64 = ["python", "native", "mmap"]
            .iter()
            .map(|a| bytes(&split[a], view))
            .sum();
        let total = bytes(&v["totals"], view);
        assert!(sum.abs_diff(total) <= 2, "{view}: {sum} vs {total}");
    }
    // At 4 KiB the 1 MiB mapping is certain to be sampled: exact.
    assert_eq!(bytes(&v["totals_by_allocator"]["mmap"], "live"), 1 << 20);
    assert_eq!(bytes(&v["totals_by_allocator"]["mmap"], "peak"), 1 << 20);
    let locations = v["locations"].as_array().unwrap();
    let kind = |function: &str, line: u64| {
        let l = locations
            .iter()
            .find(|l| l["function"] == function && l["line"] == line)
            .unwrap_or_else(|| panic!("{function}:{line} missing"));
        l["allocator"].as_str().unwrap().to_owned()
    };
    assert_eq!(kind("build_index", 12), "python");
    assert_eq!(kind("load_rows", 33), "mixed");
    assert_eq!(kind("map_file", 41), "mmap");
    assert_eq!(kind("<no Python frame>", 0), "native");
    for l in locations {
        let Some(split) = l.get("allocators") else {
            assert_ne!(l["allocator"], "mixed", "{l}");
            continue;
        };
        assert_eq!(l["allocator"], "mixed", "{l}");
        let split = split.as_object().unwrap();
        assert!(split.len() >= 2, "{l}");
        for view in ["allocated", "live", "peak"] {
            let key = format!("{}_bytes", if view == "allocated" { "alloc" } else { view });
            let sum: u64 = split.values().map(|a| bytes(a, view)).sum();
            let whole = l[&key].as_u64().unwrap();
            assert!(sum.abs_diff(whole) <= 2, "{l}");
        }
    }
}

#[test]
fn the_allocator_option_filters_every_view() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture(dir.path(), "on");
    let f = s(&file);
    let all = json(&["report", f]);
    let native = json(&["report", f, "--allocator", "native"]);
    assert_eq!(native["allocators"], serde_json::json!(["native"]));
    assert_eq!(
        native["totals"]["allocated"],
        all["totals_by_allocator"]["native"]["allocated"]
    );
    assert!(native["totals_by_allocator"].get("python").is_none());
    assert!(native["locations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["allocator"] == "native"));
    let two = json(&["report", f, "--allocator", "native", "--allocator", "mmap"]);
    let comma = json(&["report", f, "--allocator", "mmap,native"]);
    assert_eq!(two["totals"], comma["totals"]);
    let python = json(&["report", f, "--allocator", "python", "--by", "stack"]);
    assert_eq!(python["locations_total"], 3);

    // Flamegraph: the filter, the tooltip split, the allocator as root frame.
    let svg_of = |args: &[&str]| {
        let out = dir.path().join("f.svg");
        let mut all = vec!["flamegraph", f, "-o", s(&out)];
        all.extend_from_slice(args);
        ok(&all);
        std::fs::read_to_string(&out).unwrap()
    };
    let svg = svg_of(&[]);
    assert!(svg.contains("; mmap 100%"), "the mapping's box says mmap");
    assert!(
        svg.contains("; native 100%, python &lt;1%"),
        "load_rows is mixed"
    );
    assert!(!svg.contains("&lt;allocator"));
    let by = svg_of(&["--by-allocator", "--view", "live"]);
    for a in ["python", "native", "mmap"] {
        assert!(by.contains(&format!("&lt;allocator {a}&gt;")), "{a}");
    }
    let mmap_only = svg_of(&["--allocator", "mmap"]);
    assert!(!mmap_only.contains("build_index") && mmap_only.contains("map_file"));
    assert!(mmap_only.contains("mmap allocations only"));

    // Folded stacks and speedscope with the allocator frame; pprof's label.
    let folded = dir.path().join("x.folded");
    ok(&[
        "export",
        f,
        "-o",
        s(&folded),
        "--by-allocator",
        "--view",
        "live",
    ]);
    golden(
        "export-allocators-live.folded",
        &std::fs::read_to_string(&folded).unwrap(),
    );
    let scope = dir.path().join("x.speedscope.json");
    ok(&["export", f, "-o", s(&scope), "--by-allocator"]);
    let scope: Value = serde_json::from_slice(&std::fs::read(&scope).unwrap()).unwrap();
    let names: Vec<&str> = scope["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"<allocator native>"), "{names:?}");
    let pb = dir.path().join("x.pb.gz");
    ok(&["export", f, "-o", s(&pb), "--allocator", "native,mmap"]);
    assert_eq!(pprof_allocators(&pb), ["mmap", "native"]);

    // The diff of the capture against itself with only Python's allocators.
    let d = stdout(&ok(&[
        "diff",
        f,
        f,
        "--allocator",
        "python",
        "--view",
        "allocated",
    ]));
    assert!(d.contains("allocators shown: python only"), "{d}");
    assert!(
        d.contains("total allocated: 23.11 KiB ± 7.69 KiB → 23.11 KiB"),
        "{d}"
    );
}

/// The values of the `allocator` label of the samples of a pprof file, sorted and deduplicated.
fn pprof_allocators(path: &Path) -> Vec<String> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let p = PprofProfile::decode(raw.as_slice()).unwrap();
    let key = p
        .string_table
        .iter()
        .position(|s| s == "allocator")
        .unwrap() as i64;
    let mut values: Vec<String> = p
        .sample
        .iter()
        .flat_map(|s| s.label.iter().filter(|l| l.key == key))
        .map(|l| p.string_table[l.str as usize].clone())
        .collect();
    values.sort();
    values.dedup();
    values
}

#[test]
fn a_python_only_capture_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.meta("rate=1\nnative=off\n")
        .code(1, "a.py", "f", 1)
        .alloc(1, 100, 1, &[(1, 2)]);
    let file = c.write(dir.path(), "py.mprof");
    let text = stdout(&ok(&["report", s(&file)]));
    assert!(
        text.contains("native allocations were not recorded (--python-only)"),
        "{text}"
    );
    assert!(text.contains("total allocated: 100 B ± 0 B\n"), "{text}");
    assert_eq!(json(&["report", s(&file)])["native_recorded"], false);
}

#[test]
fn a_bad_allocator_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture(dir.path(), "on");
    for cmd in ["report", "export", "diff", "flamegraph"] {
        let mut args = vec![cmd, s(&file)];
        if cmd == "diff" {
            args.push(s(&file));
        }
        args.extend(["--allocator", "malloc"]);
        let o = mprof(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains("python, native or mmap"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn the_html_report_splits_its_totals_and_tags_its_sites() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture(dir.path(), "on");
    let out = dir.path().join("r.html");
    ok(&["html", s(&file), "-o", s(&out)]);
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(
        html.contains("= python 18.03 KiB + native 845.25 KiB + mmap 1.00 MiB</dd>"),
        "live bytes by allocator"
    );
    assert!(html.contains("map_file (app.py:41)  [mmap]"));
    let off = capture(dir.path(), "off");
    ok(&["html", s(&off), "-o", s(&out)]);
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("native allocations were not recorded (--python-only)"));
}
