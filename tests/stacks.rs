//! The stack of every sample is the stack that allocated, however it changed since the
//! thread's previous sample: the agent re-reads only the frames that changed (see
//! `injector/agent/src/sample_stack.rs`), and this is what says it notices every change.

mod common;

use common::{mprof, pythons, record_script, run_with_timeout, tempdir};
use std::collections::BTreeMap;
use std::time::Duration;

/// What `stack_shapes.py` writes.
#[derive(serde::Deserialize)]
struct Truth {
    unit: u64,
    stacks: BTreeMap<String, u64>,
}

/// `tests/py/stack_shapes.py` allocates from stacks whose changed part takes every shape
/// (recursion whose depth jumps about, stacks that differ only in their outermost frame, a
/// generator resumed from two callers, one caller on two lines, two threads switching all the
/// time) and writes the stack of every allocation as it saw it. At `--rate 1` the folded
/// stacks that end at its allocation must be exactly those, each with its bytes: the
/// allocations are whole units, and what the interpreter itself allocates at that line (once
/// per code object, under half a unit) is all a stack may have beyond them.
#[test]
fn every_sample_has_the_stack_that_allocated_however_the_stack_changed() {
    for py in pythons() {
        let dir = tempdir();
        let capture = dir.path().join("shapes.mprof");
        record_script(
            &py,
            &["--rate", "1", "--quiet"],
            &[],
            &capture,
            "stack_shapes.py",
            dir.path(),
        );
        let written: Truth = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("truth.json")).expect("truth.json"),
        )
        .expect("truth.json parses");
        let (unit, truth) = (written.unit, written.stacks);
        assert!(
            truth.len() > 50,
            "{}: only {} stacks",
            py.label,
            truth.len()
        );
        // The allocating frame, `leaf (path:line)`: every stack of the truth ends there.
        let leaf = truth
            .keys()
            .next()
            .unwrap()
            .rsplit(';')
            .next()
            .unwrap()
            .to_string();

        let folded = dir.path().join("shapes.folded");
        let out = run_with_timeout(
            mprof()
                .args(["export", "-f", "folded", "-o"])
                .arg(&folded)
                .arg(&capture),
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}: export failed", py.label);
        let mut got: BTreeMap<String, u64> = BTreeMap::new();
        for line in std::fs::read_to_string(&folded).unwrap().lines() {
            let (stack, bytes) = line.rsplit_once(' ').expect("folded line");
            let frames: Vec<&str> = stack.split(';').collect();
            if frames.last() != Some(&leaf.as_str()) {
                continue;
            }
            // From the scenario's own frame in (the truth starts there); the whole stack when
            // the sample lost it.
            let root = frames
                .iter()
                .rposition(|f| f.starts_with("scenarios (") || f.starts_with("worker ("))
                .unwrap_or(0);
            *got.entry(frames[root..].join(";")).or_default() += bytes.parse::<u64>().unwrap();
        }

        let mut wrong = Vec::new();
        let close = |have: u64, want: u64| have >= want && have - want < unit / 2;
        for (stack, want) in &truth {
            match got.get(stack) {
                Some(&have) if close(have, *want) => {}
                have => wrong.push(format!("  {want} bytes, recorded {have:?}: {stack}")),
            }
        }
        for (stack, &have) in &got {
            if !truth.contains_key(stack) && !close(have, 0) {
                wrong.push(format!(
                    "  never allocated from, recorded {have} bytes: {stack}"
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{}: {} of {} stacks wrong:\n{}",
            py.label,
            wrong.len(),
            truth.len(),
            wrong[..wrong.len().min(20)].join("\n")
        );
        eprintln!("{}: {} stacks, every one exact", py.label, truth.len());
    }
}
