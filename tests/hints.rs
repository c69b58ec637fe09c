//! What mprof tells a user who would otherwise be stuck, with real interpreters and processes:
//! an attach to a parent whose Python children do the work names them; a fast-growing
//! capture is announced once (the threshold is lowered through `MPROF_TEST_GROWTH_NOTE`, so
//! the test does not depend on the machine's speed; the default threshold is unit-tested in
//! `src/sessions/hints.rs`); and the command line's conveniences: `--view leaks`, size units,
//! `--help`.

mod common;

use common::procs::{attach_once, Target, LIMIT};
use common::{mprof, pythons, run_with_timeout, script, Python};
use std::process::Command;

/// pyenv's newest interpreter and Debian's static one (whose children have no libpython).
fn interpreters() -> Vec<Python> {
    let all = pythons();
    let mut picked: Vec<Python> = all
        .iter()
        .filter(|p| p.label.contains("debian"))
        .cloned()
        .collect();
    if let Some(pyenv) = all.iter().rev().find(|p| p.label.starts_with("pyenv")) {
        picked.push(pyenv.clone());
    }
    picked
}

#[test]
fn an_attach_to_a_parent_whose_python_children_work_names_them() {
    for py in interpreters() {
        let dir = common::tempdir();
        let target = Target::python(&py.path, "workers.py", &["parent", "2"]);
        let children: Vec<&str> = target.ready[2..].iter().map(String::as_str).collect();
        assert_eq!(children.len(), 2);
        let capture = dir.path().join("parent.mprof");
        let (status, err) = attach_once(
            target.pid,
            &["--duration", "1", "-o", capture.to_str().unwrap()],
        );
        assert!(status.success(), "{}: {err}", py.label);
        let pid = target.pid;
        let said = format!("mprof: PID {pid} itself allocated little (");
        assert!(err.contains(&said), "{}: {err}", py.label);
        assert!(
            err.contains("but it has 2 Python child processes, which may do the work:"),
            "{}: {err}",
            py.label
        );
        for child in &children {
            let line = format!("mprof:   PID {child}: {} ", py.path.display());
            assert!(err.contains(&line), "{}: no {line:?} in {err}", py.label);
        }
        assert!(
            err.contains(&format!(
                "mprof: attach with --follow-children to profile them too (or attach to one, \
                 e.g. mprof attach --pid {})",
                children[0]
            )),
            "{}: {err}",
            py.label
        );
        // A child does the work and has no children: no hint.
        let child = children[0].parse().unwrap();
        let capture = dir.path().join("child.mprof");
        let (status, err) = attach_once(
            child,
            &[
                "--duration",
                "1",
                "--rate",
                "4KiB",
                "-o",
                capture.to_str().unwrap(),
            ],
        );
        assert!(status.success(), "{}: {err}", py.label);
        assert!(err.contains("top allocation sites"), "{}: {err}", py.label);
        assert!(!err.contains("child process"), "{}: {err}", py.label);
    }
}

/// The growth note is printed once when the capture grows faster than the threshold, by
/// `record` and by `attach`; at the default rate and threshold a light program gets none.
#[test]
fn a_fast_growing_capture_is_announced_once() {
    if common::tier::full_tier_only(
        "a_fast_growing_capture_is_announced_once",
        "runs until the capture has grown for seconds",
    ) {
        return;
    }
    let py = &interpreters()[0];
    let dir = tempfile::tempdir().unwrap();
    let record = |args: &[&str], note: Option<&str>| {
        let mut cmd = mprof();
        cmd.arg("record")
            .arg("-o")
            .arg(dir.path().join("churn.mprof"))
            .args(args)
            .arg("--")
            .arg(&py.path)
            .arg(script("workers.py"))
            .args(["churn", "3.5"]);
        if let Some(limit) = note {
            cmd.env("MPROF_TEST_GROWTH_NOTE", limit);
        }
        let out = run_with_timeout(&mut cmd, LIMIT);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = record(&["--rate", "1"], Some("1000"));
    assert_eq!(
        err.matches("mprof: note: the capture grows by ").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("/s (--rate 1 records every allocation); a minute of this is "),
        "{err}"
    );
    let quiet = record(&[], None);
    assert!(!quiet.contains("note:"), "{quiet}");

    let target = Target::python(&py.path, "workers.py", &["churn", "60"]);
    let mut attach = Command::new(env!("CARGO_BIN_EXE_mprof"));
    attach
        .env("MPROF_TEST_GROWTH_NOTE", "1000")
        .args(["attach", "--rate", "1", "--duration", "3.5", "--pid"])
        .arg(target.pid.to_string())
        .arg("-o")
        .arg(dir.path().join("attach.mprof"));
    let out = run_with_timeout(&mut attach, LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.matches("mprof: note: the capture grows by ").count(),
        1,
        "{err}"
    );
}

#[test]
fn leaks_is_another_name_for_the_live_view() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = mprof::capture::testing::CaptureBuilder::new();
    c.meta("rate=1\n")
        .code(1, "a.py", "f", 1)
        .alloc(1, 100, 1, &[(1, 2)])
        .alloc(2, 300, 2, &[(1, 3)])
        .free(2);
    let file = c.write(dir.path(), "c.mprof");
    let run = |view: &str| {
        let out = mprof()
            .arg("report")
            .arg(&file)
            .args(["--view", view])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let leaks = run("leaks");
    assert_eq!(leaks, run("live"));
    assert!(
        leaks.starts_with("mprof report: live bytes at the end"),
        "{leaks}"
    );
}

#[test]
fn sizes_are_1024_based_and_documented_in_help() {
    let help = mprof().args(["record", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("Units are 1024-based whatever their spelling: `k`, `KB` and `KiB` are 1024 bytes, `MB` and `MiB` 1,048,576"),
        "{help}"
    );
    // --rate 1MB is one MiB: the capture says so.
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("mb.mprof");
    let py = &interpreters()[0];
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "--rate", "1MB", "-o"])
            .arg(&capture)
            .arg("--")
            .arg(&py.path)
            .args(["-c", "pass"]),
        LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = common::report_json(&capture, &[]);
    assert_eq!(report["rate"], 1 << 20);
    let bad = mprof()
        .args(["record", "--rate", "1MiBs", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("unknown unit `MiBs`"), "{err}");
}
