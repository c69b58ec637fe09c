//! Races between an attach and what the target does meanwhile, tried as an unlucky operator and
//! as a hostile local user would: the target replaces its program (a setuid one) while root
//! attaches, dies and leaves its PID to another Python, truncates a library it has mapped,
//! loads and unloads libraries from threads, forks while mprof detaches; and a debugger after
//! mprof. Each test counts the processes harmed next to a control run without mprof.
//!
//! Targets are children of the test, killed by their guards; every wait has a deadline.

mod common;

use common::procs::{attach_once, is_root, signal, Target, LIMIT};
use common::{main_python, mprof, pythons, run_with_timeout, script, tools, Python};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// A small deterministic generator, so a failing trial can be replayed from its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

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
/// outcome.
fn exec_trial(py: &Python, rng: &mut Lcg, program: &[&str], attach: bool) -> (ExitStatus, String) {
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
    let (status, _) = target.finish(LIMIT);
    (status, said)
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
    if !is_root() {
        eprintln!(
            "SKIPPED setuid exec during attach: needs root (mprof as root, target as nobody)"
        );
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
            let (status, _) = exec_trial(py, &mut rng, &passwd, false);
            assert!(
                status.success(),
                "{}: control {i}: passwd failed: {status}",
                py.label
            );
        }
        let mut said = BTreeMap::<String, usize>::new();
        for i in 0..trials {
            let (status, what) = exec_trial(py, &mut rng, &passwd, true);
            if !status.success() {
                harmed.push(format!("trial {i}: {status} ({what})"));
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
    let all = pythons();
    let py = main_python(&all);
    let mut rng = Lcg(0xe8ec);
    let mut said = BTreeMap::<String, usize>::new();
    for _ in 0..20 {
        let (status, what) = exec_trial(&py, &mut rng, &["/bin/sleep", "sleep", "0.6"], true);
        assert!(status.success(), "{}: sleep failed: {status}", py.label);
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
