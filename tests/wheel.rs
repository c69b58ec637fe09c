//! pymprof, the pip package (`python/`, docs/python.md): the wheel the README's command builds
//! (`tools/build-wheel.sh`: maturin through `python/pyproject.toml`) is one wheel for every
//! CPython 3.8–3.13, loads on glibc 2.28 and older, and, installed into a fresh venv of each
//! interpreter present, runs from there: `mprof record`, `python -m pymprof report`, and the
//! Python tests of `python/tests` (the API, the tracemalloc drop-in, the 1% match with the
//! standard module; all of them, the pytest plugin's too, on 3.8 and 3.13), copied out of the
//! source tree so that only the installed copy can be imported.
//!
//! Needs what `tools/test-deps.sh` installs (maturin, zig, the pytest wheels, in
//! `~/.cache/mprof/pytools`); without it each test prints SKIPPED.

mod common;

use common::{pythons, run_with_timeout, Python};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The venv of Python tools `tools/test-deps.sh` makes, or `None` after saying why the test
/// is skipped.
fn pytools(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MPROF_PYTOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"));
            Some(cache.join("mprof/pytools"))
        })
        .unwrap();
    if dir.join("bin/maturin").is_file() && dir.join("wheels").is_dir() {
        return Some(dir);
    }
    common::tier::skip(
        test,
        &format!(
            "no Python build tools in {} (run tools/test-deps.sh)",
            dir.display()
        ),
    );
    None
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The wheel, built once for this test binary by the README's command.
fn wheel(tools: &Path) -> &'static Path {
    static WHEEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = WHEEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = run_with_timeout(
            Command::new(Path::new(ROOT).join("tools/build-wheel.sh"))
                .arg(dir.path())
                .env("MPROF_PYTOOLS", tools),
            Duration::from_secs(900),
        );
        assert!(
            out.status.success(),
            "building the wheel failed:\n{}",
            text(&out)
        );
        let wheels: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "whl"))
            .collect();
        assert_eq!(wheels.len(), 1, "one wheel: {wheels:?}");
        let wheel = wheels[0].clone();
        (dir, wheel)
    });
    path
}

/// The newest `GLIBC_` symbol version `objdump -T` finds among what `file` needs.
fn newest_glibc(file: &Path) -> (u32, u32) {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "objdump -T {}: {}",
        file.display(),
        text(&out)
    );
    let dump = String::from_utf8_lossy(&out.stdout);
    dump.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|n| n.parse::<u32>());
            Some((parts.next()?.ok()?, parts.next()?.ok()?))
        })
        .max()
        .expect("no GLIBC_ version at all")
}

#[test]
fn the_wheel_serves_every_python_and_loads_on_glibc_2_28() {
    let test = "the_wheel_serves_every_python_and_loads_on_glibc_2_28";
    let Some(tools) = pytools(test) else { return };
    if Command::new("objdump").arg("--version").output().is_err() {
        common::tier::skip(test, "no objdump (binutils, which .ci/run installs)");
        return;
    }
    let wheel = wheel(&tools);
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    // A launcher and a binary, no extension module: one wheel for every CPython 3.
    assert!(
        name.starts_with("pymprof-") && name.ends_with("-py3-none-manylinux_2_28_x86_64.whl"),
        "{name}"
    );
    let dir = tempfile::tempdir().unwrap();
    let unzip = Command::new(tools.join("bin/python"))
        .args(["-m", "zipfile", "-e"])
        .arg(wheel)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(unzip.status.success(), "{}", text(&unzip));
    let version = name.split('-').nth(1).unwrap();
    let binary = dir
        .path()
        .join(format!("pymprof-{version}.data/scripts/mprof"));
    let agent = dir.path().join("libmprof_agent.so");
    std::fs::write(&agent, mprof_injector::agent::AGENT_SO).unwrap();
    for (what, file) in [("the mprof binary", &binary), ("the agent", &agent)] {
        let newest = newest_glibc(file);
        eprintln!(
            "{what}: newest symbol version GLIBC_{}.{}",
            newest.0, newest.1
        );
        assert!(
            newest <= (2, 28),
            "{what} needs GLIBC_{}.{}: it was linked without zig (run tools/test-deps.sh, then \
             `touch src/main.rs && cargo build --release`; see tools/cc-floor.sh)",
            newest.0,
            newest.1
        );
    }
    let auditwheel = tools.join("bin/auditwheel");
    let shown = Command::new(&auditwheel)
        .arg("show")
        .arg(wheel)
        .output()
        .unwrap();
    let said = text(&shown);
    eprintln!("auditwheel show: {said}");
    assert!(
        shown.status.success() && said.contains("manylinux_2_28_x86_64"),
        "{said}"
    );
}

/// Runs `cmd` (with a deadline) and returns its output; `what` names it in a failure.
fn check(cmd: &mut Command, what: &str, failures: &mut Vec<String>) -> Option<Output> {
    let out = run_with_timeout(cmd, Duration::from_secs(600));
    if out.status.success() {
        return Some(out);
    }
    failures.push(format!("{what} failed ({}):\n{}", out.status, text(&out)));
    None
}

/// A command that runs like a user's: no trace of the source tree in its environment.
fn clean(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "PYTHONPATH",
        "PYMPROF_MPROF",
        "PYMPROF_AS_TRACEMALLOC",
        "PYTHONHOME",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Installs the wheel into a fresh venv of `py` and runs everything from it; returns what
/// failed (empty when all passed), or `None` when this interpreter cannot make a venv.
fn in_a_fresh_venv(py: &Python, wheel: &Path, tools: &Path) -> Option<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let made = Command::new(&py.path)
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap();
    if !made.status.success() {
        // pyenv's interpreters make venvs; Debian's needs python3-venv, which .ci/run installs.
        common::tier::skip(
            &py.label,
            &format!("cannot make a venv: {}", text(&made).trim()),
        );
        return None;
    }
    let python = venv.join("bin/python");
    let mut failures = Vec::new();
    let installed = check(
        clean(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-index"])
            .args(["--disable-pip-version-check", "--find-links"])
            .arg(wheel.parent().unwrap())
            .arg("--find-links")
            .arg(tools.join("wheels"))
            .args(["pymprof", "pytest"]),
        "pip install",
        &mut failures,
    );
    installed?;
    // The command, by its name in the venv and through `python -m pymprof`.
    for (cmd, what) in [
        (clean(&venv.join("bin/mprof")), "mprof --version"),
        (clean(&python), "python -m pymprof --version"),
    ] {
        let mut cmd = cmd;
        if what.starts_with("python") {
            cmd.args(["-m", "pymprof"]);
        }
        if let Some(out) = check(cmd.arg("--version"), what, &mut failures) {
            if !String::from_utf8_lossy(&out.stdout).starts_with("mprof ") {
                failures.push(format!("{what} said {}", text(&out)));
            }
        }
    }
    // `mprof record` and `python -m pymprof report` from the venv.
    let script = dir.path().join("alloc.py");
    std::fs::write(
        &script,
        "data = [bytes(5000) for _ in range(4000)]\nprint('done')\n",
    )
    .unwrap();
    let capture = dir.path().join("alloc.mprof");
    let recorded = check(
        clean(&venv.join("bin/mprof"))
            .args(["record", "-q", "-o"])
            .arg(&capture)
            .arg("--")
            .arg(&python)
            .arg(&script),
        "mprof record",
        &mut failures,
    );
    if recorded.is_some() {
        if let Some(out) = check(
            clean(&python)
                .args(["-m", "pymprof", "report", "--json", "--by", "line"])
                .arg(&capture),
            "python -m pymprof report",
            &mut failures,
        ) {
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let top = &report["locations"][0];
            if top["line"] != 1 || !top["file"].as_str().unwrap_or("").ends_with("alloc.py") {
                failures.push(format!("the report's top location is {top}"));
            }
        }
    }
    // The Python tests, from a copy: only the installed pymprof can be imported.
    let tests = dir.path().join("tests");
    copy_dir(&Path::new(ROOT).join("python/tests"), &tests);
    let pytest = |extra: &[&str], env: &[(&str, &str)]| {
        let mut cmd = clean(&python);
        cmd.current_dir(dir.path())
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"])
            .args(extra)
            .env("PYMPROF_EXPECT_INSTALLED", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    };
    // Every test on the oldest and the newest Python. On those between, to keep the suite's
    // time: the installed copy, the API and the 1% match, and the tracemalloc tests on the
    // drop-in; not the plugin's (a dozen pytest runs in subprocesses, the slowest part) nor
    // the tracemalloc tests on the standard module (they test the tests).
    let full = py.label.ends_with("3.8") || py.label.ends_with("3.13");
    let all: &[&str] = if full {
        &["tests"]
    } else {
        &[
            "tests/test_installed.py",
            "tests/test_api.py",
            "tests/test_matches_tracemalloc.py",
        ]
    };
    let suites: [Suite; 2] = [
        (all, &[], "the Python tests"),
        (
            &["tests/test_tracemalloc_compat.py"],
            &[("PYMPROF_AS_TRACEMALLOC", "1")],
            "the tracemalloc tests on pymprof.tracemalloc",
        ),
    ];
    for (args, env, what) in suites {
        if let Some(out) = check(&mut pytest(args, env), what, &mut failures) {
            let said = text(&out);
            let last = said
                .lines()
                .rev()
                .find(|l| l.contains("passed"))
                .unwrap_or("");
            eprintln!("{}: {what}: {}", py.label, last.trim());
        }
    }
    Some(failures)
}

/// A pytest run: its arguments, its environment, and what it is.
type Suite<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "__pycache__" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(name));
        } else {
            std::fs::copy(entry.path(), to.join(name)).unwrap();
        }
    }
}

#[test]
fn installed_in_fresh_venvs_everything_runs_from_the_installed_copy() {
    let test = "installed_in_fresh_venvs_everything_runs_from_the_installed_copy";
    if common::tier::full_tier_only(test, "pip and pytest in a fresh venv of every interpreter") {
        return;
    }
    let Some(tools) = pytools(test) else { return };
    let wheel = wheel(&tools);
    // Two interpreters at a time: most of each one's time is spent waiting on its children.
    let all = pythons();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(py) = all.get(i) else { break };
                let outcome = in_a_fresh_venv(py, wheel, &tools);
                results.lock().unwrap().push((i, py.label.clone(), outcome));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut tested = Vec::new();
    let mut failures = Vec::new();
    for (_, label, outcome) in results {
        let Some(failed) = outcome else { continue };
        tested.push(label.clone());
        failures.extend(failed.into_iter().map(|f| format!("{label}: {f}")));
    }
    eprintln!(
        "pymprof installed and run in fresh venvs of: {}",
        tested.join(", ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    for needed in ["3.8", "3.13"] {
        assert!(
            tested.iter().any(|l| l.ends_with(needed)),
            "no venv of {needed} was tested: {tested:?}"
        );
    }
}
