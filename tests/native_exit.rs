//! Native stacks of programs that end (or unload a library) before mprof's reader gets to their
//! samples (`--native`): the agent asks the reader to read its memory map first and waits for
//! the answer, bounded (the map handshake, `common/src/ring.rs`). A program that loads the
//! test's C extension late (`tests/c/native_chain.c`, built `-g -O1`), allocates through it
//! and exits at once is symbolized on every interpreter, run after run; so is one whose mprof
//! is held stopped across its exit (shorter than the agent's patience), and one that unloads
//! the library with `dlclose` before mprof reads a sample of it. A killed or stopped mprof
//! never holds the target beyond the bound: it exits promptly with its own status.
//!
//! This binary makes itself a child subreaper, so that a target whose mprof was killed is
//! reparented to the test, which reads its exit status.

mod common;

use common::mixed::{assert_c_frame, expect, report_stacks, Frame, CHAIN};
use common::native::build_chain;
use common::procs::{signal, touch, wait_line, Target, LIMIT};
use common::{mprof, pythons, record_script, script, Python};
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant};

const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;
/// Runs of the exit race on the main interpreter ([`common::main_python`]) ...
const RUNS: usize = 5;
/// ... and on each of the others, where the handshake is the same code.
const RUNS_ELSEWHERE: usize = 2;
/// The agent waits for a silent reader this long (`injector/agent/src/map_request.rs`), and
/// this long at most for any reader.
const SILENT: Duration = Duration::from_millis(250);
const BOUND: Duration = Duration::from_secs(1);
/// What the workload's "wait" mode exits with.
const STATUS: i32 = 3;
const RECORD: [&str; 4] = ["--native", "--rate", "1", "-q"];

/// Runs `test` on every interpreter with the extension built for it, in a fresh directory:
/// `test(python, directory, extension)`.
fn with_the_extension(mut test: impl FnMut(&Python, &Path, &Path)) {
    for py in pythons() {
        let dir = common::tempdir();
        if let Some(so) = build_chain(&py, dir.path(), &["-g", "-O1"]) {
            test(&py, dir.path(), &so);
        }
    }
}

/// The chain of the workload's `alloc_in_chain`, symbolized: C functions with their DWARF
/// lines from the extension, then the workload's Python frames.
fn assert_symbolized(label: &str, capture: &Path, so: &Path) {
    let (all, _) = report_stacks(capture, &[]);
    let chain = expect(label, &all, &CHAIN);
    for (f, marker) in chain.iter().zip(["level2", "level1", "entry"]) {
        assert_c_frame(label, f, marker, so);
    }
    chain[3..]
        .iter()
        .for_each(|f| assert_workload_frame(label, f));
}

fn assert_workload_frame(label: &str, f: &Frame) {
    assert_eq!(f.kind, "python", "{label}: {f:?}");
    assert!(
        f.file.ends_with("native_exit_workload.py"),
        "{label}: {f:?}"
    );
}

/// A program that loads the extension, allocates through it and exits at once, recorded
/// `--native --rate 1` five times on the main interpreter and twice on every other one: its C
/// frames are symbolized every time.
#[test]
fn a_program_that_loads_a_library_and_exits_at_once_is_symbolized() {
    if common::tier::full_tier_only(
        "a_program_that_loads_a_library_and_exits_at_once_is_symbolized",
        "--native --rate 1 recordings repeated on every interpreter",
    ) {
        return;
    }
    let main = common::main_python(&pythons());
    with_the_extension(|py, dir, so| {
        let runs = if py.label == main.label {
            RUNS
        } else {
            RUNS_ELSEWHERE
        };
        for run in 0..runs {
            let capture = dir.join(format!("r{run}.mprof"));
            record_script(py, &RECORD, &[], &capture, "native_exit_workload.py", dir);
            assert_symbolized(&format!("{} run {run}", py.label), &capture, so);
        }
        eprintln!("{}: {runs} short runs, C frames symbolized", py.label);
    });
}

/// A library loaded with ctypes, allocated through, and unloaded (`dlclose`) at once: the
/// agent has the map read before the library goes, so its frame is symbolized.
#[test]
fn a_library_unloaded_right_after_its_allocation_is_symbolized() {
    if common::tier::full_tier_only(
        "a_library_unloaded_right_after_its_allocation_is_symbolized",
        "--native --rate 1 recordings of dlclose",
    ) {
        return;
    }
    with_the_extension(|py, dir, so| {
        let capture = dir.join("dlclose.mprof");
        record_script(
            py,
            &RECORD,
            &[],
            &capture,
            "native_dlclose_workload.py",
            dir,
        );
        let (all, _) = report_stacks(&capture, &[]);
        let stack = all
            .iter()
            .find(|s| s.iter().any(|f| f.function == "alloc_through_ctypes"))
            .unwrap_or_else(|| panic!("{}: no stack through ctypes", py.label));
        assert_c_frame(&py.label, &stack[0], "level2", so);
        eprintln!("{}: unloaded library symbolized", py.label);
    });
}

/// `mprof record --native --rate 1` of the workload in "wait" mode, as a target (the
/// workload's "ready" line is the test's): returns it and mprof's pid.
fn start_waiting_workload(py: &Python, dir: &Path, capture: &Path) -> (Target, u32) {
    let target = Target::start(
        mprof()
            .arg("record")
            .args(RECORD)
            .arg("-o")
            .arg(capture)
            .arg("--")
            .arg(&py.path)
            .arg(script("native_exit_workload.py"))
            .arg(dir)
            .arg("wait"),
    );
    let mprof_pid = target.guard.0.id();
    (target, mprof_pid)
}

/// Lets the waiting workload load the extension, allocate and reach its exit; stops mprof
/// (SIGSTOP) once the program is in its last atexit handler, and lets the program go on to
/// the interpreter's finalization and the agent's exit wait. Returns when mprof was stopped.
fn stop_mprof_at_the_exit(target: &Target, mprof_pid: u32, dir: &Path) -> Instant {
    touch(dir, "go");
    wait_line(&target.out, "exiting", LIMIT, &mut Vec::new()).expect("the program exits");
    signal(mprof_pid, SIGSTOP);
    let stopped = Instant::now();
    touch(dir, "leave");
    stopped
}

/// mprof stopped (SIGSTOP) just before the program loads the library, and let go once the
/// program is in its exit: without the agent's wait the program would be gone, its map
/// with it. Held for less than the agent's patience, the map is read and the frames are
/// symbolized.
#[test]
fn a_reader_held_up_across_the_exit_still_reads_the_map() {
    if common::tier::full_tier_only(
        "a_reader_held_up_across_the_exit_still_reads_the_map",
        "mprof held stopped across the exit",
    ) {
        return;
    }
    with_the_extension(|py, dir, so| {
        let capture = dir.join("held.mprof");
        let (target, mprof_pid) = start_waiting_workload(py, dir, &capture);
        signal(mprof_pid, SIGSTOP);
        let stopped = Instant::now();
        touch(dir, "leave");
        touch(dir, "go");
        let exiting = wait_line(&target.out, "exiting", LIMIT, &mut Vec::new());
        assert!(exiting.is_some(), "{}: the program never exited", py.label);
        std::thread::sleep(Duration::from_millis(30));
        signal(mprof_pid, SIGCONT);
        let held = stopped.elapsed();
        let (status, _) = target.finish(LIMIT);
        assert_eq!(status.code(), Some(STATUS), "{}: mprof's status", py.label);
        assert!(
            held < SILENT,
            "{}: mprof was held {held:?}, longer than the agent waits for a silent reader; \
             the machine is too slow for this test",
            py.label
        );
        assert_symbolized(&format!("{} (held {held:?})", py.label), &capture, so);
        eprintln!(
            "{}: mprof held {held:?} across the exit, symbolized",
            py.label
        );
    });
}

/// Makes this test process the reaper of its orphaned descendants (a target whose mprof was
/// killed), so that it can read their exit status.
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER");
    });
}

/// Whether `pid` naps as the agent's exit wait does: glibc's `nanosleep`, a relative
/// `clock_nanosleep` on CLOCK_REALTIME (Python's `time.sleep` sleeps on CLOCK_MONOTONIC until
/// an absolute time from 3.11 on, and in `select` before).
fn napping(pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) else {
        return false;
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    matches!(words[..], ["35", ..] | ["230", "0x0", "0x0", ..])
}

/// The exit status of `pid` (a child of this process), waited for up to `limit`.
fn reap(pid: u32, limit: Duration) -> Option<i32> {
    let end = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int into `status`, a live local.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
        if r == pid as i32 {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// mprof stopped as the program reaches its exit, then SIGKILLed while the program waits for
/// the map to be read: the program still exits within the agent's bound, with its own status.
/// The program waits only while mprof's last heartbeat is under 250 ms old, and finalization
/// at `--rate 1 --native` can take most of that on a loaded machine: a run in which it reached
/// its exit too late to wait is run again (it must still exit, with its status), up to
/// `TRIES` runs, of which one must have been killed during the wait.
#[test]
fn a_killed_mprof_never_holds_the_target_at_its_exit() {
    const TRIES: usize = 6;
    become_subreaper();
    with_the_extension(|py, dir, _| {
        for attempt in 1..=TRIES {
            let capture = dir.join(format!("k{attempt}.mprof"));
            for name in ["go", "leave"] {
                let _ = std::fs::remove_file(dir.join(name));
            }
            let (mut target, mprof_pid) = start_waiting_workload(py, dir, &capture);
            let stopped = stop_mprof_at_the_exit(&target, mprof_pid, dir);
            while !napping(target.pid) && stopped.elapsed() < SILENT {
                std::thread::sleep(Duration::from_millis(1));
            }
            let waited = napping(target.pid);
            signal(mprof_pid, SIGKILL);
            let killed = Instant::now();
            target.guard.0.wait().unwrap();
            let status = reap(target.pid, Duration::from_secs(10));
            let took = killed.elapsed();
            assert_eq!(
                status.map(|s| (libc::WIFEXITED(s), libc::WEXITSTATUS(s))),
                Some((true, STATUS)),
                "{}: the program's status after its mprof was killed",
                py.label
            );
            assert!(took < BOUND, "{}: exited {took:?} after the kill", py.label);
            if waited {
                eprintln!(
                    "{}: mprof killed while the program waited (run {attempt}): it exited \
                     {took:?} later, status {STATUS}",
                    py.label
                );
                return;
            }
            eprintln!(
                "{}: run {attempt} reached its exit after mprof's heartbeat was stale (no \
                 wait); exited {took:?} after the kill, status {STATUS}",
                py.label
            );
        }
        panic!("{}: no wait at the exit in {TRIES} runs", py.label);
    });
}

/// mprof stopped as the program reaches its exit and through the whole exit: the program
/// exits all the same, 250 ms after mprof's last heartbeat
/// (a zombie until mprof runs again, whose status is its own), and mprof, let go, finishes
/// its capture and returns the program's status.
#[test]
fn a_stopped_mprof_never_holds_the_target_at_its_exit() {
    if common::tier::full_tier_only(
        "a_stopped_mprof_never_holds_the_target_at_its_exit",
        "mprof held stopped through the exit",
    ) {
        return;
    }
    with_the_extension(|py, dir, _| {
        let capture = dir.join("s.mprof");
        let (target, mprof_pid) = start_waiting_workload(py, dir, &capture);
        let stopped = stop_mprof_at_the_exit(&target, mprof_pid, dir);
        let zombie = loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", target.pid)).unwrap();
            if stat.contains(") Z ") {
                break stat;
            }
            assert!(
                stopped.elapsed() < Duration::from_secs(10),
                "{}: the program did not exit while mprof was stopped",
                py.label
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let exited = stopped.elapsed();
        // Field 52 of a zombie's stat: its status as waitpid reports it.
        let code: i32 = zombie.rsplit(' ').next().unwrap().trim().parse().unwrap();
        assert_eq!(code >> 8, STATUS, "{}: {zombie}", py.label);
        assert!(
            exited < BOUND,
            "{}: the program took {exited:?} to exit with its mprof stopped",
            py.label
        );
        signal(mprof_pid, SIGCONT);
        let (status, _) = target.finish(LIMIT);
        assert_eq!(status.code(), Some(STATUS), "{}", py.label);
        let (all, _) = report_stacks(&capture, &[]);
        assert!(!all.is_empty(), "{}: the capture is readable", py.label);
        eprintln!(
            "{}: mprof stopped across the exit: the program exited {exited:?} after the stop",
            py.label
        );
    });
}
