//! What happens to the target when things go wrong on mprof's side: mprof killed at any moment
//! of an attach must never harm the target.

mod common;

use common::procs::Lcg;
use common::{mprof, pythons, script, ChildGuard, Python};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The unprofiled output of the kill target, and a step count that keeps it busy for a while.
fn baseline(py: &Python, mode: &str, steps: u32) -> String {
    let out = Command::new(&py.path)
        .arg(script("kill_target.py"))
        .args([mode, &steps.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: baseline failed", py.label);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.starts_with("done"))
        .expect("done line")
        .to_string()
}

/// How far an attach had got when mprof was killed, read from the target's mappings.
fn stage(pid: u32) -> &'static str {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    if maps.contains("mprof-ring") {
        "sampling"
    } else if maps.contains("mprof-agent") {
        "agent loaded"
    } else if maps
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("rwxp"))
    {
        "region mapped"
    } else {
        "nothing injected"
    }
}

struct Trial {
    label: String,
    mode: &'static str,
    delay_us: u64,
    seed: u64,
}

/// Runs one trial; returns how far the attach got, or what harm was done.
fn trial(py: &Python, t: &Trial, steps: u32, expected: &str) -> Result<&'static str, String> {
    let mut target = ChildGuard(
        Command::new(&py.path)
            .arg(script("kill_target.py"))
            .args([t.mode, &steps.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(target.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "{line}");
    let pid = target.0.id();
    let dir = tempfile::tempdir().unwrap();
    let mut attach = ChildGuard(
        mprof()
            .args([
                "attach",
                "--pid",
                &pid.to_string(),
                "-q",
                "--rate",
                "4096",
                "-o",
            ])
            .arg(dir.path().join("c.mprof"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_micros(t.delay_us));
    let _ = attach.0.kill();
    let _ = attach.0.wait();
    let reached = stage(pid);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = target.0.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{} hung after mprof was killed", t.label));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    target
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    if !status.success() || rest.trim() != expected {
        return Err(format!(
            "{} {} (seed {}, mprof killed {} µs after start, {reached}): {status}, printed {:?}, \
             expected {expected:?}, stderr {err:?}",
            t.label,
            t.mode,
            t.seed,
            t.delay_us,
            rest.trim()
        ));
    }
    Ok(reached)
}

/// mprof SIGKILLed at random moments of an attach (most of them in the first milliseconds,
/// while it injects): 210 trials across every interpreter, busy and idle targets. Every target
/// must finish with exactly the output of an unprofiled run and exit 0.
#[test]
fn killing_mprof_at_any_moment_never_harms_the_target() {
    if common::tier::full_tier_only(
        "killing_mprof_at_any_moment_never_harms_the_target",
        "210 SIGKILLs at random moments",
    ) {
        return;
    }
    let pys = pythons();
    let seed: u64 = std::env::var("MPROF_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x006d_7072_6f66);
    let trials_total: usize = std::env::var("MPROF_KILL_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(210);
    eprintln!("kill trials: {trials_total}, seed {seed} (MPROF_KILL_SEED / MPROF_KILL_TRIALS)");
    let mut rng = Lcg(seed);
    let mut plans = Vec::new();
    for i in 0..trials_total {
        let py = &pys[i % pys.len()];
        let mode = if (i / pys.len()).is_multiple_of(2) {
            "busy"
        } else {
            "idle"
        };
        let trial_seed = rng.next();
        // Three in four kills land in the first 12 ms, where the injection happens.
        let delay_us = if trial_seed.is_multiple_of(4) {
            trial_seed % 40_000
        } else {
            trial_seed % 12_000
        };
        plans.push((
            py.clone(),
            Trial {
                label: py.label.clone(),
                mode,
                delay_us,
                seed: trial_seed,
            },
        ));
    }
    // Expected outputs, computed once per interpreter and mode.
    let steps = 3000;
    let mut expected = std::collections::HashMap::new();
    for py in &pys {
        for mode in ["busy", "idle"] {
            expected.insert((py.label.clone(), mode), baseline(py, mode, steps));
        }
    }
    let mut stages = std::collections::BTreeMap::<&str, usize>::new();
    let mut harmed = Vec::new();
    // Two trials at a time: the machine is busy, as a production host would be.
    for pair in plans.chunks(2) {
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = pair
                .iter()
                .map(|(py, t)| {
                    let want = &expected[&(py.label.clone(), t.mode)];
                    s.spawn(move || trial(py, t, steps, want))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            match r {
                Ok(stage) => *stages.entry(stage).or_default() += 1,
                Err(e) => harmed.push(e),
            }
        }
    }
    eprintln!(
        "stage reached when mprof was killed: {stages:?}; harmed targets: {}",
        harmed.len()
    );
    assert!(harmed.is_empty(), "harmed targets:\n{}", harmed.join("\n"));
    assert!(
        stages.get("nothing injected").copied().unwrap_or(0) < trials_total,
        "no kill landed during an injection: the test proves nothing"
    );
}

/// A running static python whose executable was deleted (every running Debian python3 after
/// a package upgrade): root attaches and samples it; an unprivileged user, who cannot read
/// the deleted file, gets a message that says why.
#[test]
fn attach_to_an_interpreter_whose_file_was_deleted() {
    use common::procs::{as_nobody, attach_once, Target};
    let debian = std::path::Path::new("/usr/bin/python3.11");
    let test = "deleted-executable test";
    if !common::tier::root(test, "the target runs as nobody") {
        return;
    }
    if !debian.is_file() {
        common::tier::skip_here(test, "needs Debian's /usr/bin/python3.11");
        return;
    }
    let dir = common::tempdir();
    let copy = dir.path().join("python3.11");
    // Copied by another process: a file this (multi-threaded) test process held open for
    // writing could be inherited by a child another test forks meanwhile, and exec'ing the
    // copy would then fail with ETXTBSY.
    assert!(Command::new("cp")
        .arg(debian)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    let code = "import os, time\nprint('ready', os.getpid(), flush=True)\n\
                while True:\n    x = [bytearray(1000) for _ in range(100)]\n    time.sleep(0.01)\n";
    let target = Target::start(Command::new(&copy).args(["-c", code]));
    let nobody_target = Target::start(&mut as_nobody(Command::new(&copy).args(["-c", code])));
    std::fs::remove_file(&copy).unwrap();
    let exe = std::fs::read_link(format!("/proc/{}/exe", target.pid)).unwrap();
    assert!(exe.to_string_lossy().ends_with(" (deleted)"), "{exe:?}");

    let capture = dir.path().join("c.mprof");
    let (status, err) = attach_once(
        target.pid,
        &["--duration", "0.5", "-o", capture.to_str().unwrap()],
    );
    assert!(status.success(), "{err}");
    assert!(err.contains("attached to PID"), "{err}");
    // ... and sampled it: the loop's bytearrays are in the capture.
    let json = common::report_json(&capture, &["--top", "0"]);
    assert!(
        json["totals"]["allocated"]["bytes"].as_u64().unwrap_or(0) > 0,
        "no samples from the deleted interpreter: {json}"
    );

    // As nobody, attaching to nobody's own process (allowed: no Yama here, or scope 0).
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    if scope.trim().is_empty() || scope.trim() == "0" {
        let out = common::run_with_timeout(
            as_nobody(
                mprof()
                    .args(["attach", "--pid", &nobody_target.pid.to_string(), "-o"])
                    .arg(dir.path().join("n.mprof")),
            )
            .current_dir(dir.path()),
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("was deleted or replaced") && err.contains("needs root"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    } else {
        common::tier::skip_here(
            "unprivileged half",
            &format!("kernel.yama.ptrace_scope is {}", scope.trim()),
        );
    }
}

/// Two attaches to one PID at the same moment, writing the same capture: one wins, the loser
/// says that another tracer or session got there first (not "stopped", not "permission
/// denied" as root), and the winner's capture survives the loser.
#[test]
fn concurrent_attaches_to_one_pid() {
    if common::tier::full_tier_only(
        "concurrent_attaches_to_one_pid",
        "a race repeated six times",
    ) {
        return;
    }
    use common::procs::Target;
    let pys = pythons();
    let py = pys
        .iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&pys[0]);
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..6u64 {
        let target = Target::python(&py.path, "kill_target.py", &["idle", "400000"]);
        let dir = common::tempdir();
        let capture = dir.path().join("same.mprof");
        let run = || {
            mprof()
                .args([
                    "attach",
                    "--pid",
                    &target.pid.to_string(),
                    "--duration",
                    "1",
                    "-q",
                ])
                .arg("-o")
                .arg(&capture)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        // The second one starts 0 to 25 ms later: the loser meets the winner at each stage.
        let a = run();
        std::thread::sleep(Duration::from_millis(round * 5));
        let b = run();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let wins = [&a, &b].iter().filter(|o| o.status.success()).count();
        assert_eq!(wins, 1, "round {round}: {wins} winners: {a:?} {b:?}");
        let loser = if a.status.success() { &b } else { &a };
        let err = String::from_utf8_lossy(&loser.stderr).trim().to_string();
        assert_eq!(err.lines().count(), 1, "round {round}: {err}");
        assert!(
            err.contains("already being profiled")
                || err.contains("already traced by PID")
                || err.contains("being traced by another process"),
            "round {round}: loser said {err:?}"
        );
        assert!(
            !err.contains("stopped") && !err.contains("permission denied"),
            "{err}"
        );
        let out =
            common::run_with_timeout(mprof().arg("report").arg(&capture), Duration::from_secs(60));
        assert!(
            out.status.success(),
            "round {round}: the winner's capture is gone or damaged: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let key = err
            .split(':')
            .next_back()
            .unwrap_or("")
            .trim()
            .chars()
            .take(40)
            .collect();
        *outcomes.entry(key).or_default() += 1;
        drop(target);
    }
    eprintln!("losers said: {outcomes:?}");
}

/// A hostile target running as `nobody` swaps every mprof memory file it holds for an O_PATH
/// descriptor of a root-only file, racing root's attach: mprof never writes through such a
/// descriptor (it takes the target's descriptors with pidfd_getfd and checks them), so the
/// root-only file is never touched, and the target comes to no harm it did not ask for. The
/// target reports each swap it made, and the test asserts that the attack took place for every
/// interpreter (a swap, or mprof's "interfered" refusal), not only that the file survived.
#[test]
fn a_target_that_swaps_its_descriptors_cannot_make_root_write_a_file() {
    use common::procs::{attach_once, Target};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !common::tier::root("descriptor-swap attack", "mprof as root, target as nobody") {
        return;
    }
    let pys = pythons();
    let dir = common::tempdir();
    let victim = dir.path().join("root-only");
    let content = b"root's precious data\n".repeat(100);
    std::fs::write(&victim, &content).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&victim).unwrap();
    let hostile = dir.path().join("hostile_fd_swap.py");
    std::fs::copy(script("hostile_fd_swap.py"), &hostile).unwrap();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for py in &pys {
        let mut cmd = Command::new(&py.path);
        cmd.arg(&hostile).arg(&victim);
        let target = Target::start(&mut cmd);
        // The target prints "swapped N" for each dup2 over one of mprof's memory files. The
        // attack has to have taken place (or mprof saw it and refused) for the test to mean
        // anything; it is a race the target can lose, so attach at least 4 times and until
        // it has happened (at most 30).
        let (mut refused, mut swaps) = (0, 0);
        for round in 0.. {
            if round >= 30 || (round >= 4 && swaps + refused > 0) {
                break;
            }
            let capture = dir.path().join(format!("c{round}.mprof"));
            let (status, err) = attach_once(
                target.pid,
                &["--duration", "0.1", "-q", "-o", capture.to_str().unwrap()],
            );
            let outcome = if status.success() {
                "attached".to_string()
            } else {
                assert_eq!(err.trim().lines().count(), 1, "{}: {err}", py.label);
                // "PID 123 interfered ... (descriptor 4 ...", "the loader of PID 123 refused
                // the mprof agent: ...": keep what does not vary.
                let text = err.split(':').nth(2).unwrap_or(&err).trim();
                text.split_whitespace()
                    .map(|w| {
                        if w.chars().any(|c| c.is_ascii_digit()) {
                            "N"
                        } else {
                            w
                        }
                    })
                    .take(7)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if !status.success() && err.contains("interfered with the attach") {
                refused += 1;
            }
            *outcomes.entry(outcome).or_default() += 1;
            swaps +=
                std::iter::from_fn(|| target.out.recv_timeout(Duration::from_millis(100)).ok())
                    .filter(|l| l.starts_with("swapped "))
                    .count();
        }
        eprintln!(
            "{}: {swaps} descriptor swaps over mprof's memory files, {refused} refusals",
            py.label
        );
        assert!(
            swaps + refused > 0,
            "{}: the target never swapped a descriptor and mprof never refused: no attack took place",
            py.label
        );
        let after = std::fs::metadata(&victim).unwrap();
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            content,
            "{}: victim changed",
            py.label
        );
        assert_eq!(
            (after.len(), after.mtime(), after.mode()),
            (before.len(), before.mtime(), before.mode())
        );
    }
    eprintln!("outcomes of attaching to a descriptor-swapping target: {outcomes:?}");
}

/// The MiB a fill run held before MemoryError, from its "max N" line.
fn held_mib(lines: &[String]) -> u64 {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("max ")?.parse().ok())
        .unwrap_or_else(|| panic!("no max line in {lines:?}"))
}

/// Under an address-space limit (ulimit -v 400 MiB), the ring is sized to fit: a program
/// profiled by `record` or `attach` can hold nearly as much as unprofiled before MemoryError;
/// and a target at its limit is refused, with the reason, and left as it was.
#[test]
fn the_ring_fits_under_an_address_space_limit() {
    use common::procs::{attach_once, touch, wait_line, Attach, Target, LIMIT};
    let all = pythons();
    let py = all
        .iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&all[0]);
    let limit = "400";
    let baseline = {
        let t = Target::python(&py.path, "ulimit_target.py", &["fill", limit]);
        held_mib(&t.finish(LIMIT).1)
    };
    let dir = common::tempdir();
    let out = common::run_with_timeout(
        Command::new("prlimit")
            .arg(format!("--as={}", 400u64 << 20))
            .arg(env!("CARGO_BIN_EXE_mprof"))
            .args(["record", "-q", "-o"])
            .arg(dir.path().join("r.mprof"))
            .arg("--")
            .arg(&py.path)
            .arg(script("ulimit_target.py"))
            .args(["fill", "0"]),
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recorded = held_mib(&text.lines().map(String::from).collect::<Vec<_>>());

    let target = Target::python(
        &py.path,
        "ulimit_target.py",
        &["fill", limit, dir.path().to_str().unwrap()],
    );
    let mut attach = Attach::start(
        target.pid,
        &["-o", dir.path().join("a.mprof").to_str().unwrap()],
    );
    attach.attached();
    touch(dir.path(), "go");
    let (_, lines) = target.finish(LIMIT);
    let attached = held_mib(&lines);
    let _ = attach.finish();
    eprintln!(
        "{}: under ulimit -v {limit} MiB, held before MemoryError: unprofiled {baseline} MiB, \
         record {recorded} MiB, attach {attached} MiB",
        py.label
    );
    assert!(
        recorded * 100 >= baseline * 90,
        "record: {recorded} of {baseline} MiB"
    );
    assert!(
        attached * 100 >= baseline * 90,
        "attach: {attached} of {baseline} MiB"
    );

    // A target with almost nothing left is refused before anything changes in it.
    let mut near = Target::python(&py.path, "ulimit_target.py", &["near", limit]);
    wait_line(&near.out, "full", LIMIT, &mut Vec::new()).expect("target filled up");
    let (status, err) = attach_once(
        near.pid,
        &["-o", dir.path().join("n.mprof").to_str().unwrap()],
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("ulimit -v") && err.contains("address space"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!near.maps().contains("mprof"), "something was injected");
    assert!(near.alive());
}
