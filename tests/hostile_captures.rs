//! Hostile capture files (issue 7, point 8): a capture rewritten while it is read, captures
//! crafted to amplify memory or output, and control characters from a real target's names.

mod common;

use common::hostile::*;
use common::{mprof, pythons, run_with_timeout, script};

/// A capture of `n` samples at distinct addresses (so the peak is at the end), each on its
/// own line of one function.
fn synthetic_capture(n: u64, name: &str) -> Vec<u8> {
    use mprof_common::record::{encode, Frame, Record};
    let mut bytes = b"MPROFCAP".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let mut push = |r: Record| bytes.extend_from_slice(&encode(&r));
    push(Record::Meta {
        text: "rate=1\n".into(),
    });
    push(Record::Code {
        code: 1,
        firstline: 1,
        filename: "a.py".into(),
        name: name.into(),
    });
    for i in 0..n {
        push(sample(
            i,
            vec![Frame {
                code: 1,
                line: (i % 1000) as u32,
            }],
        ));
    }
    bytes
}

/// Sample `i` of a synthetic capture: 100 bytes at address `i`, at time `i`, on thread 1.
fn sample(i: u64, frames: Vec<mprof_common::record::Frame>) -> mprof_common::record::Record {
    mprof_common::record::Record::Alloc {
        native: None,
        tid: 1,
        flags: 0,
        addr: i,
        size: 100,
        time_ns: i,
        frames,
    }
}

/// A capture rewritten in place (with other records) while reports read it: every report
/// either reads one consistent file or says the capture changed; none panics. (The second
/// pass used to find more allocations than the first and panic.)
#[test]
fn a_capture_rewritten_while_report_reads_it_is_corrupt_not_a_panic() {
    let dir = common::tempdir();
    let path = dir.path().join("c.mprof");
    let (big, small) = (
        synthetic_capture(200_000, "big"),
        synthetic_capture(150_000, "small"),
    );
    std::fs::write(&path, &big).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let bytes = if n.is_multiple_of(2) { &small } else { &big };
                std::fs::write(&path, bytes).unwrap();
                n += 1;
            }
            n
        })
    };
    let mut outcomes = std::collections::BTreeMap::new();
    // At least 30 reports, and until one of them met a rewrite while reading (at most 150):
    // the test must have seen the attack it is about.
    for round in 0..150 {
        if round >= 30 && outcomes.contains_key("changed") {
            break;
        }
        let out = run_with_timeout(mprof().arg("report").arg(&path), LIMIT);
        let ok = clean_exit(&out, "report during rewrites");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let kind = if ok {
            "read".to_owned()
        } else if err.contains("changed while it was being read") {
            "changed".to_owned()
        } else if err.contains("is not a usable mprof capture") && err.lines().count() == 1 {
            // Opened (or read again) while empty or half written: one line saying so.
            "not a usable capture".to_owned()
        } else {
            err.trim().chars().take(200).collect()
        };
        *outcomes.entry(kind).or_insert(0) += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = writer.join().unwrap();
    eprintln!("rewrites: {rewrites}; reports: {outcomes:?}");
    for kind in outcomes.keys() {
        assert!(
            kind == "read" || kind == "changed" || kind == "not a usable capture",
            "unexpected outcome: {kind}"
        );
    }
    assert!(
        outcomes.contains_key("changed"),
        "no report met a rewrite while reading: {outcomes:?}"
    );
}

/// Crafted captures: the 65,535-frame stack over a 60 KB name full of control
/// characters. `report` reads it under an address-space limit of 4x its size plus a fixed
/// amount, prints a bounded report, and no control character reaches the text.
#[test]
fn crafted_captures_stay_within_memory_and_output_bounds() {
    use mprof_common::record::{encode, Frame, Record};
    let dir = common::tempdir();
    let path = dir.path().join("crafted.mprof");
    let mut bytes = synthetic_capture(0, "x");
    let evil = "\x1b]52;c;aGk=\x07\x1b[2J".repeat(3000);
    bytes.extend_from_slice(&encode(&Record::Code {
        code: 7,
        firstline: 1,
        filename: evil.clone(),
        name: evil,
    }));
    let frames: Vec<Frame> = (0..65_535).map(|i| Frame { code: 7, line: i }).collect();
    bytes.extend_from_slice(&encode(&Record::Alloc {
        native: None,
        tid: 1,
        flags: 0,
        addr: 1,
        size: 10,
        time_ns: 0,
        frames,
    }));
    std::fs::write(&path, &bytes).unwrap();
    let limit = 4 * bytes.len() as u64 + (64 << 20) + (96 << 20);
    for args in [
        vec!["--by", "stack", "--top", "0"],
        vec!["--by", "stack", "--top", "0", "--json"],
    ] {
        let mut cmd = mprof();
        cmd.arg("report").arg(&path).args(&args);
        // SAFETY: the closure runs in the forked child before exec; it only fills a stack
        // struct and calls setrlimit, which allocates nothing, takes no lock and is
        // async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                let rl = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                libc::setrlimit(libc::RLIMIT_AS, &rl);
                Ok(())
            });
        }
        let out = run_with_timeout(&mut cmd, LIMIT);
        assert!(clean_exit(&out, "crafted capture"), "{args:?}: {out:?}");
        assert!(
            out.stdout.len() < 2 << 20,
            "{args:?}: {} bytes",
            out.stdout.len()
        );
        if !args.contains(&"--json") {
            assert!(!out.stdout.contains(&0x1b) && !out.stdout.contains(&0x07));
        }
        eprintln!(
            "crafted capture of {} bytes, report {args:?}: {} bytes of output",
            bytes.len(),
            out.stdout.len()
        );
    }
}

/// A capture far denser than real ones of its size (each sample a 64-frame stack of its own, as
/// a program with millions of distinct stacks makes) needs more memory than the reader allows:
/// it is refused with a one-line error that says how to read it anyway, and read when
/// `MPROF_READ_MEMORY_MIB` allows more.
#[test]
fn a_capture_denser_than_the_allowance_is_read_when_more_memory_is_allowed() {
    use mprof_common::record::{encode, Frame};
    let dir = common::tempdir();
    let path = dir.path().join("dense.mprof");
    let mut bytes = synthetic_capture(0, "f");
    for i in 0..40_000u64 {
        let frames: Vec<Frame> = (0..64)
            .map(|d| Frame {
                code: 1,
                line: (i * 64 + d) as u32,
            })
            .collect();
        bytes.extend_from_slice(&encode(&sample(i, frames)));
    }
    std::fs::write(&path, &bytes).unwrap();
    let report = |allow: Option<&str>| {
        let mut cmd = mprof();
        cmd.arg("report").arg(&path).args(["--top", "3"]);
        cmd.env_remove("MPROF_READ_MEMORY_MIB");
        if let Some(mib) = allow {
            cmd.env("MPROF_READ_MEMORY_MIB", mib);
        }
        run_with_timeout(&mut cmd, LIMIT)
    };
    let refused = report(None);
    let err = String::from_utf8_lossy(&refused.stderr);
    // A clean refusal: exit status 2 and one error line.
    assert!(!clean_exit(&refused, "dense capture"), "read: {refused:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("MiB of memory") && err.contains("MPROF_READ_MEMORY_MIB=<MiB>"),
        "{err}"
    );
    let read = report(Some("4000"));
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert!(String::from_utf8_lossy(&read.stdout).contains("40000 samples"));
}

/// A real target whose code objects and file names hold terminal control sequences, on every
/// interpreter: text reports show them escaped, JSON keeps them exactly (written as JSON
/// escapes, so its bytes carry none either).
#[test]
fn control_characters_from_a_real_target_never_reach_the_terminal() {
    const EVIL_NAME: &str = "boom\x1b]0;pwned\x07\x1b[31m\u{202e}";
    for py in pythons() {
        let dir = common::tempdir();
        let capture = dir.path().join("c.mprof");
        let out = run_with_timeout(
            mprof()
                .args(["record", "--rate", "4KiB", "--max-depth", "256", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(script("hostile_names.py")),
            LIMIT,
        );
        assert!(clean_exit(&out, &py.label));
        for text in [
            out.stderr.clone(),
            run_with_timeout(
                mprof()
                    .arg("report")
                    .arg(&capture)
                    .args(["--by", "stack", "--top", "0"]),
                LIMIT,
            )
            .stdout,
        ] {
            let text = String::from_utf8_lossy(&text).into_owned();
            assert!(
                text.contains("boom\\u{1b}]0;pwned\\u{7}"),
                "{}: {text}",
                py.label
            );
            assert!(!text.contains(['\x1b', '\x07', '\u{202e}']), "{}", py.label);
        }
        let json = common::report_json(&capture, &["--by", "function", "--top", "0"]);
        assert!(
            common::by_function(&json).contains_key(EVIL_NAME),
            "{}: {json}",
            py.label
        );
        let raw = run_with_timeout(
            mprof()
                .arg("report")
                .arg(&capture)
                .args(["--json", "--by", "function", "--top", "0"]),
            LIMIT,
        )
        .stdout;
        let raw = String::from_utf8_lossy(&raw);
        assert!(!raw.contains(['\x1b', '\x07', '\u{202e}']), "{}", py.label);
    }
}
