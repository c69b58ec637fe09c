//! `record --follow-children`: multiprocessing workers (fork, spawn, forkserver), a pre-fork
//! server and a fork bomb, each child in a capture of its own beside the program's.

mod common;

use common::{by_function, mprof, pythons, report_json, run_with_timeout, script, Python};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Records `pool_workload.py METHOD` with `--follow-children`; returns the truth per worker
/// and the directory of children's captures.
fn record(py: &Python, dir: &Path, method: &str, extra: &[&str]) -> HashMap<u32, f64> {
    let capture = dir.join("c.mprof");
    let truth = dir.join("truth.json");
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "--follow-children", "-o"])
            .arg(&capture)
            .args(extra)
            .arg("--")
            .arg(&py.path)
            .arg(script("pool_workload.py"))
            .arg(method)
            .arg(&truth),
        LIMIT,
    );
    assert!(
        out.status.success(),
        "{} {method}: {}",
        py.label,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: HashMap<String, f64> =
        serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    v.into_iter()
        .map(|(k, v)| (k.parse().unwrap(), v))
        .collect()
}

/// A child's capture: bytes still live in `function` when the child ended (workers keep what
/// they allocate until then), and the standard error.
fn live_in(capture: &Path, function: &str) -> (f64, f64) {
    let report = report_json(
        capture,
        &["--view", "live", "--by", "function", "--top", "0"],
    );
    let site = by_function(&report).get(function).cloned();
    site.map_or((0.0, 0.0), |s| {
        (
            s["live_bytes"].as_f64().unwrap(),
            s["live_stderr"].as_f64().unwrap(),
        )
    })
}

fn child_capture(dir: &Path, pid: u32) -> std::path::PathBuf {
    dir.join("c.mprof.d").join(format!("{pid}.mprof"))
}

/// Every worker of a multiprocessing pool (fork, spawn, forkserver) is profiled: at `--rate 1`
/// each worker's bytes in `keep_in_worker` match what it reported, and so does the sum.
#[test]
fn pool_workers_are_profiled_with_every_start_method() {
    if common::tier::full_tier_only(
        "pool_workers_are_profiled_with_every_start_method",
        "every start method, by design",
    ) {
        return;
    }
    for py in pythons() {
        for method in ["fork", "spawn", "forkserver"] {
            let dir = common::tempdir();
            let truth = record(&py, dir.path(), method, &["--rate", "1"]);
            assert_eq!(
                truth.len(),
                2,
                "{} {method}: two workers: {truth:?}",
                py.label
            );
            let mut total = (0.0, 0.0);
            for (&pid, &want) in &truth {
                let (got, _) = live_in(&child_capture(dir.path(), pid), "keep_in_worker");
                assert!(
                    (got - want).abs() / want < 0.01,
                    "{} {method}: worker {pid} keeps {got}, truth {want}",
                    py.label
                );
                total.0 += got;
                total.1 += want;
            }
            assert!((total.0 - total.1).abs() / total.1 < 0.01);
        }
        eprintln!(
            "{}: fork, spawn and forkserver workers within 1% at --rate 1",
            py.label
        );
    }
}

/// At the default rate, each worker's estimate lies within three standard errors.
#[test]
fn pool_worker_estimates_lie_within_three_standard_errors() {
    // The objects keep_in_worker keeps (sys.getsizeof(bytes(10_000)) on 64-bit CPython) and
    // the rate of this test.
    const OBJECT: f64 = 10_033.0;
    const RATE: f64 = 65_536.0;
    let all = pythons();
    let py = all
        .iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&all[0]);
    for seed in ["1", "2"] {
        let dir = common::tempdir();
        let truth = record(py, dir.path(), "fork", &["--seed", seed, "--rate", "64KiB"]);
        assert!(
            truth.values().all(|&b| b % OBJECT == 0.0),
            "keep_in_worker's objects are not {OBJECT} bytes: {truth:?}"
        );
        for (&pid, &want) in &truth {
            let (got, stderr) = live_in(&child_capture(dir.path(), pid), "keep_in_worker");
            // The estimator's own standard error for this worker: `want / OBJECT` objects of
            // OBJECT bytes, each sampled with p = 1 - exp(-OBJECT/rate) and weighing OBJECT/p,
            // vary by sqrt(want * OBJECT * (1 - p) / p). The report's standard error is that
            // estimated from the sample, too small when a worker drew few samples (which
            // workers get how many tasks changes from run to run), so the larger of the two.
            let p = 1.0 - (-OBJECT / RATE).exp();
            let model = (want * OBJECT * (1.0 - p) / p).sqrt();
            let se = stderr.max(model);
            assert!(
                (got - want).abs() <= 3.0 * se,
                "seed {seed}: worker {pid} estimated {got} ± {stderr} (model {model:.0}), \
                 truth {want}"
            );
        }
    }
}

/// A pre-fork server (os.fork workers sharing a listening socket, under a bounded loopback
/// client: each worker's request handler appears, exact) and a fork bomb of 100 short-lived
/// children: every child is profiled, nothing hangs, no child is left behind (no zombie) and
/// none leaves an mprof descriptor in its parent.
#[test]
fn prefork_workers_and_a_fork_bomb() {
    if common::tier::full_tier_only(
        "prefork_workers_and_a_fork_bomb",
        "a fork bomb of a hundred children",
    ) {
        return;
    }
    let all = pythons();
    for py in [all[0].clone(), all.last().unwrap().clone()] {
        let dir = common::tempdir();
        let truth = record(&py, dir.path(), "prefork", &["--rate", "1"]);
        for (&pid, &want) in &truth {
            let (got, _) = live_in(&child_capture(dir.path(), pid), "handle_request");
            assert!(
                (got - want).abs() / want < 0.01,
                "{}: worker {pid} handled {got} bytes, truth {want}",
                py.label
            );
        }
        let dir = common::tempdir();
        record(&py, dir.path(), "forkbomb", &["--rate", "1"]);
        let leaks: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("truth.json.leaks")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            leaks["fds_after"], leaks["fds_before"],
            "{}: the children left mprof descriptors in their parent",
            py.label
        );
        assert_eq!(
            leaks["zombies"],
            serde_json::json!([]),
            "{}: zombies left",
            py.label
        );
        let captures: Vec<_> = std::fs::read_dir(dir.path().join("c.mprof.d"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(
            captures.len(),
            100,
            "{}: every short-lived child captured",
            py.label
        );
        let mut with_samples = 0;
        for c in &captures {
            let report = report_json(&c.path(), &["--by", "function", "--top", "0"]);
            let got = by_function(&report)
                .get("short_lived")
                .and_then(|s| s["alloc_bytes"].as_f64())
                .unwrap_or(0.0);
            if got > 0.0 {
                with_samples += 1;
            }
        }
        assert_eq!(
            with_samples, 100,
            "{}: every child's allocations seen",
            py.label
        );
        eprintln!(
            "{}: pre-fork workers exact, 100 forked children captured",
            py.label
        );
    }
}

/// Without `--follow-children`, the summary says that Python children ran unprofiled, names
/// some, and names the flag (forked workers and spawned ones alike).
#[test]
fn unfollowed_children_are_named_in_the_summary() {
    let all = pythons();
    let py = all
        .iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&all[0]);
    for method in ["fork", "spawn"] {
        let dir = common::tempdir();
        let capture = dir.path().join("c.mprof");
        let out = run_with_timeout(
            mprof()
                .args(["record", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(script("pool_workload.py"))
                .arg(method)
                .arg(dir.path().join("truth.json")),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{method}: {err}");
        assert!(
            err.contains("not profiled") && err.contains("--follow-children"),
            "{method}: no hint: {err}"
        );
        assert!(!dir.path().join("c.mprof.d").exists());
    }
}

/// `attach --follow-children` to a pre-fork master: its workers are attached too, their
/// request handler appears in their captures, and after the detach every worker finishes its
/// work unharmed and reports it, with no ring left mapped.
#[test]
fn attach_follows_the_workers_of_a_prefork_master() {
    use common::procs::{attach_once, Target};
    for py in pythons() {
        let dir = common::tempdir();
        let stop = dir.path().join("stop");
        let master = Target::python(&py.path, "prefork_server.py", &[stop.to_str().unwrap()]);
        std::thread::sleep(Duration::from_millis(300));
        let capture = dir.path().join("a.mprof");
        let (status, err) = attach_once(
            master.pid,
            &[
                "--follow-children",
                "--duration",
                "1",
                "-o",
                capture.to_str().unwrap(),
            ],
        );
        assert!(status.success(), "{}: {err}", py.label);
        let workers: Vec<_> = std::fs::read_dir(dir.path().join("a.mprof.d"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(workers.len(), 2, "{}: {err}", py.label);
        for w in &workers {
            let (got, _) = {
                let report = report_json(w, &["--by", "function", "--top", "0"]);
                let site = by_function(&report).get("handle_request").cloned();
                (
                    site.map_or(0.0, |s| s["alloc_bytes"].as_f64().unwrap()),
                    0.0,
                )
            };
            assert!(
                got > 0.0,
                "{}: no handle_request in {}",
                py.label,
                w.display()
            );
            let pid: u32 = w.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            assert!(
                !maps.contains("mprof-ring"),
                "{}: a ring is left in {pid}",
                py.label
            );
        }
        std::fs::write(&stop, b"").unwrap();
        let (status, out) = master.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        // Both workers print at once on one pipe: count their reports, however interleaved.
        let done = out.join(" ").matches("worker").count();
        assert_eq!(done, 2, "{}: {out:?}", py.label);
        eprintln!("{}: workers attached and unharmed: {done:?}", py.label);
    }
}
