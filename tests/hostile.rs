//! Hostile targets (issue 7, point 2), attacked as a real attacker would: targets that
//! scribble on their ring or resize its memory file, some running as `nobody`. Each test checks
//! that the attack fails and that a root-owned sentinel file keeps its contents. Planted
//! symlinks are in hostile_outputs.rs, hostile capture files in hostile_captures.rs.

mod common;

use common::hostile::*;
use common::{mprof, pythons, run_with_timeout, ChildGuard, Python};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// `record` of a target that becomes `nobody` and then scribbles on its ring, one way per run,
/// on every interpreter: mprof ends the session with one clear line or finishes normally, and
/// never crashes. Before the fix, a bad magic made it panic and a bad length read out of
/// bounds.
#[test]
fn record_survives_a_target_that_scribbles_on_its_ring() {
    if !common::tier::root(
        "scribbling targets under record",
        "the target drops to nobody",
    ) {
        return;
    }
    let sentinel = Sentinel::new();
    let all = pythons();
    let modes = ["header", "head", "length", "state", "garbage"];
    let mut runs: Vec<(Python, &str)> = all
        .iter()
        .enumerate()
        .map(|(i, py)| (py.clone(), modes[i % modes.len()]))
        .collect();
    let main = main_python(&all);
    runs.extend(modes.iter().map(|m| (main.clone(), *m)));
    for (py, mode) in runs {
        let dir = workdir();
        let capture = dir.path().join("c.mprof");
        // "state" samples often, so that the session's end (which the agent's stop writes to
        // the same word) comes after the scribble: the damage must stay visible all the same.
        let rate = if matches!(mode, "header" | "state") {
            "16KiB"
        } else {
            "1GiB"
        };
        let out = run_with_timeout(
            mprof()
                .args(["record", "--rate", rate, "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(dir.path().join("ring_scribbler.py"))
                .args([mode, "--drop"]),
            LIMIT,
        );
        let what = format!("record, {} scribbling {mode}", py.label);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("scribbled {mode}")),
            "{what}: {stdout}"
        );
        let ok = clean_exit(&out, &what);
        let err = String::from_utf8_lossy(&out.stderr);
        match mode {
            // The header's magic is not the reader's business: the session goes on.
            "header" => assert!(ok, "{what}: {err}"),
            _ => assert!(!ok && err.contains("damaged the ring"), "{what}: {err}"),
        }
        // What was captured before the attack reads.
        let report = run_with_timeout(mprof().arg("report").arg(&capture), LIMIT);
        assert!(report.status.success(), "{what}: {report:?}");
        sentinel.check();
    }
}

/// The ring's memory file is sealed against resizing: a launcher that truncates it (the agent
/// keeps out of non-Python processes, so a shell holds the descriptor) gets EPERM, and mprof,
/// whose mapping would otherwise fault with SIGBUS, records the program to its end.
#[test]
fn record_survives_a_launcher_that_truncates_the_ring() {
    let py = main_python(&pythons());
    let dir = workdir();
    let capture = dir.path().join("c.mprof");
    let shell = format!(
        "truncate -s 0 /proc/self/fd/$MPROF_RING_FD; echo \"truncate rc=$?\" >&2; \
         truncate -s 1G /proc/self/fd/$MPROF_RING_FD; echo \"grow rc=$?\" >&2; \
         exec {} -c 'x = [bytearray(100000) for _ in range(100)]'",
        py.path.display()
    );
    let out = run_with_timeout(
        mprof()
            .args(["record", "--rate", "1", "-o"])
            .arg(&capture)
            .args(["--", "sh", "-c", &shell]),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(clean_exit(&out, "truncating launcher"), "{err}");
    assert!(
        err.contains("truncate rc=1") && err.contains("grow rc=1"),
        "{err}"
    );
    assert!(err.contains("Operation not permitted"), "{err}");
    let json = common::report_json(&capture, &["--top", "0"]);
    assert!(json["totals"]["allocated"]["bytes"].as_u64().unwrap() >= 10_000_000);
}

/// Starts the scribbler as `nobody` and returns it with its PID.
fn nobody_target(
    dir: &Path,
    py: &Path,
    mode: &str,
) -> (
    ChildGuard,
    u32,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(py)
        .arg(dir.join("ring_scribbler.py"))
        .arg(mode)
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("ready line").unwrap();
    let pid = first
        .strip_prefix("ready ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    (ChildGuard(child), pid, lines)
}

/// `attach` (as root) to a target running as `nobody` that scribbles on its ring, or races to
/// resize the ring's memory file from the moment it appears: mprof ends with one line or
/// finishes, never crashes, and the sentinel is untouched.
#[test]
fn attach_survives_a_target_that_scribbles_on_its_ring() {
    let test = "hostile attach targets";
    if !common::tier::root(test, "the target runs as nobody") {
        return;
    }
    if !Path::new("/usr/bin/python3").is_file() {
        common::tier::skip_here(test, "/usr/bin/python3 not present");
        return;
    }
    let sentinel = Sentinel::new();
    let py = Path::new("/usr/bin/python3");
    for mode in ["header", "head", "state", "garbage", "truncate-race"] {
        let dir = workdir();
        let capture = dir.path().join("c.mprof");
        let (mut guard, pid, mut lines) = nobody_target(dir.path(), py, mode);
        let out = run_with_timeout(
            mprof()
                .args(["attach", "--pid", &pid.to_string(), "--duration", "4", "-o"])
                .arg(&capture),
            LIMIT,
        );
        let what = format!("attach, target scribbling {mode}");
        let ok = clean_exit(&out, &what);
        let err = String::from_utf8_lossy(&out.stderr);
        if mode == "truncate-race" && !ok {
            // The target resized the file before mprof took it (it is no longer the fresh
            // memory file mprof had made) or between mprof's sizing and sealing it: either
            // way mprof saw it and refused, before mapping anything.
            assert!(
                (err.contains("cannot set up the ring") && err.contains("resized"))
                    || err.contains("interfered with the attach"),
                "{what}: {err}"
            );
            drop(guard);
            sentinel.check();
            continue;
        }
        let rest: Vec<String> = lines.by_ref().map_while(Result::ok).collect();
        let status = guard.0.wait().unwrap();
        assert!(
            status.success(),
            "{what}: the target ended {status}: {rest:?}"
        );
        if mode != "truncate-race" {
            // The attack took place (the target found its ring and scribbled on it).
            assert!(
                rest.iter().any(|l| *l == format!("scribbled {mode}")),
                "{what}: the target never scribbled: {rest:?}"
            );
        }
        match mode {
            "header" | "truncate-race" => assert!(ok, "{what}: {err}"),
            _ => assert!(!ok && err.contains("damaged the ring"), "{what}: {err}"),
        }
        if mode == "truncate-race" {
            // Resizes before the seal are harmless (mprof sizes the file, then checks it);
            // every attempt after it must fail. When the attach borrowed the racing thread
            // itself, the racer never saw the descriptor (the trampoline closes it): nothing
            // to check then but that mprof finished and the target is whole (the seals are
            // shown by `record_survives_a_launcher_that_truncates_the_ring`).
            let answers = rest
                .iter()
                .find(|l| l.starts_with("truncate answers"))
                .unwrap_or_else(|| panic!("{rest:?}"));
            let saw_the_file = answers.contains("resized") || answers.contains("EPERM");
            assert!(
                !saw_the_file || answers.contains("EPERM"),
                "the seals refused nothing: {answers}"
            );
            if !saw_the_file {
                eprintln!("{what}: the racer was the borrowed thread and never saw the file");
            }
        }
        sentinel.check();
    }
}
