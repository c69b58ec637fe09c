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
        check_shapes(&py, None);
    }
}

/// The same shapes with `--max-depth 20`, where the depths jump across the cut: a stack of
/// more Python frames keeps its innermost 20 under `<truncated stack>`, and the frames kept are
/// worked out from the thread's previous sample like any others (a deep stack used to be
/// walked afresh at every sample: at 300 frames a sample cost about 100 times a 30-deep one).
/// The C-stack shims of 3.12+ count as no frame: the cut must fall where a walk of the
/// Python frames alone puts it.
#[test]
fn a_stack_deeper_than_the_max_depth_keeps_its_innermost_frames_however_it_changed() {
    for py in pythons() {
        check_shapes(&py, Some(20));
    }
}

fn check_shapes(py: &common::Python, max_depth: Option<u32>) {
    {
        let dir = tempdir();
        let capture = dir.path().join("shapes.mprof");
        let max = max_depth.map(|m| m.to_string());
        let mut options = vec!["--rate", "1", "--quiet"];
        let mut env = vec![];
        if let Some(max) = &max {
            options.extend(["--max-depth", max.as_str()]);
            env.push(("SHAPES_MAX_DEPTH", max.as_str()));
        }
        record_script(py, &options, &env, &capture, "stack_shapes.py", dir.path());
        let written: Truth = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("truth.json")).expect("truth.json"),
        )
        .expect("truth.json parses");
        let (unit, truth) = (written.unit, written.stacks);
        // A cut stack is one stack however deep it was.
        let least = if max_depth.is_some() { 30 } else { 50 };
        assert!(
            truth.len() > least,
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
        eprintln!(
            "{}: {} stacks, every one exact (max depth {max_depth:?})",
            py.label,
            truth.len()
        );
    }
}

/// A module's code object is freed once its import is done, and the next module's often takes
/// its address; so does a template compiled again under the same file name. A frame of the new
/// code at the same instruction offset as a frame of the old one, in the same place of the
/// thread's chain, looked unchanged to the chain's compare, and its line came from a cache that
/// told code objects apart by address and name only: on 3.12 one module of twelve imported in a
/// row lost its bytes to the one before in every run at the default rate, and at `--rate 1`
/// eleven of twelve were put on the first one's line. `reused_code.py` allocates about 1 MB on
/// line k + 2 of module (or template) k, at the same bytecode offset in each: every module's
/// bytes must be on its own line, at `--rate 1` exactly and at the default rate within a
/// factor that 30 samples a module never reach by chance.
#[test]
fn a_code_object_at_a_reused_address_is_not_taken_for_the_one_before() {
    for py in pythons() {
        for mode in ["import", "exec"] {
            for rate in ["1", "32KiB"] {
                for seed in ["1", "2"] {
                    if rate == "1" && seed == "2" {
                        continue;
                    }
                    check_reused_code(&py, mode, rate, seed);
                }
            }
        }
        eprintln!("{}: reused code addresses told apart", py.label);
    }
}

fn check_reused_code(py: &common::Python, mode: &str, rate: &str, seed: &str) {
    let dir = tempdir();
    let capture = dir.path().join("c.mprof");
    let truth_file = dir.path().join("truth.json");
    let mut args = vec![mode.to_string()];
    if mode == "import" {
        args.push(dir.path().to_str().unwrap().to_string());
    }
    args.push(truth_file.to_str().unwrap().to_string());
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "--rate", rate, "--seed", seed, "-o"])
            .arg(&capture)
            .arg("--")
            .arg(&py.path)
            .arg(common::script("reused_code.py"))
            .args(&args),
        Duration::from_secs(120),
    );
    let what = format!("{} {mode} rate {rate} seed {seed}", py.label);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let truth: BTreeMap<String, u64> =
        serde_json::from_str(&std::fs::read_to_string(&truth_file).unwrap()).unwrap();
    let report = common::report_json(&capture, &["--by", "line", "--top", "0"]);
    // (name, line) -> allocated bytes; a module is named by its file, a template by the size
    // of its buffers, which its line tells.
    let mut got: BTreeMap<(String, u64), f64> = BTreeMap::new();
    for row in report["locations"].as_array().unwrap() {
        let file = row["file"].as_str().unwrap_or("");
        let line = row["line"].as_u64().unwrap_or(0);
        let name = match mode {
            "import" => match file.rsplit('/').next().and_then(|f| f.strip_suffix(".py")) {
                Some(m) if m.starts_with("mod") => m.to_string(),
                _ => continue,
            },
            _ if file == "<template>" && line >= 2 => (5000 + 8 * (line - 2)).to_string(),
            _ => continue,
        };
        *got.entry((name, line)).or_default() += row["alloc_bytes"].as_f64().unwrap();
    }
    for (name, &line) in &truth {
        let size: u64 = match mode {
            "import" => 5000 + 8 * (line - 2),
            _ => name.parse().unwrap(),
        };
        let want = 200.0 * size as f64;
        let have = got.get(&(name.clone(), line)).copied().unwrap_or(0.0);
        let ok = if rate == "1" {
            have >= want && have < want * 1.05
        } else {
            have > want * 0.5 && have < want * 1.5
        };
        assert!(
            ok,
            "{what}: {name} line {line}: {have} bytes, {want} allocated there; recorded: {got:?}"
        );
        // Nothing of another line of the same module (the one before's line) holds a share.
        for ((n, l), b) in &got {
            assert!(
                n != name || *l == line || *b < want * 0.1,
                "{what}: {name} line {l} holds {b} bytes, allocated on line {line}"
            );
        }
    }
}
