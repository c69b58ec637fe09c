//! The views (`report`, `flamegraph`) run as the real binary on hand-built captures (built
//! with the library's `mprof::capture::testing` builders).
//!
//! Golden files live in `tests/golden/`; `MPROF_BLESS=1 cargo test --test views` rewrites them
//! from the current output (review the diff before committing).

mod common;

use common::views::{fixture, golden, json, mprof, ok, stderr, stdout};
use mprof::capture::testing::CaptureBuilder as Capture;
use mprof_common::record::Record;
use serde_json::Value;
/// `s / (1 - exp(-s/r))`: what one sample of `s` bytes stands for.
fn weight(s: f64, r: f64) -> f64 {
    s / -(-s / r).exp_m1()
}

#[test]
fn text_reports_match_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    let f = file.to_str().unwrap();
    for (view, by) in [
        ("allocated", "line"),
        ("live", "function"),
        ("peak", "stack"),
        ("allocated", "file"),
    ] {
        let o = ok(&["report", f, "--view", view, "--by", by, "--top", "0"]);
        golden(&format!("report-{view}-{by}.txt"), &stdout(&o));
    }
    let top2 = ok(&["report", f, "--top", "2", "--by", "line"]);
    golden("report-allocated-line-top2.txt", &stdout(&top2));
}

#[test]
fn json_report_matches_golden_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    let o = ok(&[
        "report",
        file.to_str().unwrap(),
        "--by",
        "stack",
        "--json",
        "--top",
        "0",
    ]);
    golden("report-allocated-stack.json", &stdout(&o));
}

#[test]
fn folded_lines_match_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    for view in ["allocated", "live", "peak"] {
        let out = dir.path().join(format!("{view}.folded"));
        ok(&[
            "flamegraph",
            file.to_str().unwrap(),
            "--view",
            view,
            "-o",
            out.to_str().unwrap(),
        ]);
        let text = std::fs::read_to_string(&out).unwrap();
        golden(&format!("flamegraph-{view}.folded"), &text);
    }
}

#[test]
fn exact_capture_gives_exact_numbers_in_every_view() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.meta("rate=1\n")
        .code(1, "a.py", "<module>", 1)
        .code(2, "a.py", "f", 10)
        .alloc(1, 1000, 1, &[(2, 11), (1, 20)])
        .alloc(2, 3000, 2, &[(2, 12), (1, 20)])
        .alloc(3, 500, 3, &[(1, 21)])
        .free(2)
        .alloc(4, 700, 4, &[(2, 11), (1, 22)])
        .push(Record::Stats {
            samples: 4,
            dropped: 0,
        });
    let file = c.write(dir.path(), "exact.mprof");
    let f = file.to_str().unwrap();

    let v = json(&["report", f]);
    assert_eq!(v["rate"], 1);
    assert_eq!(v["samples"], 4);
    assert_eq!(v["dropped"], 0);
    assert_eq!(v["view"], "allocated");
    assert_eq!(v["by"], "your-code");
    assert_eq!(v["totals"]["allocated"]["bytes"], 5200);
    assert_eq!(v["totals"]["allocated"]["stderr"], 0);
    assert_eq!(v["totals"]["live"]["bytes"], 2200);
    assert_eq!(v["totals"]["peak"]["bytes"], 4500);
    let locs = v["locations"].as_array().unwrap();
    let first = &locs[0];
    assert_eq!(
        (&first["file"], &first["function"], &first["line"]),
        (&Value::from("a.py"), &Value::from("f"), &Value::from(12))
    );
    assert_eq!(first["alloc_bytes"], 3000);
    assert_eq!(first["live_bytes"], 0);
    assert_eq!(first["peak_bytes"], 3000);
    assert_eq!(locs[1]["line"], 11);
    assert_eq!(locs[1]["alloc_bytes"], 1700);
    assert_eq!(locs[1]["alloc_count"], 2);
    assert_eq!(locs[1]["samples"], 2);
    assert_eq!(locs[1]["live_bytes"], 1700);
    assert_eq!(locs[1]["peak_bytes"], 1000);

    let live = json(&["report", f, "--view", "live", "--by", "function"]);
    let locs = live["locations"].as_array().unwrap();
    assert_eq!(locs[0]["function"], "f");
    assert_eq!(locs[0]["line"], 10);
    assert_eq!(locs[0]["live_bytes"], 1700);
    assert_eq!(locs[1]["function"], "<module>");
    assert_eq!(locs[1]["live_bytes"], 500);

    let files = json(&["report", f, "--by", "file"]);
    assert_eq!(files["locations"][0]["file"], "a.py");
    assert_eq!(files["locations"][0]["function"], "");
    assert_eq!(files["locations"][0]["line"], 0);
    assert_eq!(files["locations"][0]["alloc_bytes"], 5200);

    let text = stdout(&ok(&["report", f, "--view", "peak"]));
    assert!(text.contains("total peak: 4.39 KiB ± 0 B"), "{text}");
}

#[test]
fn sampled_json_follows_the_estimator_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    let f = file.to_str().unwrap();
    let v = json(&["report", f, "--by", "stack", "--top", "0"]);
    assert_eq!(v["rate"], 1024);
    assert_eq!(v["samples"], 9);
    assert_eq!(v["dropped"], 3);
    assert_eq!(v["meta"]["python"], "3.12.1");
    let r = 1024.0;
    let sizes = [
        4096.0, 8192.0, 8192.0, 100_000.0, 512.0, 1500.0, 8192.0, 2048.0, 3000.0,
    ];
    let expected_total: f64 = sizes.iter().map(|&s| weight(s, r)).sum();
    let total = v["totals"]["allocated"]["bytes"].as_f64().unwrap();
    assert!(
        (total - expected_total).abs() <= 1.0,
        "{total} vs {expected_total}"
    );
    let variance: f64 = sizes
        .iter()
        .map(|&s| (-s / r).exp() * weight(s, r).powi(2))
        .sum();
    let got = v["totals"]["allocated"]["stderr"].as_f64().unwrap();
    assert!(got > 0.0);
    assert!(
        (got - variance.sqrt()).abs() <= 1.0,
        "{got} vs {}",
        variance.sqrt()
    );

    let locs = v["locations"].as_array().unwrap();
    assert_eq!(locs.len(), v["locations_total"].as_u64().unwrap() as usize);
    let sorted = locs
        .windows(2)
        .all(|w| w[0]["alloc_bytes"].as_u64() >= w[1]["alloc_bytes"].as_u64());
    assert!(sorted);
    let chunk = locs
        .iter()
        .find(|l| l["function"] == "chunk" && l["line"] == 7)
        .unwrap();
    assert_eq!(
        chunk["alloc_bytes"].as_f64().unwrap(),
        weight(512.0, r).round()
    );
    assert_eq!(chunk["live_bytes"], 0);
    assert_eq!(
        chunk["peak_bytes"].as_f64().unwrap(),
        weight(512.0, r).round()
    );
    let stack: Vec<_> = chunk["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["function"].as_str().unwrap(), f["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(stack, [("chunk", 7), ("load_rows", 35), ("<module>", 52)]);
    // Address reuse: the last allocation's code object is `parse`, not `load_rows`.
    assert!(locs
        .iter()
        .any(|l| l["function"] == "parse" && l["line"] == 72));
    assert!(locs.iter().any(|l| l["function"] == "<unknown>"));
    assert!(locs.iter().any(|l| l["function"] == "<no Python frame>"));
    // The 100000-byte block was live at the peak and freed by the end.
    let load = locs.iter().find(|l| l["line"] == 33).unwrap();
    assert_eq!(load["live_bytes"], 0);
    assert!(load["peak_bytes"].as_u64().unwrap() >= 100_000);

    let top = json(&["report", f, "--view", "peak", "--top", "3"]);
    assert_eq!(top["locations"].as_array().unwrap().len(), 3);
    assert_eq!(top["locations"][0]["function"], "load_rows");
}

#[test]
fn flamegraph_is_an_svg_with_title_and_frames() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    for (view, title) in [
        ("allocated", "mprof: allocated bytes"),
        ("live", "mprof: live bytes at the end"),
        ("peak", "mprof: live bytes at the peak"),
    ] {
        let out = dir.path().join(format!("{view}.svg"));
        let o = ok(&[
            "flamegraph",
            file.to_str().unwrap(),
            "--view",
            view,
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(stderr(&o).contains("wrote"));
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<?xml") || svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(title), "{view}: no title");
        assert!(svg.contains("build_index (app.py:12)"));
        assert!(svg.contains("rate 1.00 KiB, 9 samples, 3 dropped"));
        assert!(svg.contains("<script"), "search and zoom need the script");
    }
}

#[test]
fn an_empty_view_still_writes_a_valid_svg() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.meta("rate=1").alloc(1, 100, 1, &[]).free(1);
    let file = c.write(dir.path(), "freed.mprof");
    let out = dir.path().join("live.svg");
    let o = ok(&[
        "flamegraph",
        file.to_str().unwrap(),
        "--view",
        "live",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("mprof: warning: no live bytes"),
        "{}",
        stderr(&o)
    );
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<?xml"));
    assert!(svg.contains("No samples in this view"));
    // And the report says so too.
    let text = stdout(&ok(&["report", file.to_str().unwrap(), "--view", "live"]));
    assert!(text.contains("no samples in this view"), "{text}");
}

#[test]
fn many_records_aggregate_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.meta("rate=1");
    for i in 0..50u64 {
        c.code(0x1000 + i, &format!("m{}.py", i % 7), &format!("f{i}"), 1);
    }
    let n = 200_000u64;
    for i in 0..n {
        let depth = 1 + (i % 5);
        let frames: Vec<(u64, u32)> = (0..depth)
            .map(|d| (0x1000 + (i + d) % 50, d as u32 + 1))
            .collect();
        c.alloc(0x1_0000 + i * 16, 100, i, &frames);
        if i % 2 == 1 {
            c.free(0x1_0000 + (i - 1) * 16);
        }
    }
    let file = c.write(dir.path(), "many.mprof");
    let v = json(&[
        "report",
        file.to_str().unwrap(),
        "--by",
        "stack",
        "--top",
        "0",
    ]);
    assert_eq!(v["samples"], n);
    assert_eq!(v["totals"]["allocated"]["bytes"], n * 100);
    assert_eq!(v["totals"]["live"]["bytes"], n / 2 * 100);
    assert_eq!(v["totals"]["peak"]["bytes"], (n / 2 + 1) * 100);
    let sum: u64 = v["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["alloc_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, n * 100);
}

/// Expects failure with exit code 2 and a one-line `mprof: error:` message.
fn fails_with_one_line(args: &[&str], needle: &str) {
    let o = mprof(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("mprof: error: "), "{err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let missing = d.join("nope.mprof");
    let empty = d.join("empty.mprof");
    std::fs::write(&empty, b"").unwrap();
    let garbage = d.join("garbage.mprof");
    std::fs::write(&garbage, b"this is not a capture file at all\n").unwrap();
    let out = d.join("x.svg");
    for file in [&missing, &empty, &garbage, &d.to_path_buf()] {
        let f = file.to_str().unwrap();
        let needle = if file == &missing {
            "cannot read"
        } else {
            "mprof"
        };
        fails_with_one_line(&["report", f], needle);
        fails_with_one_line(&["report", f, "--json"], needle);
        fails_with_one_line(&["flamegraph", f, "-o", out.to_str().unwrap()], needle);
    }
    fails_with_one_line(
        &["report", garbage.to_str().unwrap()],
        "not a usable mprof capture",
    );
    assert!(!out.exists(), "no SVG for a failed run");

    let file = fixture().write(d, "ok.mprof");
    let unwritable = d.join("no/such/dir/x.svg");
    fails_with_one_line(
        &[
            "flamegraph",
            file.to_str().unwrap(),
            "-o",
            unwritable.to_str().unwrap(),
        ],
        "cannot write",
    );
}

#[test]
fn a_truncated_capture_warns_and_still_reports() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = fixture();
    c.bytes.truncate(c.bytes.len() - 5);
    let file = c.write(dir.path(), "cut.mprof");
    let f = file.to_str().unwrap();
    let o = ok(&["report", f]);
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("mprof: warning: "), "{err}");
    assert!(err.contains("truncated"), "{err}");
    // The Stats record was cut off: nothing counted as dropped, samples still there.
    assert!(
        stdout(&o).contains("9 samples, 0 dropped"),
        "{}",
        stdout(&o)
    );
    let v = json(&["report", f]);
    assert_eq!(v["samples"], 9);
    let out = dir.path().join("cut.svg");
    ok(&["flamegraph", f, "-o", out.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("build_index"));
}

#[test]
fn a_capture_without_rate_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.alloc(1, 100, 1, &[]);
    let file = c.write(dir.path(), "norate.mprof");
    let o = ok(&["report", file.to_str().unwrap()]);
    assert!(stderr(&o).contains("does not say its sampling rate"));
    assert!(stdout(&o).contains("total allocated: 100 B ± 0 B"));
}

#[test]
fn bad_arguments_are_rejected_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().write(dir.path(), "app.mprof");
    let f = file.to_str().unwrap();
    for args in [
        vec!["report", f, "--bogus"],
        vec!["report", f, "--view", "sideways"],
        vec!["report", f, "--by", "planet"],
        vec!["report", f, "--top", "-3"],
        vec!["record", "--rate", "0", "python3", "-c", "pass"],
        vec!["record", "--rate", "12XB", "python3", "-c", "pass"],
        vec![
            "record",
            "--rate",
            "99999999999TiB",
            "python3",
            "-c",
            "pass",
        ],
    ] {
        let o = mprof(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.lines().next().unwrap().starts_with("error: "),
            "{args:?}: {err}"
        );
    }
    let o = mprof(&["record", "--rate", "0", "python3", "-c", "pass"]);
    assert!(stderr(&o).contains("at least 1 byte"), "{}", stderr(&o));
}
