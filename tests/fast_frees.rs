//! Frees left to pymalloc: at the default rate the agent does not hook the MEM and OBJ
//! domains' `free` (the most frequent call of a Python program) when they are pymalloc; the
//! blocks it samples there are made ones pymalloc hands to the RAW domain, whose free it does
//! hook (see `injector/agent/src/chain.rs`). These tests show that no free of a sampled block
//! is missed that way, under every allocator setting, through `record` and `attach`, and that
//! pymalloc's own block count is what it is without mprof.

mod common;

use common::procs::{touch, wait_file, Attach, Target, LIMIT};
use common::{by_function, mprof, pythons, report_json, run_with_timeout, script, Python};
use mprof::analysis::estimate::Sample;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Blocks of pymalloc's count may differ by this much between two runs of the script (the
/// count includes the interpreter's own caches).
const BLOCKS_SLACK: i64 = 20;

/// An allocator setting: its name, the environment it needs, the interpreter's options.
type Setting = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

/// What the script printed as "blocks N".
fn blocks(stdout: &str) -> i64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("blocks ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no blocks line in {stdout:?}"))
}

/// The blocks pymalloc allocates for its own bookkeeping from the RAW domain while it serves a
/// small object, and never frees: a node of the radix tree that says which memory is its
/// (64-bit builds; bottom and middle levels: 2 and 8 KiB in 3.10, 128 and 256 KiB from 3.11, as
/// gdb prints `sizeof(arena_map_bot_t)` and `sizeof(arena_map_mid_t)`), made when a new arena
/// lands in a region of the address space no arena had used; and its table of arenas (48 bytes
/// each, 16 at first, doubled as it grows). Churn's own blocks never have these sizes: its
/// objects are at most 512 bytes and its lists' item arrays grow through other sizes.
///
/// Returns the size of the block whose one sample a live estimate of `bytes` at `rate` is (a
/// report rounds it to a whole byte), if it is one of these.
fn pymalloc_bookkeeping(bytes: f64, rate: u64) -> Option<u64> {
    one_sample_of(
        [2048, 8192, 131072, 262144]
            .into_iter()
            .chain((4..24).map(|k| 48u64 << k)),
        bytes,
        rate,
    )
}

/// The size among `sizes` whose one sample a live estimate of `bytes` at `rate` is (a report
/// rounds it to a whole byte), if there is one.
fn one_sample_of(sizes: impl IntoIterator<Item = u64>, bytes: f64, rate: u64) -> Option<u64> {
    sizes
        .into_iter()
        .find(|&size| (Sample::new(size, rate).bytes() - bytes).abs() < 1.0)
}

/// The blocks tracemalloc (started with one frame) allocates from the RAW domain when a churn
/// allocation has a traceback it had not seen, and keeps until it stops: the traceback itself
/// (a hash, its frame counts and one packed 12-byte frame: 24 bytes in every version) and the
/// entry of the table that interns it (24 bytes in 3.8, 32 from 3.9). They are made with churn's
/// stack, live at the end, and rightly shown so: seen once, on 3.12, in a CI run (one 24-byte
/// sample). Churn makes blocks of these sizes too (a bytearray's buffer, a list's first item
/// array), so this also passes one missed free of such a block; a free the agent misses for a
/// reason, not by a rare race, leaves many of churn's 25,000 samples live, not one.
///
/// Returns the size of the block whose one sample a live estimate of `bytes` at `rate` is, if
/// it is one of these.
fn tracemalloc_interned(bytes: f64, rate: u64) -> Option<u64> {
    one_sample_of([24, 32], bytes, rate)
}

/// Checks a capture of the script: no sampled block of `churn` is live at the end (many were
/// sampled, all were freed) and `keep`'s live estimate is within 5 standard errors of the truth
/// (or above it, with `more`: tracemalloc's own traces of the kept blocks are made there too).
///
/// One exception, when it was sampled: a block of pymalloc's own bookkeeping that churn's
/// objects made it allocate (`pymalloc_bookkeeping`). It is live, and churn's: mprof is right to
/// show it. Seen on 3.10 in about one run in 200 (a new arena in a fresh 256 MiB region, then a
/// 6% chance of sampling the 2 KiB node) and on 3.11 (a 128 KiB node, which covers 16 GiB).
fn check_capture(label: &str, capture: &Path, dir: &Path, more: bool) {
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("truth.json")).unwrap()).unwrap();
    let want = truth["keep"].as_f64().unwrap();
    let report = report_json(
        capture,
        &["--view", "live", "--by", "function", "--top", "0"],
    );
    let sites = by_function(&report);
    let mut churn_live = sites
        .get("churn")
        .map_or(0.0, |s| s["live_bytes"].as_f64().unwrap());
    let churn_live_samples = sites
        .get("churn")
        .map_or(0, |s| s["live_samples"].as_u64().unwrap());
    let rate = report["rate"].as_u64().unwrap();
    if churn_live_samples == 1 {
        if let Some(size) = pymalloc_bookkeeping(churn_live, rate) {
            eprintln!("{label}: churn's one live block is pymalloc's bookkeeping ({size} bytes)");
            churn_live = 0.0;
        } else if let Some(size) = more
            .then(|| tracemalloc_interned(churn_live, rate))
            .flatten()
        {
            eprintln!("{label}: churn's one live block is tracemalloc's own ({size} bytes)");
            churn_live = 0.0;
        }
    }
    if churn_live != 0.0 {
        // Kept for a post-mortem: the temporary directory goes when the test fails.
        let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "fast_frees-{}.mprof",
            label.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let _ = std::fs::copy(capture, &kept);
        panic!(
            "{label}: a freed block of churn() is still live: {} (capture {}, {} samples, {} \
             dropped, warnings {}; kept at {}; every live row: {})",
            sites["churn"],
            report["completeness"],
            report["samples"],
            report["dropped"],
            report["warnings"],
            kept.display(),
            report["locations"]
        );
    }
    // A live report's rows carry their allocated figures too.
    let churned = sites
        .get("churn")
        .map_or(0, |s| s["alloc_samples"].as_u64().unwrap());
    assert!(churned > 500, "{label}: only {churned} samples of churn()");
    let keep = &sites
        .get("keep")
        .unwrap_or_else(|| panic!("{label}: no keep row"));
    let (got, se) = (
        keep["live_bytes"].as_f64().unwrap(),
        keep["live_stderr"].as_f64().unwrap(),
    );
    let off = if more { want - got } else { (got - want).abs() };
    assert!(
        off <= 5.0 * se.max(want * 0.005),
        "{label}: keep live {got} ± {se} vs {want}"
    );
    eprintln!("{label}: {churned} churn samples all freed, keep {got:.0} ± {se:.0} vs {want}");
}

fn plain_blocks(py: &Python, dir: &Path) -> i64 {
    let out = run_with_timeout(
        Command::new(&py.path).arg(script("fast_frees.py")).arg(dir),
        LIMIT,
    );
    assert!(out.status.success(), "{}: {out:?}", py.label);
    blocks(&String::from_utf8_lossy(&out.stdout))
}

/// `record` at the default rate under every allocator setting: pymalloc (frees left to it),
/// tracemalloc on top of mprof's hooks, and the settings where the agent hooks every free
/// (malloc, the debug hooks).
#[test]
fn record_sees_every_free_at_the_default_rate_under_every_allocator() {
    if common::tier::full_tier_only(
        "record_sees_every_free_at_the_default_rate_under_every_allocator",
        "every allocator setting, by design",
    ) {
        return;
    }
    let settings: [Setting; 5] = [
        ("pymalloc", &[], &[]),
        (
            "tracemalloc on top",
            &[("FAST_FREES_TRACEMALLOC", "1")],
            &[],
        ),
        ("PYTHONMALLOC=malloc", &[("PYTHONMALLOC", "malloc")], &[]),
        (
            "PYTHONMALLOC=pymalloc_debug",
            &[("PYTHONMALLOC", "pymalloc_debug")],
            &[],
        ),
        ("-X dev", &[], &["-X", "dev"]),
    ];
    for py in pythons() {
        let plain = plain_blocks(&py, common::tempdir().path());
        for (name, env, py_args) in settings {
            let label = format!("{} {name}", py.label);
            let dir = common::tempdir();
            let capture = dir.path().join("c.mprof");
            let out = run_with_timeout(
                mprof()
                    .env_remove("PYTHONMALLOC")
                    .envs(env.iter().copied())
                    .args(["record", "-q", "-o"])
                    .arg(&capture)
                    .arg("--")
                    .arg(&py.path)
                    .args(py_args)
                    .arg(script("fast_frees.py"))
                    .arg(dir.path()),
                LIMIT,
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{label}: {} {err}", out.status);
            assert!(
                !err.contains("Debug memory block") && !err.contains("Fatal"),
                "{err}"
            );
            check_capture(
                &label,
                &capture,
                dir.path(),
                !env.is_empty() && name.contains("trace"),
            );
            if name == "pymalloc" {
                let profiled = blocks(&String::from_utf8_lossy(&out.stdout));
                assert!(
                    (profiled - plain).abs() <= BLOCKS_SLACK,
                    "{label}: pymalloc counts {profiled} blocks left by churn(), {plain} without mprof"
                );
            }
        }
    }
}

/// `attach` at the default rate to a running program: every free of a sampled small block is
/// seen, pymalloc's block count is unchanged, and the program finishes normally.
#[test]
fn attach_sees_every_free_at_the_default_rate() {
    for py in pythons() {
        attach_and_churn(&py, None);
    }
}

/// A session at `--rate 1` hooks frees that skip the filter (every address passes it then);
/// the next session, at the default rate, takes the same layer of hooks with the filter's
/// frees (or pymalloc's) again: every free of a block it sampled is still seen, and pymalloc's
/// block count is what it is without mprof.
#[test]
fn a_default_rate_attach_after_one_at_rate_1_sees_every_free() {
    if common::tier::full_tier_only(
        "a_default_rate_attach_after_one_at_rate_1_sees_every_free",
        "two sessions, one at --rate 1",
    ) {
        return;
    }
    for py in pythons() {
        attach_and_churn(&py, Some("1"));
    }
}

/// Attaches at the default rate to `fast_frees.py`, lets it churn, detaches, and checks that
/// every free of a block sampled was seen and that pymalloc's block count is what it is
/// without mprof. With `first_rate`, a session at that rate is attached and detached before,
/// while the program waits.
fn attach_and_churn(py: &Python, first_rate: Option<&str>) {
    let plain = plain_blocks(py, common::tempdir().path());
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    let d = dir.path().to_str().unwrap();
    let target = Target::python(&py.path, "fast_frees.py", &[d, "attach"]);
    if let Some(rate) = first_rate {
        let first = dir.path().join("first.mprof");
        let args = ["--rate", rate, "-o", first.to_str().unwrap()];
        let mut attach = Attach::start(target.pid, &args);
        attach.attached();
        std::thread::sleep(std::time::Duration::from_millis(300));
        attach.detach();
        let report = report_json(&first, &[]);
        assert_eq!(
            report["rate"].as_u64(),
            rate.parse().ok(),
            "{}: the first session's rate",
            py.label
        );
    }
    let mut attach = Attach::start(target.pid, &["-o", capture.to_str().unwrap()]);
    attach.attached();
    touch(dir.path(), "go");
    wait_file(&dir.path().join("done"), LIMIT);
    attach.detach();
    touch(dir.path(), "finish");
    let (status, out) = target.finish(LIMIT);
    assert!(status.success(), "{}: {status} {out:?}", py.label);
    check_capture(&py.label, &capture, dir.path(), false);
    let profiled = blocks(&out.join("\n"));
    assert!(
        (profiled - plain).abs() <= BLOCKS_SLACK,
        "{}: pymalloc counts {profiled} blocks left by churn(), {plain} without mprof",
        py.label
    );
}

/// The live estimates of the blocks found in CI and here (one sample of pymalloc's radix node:
/// 33,803 bytes for 3.10's 2 KiB one, 133,517 for 3.11's 128 KiB one, at the default rate) are
/// told apart from churn's own blocks.
#[test]
fn pymalloc_bookkeeping_is_told_by_its_size() {
    let rate = 32768;
    let estimate = |size: u64| Sample::new(size, rate).bytes().round();
    assert_eq!(pymalloc_bookkeeping(33803.0, rate), Some(2048));
    assert_eq!(pymalloc_bookkeeping(133517.0, rate), Some(131072));
    for size in [2048, 8192, 131072, 262144, 768, 1536, 3072, 6144] {
        assert_eq!(pymalloc_bookkeeping(estimate(size), rate), Some(size));
    }
    // Churn's objects and its lists' item arrays (3.9+ and 3.8 growth), those near the
    // bookkeeping sizes among them.
    for size in [
        64, 332, 512, 1024, 1856, 2144, 2152, 6080, 6168, 121376, 136576, 246432, 277280,
    ] {
        assert_eq!(pymalloc_bookkeeping(estimate(size), rate), None, "{size}");
    }
}
