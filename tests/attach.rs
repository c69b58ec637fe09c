//! `mprof attach` end to end: real interpreters, real processes, the real binary. What an
//! attach captures and how targets in every state (allocating, idle, busy in native code) take
//! it; the attach under load, killed, refused or across users is in `attach_robustness.rs`.
//!
//! Every target is a child of the test wrapped in a guard that kills it, and every mprof run
//! has a deadline, so a failing test leaves nothing running and never hangs.

mod common;

use common::procs::{
    attach_once, attached_ms, attached_workload, signal, touch, wait_file, Attach,
    AttachedWorkload, Target, LIMIT,
};
use common::{by_function, main_python, mprof, pythons, report_json, run_with_timeout, script};
use std::collections::HashMap;
use std::time::Duration;

const SIGTERM: i32 = 15;

/// Attach to a running program, let it allocate known amounts, detach; the capture attributes
/// the bytes exactly (`--rate 1`) and the program then finishes normally.
#[test]
fn attach_to_a_running_workload_on_every_version() {
    for py in pythons() {
        let AttachedWorkload {
            target,
            attach,
            capture,
            dir,
        } = attached_workload(&py.path);
        touch(dir.path(), "go");
        wait_file(&dir.path().join("allocated"), LIMIT);
        let err = attach.detach();
        // Its heap is what was allocated while attached, and the summary says so.
        assert!(
            err.contains(", peak live heap ")
                && err.contains(" (of what was allocated while attached)"),
            "{}: {err}",
            py.label
        );
        touch(dir.path(), "finish");
        let (status, out) = target.finish(LIMIT);
        assert_eq!(
            status.code(),
            Some(7),
            "{}: target status {status}, output {out:?}",
            py.label
        );
        assert!(
            out.iter().any(|l| l.starts_with("finished")),
            "{}: {out:?}",
            py.label
        );

        let want: HashMap<String, f64> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("truth.json")).unwrap())
                .unwrap();
        let report = report_json(
            &capture,
            &["--view", "live", "--by", "function", "--top", "0"],
        );
        assert_eq!(report["meta"]["mode"], "attach");
        let got = by_function(&report);
        for (func, bytes) in &want {
            let live = got
                .get(func.as_str())
                .and_then(|v| v["live_bytes"].as_f64())
                .unwrap_or_else(|| panic!("{}: {func} missing from {report}", py.label));
            let err = (live - bytes).abs() / bytes;
            assert!(
                err < 0.01,
                "{}: {func} live {live} vs truth {bytes}",
                py.label
            );
        }
        let churn = &got["churn"];
        assert!(
            churn["alloc_bytes"].as_f64().unwrap() >= 2000.0 * 5000.0,
            "{}: {churn}",
            py.label
        );
        eprintln!(
            "{}: attach attributes live bytes within 1%, target finished",
            py.label
        );
    }
}

/// After a detach nothing of the session stays in the target: no ring mapping, no open memory
/// file; the agent stays loaded (by design) and a second attach reuses it.
#[test]
fn detach_leaves_no_ring_and_reattach_reuses_the_agent() {
    let all = pythons();
    let py = main_python(&all);
    let dir = common::tempdir();
    let mut target = Target::python(&py.path, "attach_idle.py", &["sleep"]);
    for round in 0..3 {
        let capture = dir.path().join(format!("c{round}.mprof"));
        let (status, err) = attach_once(
            target.pid,
            &["--duration", "0.3", "-o", capture.to_str().unwrap()],
        );
        assert!(status.success(), "round {round}: {err}");
        assert_eq!(
            err.contains("agent reused"),
            round > 0,
            "round {round}: {err}"
        );
        let maps = target.maps();
        assert!(
            !maps.contains("mprof-ring"),
            "round {round}: ring still mapped:\n{maps}"
        );
        assert!(
            maps.contains("mprof-agent"),
            "round {round}: agent not loaded"
        );
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", target.pid))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.display().to_string())
            .filter(|p| p.contains("mprof"))
            .collect();
        assert!(
            fds.is_empty(),
            "round {round}: descriptors left open: {fds:?}"
        );
    }
    assert!(target.alive(), "the sleeping target died");
}

/// While attached, the agent wraps the interpreter's `tp_dealloc` of code objects (to notice a
/// code object freed, whose address the next may take); each detach puts back the
/// interpreter's own, on every version.
#[test]
fn detach_puts_back_the_code_objects_dealloc() {
    for py in pythons() {
        let dir = common::tempdir();
        let seen = dir.path().join("seen");
        let mut target = Target::python(
            &py.path,
            "attach_idle.py",
            &["code_dealloc", seen.to_str().unwrap()],
        );
        let values = || -> Vec<String> {
            std::fs::read_to_string(&seen)
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect()
        };
        for round in 0..2 {
            let capture = dir.path().join(format!("c{round}.mprof"));
            let (status, err) = attach_once(
                target.pid,
                &["--duration", "0.5", "-o", capture.to_str().unwrap()],
            );
            assert!(status.success(), "{} round {round}: {err}", py.label);
            std::thread::sleep(Duration::from_millis(100));
            let v = values();
            assert_eq!(
                v.len(),
                1 + 2 * (round + 1),
                "{} round {round}: the slot took {v:?}",
                py.label
            );
            assert_eq!(v.last(), v.first(), "{} round {round}: {v:?}", py.label);
        }
        assert!(target.alive(), "{}: the target died", py.label);
    }
}

/// Targets blocked in `time.sleep`, a `selectors` (epoll) server and a raw `epoll_wait` are
/// attached well within a second, and none of them notices: the server still answers and the
/// raw `epoll_wait` never returns EINTR.
#[test]
fn idle_targets_are_attached_within_a_second_and_notice_nothing() {
    for py in pythons() {
        for mode in ["sleep", "selectors", "epoll"] {
            let dir = common::tempdir();
            let capture = dir.path().join("c.mprof");
            let mut target = Target::python(&py.path, "attach_idle.py", &[mode]);
            let mut attach = Attach::start(
                target.pid,
                &["--duration", "0.5", "-o", capture.to_str().unwrap()],
            );
            let took = attach.attached();
            let (status, err) = attach.finish();
            assert!(status.success(), "{} {mode}: {err}", py.label);
            assert!(
                took < Duration::from_secs(1),
                "{} {mode}: attached after {took:?}",
                py.label
            );
            if mode == "selectors" {
                use std::io::{Read, Write};
                let port: u16 = target.ready[2].parse().unwrap();
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(b"ping").unwrap();
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"ping", "{}: the server no longer echoes", py.label);
            }
            assert!(target.alive(), "{} {mode}: target died", py.label);
            signal(target.pid, SIGTERM);
            let (_, out) = target.finish(LIMIT);
            assert!(
                !out.iter()
                    .any(|l| l.contains("EINTR") || l.contains("errno")),
                "{} {mode}: {out:?}",
                py.label
            );
            eprintln!(
                "{} {mode}: attached in {} ms ({took:?} from the command's start)",
                py.label,
                attached_ms(&err)
            );
        }
    }
}

/// A target whose only thread computes in OpenSSL for seconds (GIL released, never in the
/// interpreter): the attach finds it at a safe point there, and its digests come out right.
#[test]
fn attach_while_the_only_thread_is_busy_in_a_native_library() {
    for py in pythons() {
        let args = ["1", "6000000"];
        let base = std::process::Command::new(&py.path)
            .arg(script("attach_busy_native.py"))
            .args(args)
            .output()
            .unwrap();
        let expected = String::from_utf8_lossy(&base.stdout)
            .lines()
            .find(|l| l.starts_with("done"))
            .map(String::from);
        let Some(expected) = expected else {
            // A build without OpenSSL has no pbkdf2_hmac from 3.12 on.
            common::tier::skip_here(&py.label, "hashlib.pbkdf2_hmac unavailable");
            continue;
        };
        let dir = common::tempdir();
        let target = Target::python(&py.path, "attach_busy_native.py", &args);
        std::thread::sleep(Duration::from_millis(200));
        let (status, err) = attach_once(
            target.pid,
            &[
                "--timeout",
                "1.5",
                "--duration",
                "0.2",
                "-o",
                dir.path().join("c.mprof").to_str().unwrap(),
            ],
        );
        assert!(status.success(), "{}: {err}", py.label);
        assert!(err.contains("running"), "{}: {err}", py.label);
        let (status, out) = target.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        assert!(out.contains(&expected), "{}: {out:?}", py.label);
        eprintln!("{}: {}", py.label, err.lines().next().unwrap_or(""));
    }
}

/// An attach capture says whom it profiled: every view shows the target's PID and command
/// line (text report header, JSON meta).
#[test]
fn attach_captures_name_the_pid_and_command_line() {
    let all = pythons();
    let py = main_python(&all);
    let dir = common::tempdir();
    let target = Target::python(&py.path, "attach_idle.py", &["sleep"]);
    let capture = dir.path().join("who.mprof");
    let (status, err) = attach_once(
        target.pid,
        &["--duration", "0.2", "-q", "-o", capture.to_str().unwrap()],
    );
    assert!(status.success(), "{err}");
    let report = run_with_timeout(mprof().arg("report").arg(&capture), LIMIT);
    let text = String::from_utf8_lossy(&report.stdout);
    let want = format!(
        "attach PID {}: {} {} sleep",
        target.pid,
        py.path.display(),
        script("attach_idle.py").display()
    );
    assert!(text.contains(&want), "{want:?} not in:\n{text}");
    let json = report_json(&capture, &[]);
    assert_eq!(json["meta"]["pid"], target.pid.to_string());
    assert!(json["meta"]["command"]
        .as_str()
        .unwrap()
        .ends_with("attach_idle.py sleep"));
}
