//! The views read back what `--every --profiles-dir` wrote: a real leaking program recorded
//! with one pprof file a second, then `report`, `diff` (the first seconds against the last:
//! `DIR@..2s` and `DIR@-2s..`), `flamegraph`, `timeline` and one file alone, on the directory;
//! a corrupt file and a planted symlink in it are a warning each, never a crash or a read
//! elsewhere; a range that selects no interval is a one-line error.

mod common;

use common::{main_python, mprof, pythons, run_with_timeout, script, tempdir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// The line of `rolling_leak.py` marked `# LEAK`.
fn leak_line() -> u64 {
    let text = std::fs::read_to_string(script("rolling_leak.py")).unwrap();
    let at = text.lines().position(|l| l.ends_with("# LEAK")).unwrap();
    at as u64 + 1
}

fn run(args: &[&str], path: &Path) -> Output {
    run_with_timeout(mprof().args(args).arg(path), LIMIT)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output, what: &str) -> Value {
    assert!(out.status.success(), "{what}: {}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `DIR@RANGE` as a path.
fn ranged(dir: &Path, range: &str) -> PathBuf {
    PathBuf::from(format!("{}@{range}", dir.display()))
}

#[test]
fn a_directory_of_interval_profiles_reads_back_in_every_view() {
    let py = main_python(&pythons());
    let dir = tempdir();
    let profiles = dir.path().join("profiles");
    let out = run_with_timeout(
        mprof()
            .args([
                "record",
                "-q",
                "--every",
                "1s",
                "--rate",
                "64KiB",
                "--profiles-dir",
            ])
            .arg(&profiles)
            .arg("-o")
            .arg(dir.path().join("cap.mprof"))
            .arg("--")
            .arg(&py.path)
            .arg(script("rolling_leak.py"))
            .arg("6"),
        LIMIT,
    );
    assert!(out.status.success(), "{}: {}", py.label, stderr(&out));
    let files = common::interval_files(&profiles);
    assert!(
        files.len() >= 5,
        "{}: {} interval files",
        py.label,
        files.len()
    );
    let line = leak_line();

    // The live heap at the end: the leaking line first.
    let report = json(
        &run(
            &["report", "--view", "live", "--by", "line", "--json"],
            &profiles,
        ),
        "report",
    );
    let top = &report["locations"][0];
    assert!(
        top["file"].as_str().unwrap().ends_with("rolling_leak.py") && top["line"] == line,
        "{}: the top live line is {top}",
        py.label
    );
    let live = top["live_bytes"].as_f64().unwrap();
    assert!(live > 20.0 * 1048576.0, "{}: {live} bytes live", py.label);
    assert_eq!(report["meta"]["intervals"], files.len().to_string());
    assert_eq!(report["samples"].as_u64().map(|s| s > 0), Some(true));

    // The first two seconds against the last two: growth at the leaking line, beyond noise.
    let out = run_with_timeout(
        mprof()
            .args(["diff", "--by", "line", "--json"])
            .arg(ranged(&profiles, "..2s"))
            .arg(ranged(&profiles, "-2s..")),
        LIMIT,
    );
    let diff = json(&out, "diff");
    let grew = &diff["sites"][0];
    assert!(
        grew["label"]
            .as_str()
            .unwrap()
            .contains(&format!("rolling_leak.py:{line}")),
        "{}: the largest growth is {grew}",
        py.label
    );
    let (change, err) = (
        grew["change_bytes"].as_f64().unwrap(),
        grew["change_stderr"].as_f64().unwrap(),
    );
    assert!(
        change > 8.0 * 1048576.0 && change > 4.0 * err && grew["noise"] == false,
        "{}: growth {change} ± {err}",
        py.label
    );
    assert!(grew["base_bytes"].as_f64() < grew["new_bytes"].as_f64());

    // The flamegraph and the timeline of the directory.
    let svg = dir.path().join("f.svg");
    let out = run_with_timeout(
        mprof()
            .args(["flamegraph", "--view", "live", "-o"])
            .arg(&svg)
            .arg(&profiles),
        LIMIT,
    );
    assert!(out.status.success(), "flamegraph: {}", stderr(&out));
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.starts_with("<?xml") && svg.contains("leak"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    let csv = dir.path().join("t.csv");
    let out = run_with_timeout(
        mprof().args(["timeline", "-o"]).arg(&csv).arg(&profiles),
        LIMIT,
    );
    assert!(out.status.success(), "timeline: {}", stderr(&out));
    let csv = std::fs::read_to_string(csv).unwrap();
    let heaps: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(heaps.len(), files.len(), "one point per interval: {csv}");
    assert!(
        heaps[heaps.len() - 2] > 2.0 * heaps[0],
        "the heap grows: {heaps:?}"
    );

    // One file alone: its interval.
    let one = json(
        &run(&["report", "--view", "allocated", "--json"], &files[2]),
        "one file",
    );
    assert_eq!(one["meta"]["intervals"], "1");
    let allocated = one["totals"]["allocated"]["bytes"].as_f64().unwrap();
    assert!(
        allocated > 1048576.0 && allocated < 20.0 * 1048576.0,
        "{allocated}"
    );

    hostile_entries_are_skipped(&profiles, files.len(), dir.path());
    a_range_of_no_interval_is_a_one_line_error(&profiles);
}

/// A copy of the directory with a corrupt interval file and a symlink named like one (to a
/// sound file outside): the corrupt one is a warning, the symlink is not followed.
fn hostile_entries_are_skipped(profiles: &Path, n: usize, work: &Path) {
    let copy = work.join("hostile");
    std::fs::create_dir(&copy).unwrap();
    for f in common::interval_files(profiles) {
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        copy.join("mprof-9999999999998-1-000001.pb.gz"),
        b"\x1f\x8b\x08\x00crafted, not gzip",
    )
    .unwrap();
    let outside = work.join("outside.pb.gz");
    std::fs::copy(&common::interval_files(profiles)[1], &outside).unwrap();
    std::os::unix::fs::symlink(&outside, copy.join("mprof-9999999999999-1-000002.pb.gz")).unwrap();
    std::fs::write(copy.join("README.txt"), b"not a profile").unwrap();
    let out = run(&["report", "--view", "live", "--json"], &copy);
    let report = json(&out, "hostile directory");
    assert_eq!(
        report["meta"]["intervals"],
        n.to_string(),
        "the symlink was followed"
    );
    let err = stderr(&out);
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mprof: warning:"))
        .collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("skipping mprof-9999999999998-1-000001.pb.gz")),
        "{err}"
    );
    assert!(warnings.iter().any(|w| w.contains("1 symlink(s)")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn a_range_of_no_interval_is_a_one_line_error(profiles: &Path) {
    for range in ["1h..", "..-1h", "3s..2s"] {
        let out = run(&["report"], &ranged(profiles, range));
        let err = stderr(&out);
        assert!(!out.status.success(), "{range}: {err}");
        assert_eq!(err.lines().count(), 1, "{range}: {err}");
        assert!(
            err.starts_with("mprof: error:") && err.contains("selects none"),
            "{err}"
        );
    }
    let out = run(&["report"], &ranged(profiles, "2h"));
    let err = stderr(&out);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("FROM..TO"), "{err}");
}
