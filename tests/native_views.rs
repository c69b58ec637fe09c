//! Which allocator the bytes came from, on real interpreters: a workload keeps known bytes
//! from Python objects, the C allocator family (the test's extension and ctypes) and
//! anonymous mappings, each from its own function (`tests/py/allocator_workload.py`). At
//! `--rate 1` the report and its JSON put each function's bytes under its allocator within 1%,
//! `--allocator` keeps one, and `--python-only` (record and attach) records no native byte and
//! says so. With numpy importable, arrays kept are found at the line that made them.

mod common;

use common::native::build_extension;
use common::procs::{touch, wait_line, Attach, Target, LIMIT};
use common::{by_function, mprof, pythons, record_script, report_json, run_with_timeout, Python};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// "truth FUNCTION ALLOCATOR BYTES" lines: (function, allocator, live bytes kept).
fn truths(stdout: &str) -> Vec<(String, String, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("truth ")?.split_whitespace();
            Some((w.next()?.into(), w.next()?.into(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// `mprof record` of the workload, with `args` before `--`.
fn record(py: &Python, dir: &Path, capture: &Path, args: &[&str]) -> Output {
    record_script(py, args, &[], capture, "allocator_workload.py", dir)
}

/// A location's live bytes from one allocator (0 when it has none): its own figures when
/// all its samples are that allocator's, its split when they are `mixed`.
fn live_of(location: &Value, allocator: &str) -> u64 {
    match location["allocator"].as_str().unwrap() {
        "mixed" => location["allocators"][allocator]["live"]["bytes"]
            .as_u64()
            .unwrap_or(0),
        one if one == allocator => location["live_bytes"].as_u64().unwrap(),
        _ => 0,
    }
}

fn within(got: u64, truth: u64, tolerance: f64) -> bool {
    (got as f64 - truth as f64).abs() <= tolerance * truth as f64
}

/// Every function's live bytes under its own allocator within 1% of the truth, and less than
/// 1% of them under any other.
fn check_split(label: &str, capture: &Path, truth: &[(String, String, u64)]) {
    assert_eq!(truth.len(), 6, "{label}: {truth:?}");
    let report = report_json(
        capture,
        &["--view", "live", "--by", "function", "--top", "0"],
    );
    let sites = by_function(&report);
    for (function, allocator, bytes) in truth {
        let site = &sites[function];
        for other in ["python", "native", "mmap"] {
            let live = live_of(site, other);
            if other == allocator {
                assert!(
                    within(live, *bytes, 0.01),
                    "{label}: {function} {other} {live} vs {bytes}"
                );
            } else {
                assert!(
                    live < bytes / 100,
                    "{label}: {function} has {live} {other} bytes"
                );
            }
        }
    }
    let totals = &report["totals_by_allocator"];
    for allocator in ["python", "native", "mmap"] {
        let want: u64 = truth.iter().filter(|t| t.1 == allocator).map(|t| t.2).sum();
        let got = totals[allocator]["live"]["bytes"].as_u64().unwrap();
        assert!(
            got as f64 >= 0.99 * want as f64,
            "{label}: {allocator} total {got} < {want}"
        );
    }
}

#[test]
fn record_reports_each_allocators_bytes_exactly_and_filters_them() {
    for py in pythons() {
        let dir = common::tempdir();
        if build_extension(&py, dir.path()).is_none() {
            continue;
        }
        let capture = dir.path().join("r.mprof");
        let out = record(&py, dir.path(), &capture, &["--rate", "1"]);
        let truth = truths(&String::from_utf8_lossy(&out.stdout));
        check_split(&py.label, &capture, &truth);

        // The summary and the text report say how the allocators share the heap.
        let summary = String::from_utf8_lossy(&out.stderr);
        assert!(
            summary.contains("peak live heap by allocator: python "),
            "{}: {summary}",
            py.label
        );
        let text = mprof()
            .args(["report", "--view", "live", "--by", "function", "--top", "0"])
            .arg(&capture)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        let header = text
            .lines()
            .find(|l| l.starts_with("total live: "))
            .unwrap();
        assert!(
            header.contains(" = python ")
                && header.contains(" + native ")
                && header.contains(" + mmap "),
            "{}: {header}",
            py.label
        );
        for (function, allocator, _) in &truth {
            let row = text
                .lines()
                .find(|l| l.contains(&format!("{function} (")))
                .unwrap_or_else(|| panic!("{}: no row for {function}\n{text}", py.label));
            let tag = format!("[{allocator}");
            assert_eq!(
                row.contains(&tag),
                allocator != "python",
                "{}: {row}",
                py.label
            );
        }

        // --allocator keeps one allocator's bytes: the totals are that allocator's.
        let all = report_json(&capture, &["--view", "live"]);
        let native = report_json(&capture, &["--view", "live", "--allocator", "native"]);
        assert_eq!(
            native["totals"]["live"], all["totals_by_allocator"]["native"]["live"],
            "{}",
            py.label
        );
        let native_sites = by_function(&report_json(
            &capture,
            &[
                "--view",
                "live",
                "--by",
                "function",
                "--allocator",
                "native",
                "--top",
                "0",
            ],
        ));
        for (function, allocator, bytes) in &truth {
            let live = native_sites
                .get(function)
                .map_or(0, |s| s["live_bytes"].as_u64().unwrap());
            if allocator == "native" {
                assert!(within(live, *bytes, 0.01), "{}: {function}", py.label);
            } else {
                assert!(live < bytes / 100, "{}: {function} {live}", py.label);
            }
        }
        eprintln!("{}: record --rate 1: every allocator within 1%", py.label);
    }
}

/// No native or mmap sample at all, Python's bytes as before, and every view says so.
fn check_python_only(label: &str, capture: &Path, truth: &[(String, String, u64)]) {
    let report = report_json(
        capture,
        &["--view", "live", "--by", "function", "--top", "0"],
    );
    assert_eq!(report["native_recorded"], false, "{label}");
    assert_eq!(report["meta"]["native"], "off", "{label}");
    for allocator in ["native", "mmap"] {
        let samples = &report["totals_by_allocator"][allocator]["allocated"]["samples"];
        assert_eq!(samples, 0, "{label}: {allocator} samples");
    }
    let python = truth.iter().find(|t| t.1 == "python").unwrap();
    let live = by_function(&report)[&python.0]["live_bytes"]
        .as_u64()
        .unwrap();
    assert!(within(live, python.2, 0.01), "{label}: {live}");
    let text = mprof().args(["report"]).arg(capture).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("native allocations were not recorded (--python-only)"),
        "{label}: {text}"
    );
}

#[test]
fn python_only_records_no_native_bytes_in_record_and_attach() {
    for py in pythons() {
        let dir = common::tempdir();
        if build_extension(&py, dir.path()).is_none() {
            continue;
        }
        let capture = dir.path().join("r.mprof");
        let out = record(&py, dir.path(), &capture, &["--rate", "1", "--python-only"]);
        let summary = String::from_utf8_lossy(&out.stderr);
        assert!(
            summary.contains("native allocations were not recorded (--python-only)"),
            "{}: {summary}",
            py.label
        );
        let truth = truths(&String::from_utf8_lossy(&out.stdout));
        check_python_only(&format!("{} record", py.label), &capture, &truth);

        let d = dir.path().to_str().unwrap();
        let target = Target::python(&py.path, "allocator_workload.py", &[d, "wait"]);
        let capture = dir.path().join("a.mprof");
        let mut attach = Attach::start(
            target.pid,
            &[
                "--rate",
                "1",
                "--python-only",
                "-o",
                capture.to_str().unwrap(),
            ],
        );
        attach.attached();
        touch(dir.path(), "go");
        let mut lines = Vec::new();
        wait_line(&target.out, "allocated", LIMIT, &mut lines).expect("workload ran");
        let summary = attach.detach();
        assert!(
            summary.contains("not recorded (--python-only)"),
            "{summary}"
        );
        touch(dir.path(), "finish");
        let (status, _) = target.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        check_python_only(
            &format!("{} attach", py.label),
            &capture,
            &truths(&lines.join("\n")),
        );
        eprintln!(
            "{}: --python-only: no native byte (record, attach)",
            py.label
        );
    }
}

const NUMPY_SCRIPT: &str = "\
import numpy as np
kept = []
for i in range(20):
    kept.append(np.ones(625_000))  # line 4: 20 arrays of 5,000,000 bytes
print('kept', sum(a.nbytes for a in kept), flush=True)
";

/// numpy arrays kept, at the default rate: the live bytes of the stacks that pass through the
/// line that made them are the arrays' bytes within 3 standard errors.
#[test]
fn numpy_arrays_are_found_at_the_line_that_made_them() {
    for py in pythons() {
        let has_numpy = std::process::Command::new(&py.path)
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_numpy {
            let test = format!("numpy test on {}", py.label);
            // tools/test-deps.sh installs numpy into pyenv's 3.11 only.
            if py.label == "pyenv 3.11" {
                common::tier::skip(
                    &test,
                    "numpy not importable (tools/test-deps.sh installs it into pyenv's 3.11)",
                );
            } else {
                common::tier::skip_here(&test, "numpy is installed into pyenv's 3.11 only");
            }
            continue;
        }
        let dir = common::tempdir();
        let file = dir.path().join("arrays.py");
        std::fs::write(&file, NUMPY_SCRIPT).unwrap();
        let capture = dir.path().join("n.mprof");
        let out = run_with_timeout(
            mprof()
                .args(["record", "-q", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(&file),
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let truth: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("kept ")?.parse().ok())
            .expect("the script says what it kept");
        let report = report_json(&capture, &["--view", "live", "--by", "stack", "--top", "0"]);
        let name = file.to_str().unwrap();
        let (mut bytes, mut variance) = (0u64, 0f64);
        for l in report["locations"].as_array().unwrap() {
            let at_line = l["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["file"] == name && f["line"] == 4);
            if at_line {
                bytes += l["live_bytes"].as_u64().unwrap();
                variance += l["live_stderr"].as_f64().unwrap().powi(2);
            }
        }
        let sigma = variance.sqrt();
        let error = (bytes as f64 - truth as f64).abs();
        eprintln!(
            "{}: numpy arrays at line 4: {bytes} bytes ± {sigma:.0}, truth {truth}",
            py.label
        );
        assert!(
            error <= 3.0 * sigma.max(1.0),
            "{}: {bytes} vs {truth} (σ {sigma:.0})",
            py.label
        );
    }
}
