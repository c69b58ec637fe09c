//! Races between an attach and what the target does meanwhile, tried as an unlucky operator and
//! as a hostile local user would: the target replaces its program (a setuid one) while root
//! attaches, dies and leaves its PID to another Python, truncates a library it has mapped,
//! loads and unloads libraries from threads, forks while mprof detaches; and a debugger after
//! mprof. Each test counts the processes harmed next to a control run without mprof.
//!
//! Targets are children of the test, killed by their guards; every wait has a deadline.

mod common;

use common::procs::{attach_once, signal, Lcg, Target, LIMIT};
use common::{main_python, mprof, pythons, run_with_timeout, script, tools, Python};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// mprof's one-line message without the numbers that vary (PIDs, paths' digits, times).
fn outcome(status: ExitStatus, err: &str) -> String {
    if status.success() {
        let last = err.lines().rev().find(|l| l.starts_with("mprof: PID"));
        return match last {
            Some(l) if l.contains("replaced its program") => "attached; exec seen".into(),
            Some(l) if l.contains("exited while attached") => "attached; exited".into(),
            _ => "attached".into(),
        };
    }
    let line = err
        .lines()
        .last()
        .unwrap_or("")
        .replace("mprof: error: ", "");
    line.split_whitespace()
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .take(6)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One trial: the target execs `program` after a pseudo-random delay while mprof attaches (or,
/// for the control, while nothing does). Returns the exec'd program's exit status and mprof's
/// outcome, and the target's output (for a failure's message).
fn exec_trial(
    py: &Python,
    rng: &mut Lcg,
    program: &[&str],
    attach: bool,
) -> (ExitStatus, String, Vec<String>) {
    let delay = format!("{:.4}", rng.below(25) as f64 / 1000.0);
    let who = if rng.below(2) == 0 { "main" } else { "thread" };
    let target = Target::start(
        Command::new(&py.path)
            .arg(script("exec_during_attach.py"))
            .args([delay.as_str(), who])
            .args(program),
    );
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    let said = if attach {
        let (status, err) = attach_once(
            target.pid,
            &["--duration", "0.3", "-q", "-o", capture.to_str().unwrap()],
        );
        outcome(status, &err)
    } else {
        "control".into()
    };
    let (status, out) = target.finish(LIMIT);
    (status, said, out)
}

/// Point 1 of the attach races: a target that execs a setuid-root program (`passwd -S`, as
/// `nobody`) while root's mprof attaches. Before mprof noticed execs, 3 of 100 such `passwd`
/// processes died of SIGSEGV (a thread seized just as it called `execve` was worked on in the
/// new program with the old one's addresses). Now every exec is noticed at once (ptrace's exec
/// event; the memory file opened at the start no longer reads) and the new program is let go
/// untouched: none is harmed, and mprof says the program was replaced where it can still tell
/// (a `passwd` that has exited and been reaped leaves nothing to tell by).
#[test]
fn a_target_that_execs_a_setuid_program_during_the_attach_is_left_alone() {
    if common::tier::full_tier_only(
        "a_target_that_execs_a_setuid_program_during_the_attach_is_left_alone",
        "a race repeated a hundred times",
    ) {
        return;
    }
    if !common::tier::root(
        "setuid exec during attach",
        "mprof as root, target as nobody",
    ) {
        return;
    }
    let all = pythons();
    let main = main_python(&all);
    let passwd = ["/usr/bin/passwd", "passwd", "-S"];
    for py in &all {
        let trials = if py.label == main.label { 100 } else { 12 };
        let mut rng = Lcg(0x5e7_u64 + trials);
        let mut harmed = Vec::new();
        for i in 0..trials / 4 {
            let (status, _, out) = exec_trial(py, &mut rng, &passwd, false);
            assert!(
                status.success(),
                "{}: control {i}: passwd failed: {status}, output {out:?}",
                py.label
            );
        }
        let mut said = BTreeMap::<String, usize>::new();
        for i in 0..trials {
            let (status, what, out) = exec_trial(py, &mut rng, &passwd, true);
            if !status.success() {
                harmed.push(format!("trial {i}: {status} ({what}), output {out:?}"));
            }
            *said.entry(what).or_default() += 1;
        }
        eprintln!(
            "{}: {trials} setuid execs during an attach, {} harmed; mprof said {said:?}",
            py.label,
            harmed.len()
        );
        assert!(harmed.is_empty(), "{}: {harmed:?}", py.label);
        let seen = said
            .iter()
            .filter(|(k, _)| k.contains("replaced its program") || k.contains("exec seen"))
            .map(|(_, n)| n)
            .sum::<usize>();
        assert!(seen > 0, "{}: no exec was reported: {said:?}", py.label);
        for what in said.keys() {
            let known = [
                "attached",
                "replaced its program",
                "exec seen",
                "exited",
                "not a Python",
                "no process with",
            ];
            assert!(
                known.iter().any(|k| what.contains(k)),
                "{}: unexpected outcome {what:?}",
                py.label
            );
        }
    }
}

/// Point 10 with point 1: while the program exec'd (`sleep`, which runs on) is alive, mprof
/// never says the target exited: it says the program was replaced, during the attach or
/// while attached.
#[test]
fn an_exec_during_the_attach_is_not_called_an_exit() {
    if common::tier::full_tier_only(
        "an_exec_during_the_attach_is_not_called_an_exit",
        "a race repeated twenty times",
    ) {
        return;
    }
    let all = pythons();
    let py = main_python(&all);
    let mut rng = Lcg(0xe8ec);
    let mut said = BTreeMap::<String, usize>::new();
    for _ in 0..20 {
        let (status, what, out) = exec_trial(&py, &mut rng, &["/bin/sleep", "sleep", "0.6"], true);
        assert!(
            status.success(),
            "{}: sleep failed: {status} ({what}), output {out:?}",
            py.label
        );
        *said.entry(what).or_default() += 1;
    }
    eprintln!("{}: 20 execs of sleep during an attach: {said:?}", py.label);
    for what in said.keys() {
        // Looked at after the exec: `sleep` is rightly not a Python.
        let known = ["replaced its program", "exec seen", "not a Python"];
        assert!(
            what == "attached" || known.iter().any(|k| what.contains(k)),
            "{}: mprof said {what:?} of a target that exec'd sleep: {said:?}",
            py.label
        );
    }
    assert!(
        said.keys().any(|k| k != "attached"),
        "{}: no exec happened during an attach: {said:?}",
        py.label
    );
}

/// `gdb -p PID` lists the target's libraries and detaches, within a deadline; the target is
/// running again afterwards.
fn gdb_lists_libraries(gdb: &Path, pid: u32, what: &str) {
    let out = run_with_timeout(
        Command::new(gdb).args([
            "-nx",
            "-batch",
            "-p",
            &pid.to_string(),
            "-ex",
            "info sharedlibrary",
        ]),
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("libc.so"),
        "{what}: gdb -p {pid} failed or hung ({}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    if maps.contains("mprof-agent") {
        assert!(
            text.contains("/memfd:mprof-agent.so (deleted)") && !text.contains("/proc/self/fd/"),
            "{what}: the agent is not listed under its memory file's name: {text}"
        );
    }
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = state
        .rsplit_once(") ")
        .map_or(' ', |(_, r)| r.chars().next().unwrap());
    assert!(
        !matches!(state, 'T' | 't'),
        "{what}: PID {pid} was left stopped ({state})"
    );
}

/// Point 7: a debugger after mprof. The agent was loaded as `/proc/self/fd/N`, the name the
/// loader kept and debuggers read: `gdb -p` opened it in its own process, where N was its own
/// pipe, and hung for ever with the target stopped (6 of 6 before; memray's attach drives gdb
/// and hung the same way). The agent now renames itself after its memory file. Checked on a
/// target never profiled (the control), after an attach and detach, and under `record`.
#[test]
fn a_debugger_attaches_after_mprof_as_if_mprof_had_never_come() {
    if common::tier::full_tier_only(
        "a_debugger_attaches_after_mprof_as_if_mprof_had_never_come",
        "a real consumer (gdb)",
    ) {
        return;
    }
    let Some(gdb) = tools::gdb("gdb after mprof") else {
        return;
    };
    for py in &pythons() {
        let target = Target::python(&py.path, "attach_idle.py", &["sleep"]);
        gdb_lists_libraries(&gdb, target.pid, &format!("{}: never profiled", py.label));
        let dir = common::tempdir();
        let capture = dir.path().join("c.mprof");
        let (status, err) = attach_once(
            target.pid,
            &["--duration", "0.2", "-q", "-o", capture.to_str().unwrap()],
        );
        assert!(status.success(), "{}: {err}", py.label);
        gdb_lists_libraries(&gdb, target.pid, &format!("{}: after attach", py.label));
        let recorded = Target::start(
            mprof()
                .args(["record", "-q", "-o"])
                .arg(dir.path().join("r.mprof"))
                .arg("--")
                .arg(&py.path)
                .arg(script("attach_idle.py"))
                .arg("sleep"),
        );
        gdb_lists_libraries(&gdb, recorded.pid, &format!("{}: under record", py.label));
        signal(recorded.pid, 9);
        eprintln!("{}: gdb -p after attach and under record: ok", py.label);
    }
}

/// One storm target: `attaches` attach/detach cycles (every other one with `--native`) while
/// its native threads load and unload libraries, or none (the control, which runs as long).
/// Returns whether the target ended well, and the attaches that failed (with why).
fn storm_run(py: &Python, lib: &Path, attaches: usize) -> (bool, Vec<String>) {
    let dir = common::tempdir();
    let target = Target::python(
        &py.path,
        "dlopen_storm.py",
        &[lib.to_str().unwrap(), dir.path().to_str().unwrap(), "4"],
    );
    let mut failed = Vec::new();
    for i in 0..attaches.max(1) {
        if attaches == 0 {
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        let capture = dir.path().join("c.mprof");
        let mut args = vec!["--duration", "0.15", "--rate", "64KiB", "-q", "-o"];
        args.push(capture.to_str().unwrap());
        if i % 2 == 1 {
            args.push("--native");
        }
        let (status, err) = attach_once(target.pid, &args);
        if !status.success() {
            failed.push(err.trim().to_string());
        }
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let (status, out) = target.finish(LIMIT);
    let done = out.iter().any(|l| l.starts_with("done loads="));
    let ok = status.success() && done;
    if !ok {
        failed.push(format!("the target ended with {status}, output {out:?}"));
    }
    (ok, failed)
}

/// Point 2: native threads that `dlopen` and `dlclose` libraries (holding no GIL, as a plugin
/// loader's do) while mprof attaches and detaches. The GOT scan met objects the loader was
/// still relocating and made their RELRO read-only under it: every target of this storm
/// died of SIGSEGV in ld.so (10 of 10 runs on 3.12, a control 0 of 30). Now a scan leaves an
/// object being relocated alone, gives every page back the protection it had, and puts the
/// entries back only in objects still listed, outside the session lock: 200 cycles on the
/// main interpreter (10 on the others, where the storm had killed every target), 0 targets
/// harmed.
#[test]
fn threads_loading_libraries_during_attach_and_detach_are_unharmed() {
    if common::tier::full_tier_only(
        "threads_loading_libraries_during_attach_and_detach_are_unharmed",
        "two hundred attach cycles under a storm",
    ) {
        return;
    }
    let dir = common::tempdir();
    let lib = common::native::build_library(dir.path(), "dlopen_storm");
    let all = pythons();
    let main = main_python(&all);
    for py in &all {
        let (control, _) = storm_run(py, &lib, 0);
        assert!(control, "{}: the storm failed without mprof", py.label);
        let cycles = if py.label == main.label { 200 } else { 10 };
        let per_target = 5;
        let (mut harmed, mut failed) = (0, Vec::new());
        for _ in 0..cycles / per_target {
            let (ok, why) = storm_run(py, &lib, per_target);
            harmed += usize::from(!ok);
            failed.extend(why);
        }
        eprintln!(
            "{}: {cycles} attach/detach cycles under a dlopen/dlclose storm, {harmed} of {} \
             targets harmed, {} attaches refused",
            py.label,
            cycles / per_target,
            failed.len()
        );
        assert_eq!(
            harmed, 0,
            "{}: targets harmed; refusals: {failed:?}",
            py.label
        );
        // Refusals may happen (no thread at a safe point in time), but not most of the time.
        assert!(
            failed.len() * 4 < cycles,
            "{}: too many attaches failed: {failed:?}",
            py.label
        );
    }
}

/// The forks a fork-storm target has counted by its latest progress line, waiting up to
/// `limit` for lines.
fn forks_by(target: &Target, limit: Duration) -> u64 {
    let mut last = 0;
    let end = std::time::Instant::now() + limit;
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        match target.out.recv_timeout(left) {
            Ok(line) => {
                if let Some(n) = line.strip_prefix("forks ") {
                    last = n.parse().unwrap_or(last);
                }
            }
            Err(_) => break,
        }
    }
    last
}

/// Point 12: threads forking (a pre-fork server's life) while mprof attaches and detaches.
/// The fork handler took the GOT lock, then the session lock, while a detach held the session
/// lock and restored the GOT entries under it: both could wait for ever. The order is one now
/// (the agent's `locks.rs`, whose test shows the handler waiting for the session lock with
/// nothing held); this runs 200 detaches (10 on the other interpreters) under the storm: no
/// target hangs, every one ends well.
#[test]
fn a_fork_storm_across_detaches_never_hangs() {
    if common::tier::full_tier_only(
        "a_fork_storm_across_detaches_never_hangs",
        "two hundred detaches under a fork storm",
    ) {
        return;
    }
    let all = pythons();
    let main = main_python(&all);
    for py in &all {
        let detaches = if py.label == main.label { 200 } else { 10 };
        let per_target = detaches.min(20);
        for round in 0..detaches / per_target {
            let dir = common::tempdir();
            let target = Target::python(
                &py.path,
                "fork_storm.py",
                &[dir.path().to_str().unwrap(), "4"],
            );
            let capture = dir.path().join("c.mprof");
            for i in 0..per_target {
                let (status, err) = attach_once(
                    target.pid,
                    &[
                        "--duration",
                        "0.1",
                        "--rate",
                        "4KiB",
                        "-q",
                        "-o",
                        capture.to_str().unwrap(),
                    ],
                );
                assert!(
                    status.success(),
                    "{}: round {round}, detach {i}: {err}",
                    py.label
                );
            }
            let before = forks_by(&target, Duration::from_millis(500));
            std::fs::write(dir.path().join("stop"), b"").unwrap();
            let (status, out) = target.finish(Duration::from_secs(30));
            assert!(
                status.success() && out.iter().any(|l| l.starts_with("done forks=")),
                "{}: round {round}: the storm did not end well ({status}): {out:?}",
                py.label
            );
            assert!(before > 0, "{}: round {round}: no fork counted", py.label);
        }
        eprintln!(
            "{}: {detaches} detaches under a fork storm, no hang",
            py.label
        );
    }
}

/// Point 13: under `record --follow-children`, a forked child hands its ring to mprof from
/// inside `fork()`. With mprof stopped (SIGSTOP: a debugger, a ^Z), its listening socket's
/// backlog filled and every later child blocked in `connect`: the program's forks stopped.
/// Now a child gives up after half a second and runs on unprofiled: while mprof is stopped
/// for 3 s, the program goes on forking.
#[test]
fn forks_go_on_while_mprof_is_stopped() {
    let all = pythons();
    let py = main_python(&all);
    let dir = common::tempdir();
    let target = Target::start(
        mprof()
            .args(["record", "-q", "--follow-children", "-o"])
            .arg(dir.path().join("r.mprof"))
            .arg("--")
            .arg(&py.path)
            .arg(script("fork_storm.py"))
            .arg(dir.path())
            .arg("4"),
    );
    let mprof_pid = target.guard.0.id();
    let before = forks_by(&target, Duration::from_millis(600));
    signal(mprof_pid, 19); // SIGSTOP
    let _ = forks_by(&target, Duration::from_millis(1500)); // the backlog fills, if it can
    let stalled_from = forks_by(&target, Duration::from_millis(300));
    let during = forks_by(&target, Duration::from_millis(1500));
    signal(mprof_pid, 18); // SIGCONT
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let (status, out) = target.finish(Duration::from_secs(30));
    eprintln!(
        "{}: forks {before} before mprof stopped, {stalled_from} -> {during} while stopped",
        py.label
    );
    assert!(status.success(), "{}: {status}: {out:?}", py.label);
    assert!(
        during > stalled_from,
        "{}: the program's forks stopped while mprof was stopped ({stalled_from} -> {during})",
        py.label
    );
}

/// Point 4: a target (`nobody`) truncates and rewrites, over and over, a library it owns and
/// has loaded (its unmapped tail: the section headers), while root runs `attach --native`,
/// which reads every loaded library's headers.
/// mprof mapped those files and died of SIGBUS (7 of 17 attaches, captures incomplete); it now
/// reads them with `pread` (a short read is an error): 20 attaches, none dies, every capture
/// is complete, the target is unharmed.
#[test]
fn a_library_truncated_under_attach_native_never_kills_mprof() {
    use std::os::unix::process::ExitStatusExt;
    if common::tier::full_tier_only(
        "a_library_truncated_under_attach_native_never_kills_mprof",
        "20 attaches racing a truncating target",
    ) || !common::tier::root("truncated library", "mprof as root, target as nobody")
    {
        return;
    }
    let lib = ["libbz2.so.1", "libxml2.so.2"]
        .iter()
        .map(|n| Path::new("/usr/lib/x86_64-linux-gnu").join(n))
        .find(|p| p.is_file());
    let Some(lib) = lib else {
        common::tier::skip(
            "truncated library",
            "no libbz2 or libxml2 (.ci/run installs libbz2)",
        );
        return;
    };
    let all = pythons();
    let py = main_python(&all);
    let dir = common::tempdir();
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    let target = Target::python(
        &py.path,
        "truncating_library.py",
        &[lib.to_str().unwrap(), dir.path().to_str().unwrap()],
    );
    let out_dir = common::tempdir();
    for i in 0..20 {
        let capture = out_dir.path().join(format!("c{i}.mprof"));
        let out = run_with_timeout(
            mprof().args([
                "attach",
                "--pid",
                &target.pid.to_string(),
                "--native",
                "--duration",
                "0.2",
                "-q",
                "-o",
                capture.to_str().unwrap(),
            ]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.signal().is_none() && out.status.success(),
            "{}: attach {i}: {} {err}",
            py.label,
            out.status
        );
        let report = run_with_timeout(mprof().arg("report").arg(&capture), LIMIT);
        let said = String::from_utf8_lossy(&report.stderr);
        assert!(
            report.status.success() && !said.contains("incomplete"),
            "{}: capture {i}: {said}",
            py.label
        );
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let (status, out) = target.finish(LIMIT);
    assert!(
        status.success(),
        "{}: the target: {status} {out:?}",
        py.label
    );
    eprintln!(
        "{}: 20 attach --native under a truncating target: none died; {out:?}",
        py.label
    );
}

/// Point 10: mprof out of file descriptors (`ulimit -n 8`) said "PID … exited during the
/// attach" of a live target (5 of 5). It now says what it lacks before it starts (and raises
/// a soft limit itself when the hard one allows), and the target is untouched.
#[test]
fn too_few_file_descriptors_is_said_not_called_an_exit() {
    let all = pythons();
    let py = main_python(&all);
    let target = Target::python(&py.path, "attach_idle.py", &["sleep"]);
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    for (limit, should_attach) in [("8", false), ("-S 8", true)] {
        let line = format!(
            "ulimit -n {limit}; exec '{}' attach --pid {} --duration 0.2 -q -o '{}'",
            env!("CARGO_BIN_EXE_mprof"),
            target.pid,
            capture.display()
        );
        let out = run_with_timeout(Command::new("sh").args(["-c", &line]), LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("exited"), "ulimit -n {limit}: {err}");
        if should_attach {
            assert!(out.status.success(), "ulimit -n {limit}: {err}");
        } else {
            assert_eq!(out.status.code(), Some(2), "ulimit -n {limit}: {err}");
            assert!(
                err.contains("file descriptors") && err.trim().lines().count() == 1,
                "ulimit -n {limit}: {err}"
            );
        }
    }
    assert!(
        std::fs::metadata(format!("/proc/{}", target.pid)).is_ok(),
        "the target is gone"
    );
}

/// Runs `tests/py/pid_reuse.py` as PID 1 of a new PID namespace (where it alone decides which
/// PID comes next); `None` when no namespace can be made here. Returns its summary line.
fn pid_reuse_run(py: &Python, trials: u32, mprof: bool) -> Option<String> {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(&py.path)
        .arg(script("pid_reuse.py"))
        .arg(&py.path)
        .arg(trials.to_string())
        .arg("7");
    if mprof {
        cmd.arg(env!("CARGO_BIN_EXE_mprof"));
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(600));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text.lines().rev().find(|l| l.starts_with("trials="))?;
    Some(summary.to_string())
}

/// Point 3: the target killed mid-attach and another Python started on its PID at once
/// (forced with `ns_last_pid` in a PID namespace). mprof went on with the PID's number, and
/// hijacked the newcomer's threads with the old process's addresses: 2 of 60 newcomers died
/// of SIGSEGV here (the issue saw 4 of 190), the control 0. Now mprof holds the target by
/// pidfd and its `/proc` directory from the first step, and checks every thread it seizes
/// is the target's: 190 trials on the main interpreter (10 on the others), no newcomer harmed.
#[test]
fn a_pid_reused_during_the_attach_is_never_touched() {
    if common::tier::full_tier_only(
        "a_pid_reused_during_the_attach_is_never_touched",
        "190 kills and PID reuses during an attach",
    ) || !common::tier::root("PID reuse", "a PID namespace and its ns_last_pid")
    {
        return;
    }
    let all = pythons();
    let main = main_python(&all);
    let Some(control) = pid_reuse_run(&main, 20, false) else {
        common::tier::skip_here(
            "PID reuse",
            "no PID namespace can be made here (unshare --pid)",
        );
        return;
    };
    assert!(control.ends_with("harmed=0"), "control: {control}");
    for py in &all {
        let trials = if py.label == main.label { 190 } else { 10 };
        let summary = pid_reuse_run(py, trials, true).expect("summary");
        eprintln!("{}: {summary} (control: {control})", py.label);
        assert!(summary.ends_with("harmed=0"), "{}: {summary}", py.label);
        let reused: u32 = summary
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("reused="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            reused * 2 > trials,
            "{}: too few PIDs reused: {summary}",
            py.label
        );
    }
}
