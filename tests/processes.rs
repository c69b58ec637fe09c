//! A followed process tree as one capture set: `record --follow-children` on a program that
//! forks a child, runs `sys.executable` and a shell; every process is listed with its parent
//! and its start and exit, the shell is left alone, and every view offers all the processes
//! merged and one of them with `--pid`.

mod common;

use common::{by_function, mprof, pythons, report_json, run_with_timeout, script, Python};
use mprof::views::export::pprof::PprofProfile;
use prost::Message;
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const FUNCTIONS: [&str; 3] = ["in_program", "in_forked", "in_exec_child"];

/// Records the test script `name` (with `arg`) at `--rate 1`, following its children, into
/// `capture`; returns mprof's standard error.
fn record_tree(py: &Python, name: &str, arg: &Path, capture: &Path) -> String {
    record_tree_with(py, name, &[arg.as_os_str()], capture)
}

/// [`record_tree`] with the script's arguments `args`.
fn record_tree_with(py: &Python, name: &str, args: &[&OsStr], capture: &Path) -> String {
    let out = run_with_timeout(
        mprof()
            .args(["record", "--rate", "1", "--follow-children", "-o"])
            .arg(capture)
            .arg("--")
            .arg(&py.path)
            .arg(script(name))
            .args(args),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}: {err}", py.label);
    err
}

/// Records `tree_workload.py` at `--rate 1`; returns mprof's standard error and the truth:
/// function → (pid, bytes kept), and what the shell printed with its exit status.
fn record(py: &Python, dir: &Path) -> (String, HashMap<String, (u32, f64)>, Value) {
    let truth = dir.join("truth.json");
    let err = record_tree(py, "tree_workload.py", &truth, &dir.join("c.mprof"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    let known = FUNCTIONS
        .iter()
        .map(|f| {
            let pid = v[f][0].as_u64().unwrap() as u32;
            (f.to_string(), (pid, v[f][1].as_f64().unwrap()))
        })
        .collect();
    (err, known, v["sh"].clone())
}

/// Live bytes per function of a report of `capture` (`args` added).
fn live(capture: &Path, args: &[&str]) -> HashMap<String, f64> {
    let mut all = vec!["--view", "live", "--by", "function", "--top", "0"];
    all.extend_from_slice(args);
    by_function(&report_json(capture, &all))
        .into_iter()
        .map(|(f, v)| (f, v["live_bytes"].as_f64().unwrap_or(0.0)))
        .collect()
}

fn within_1_percent(got: Option<&f64>, want: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() / want < 0.01)
}

/// Every process is profiled and listed (pid, parent, how it was born, start and exit); the
/// merged report and each process's own are exact at `--rate 1`; the shell ran unharmed and
/// unprofiled; the summary says how many processes were profiled.
#[test]
fn a_process_tree_is_one_capture_set() {
    for py in pythons() {
        let dir = common::tempdir();
        let (err, truth, sh) = record(&py, dir.path());
        let capture = dir.path().join("c.mprof");
        assert_eq!(sh, serde_json::json!(["42 clean", 0]), "{}", py.label);
        assert!(
            err.contains("3 process(es) profiled"),
            "{}: {err}",
            py.label
        );
        let program = truth["in_program"].0;
        let table = report_json(&capture, &["--per-process"]);
        let rows = table["processes"].as_array().unwrap();
        let mut born = HashMap::new();
        for r in rows {
            let pid = r["pid"].as_u64().unwrap() as u32;
            born.insert(pid, r["born"].as_str().unwrap().to_owned());
            let (start, exit) = (r["start_unix_ms"].as_u64(), r["exit_unix_ms"].as_u64());
            assert!(
                start.is_some() && exit >= start,
                "{}: {pid} start {start:?} exit {exit:?}",
                py.label
            );
            if pid != program {
                assert_eq!(r["ppid"].as_u64(), Some(program as u64), "{}", py.label);
            }
        }
        // Every capture says which Python made it, a fork's too.
        let version = report_json(&capture, &[])["meta"]["python"].clone();
        assert!(
            version.as_str().is_some_and(|v| v.starts_with('3')),
            "{version}"
        );
        for entry in std::fs::read_dir(dir.path().join("c.mprof.d")).unwrap() {
            let child = report_json(&entry.unwrap().path(), &[]);
            assert_eq!(child["meta"]["python"], version, "{}", py.label);
        }
        let expect: HashMap<u32, String> = [
            (program, "record"),
            (truth["in_forked"].0, "fork"),
            (truth["in_exec_child"].0, "exec"),
        ]
        .into_iter()
        .map(|(p, b)| (p, b.to_owned()))
        .collect();
        assert_eq!(
            born, expect,
            "{}: the shell is not a process of the set",
            py.label
        );
        let merged = live(&capture, &[]);
        for f in FUNCTIONS {
            let (pid, want) = truth[f];
            assert!(
                within_1_percent(merged.get(f), want),
                "{}: merged {f}: {:?}, truth {want}",
                py.label,
                merged.get(f)
            );
            let alone = live(&capture, &["--pid", &pid.to_string()]);
            assert!(within_1_percent(alone.get(f), want), "{}: {f}", py.label);
            for other in FUNCTIONS.iter().filter(|&&o| o != f) {
                assert!(
                    !alone.contains_key(*other),
                    "{}: {other} in {pid}",
                    py.label
                );
            }
        }
        eprintln!("{}: 3 processes, merged and one by one within 1%", py.label);
    }
}

fn run_ok(args: &[&str]) -> String {
    let out = run_with_timeout(mprof().args(args), LIMIT);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "mprof {args:?}: {err}");
    err
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned()
}

/// The HTML page with its flamegraphs (base64 `data:` URIs) decoded.
fn html_text(path: &Path) -> String {
    use base64::Engine;
    let page = read(path);
    let mut text = page.clone();
    for part in page.split("base64,").skip(1) {
        let data = part.split('"').next().unwrap();
        let svg = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&svg));
    }
    text
}

fn pprof_text(path: &Path) -> String {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    format!("{:?}", PprofProfile::decode(raw.as_slice()).unwrap())
}

/// Every view of the same capture (flamegraph SVG and folded, HTML, timeline, pprof,
/// speedscope, the text report) shows all the processes by default and the forked child
/// alone with `--pid`; a pid that is not in the set is refused with a message.
#[test]
fn every_view_shows_all_processes_or_one() {
    if common::tier::full_tier_only(
        "every_view_shows_all_processes_or_one",
        "every view of a capture set; a_process_tree_is_one_capture_set runs",
    ) {
        return;
    }
    let py = pythons().pop().unwrap();
    let dir = common::tempdir();
    let (_, truth, _) = record(&py, dir.path());
    let capture = dir.path().join("c.mprof");
    let c = capture.to_str().unwrap();
    let child = truth["in_forked"].0.to_string();
    type View = (&'static str, fn(&Path) -> String, &'static [&'static str]);
    let views: [View; 7] = [
        ("fg.svg", read, &["flamegraph"]),
        ("fg.folded", read, &["flamegraph"]),
        ("r.html", html_text, &["html"]),
        ("t.svg", read, &["timeline", "--top", "50"]),
        ("p.pb.gz", pprof_text, &["export", "--format", "pprof"]),
        (
            "s.speedscope.json",
            read,
            &["export", "--format", "speedscope"],
        ),
        ("f.folded", read, &["export", "--format", "folded"]),
    ];
    for (name, text, command) in views {
        for pick in [None, Some(child.as_str())] {
            let out = dir.path().join(format!("{}{name}", pick.unwrap_or("all")));
            let mut args = command.to_vec();
            args.extend([c, "-o", out.to_str().unwrap()]);
            if let Some(pid) = pick {
                args.extend(["--pid", pid]);
            }
            let err = run_ok(&args);
            let shown = text(&out);
            for f in FUNCTIONS {
                if name == "t.svg" && pick.is_none() && f == "in_forked" {
                    // The timeline ranks sites by their bytes at the merged peak, when the
                    // forked child has ended already.
                    continue;
                }
                let want = pick.is_none() || f == "in_forked";
                assert_eq!(shown.contains(f), want, "{args:?}: {f}\n{err}");
            }
        }
    }
    let out = run_with_timeout(mprof().args(["report", c, "--by", "function"]), LIMIT);
    let all = String::from_utf8_lossy(&out.stdout);
    assert!(all.contains("3 processes merged"), "{all}");
    let out = run_with_timeout(mprof().args(["report", c, "--pid", &child]), LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("process {child} alone")), "{text}");
    let out = run_with_timeout(mprof().args(["report", c, "--pid", "1"]), LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("PID 1"), "{err}");
}

/// Forked children gone (exited and reaped, perhaps with the program) before mprof reads their
/// rings are still listed with the command they ran, their parent's: /proc no longer has them.
#[test]
fn a_fork_gone_before_it_is_read_keeps_its_command() {
    let py = pythons().into_iter().next().unwrap();
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    let pid_file = dir.path().join("children");
    record_tree(&py, "quick_fork.py", &pid_file, &capture);
    let table = report_json(&capture, &["--per-process"]);
    let rows = table["processes"].as_array().unwrap();
    let command = |pid: u64| {
        rows.iter()
            .find(|r| r["pid"].as_u64() == Some(pid))
            .map(|r| r["command"].as_str().unwrap().to_owned())
    };
    let program = rows
        .iter()
        .find(|r| r["born"] == "record")
        .and_then(|r| r["pid"].as_u64())
        .unwrap();
    let want = command(program).unwrap();
    assert!(want.contains("quick_fork.py"), "{want}");
    let children = read(&pid_file);
    assert_eq!(children.lines().count(), 8);
    for child in children.lines() {
        let child: u64 = child.parse().unwrap();
        assert_eq!(command(child).as_deref(), Some(want.as_str()), "{table}");
    }
}

/// A recording of `exec_chain.py` (see its doc; `extra` after its truth file), following
/// children at `--rate 1`, with what the script says it did.
struct ExecChain {
    dir: tempfile::TempDir,
    capture: std::path::PathBuf,
    /// mprof's standard error.
    err: String,
    /// The pid that ran both programs, and the bytes each kept.
    pid: u64,
    first: f64,
    second: f64,
}

fn record_exec_chain(py: &Python, extra: &[&str]) -> ExecChain {
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    let truth_file = dir.path().join("truth.json");
    let mut args = vec![truth_file.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    let err = record_tree_with(py, "exec_chain.py", &args, &capture);
    let truth: Value = serde_json::from_str(&read(&truth_file)).unwrap();
    ExecChain {
        dir,
        capture,
        err,
        pid: truth["pid"].as_u64().unwrap(),
        first: truth["first"].as_f64().unwrap(),
        second: truth["second"].as_f64().unwrap(),
    }
}

/// A followed child that runs a new Python by exec (the same pid): each program gets a capture
/// of its own (`PID.mprof`, then `PID-2.mprof`), both are in the merged figures, and `--pid`
/// shows both, the first program's blocks leaving the live heap at its exec.
#[test]
fn a_child_that_runs_a_new_python_by_exec_keeps_both_programs() {
    if common::tier::full_tier_only(
        "a_child_that_runs_a_new_python_by_exec_keeps_both_programs",
        "exec chains, at length",
    ) {
        return;
    }
    for py in pythons() {
        let ExecChain {
            dir,
            capture,
            pid,
            first,
            second,
            ..
        } = record_exec_chain(&py, &[]);
        // `PID.mprof` and `PID-2.mprof`, also where the child was forked before its exec
        // (older `subprocess`): that fork took no sample, and its capture and name are gone.
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("c.mprof.d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{pid}.")) || n.starts_with(&format!("{pid}-")))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [format!("{pid}-2.mprof"), format!("{pid}.mprof")],
            "{}",
            py.label
        );
        let table = report_json(&capture, &["--per-process"]);
        let rows: Vec<&Value> = table["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["pid"].as_u64() == Some(pid))
            .collect();
        assert_eq!(rows.len(), 2, "{}: {table}", py.label);
        assert!(rows.iter().all(|r| r["born"] == "exec"), "{}", py.label);
        let commands: Vec<&str> = rows
            .iter()
            .map(|r| r["command"].as_str().unwrap())
            .collect();
        assert!(
            commands[0].ends_with(" first") && commands[1].ends_with(" second"),
            "{}: {commands:?}",
            py.label
        );
        let merged = live(&capture, &[]);
        let alone = live(&capture, &["--pid", &pid.to_string()]);
        for (f, want) in [("in_first_program", first), ("in_second_program", second)] {
            assert!(within_1_percent(merged.get(f), want), "{}: {f}", py.label);
            assert!(within_1_percent(alone.get(f), want), "{}: {f}", py.label);
        }
        // One program at a time: the process's peak is the higher of its programs' own, not
        // their sum (the first program's blocks leave the live heap at its exec).
        let report = report_json(&capture, &["--pid", &pid.to_string(), "--view", "peak"]);
        let peak = report["totals"]["peak"]["bytes"].as_f64().unwrap();
        let own = rows.iter().map(|r| r["peak_bytes"].as_f64().unwrap());
        let (highest, sum) = (own.clone().fold(0.0, f64::max), own.sum::<f64>());
        assert!(
            peak >= second && (peak - highest).abs() <= highest * 0.01 && sum > peak + first,
            "{}: peak {peak}, the programs' own {highest} (sum {sum})",
            py.label
        );
    }
}

/// The program itself runs a new Python by exec (a launcher, `poetry run`): under
/// `--follow-children` the new program is profiled too, as `PID-2.mprof` beside the program's
/// capture; the program's blocks leave the live heap at its exec, and `--pid` shows both.
#[test]
fn a_program_that_runs_a_new_python_by_exec_is_followed() {
    if common::tier::full_tier_only(
        "a_program_that_runs_a_new_python_by_exec_is_followed",
        "exec chains, at length",
    ) {
        return;
    }
    for py in pythons() {
        let ExecChain {
            dir,
            capture,
            err,
            pid,
            first,
            second,
        } = record_exec_chain(&py, &["first"]);
        assert!(
            err.contains(
                "1 process(es) profiled: the program and 0 followed child process(es); they \
                 ran 1 more program(s) by exec"
            ),
            "{}: {err}",
            py.label
        );
        assert!(
            dir.path()
                .join(format!("c.mprof.d/{pid}-2.mprof"))
                .is_file(),
            "{}",
            py.label
        );
        let table = report_json(&capture, &["--per-process"]);
        let rows = table["processes"].as_array().unwrap();
        let born: Vec<(u64, &str)> = rows
            .iter()
            .map(|r| (r["pid"].as_u64().unwrap(), r["born"].as_str().unwrap()))
            .collect();
        assert_eq!(born, [(pid, "record"), (pid, "exec")], "{}", py.label);
        for args in [&[][..], &["--pid", &pid.to_string()][..]] {
            let got = live(&capture, args);
            for (f, want) in [("in_first_program", first), ("in_second_program", second)] {
                assert!(
                    within_1_percent(got.get(f), want),
                    "{} {args:?}: {f}: {:?}",
                    py.label,
                    got.get(f)
                );
            }
            let report = report_json(&capture, &[&["--view", "peak"], args].concat());
            let peak = report["totals"]["peak"]["bytes"].as_f64().unwrap();
            let own = rows.iter().map(|r| r["peak_bytes"].as_f64().unwrap());
            let highest = own.fold(0.0, f64::max);
            assert!(
                (peak - highest).abs() <= highest * 0.01,
                "{} {args:?}: peak {peak}, the programs' own {highest}",
                py.label
            );
        }
    }
}

/// Without `--follow-children`, a program that runs a new Python by exec is told at the end
/// that what ran after the exec was not profiled, and how to profile it.
#[test]
fn a_program_that_runs_a_new_python_by_exec_is_named_without_follow() {
    let py = pythons().into_iter().next().unwrap();
    let dir = common::tempdir();
    let truth = dir.path().join("truth.json");
    let out = run_with_timeout(
        mprof()
            .args(["record", "-o"])
            .arg(dir.path().join("c.mprof"))
            .arg("--")
            .arg(&py.path)
            .arg(script("exec_chain.py"))
            .arg(&truth)
            .args(["first", "slow"]),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", py.label);
    let hint = err
        .lines()
        .find(|l| l.contains("ran a new program by exec"))
        .unwrap_or_else(|| panic!("{}: no word of the exec: {err}", py.label));
    assert!(
        hint.contains("exec_chain.py") && hint.contains("--follow-children"),
        "{hint}"
    );
    assert!(truth.is_file(), "the new program ran");
}

/// At the default rate the session's loop sleeps between quiet rounds, but a child that
/// announces itself wakes it: its command line is read at once, before the child runs
/// another program by exec (a round later it would be the next program's).
#[test]
fn a_child_is_taken_on_as_soon_as_it_announces_itself() {
    let py = pythons().into_iter().next().unwrap();
    for _ in 0..3 {
        let dir = common::tempdir();
        let capture = dir.path().join("c.mprof");
        let out = run_with_timeout(
            mprof()
                .args(["record", "--follow-children", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(script("exec_chain.py"))
                .arg(dir.path().join("truth.json")),
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table = report_json(&capture, &["--per-process"]);
        let commands: Vec<&str> = table["processes"]
            .as_array()
            .unwrap()
            .iter()
            .skip(1)
            .map(|r| r["command"].as_str().unwrap())
            .collect();
        assert_eq!(commands.len(), 2, "{table}");
        assert!(
            commands[0].ends_with(" first"),
            "{}: {commands:?}",
            py.label
        );
    }
}

/// A daemon started by a double fork (the middle process exits at once, so the daemon is
/// reparented before its ring reaches mprof) is still the program's: it names as its parent
/// the process that forked it (not the one it has by the time it asks, init), which mprof
/// admitted and saw go. Before, most runs refused it as "not a descendant" and lost its work.
#[test]
fn a_daemon_started_by_a_double_fork_is_followed() {
    if common::tier::full_tier_only(
        "a_daemon_started_by_a_double_fork_is_followed",
        "waits for the daemon to be orphaned",
    ) {
        return;
    }
    for py in pythons() {
        for run in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let capture = dir.path().join("c.mprof");
            let err = record_tree_with(&py, "daemon.py", &[], &capture);
            assert!(!err.contains("refused"), "{} run {run}: {err}", py.label);
            let report = report_json(&capture, &["--by", "function", "--top", "0"]);
            let daemon = by_function(&report)
                .get("daemon_work")
                .and_then(|row| row["alloc_bytes"].as_f64())
                .unwrap_or(0.0);
            assert!(
                daemon >= 30e6,
                "{} run {run}: the daemon's 30 MB are not in the capture: {err}",
                py.label
            );
        }
    }
}

/// Python children started with environments of their own lose `LD_PRELOAD`. One started by
/// the interpreter (`subprocess` with `env={...}`) gets the agent and the rendezvous back from
/// the agent's exec hook and loads the agent itself; one started by another program (`env
/// -i`) does not: mprof finds it (four times a second) and attaches to it, as `attach
/// --follow-children` does. Each works for 1.5 s; at least the second after the attach is in
/// its capture. Before, both went unprofiled and unmentioned.
#[test]
fn children_with_environments_of_their_own_are_attached_to() {
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("c.mprof");
        let err = record_tree_with(&py, "env_children.py", &[], &capture);
        let attached = err
            .lines()
            .filter(|l| l.contains("did not load the agent"))
            .count();
        assert_eq!(attached, 1, "{}: {err}", py.label);
        let report = report_json(&capture, &["--by", "function", "--top", "0"]);
        let worked = by_function(&report)
            .get("worker_loop")
            .and_then(|row| row["alloc_bytes"].as_f64())
            .unwrap_or(0.0);
        // 2 × 15 MB in all; at least a third of it after the attaches.
        assert!(
            worked >= 10e6,
            "{}: {worked} bytes of worker_loop: {err}",
            py.label
        );
    }
}

/// Short-lived Python children started by the interpreter with an environment of their own
/// (`subprocess` with `env={...}`, four; `os.posix_spawn`, one) end before mprof's look for
/// strays could find them: the agent's hooks of `execve` and `posix_spawn` give them the agent
/// and the rendezvous back, so each is followed from its first line and its 3 MB are in the
/// capture, exactly at `--rate 1`. Before, none of the five was in it.
#[test]
fn short_lived_children_with_environments_of_their_own_are_followed() {
    if common::tier::full_tier_only(
        "short_lived_children_with_environments_of_their_own_are_followed",
        "many short-lived children",
    ) {
        return;
    }
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("c.mprof");
        let err = record_tree_with(&py, "quick_env_children.py", &[], &capture);
        let report = report_json(
            &capture,
            &["--per-process", "--by", "function", "--top", "0"],
        );
        let children: Vec<&Value> = report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["born"] == "exec")
            .collect();
        assert_eq!(children.len(), 5, "{}: {report}\n{err}", py.label);
        let merged = report_json(&capture, &["--by", "function", "--top", "0"]);
        let rows: Vec<&Value> = merged["locations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| row["function"] == "quick_child")
            .collect();
        let made: f64 = rows
            .iter()
            .filter_map(|row| row["alloc_bytes"].as_f64())
            .sum();
        assert!(
            (15e6..15.2e6).contains(&made),
            "{}: {made} bytes in quick_child, 5 x 3,000,000 made; its rows: {rows:?}; \
             processes: {}\n{err}",
            py.label,
            report["processes"]
        );
    }
}
