//! Mixed C + Python stacks (`--native`) on every interpreter: the test builds
//! `tests/c/native_chain.c` with the system compiler (`-g -O1`), a real interpreter runs
//! `tests/py/native_chain_workload.py` under `record --native` or `attach --native`, and
//! `report --by stack` must show the C functions (from DWARF, with file:line) in the right
//! places between the Python frames, the bytecode loop's frames replaced by the Python frames
//! and hidden, and shown with `--show-interpreter-frames`. The symbolization's fallbacks and
//! the other views are in `tests/native_symbols.rs`.

mod common;

use common::mixed::*;
use common::native::{build_chain, build_stack_switch, chain_line};
use common::procs::{touch, wait_line, Attach, Target, LIMIT};
use common::pythons;
use std::path::Path;

const CALLBACK: [&str; 5] = [
    "inner",
    "callback_level1",
    "callback_entry",
    "outer",
    "<module>",
];
const SORTED: [&str; 3] = ["key", "sort_with_key", "<module>"];
const REDUCE: [&str; 3] = ["reduce_step", "reduce_it", "<module>"];

/// The four chains of the workload, each exactly, with the C frames' DWARF lines; no frame of
/// the bytecode loop anywhere.
fn check_default_view(label: &str, all: &[Vec<Frame>], so: &Path) {
    let chain = expect(label, all, &CHAIN);
    for (f, marker) in chain.iter().zip(["level2", "level1", "entry"]) {
        assert_c_frame(label, f, marker, so);
    }
    chain[3..]
        .iter()
        .for_each(|f| assert_python_frame(label, f));
    let callback = expect(label, all, &CALLBACK);
    assert_python_frame(label, &callback[0]);
    assert_c_frame(label, &callback[1], "callback_level1", so);
    assert_c_frame(label, &callback[2], "callback_entry", so);
    callback[3..]
        .iter()
        .for_each(|f| assert_python_frame(label, f));
    for want in [&SORTED[..], &REDUCE[..]] {
        let s = expect(label, all, want);
        s.iter().for_each(|f| assert_python_frame(label, f));
    }
    for s in all {
        assert!(
            !s.iter()
                .any(|f| f.function.starts_with("_PyEval_EvalFrameDefault")),
            "{label}: an interpreter frame shown by default: {:?}",
            names(s)
        );
    }
}

/// With `--show-interpreter-frames`: the bytecode loop comes after the Python frames it ran,
/// and C code of the interpreter (`sorted`, `functools.reduce`) sits between the callback and
/// its caller.
fn check_interpreter_view(label: &str, all: &[Vec<Frame>]) {
    let at = |s: &[Frame], name: &str| s.iter().position(|f| f.function == name);
    // The interpreter's call machinery, the allocator's and mprof's own frames are shown
    // too: the chain's frames are in order among them, the bytecode loop after its frame.
    let chain = all
        .iter()
        .find(|s| {
            let n = names(s);
            n.len() > CHAIN.len() && in_order(&n, &CHAIN[..4]).is_some()
        })
        .unwrap_or_else(|| panic!("{label}: no chain stack with interpreter frames"));
    let n = names(chain);
    let last = *in_order(&n, &CHAIN[..4]).unwrap().last().unwrap();
    assert!(
        n[last + 1..]
            .iter()
            .any(|f| f.starts_with("_PyEval_EvalFrameDefault")),
        "{label}: {n:?}"
    );
    for (inner, outer) in [("key", "sort_with_key"), ("reduce_step", "reduce_it")] {
        let s = all
            .iter()
            .find(|s| at(s, inner).is_some_and(|i| at(s, outer).is_some_and(|o| i < o)))
            .unwrap_or_else(|| panic!("{label}: no stack {inner} ← … ← {outer}"));
        let between = &s[at(s, inner).unwrap() + 1..at(s, outer).unwrap()];
        assert!(
            between.iter().any(|f| f.kind == "native")
                && between
                    .iter()
                    .any(|f| f.function.starts_with("_PyEval_EvalFrameDefault")),
            "{label}: nothing native between {inner} and {outer}: {:?}",
            names(s)
        );
    }
}

/// `record --native` on every interpreter: the C chain, a Python callback under C frames, and
/// Python called back by the interpreter's own C code, each in the right order.
#[test]
fn record_native_interleaves_c_and_python_frames() {
    for py in pythons() {
        let dir = common::tempdir();
        let Some(so) = build_chain(&py, dir.path(), &["-g", "-O1"]) else {
            continue;
        };
        let capture = dir.path().join("r.mprof");
        record(&py, dir.path(), &capture);
        let (all, warnings) = report_stacks(&capture, &[]);
        check_default_view(&py.label, &all, &so);
        assert!(
            !warnings.iter().any(|w| w.contains("native_chain")),
            "{}: {warnings:?}",
            py.label
        );
        let (all, _) = report_stacks(&capture, &["--show-interpreter-frames", "--top", "40"]);
        check_interpreter_view(&py.label, &all);
        let text = text_report(&capture, &[]);
        let level2 = format!("chain_level2 ({}:{}", so_source_dir(), chain_line("level2"));
        assert!(text.contains(&level2), "{}: {text}", py.label);
        assert!(text.contains("<- chain_level1 ("), "{}: {text}", py.label);
        eprintln!("{}: record --native: mixed stacks in order", py.label);
    }
}

/// `attach --native` on every interpreter: the same mixed stacks as `record`.
#[test]
fn attach_native_interleaves_c_and_python_frames() {
    for py in pythons() {
        let dir = common::tempdir();
        let Some(so) = build_chain(&py, dir.path(), &["-g", "-O1"]) else {
            continue;
        };
        let d = dir.path().to_str().unwrap();
        let target = Target::python(&py.path, "native_chain_workload.py", &[d, "wait"]);
        let capture = dir.path().join("a.mprof");
        let mut attach = Attach::start(
            target.pid,
            &["--native", "--rate", "1", "-o", capture.to_str().unwrap()],
        );
        attach.attached();
        touch(dir.path(), "go");
        wait_line(&target.out, "allocated", LIMIT, &mut Vec::new()).expect("workload ran");
        attach.detach();
        touch(dir.path(), "finish");
        let (status, _) = target.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        let (all, _) = report_stacks(&capture, &[]);
        let label = format!("{} (attach)", py.label);
        check_default_view(&label, &all, &so);
        let (all, _) = report_stacks(&capture, &["--show-interpreter-frames", "--top", "40"]);
        check_interpreter_view(&label, &all);
        eprintln!("{label}: attach --native: mixed stacks in order");
    }
}

/// With `--native` and without it the default rate is 128 KiB; a `--rate` is taken as given.
#[test]
fn native_samples_at_the_default_rate_unless_told() {
    let py = pythons().into_iter().next().expect("an interpreter");
    let dir = common::tempdir();
    for (args, want) in [
        (&["--native"][..], 128 << 10),
        (&["--native", "--rate", "32KiB"][..], 32 << 10),
        (&[][..], 128 << 10),
    ] {
        let capture = dir.path().join("r.mprof");
        let out = common::run_with_timeout(
            common::mprof()
                .args(["record", "-q", "-o"])
                .arg(&capture)
                .args(args)
                .arg("--")
                .arg(&py.path)
                .args(["-c", "x = [bytes(1000) for _ in range(1000)]"]),
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = common::run_with_timeout(
            common::mprof().arg("report").arg("--json").arg(&capture),
            LIMIT,
        );
        let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
        assert_eq!(json["rate"], want, "{args:?}");
    }
}

/// A C extension that switches stacks as greenlet does (under gevent and eventlet) allocates
/// while the words of its caller's frame, return address included, are stale: another
/// greenlet's. `record --native` and `attach --native` leave it running and ending as it does
/// without mprof, and the samples still show the extension's two frames under the Python
/// function that called it. Before, libgcc's unwinder followed the stale return address and
/// the program died of SIGSEGV (every run, as every gevent program under `--native` did).
#[test]
fn a_stack_switching_extension_survives_native_stacks() {
    if common::tier::full_tier_only(
        "a_stack_switching_extension_survives_native_stacks",
        "a greenlet-like extension built and run at length",
    ) {
        return;
    }
    for py in pythons() {
        let dir = common::tempdir();
        if build_stack_switch(&py, dir.path()).is_none() {
            continue;
        }
        let d = dir.path().to_str().unwrap();
        let capture = dir.path().join("r.mprof");
        let out = common::record_script(
            &py,
            &["-q", "--native", "--rate", "1"],
            &[],
            &capture,
            "stack_switch_workload.py",
            dir.path(),
        );
        let label = format!("{} (record)", py.label);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("done"),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check_switched(&label, &capture);

        let target = Target::python(&py.path, "stack_switch_workload.py", &[d, "wait"]);
        let capture = dir.path().join("a.mprof");
        let mut attach = Attach::start(
            target.pid,
            &[
                "--native",
                "--rate",
                "1",
                "--duration",
                "1",
                "-o",
                capture.to_str().unwrap(),
            ],
        );
        attach.attached();
        let (status, err) = attach.finish();
        let label = format!("{} (attach)", py.label);
        assert!(status.success(), "{label}: mprof {status}: {err}");
        touch(dir.path(), "finish");
        let (status, lines) = target.finish(LIMIT);
        assert!(
            status.success() && lines.iter().any(|l| l == "done"),
            "{label}: the target ended with {status}, printing {lines:?}"
        );
        check_switched(&label, &capture);
        eprintln!(
            "{}: a stack-switching extension survives --native",
            py.label
        );
    }
}

/// Every sample of the stack-switching extension shows its two C frames and, after them, the
/// Python function that called it.
fn check_switched(label: &str, capture: &Path) {
    let (all, _) = report_stacks(capture, &[]);
    let want = [
        "allocate_over_stale_stack",
        "switching",
        "switch_and_allocate",
    ];
    let switched: Vec<Vec<&str>> = all
        .iter()
        .map(|s| names(s))
        .filter(|n| n.first() == Some(&want[0]))
        .collect();
    assert!(!switched.is_empty(), "{label}: no sample of {}", want[0]);
    for s in &switched {
        assert!(in_order(s, &want).is_some(), "{label}: {s:?}");
    }
}
