//! A stranger at the rendezvous socket of `record --follow-children`. Anyone may connect to an
//! abstract Unix socket, and its name is listed in /proc/net/unix: another user's process can
//! open connections and say nothing on them, or hand over rings as a child would. mprof must
//! neither wait on them (its loop stalled, the agent's heartbeat went stale and the agent
//! switched itself off: most of the program went unprofiled, and nothing said so) nor print
//! a line for each.

mod common;

use common::hostile::{main_python, LIMIT};
use common::procs::as_nobody;
use common::{by_function, mprof, pythons, report_json, run_with_timeout, script};
use std::process::{Command, Stdio};

#[test]
fn a_stranger_at_the_rendezvous_neither_stalls_nor_floods_mprof() {
    if common::tier::full_tier_only(
        "a_stranger_at_the_rendezvous_neither_stalls_nor_floods_mprof",
        "fifty connections and twelve rings at --rate 1",
    ) {
        return;
    }
    if !common::tier::root("stranger at the rendezvous", "the stranger runs as nobody") {
        return;
    }
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let stranger = dir.path().join("rendezvous_stranger.py");
    std::fs::copy(script("rendezvous_stranger.py"), &stranger).unwrap();
    let capture = dir.path().join("c.mprof");
    let (made, said) = (dir.path().join("made"), dir.path().join("stranger.out"));
    let mut attacker = as_nobody(
        Command::new("/usr/bin/python3")
            .arg(&stranger)
            .arg(&capture)
            .arg("2.5")
            .arg(&said),
    );
    let mut attacker = common::ChildGuard(attacker.stdout(Stdio::null()).spawn().unwrap());
    let out = run_with_timeout(
        mprof()
            .args(["record", "--follow-children", "--rate", "1", "-o"])
            .arg(&capture)
            .arg("--")
            .arg(&py.path)
            .arg(script("steady_alloc.py"))
            .arg("4")
            .arg(&made),
        LIMIT,
    );
    let status = attacker.0.wait().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "the stranger failed: {status}");
    assert!(out.status.success(), "{}: {err}", py.label);
    let said = std::fs::read_to_string(&said).unwrap();
    let counts: Vec<u32> = said
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        counts[0] >= 20 && counts[1] >= 5,
        "the stranger said: {said}"
    );

    // Its rings are refused, three said one by one and the rest counted.
    let refused = err
        .lines()
        .filter(|l| l.contains("ring was refused"))
        .count();
    assert_eq!(refused, 3, "{err}");
    assert_eq!(err.matches("more rings were refused").count(), 1, "{err}");
    assert!(
        err.contains(&format!("; {} ring(s) handed over were refused", counts[1])),
        "{err}"
    );

    // The session was never held up: the agent sampled to the end, every allocation in.
    assert!(!err.contains("sampling stopped"), "{err}");
    let report = report_json(&capture, &["--by", "function", "--top", "0"]);
    let summary = format!(
        "completeness {}, dropped {}, warnings {}",
        report["completeness"], report["dropped"], report["warnings"]
    );
    assert_eq!(report["completeness"], "ended", "{summary}");
    assert_eq!(report["dropped"], 0, "{summary}");
    assert_eq!(report["warnings"].as_array().unwrap().len(), 0, "{summary}");
    let made: u64 = std::fs::read_to_string(&made)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let steady = &by_function(&report)["steady"];
    // Each bytearray is an object and its buffer: at least two allocations.
    let count = steady["alloc_count"].as_u64().unwrap();
    assert!(
        count >= 2 * made,
        "{}: {count} allocations recorded in steady(), which made {made} bytearrays",
        py.label
    );
    eprintln!(
        "{}: {said} {count} allocations recorded for {made} bytearrays",
        py.label,
        said = said.trim()
    );
}
