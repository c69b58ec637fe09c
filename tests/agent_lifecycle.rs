//! The agent's life in the target: it adds no thread (so Python 3.12+ does not warn at
//! `fork()`), survives the program taking its hooks out of the allocator chain, serves many
//! sessions in a row, an orphaned session (mprof killed) is taken over by the next attach, and
//! `record`'s audit hook does not stay in the interpreter's list after start-up.

mod common;

use common::procs::{attach_once, signal, touch, wait_file, Attach, Target, LIMIT};
use common::{by_function, mprof, pythons, report_json, run_with_timeout, script, Python};
use std::time::{Duration, Instant};

const SIGKILL: i32 = 9;

fn main_python(all: &[Python]) -> Python {
    all.iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&all[0])
        .clone()
}

/// `fork()` under `record` and while attached: with `-W error::DeprecationWarning`, Python
/// 3.12+ would end the program if it saw a second thread (the agent has none).
#[test]
fn fork_shows_no_thread_warning_under_record_or_attach() {
    for py in pythons() {
        let dir = common::tempdir();
        touch(dir.path(), "go");
        let out = run_with_timeout(
            mprof()
                .args(["record", "-q", "-o"])
                .arg(dir.path().join("r.mprof"))
                .arg("--")
                .arg(&py.path)
                .args(["-W", "error::DeprecationWarning"])
                .arg(script("lifecycle_target.py"))
                .args(["fork", dir.path().to_str().unwrap()]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{} record: {err}", py.label);
        assert!(!err.contains("multi-threaded"), "{}: {err}", py.label);
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l == "forked"),
            "{} record: the program did not fork",
            py.label
        );

        let dir = common::tempdir();
        let target = Target::start(
            std::process::Command::new(&py.path)
                .args(["-W", "error::DeprecationWarning"])
                .arg(script("lifecycle_target.py"))
                .args(["fork", dir.path().to_str().unwrap()]),
        );
        let mut attach = Attach::start(
            target.pid,
            &["-o", dir.path().join("a.mprof").to_str().unwrap()],
        );
        attach.attached();
        let threads = std::fs::read_dir(format!("/proc/{}/task", target.pid))
            .unwrap()
            .count();
        assert_eq!(threads, 1, "{}: the agent added a thread", py.label);
        touch(dir.path(), "go");
        let (status, out) = target.finish(LIMIT);
        assert!(status.success(), "{} attach: {status} {out:?}", py.label);
        assert!(out.iter().any(|l| l == "forked"), "{}: {out:?}", py.label);
        let _ = attach.finish();
    }
}

/// `tracemalloc.start()` before the attach and `tracemalloc.stop()` during the session take
/// mprof's hooks out of the chain: that session says so at detach, and the next session
/// installs the hooks again and sees the program's allocations.
#[test]
fn tracemalloc_stop_during_a_session_does_not_break_later_sessions() {
    for py in pythons() {
        let dir = common::tempdir();
        let d = dir.path().to_str().unwrap();
        let target = Target::python(&py.path, "lifecycle_target.py", &["tracemalloc", d]);
        let first = dir.path().join("first.mprof");
        let mut attach = Attach::start(target.pid, &["--rate", "1", "-o", first.to_str().unwrap()]);
        attach.attached();
        touch(dir.path(), "stop");
        wait_file(&dir.path().join("stopped"), LIMIT);
        let err = attach.detach();
        assert!(
            err.contains("replaced mprof's hooks"),
            "{}: the lost hooks went unreported: {err}",
            py.label
        );

        let second = dir.path().join("second.mprof");
        let mut attach =
            Attach::start(target.pid, &["--rate", "1", "-o", second.to_str().unwrap()]);
        attach.attached();
        touch(dir.path(), "second");
        wait_file(&dir.path().join("allocated"), LIMIT);
        let err = attach.detach();
        assert!(!err.contains("replaced"), "{}: {err}", py.label);
        let report = report_json(
            &second,
            &["--view", "live", "--by", "function", "--top", "0"],
        );
        let live = by_function(&report)
            .get("second_session")
            .and_then(|l| l["live_bytes"].as_u64())
            .unwrap_or(0);
        assert!(
            live >= 300 * 10_000,
            "{}: second session saw {live} live bytes in second_session: {report}",
            py.label
        );
        touch(dir.path(), "finish");
        let (status, _) = target.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        eprintln!(
            "{}: lost hooks reported, second session saw {live} B",
            py.label
        );
    }
}

/// 200 attach/detach cycles in a row on an allocating target: every capture holds samples
/// (a session whose hooks an earlier one took away would be empty).
#[test]
fn two_hundred_fast_reattaches_each_capture_samples() {
    if common::tier::full_tier_only(
        "two_hundred_fast_reattaches_each_capture_samples",
        "two hundred attaches in a row",
    ) {
        return;
    }
    let all = pythons();
    let py = main_python(&all);
    let dir = common::tempdir();
    let target = Target::python(&py.path, "lifecycle_target.py", &["churn"]);
    let started = Instant::now();
    let rounds = 200;
    let mut rss_at_100 = 0;
    for i in 0..rounds {
        if i == 100 {
            rss_at_100 = rss_kib(target.pid);
        }
        let capture = dir.path().join(format!("c{i}.mprof"));
        let (status, err) = attach_once(
            target.pid,
            &[
                "--duration",
                "0.03",
                "--rate",
                "4096",
                "-q",
                "-o",
                capture.to_str().unwrap(),
            ],
        );
        assert!(status.success(), "round {i}: {err}");
    }
    let took = started.elapsed();
    let rss_at_200 = rss_kib(target.pid);
    eprintln!("RSS after 100 sessions {rss_at_100} KiB, after 200 {rss_at_200} KiB");
    assert!(
        rss_at_200 <= rss_at_100 + rss_at_100 / 20,
        "sessions leave memory behind: {rss_at_100} KiB after 100, {rss_at_200} after 200"
    );
    let mut empty = Vec::new();
    for i in 0..rounds {
        let report = report_json(&dir.path().join(format!("c{i}.mprof")), &["--top", "1"]);
        if report["samples"].as_u64().unwrap_or(0) == 0 {
            empty.push(i);
        }
    }
    assert!(
        empty.is_empty(),
        "{} captures had no sample: {empty:?}",
        empty.len()
    );
    eprintln!(
        "{}: {rounds} attach/detach cycles in {took:?}, every capture sampled",
        py.label
    );
}

/// mprof SIGKILLed while attached to an idle target (whose agent never runs to notice): the
/// next attach says it waits for the dead reader's heartbeat to age, takes the session over,
/// and detaches cleanly.
#[test]
fn an_orphaned_session_is_taken_over_by_the_next_attach() {
    let all = pythons();
    for py in [main_python(&all), all.last().unwrap().clone()] {
        let dir = common::tempdir();
        let target = Target::python(&py.path, "attach_idle.py", &["sleep"]);
        let mut attach = Attach::start(
            target.pid,
            &["-o", dir.path().join("killed.mprof").to_str().unwrap()],
        );
        attach.attached();
        signal(attach.guard.0.id(), SIGKILL);
        let _ = attach.guard.0.wait();
        assert!(target.maps().contains("mprof-ring"));
        let started = Instant::now();
        let capture = dir.path().join("next.mprof");
        let (status, err) = attach_once(
            target.pid,
            &["--duration", "0.2", "-o", capture.to_str().unwrap()],
        );
        assert!(status.success(), "{}: {err}", py.label);
        // The killed mprof's heartbeat was fresh: the inspection waits for it to age (about
        // 2 s), and says so once it has waited half a second.
        let note = format!(
            "mprof: PID {} has a profiling session whose mprof stopped answering (killed?); \
             waiting up to 2 s for it to time out, then taking it over",
            target.pid
        );
        assert!(err.contains(&note), "{}: {err}", py.label);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{}: took {took:?}", py.label);
        assert!(
            !target.maps().contains("mprof-ring"),
            "{}: a ring is still mapped after the detach",
            py.label
        );
        let out = run_with_timeout(mprof().arg("report").arg(&capture), LIMIT);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}: orphaned session taken over in {took:?}", py.label);
    }
}

fn row_hex(row: &mprof_common::layout::PyLayout) -> String {
    // SAFETY: PyLayout is repr(C), made of integers with no padding.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            row as *const _ as *const u8,
            std::mem::size_of::<mprof_common::layout::PyLayout>(),
        )
    };
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The agent checks a layout row against the real interpreter before trusting it: loaded into
/// each interpreter, it accepts that version's row and refuses rows with `ob_type`, a frame's
/// code or a code object's file name in the wrong place (as a debug build or a vendor patch
/// would have them), without crashing the process.
#[test]
fn a_layout_that_does_not_fit_the_interpreter_is_refused_not_walked() {
    use mprof_common::layout::for_version;
    let dir = common::tempdir();
    let agent = dir.path().join("agent.so");
    std::fs::write(&agent, mprof_injector::agent::AGENT_SO).unwrap();
    for py in pythons() {
        let good = *for_version(3, py.minor()).expect("a supported version");
        let mut debug_object = good;
        debug_object.object_type += 16; // Py_TRACE_REFS puts two pointers first
        let mut frame_code = good;
        frame_code.frame_code += 8;
        let mut filename = good;
        filename.code_filename += 4;
        let rows = [good, debug_object, frame_code, filename];
        let out = run_with_timeout(
            std::process::Command::new(&py.path)
                .arg(script("layout_check.py"))
                .arg(&agent)
                .args(rows.iter().map(row_hex)),
            LIMIT,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            out.status.success(),
            "{}: {text} {}",
            py.label,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(lines.len(), 5, "{}: {text}", py.label);
        assert_eq!(lines[0], "ok", "{}: its own row was refused", py.label);
        for (i, line) in lines[1..4].iter().enumerate() {
            assert!(
                line.starts_with("refused: "),
                "{}: wrong row {i} accepted: {line}",
                py.label
            );
        }
        assert_eq!(lines[4], "alive");
        eprintln!("{}: {}", py.label, lines[1..4].join(" | "));
    }
}

/// A realloc that fails (MemoryError) leaves its block live: at `--rate 1` the report shows
/// the bytearray made in `keeper()` still allocated at the end, on every interpreter.
#[test]
fn a_failed_realloc_leaves_the_old_block_live() {
    for py in pythons() {
        let dir = common::tempdir();
        let capture = dir.path().join("r.mprof");
        let out = run_with_timeout(
            mprof()
                .args(["record", "-q", "--rate", "1", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(script("failed_realloc.py")),
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{}: {}",
            py.label,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "100000");
        let report = report_json(
            &capture,
            &["--view", "live", "--by", "function", "--top", "0"],
        );
        let live = by_function(&report)
            .get("keeper")
            .and_then(|l| l["live_bytes"].as_u64())
            .unwrap_or(0);
        assert!(
            live >= 100_000,
            "{}: keeper's block counted as freed by the failed realloc ({live} B live)",
            py.label
        );
    }
}

/// Eight threads allocating through `PyMem_RawMalloc` without the GIL (lzma, zlib) and through
/// OpenSSL's malloc (hashlib), under attach at `--rate 1`: no crash, and what each thread's
/// function keeps (itself or through `lzma.compress`) is reported within 1% of
/// `sys.getsizeof`.
#[test]
fn raw_allocations_from_eight_threads_without_the_gil() {
    use common::procs::wait_line;
    for py in pythons() {
        let dir = common::tempdir();
        let d = dir.path().to_str().unwrap();
        let target = Target::python(&py.path, "raw_threads.py", &[d]);
        let capture = dir.path().join("t.mprof");
        let mut attach = Attach::start(
            target.pid,
            &["--rate", "1", "-o", capture.to_str().unwrap()],
        );
        attach.attached();
        touch(dir.path(), "go");
        let mut lines = Vec::new();
        wait_line(&target.out, "done", LIMIT, &mut lines).expect("workload finished");
        attach.detach();
        touch(dir.path(), "finish");
        let (status, _) = target.finish(LIMIT);
        assert!(status.success(), "{}: {status}", py.label);
        let report = report_json(&capture, &["--view", "live", "--by", "stack", "--top", "0"]);
        let stacks = report["locations"].as_array().unwrap();
        let mut checked = 0;
        for line in &lines {
            let Some(rest) = line.strip_prefix("truth ") else {
                continue;
            };
            let (name, truth) = rest.split_once(' ').unwrap();
            let truth: f64 = truth.parse().unwrap();
            let live: f64 = stacks
                .iter()
                .filter(|l| {
                    l["stack"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|f| f["function"] == name)
                })
                .map(|l| l["live_bytes"].as_f64().unwrap())
                .sum();
            assert!(
                (live - truth).abs() / truth < 0.01,
                "{}: {name} live {live} vs truth {truth}",
                py.label
            );
            checked += 1;
        }
        assert_eq!(checked, 8, "{}: {lines:?}", py.label);
        eprintln!(
            "{}: 8 threads without the GIL, every function within 1%",
            py.label
        );
    }
}

/// `PYTHONMALLOC` (every value) and `-X dev` make the interpreter reset its allocators after
/// the preloaded agent hooked them: `record` puts its hooks back and reports the known
/// allocations exactly at `--rate 1` (malloc-backed objects once), and the program exits
/// cleanly (no debug-allocator complaint about the agent's own block).
#[test]
fn every_allocator_setting_is_profiled() {
    if common::tier::full_tier_only(
        "every_allocator_setting_is_profiled",
        "every allocator setting, by design",
    ) {
        return;
    }
    let settings: [(&str, Option<&str>); 6] = [
        ("PYTHONMALLOC=malloc", Some("malloc")),
        ("PYTHONMALLOC=pymalloc", Some("pymalloc")),
        ("PYTHONMALLOC=debug", Some("debug")),
        ("PYTHONMALLOC=malloc_debug", Some("malloc_debug")),
        ("PYTHONMALLOC=pymalloc_debug", Some("pymalloc_debug")),
        ("-X dev", None),
    ];
    for py in pythons() {
        for (label, pymalloc) in settings {
            let dir = common::tempdir();
            let capture = dir.path().join("c.mprof");
            let truth_file = dir.path().join("truth.json");
            let mut cmd = mprof();
            cmd.args(["record", "-q", "--rate", "1", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path);
            match pymalloc {
                Some(value) => {
                    cmd.env("PYTHONMALLOC", value);
                }
                None => {
                    cmd.args(["-X", "dev"]).env_remove("PYTHONMALLOC");
                }
            }
            cmd.arg(script("known_allocs.py")).arg(&truth_file);
            let out = run_with_timeout(&mut cmd, LIMIT);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{} {label}: {} {err}",
                py.label,
                out.status
            );
            assert!(
                !err.contains("Debug memory block") && !err.contains("Fatal"),
                "{err}"
            );
            let truth: std::collections::HashMap<String, f64> =
                serde_json::from_str(&std::fs::read_to_string(&truth_file).unwrap()).unwrap();
            let report = report_json(
                &capture,
                &["--view", "live", "--by", "function", "--top", "0"],
            );
            let sites = by_function(&report);
            for (name, want) in &truth {
                let got = sites
                    .get(name)
                    .and_then(|s| s["live_bytes"].as_f64())
                    .unwrap_or(0.0);
                assert!(
                    (got - want).abs() / want < 0.01,
                    "{} {label}: {name} live {got} vs {want}",
                    py.label
                );
            }
        }
        eprintln!(
            "{}: every PYTHONMALLOC value and -X dev profiled exactly",
            py.label
        );
    }
}

/// Under `record` the agent's audit hook (which puts its allocator hooks back after the
/// interpreter's start-up) leaves the interpreter's list of audit hooks once it has served:
/// while any hook is listed, every audit event builds its arguments. The program itself finds
/// no hook of the agent's in that list (`audit_hooks.py` reads `_PyRuntime`), and its own audit
/// hook still gets its events. With the removal disabled the script counts 1 on every version.
#[test]
fn record_leaves_no_audit_hook_behind() {
    for py in pythons() {
        let dir = common::tempdir();
        let out = run_with_timeout(
            mprof()
                .args(["record", "-q", "-o"])
                .arg(dir.path().join("c.mprof"))
                .arg("--")
                .arg(&py.path)
                .arg(script("audit_hooks.py")),
            LIMIT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {} {stdout} {}",
            py.label,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in ["agent code mapped True", "agent hooks 0", "events ok"] {
            assert!(stdout.lines().any(|l| l == line), "{}: {stdout}", py.label);
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap()
}
