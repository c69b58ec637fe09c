//! Shared by the integration tests: the interpreters present on this machine, child-process
//! guards, and running the real mprof binary.

#![allow(dead_code)]

pub mod hostile;
pub mod mixed;
pub mod native;
pub mod otelcol;
pub mod procs;
pub mod tier;
pub mod tmux;
pub mod tools;
pub mod views;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The mprof binary under test.
pub fn mprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mprof"))
}

/// A CPython interpreter found on this machine.
#[derive(Clone, Debug)]
pub struct Python {
    pub label: String,
    pub path: PathBuf,
}

impl Python {
    /// The interpreter's minor version (`3.minor`), as it says itself.
    pub fn minor(&self) -> u8 {
        let out = Command::new(&self.path)
            .args(["-c", "import sys; print(sys.version_info[1])"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

/// The interpreter the long tests use: 3.11 if present (the one Debian ships), else the first.
pub fn main_python(all: &[Python]) -> Python {
    all.iter()
        .find(|p| p.label.contains("3.11"))
        .unwrap_or(&all[0])
        .clone()
}

/// The supported minor versions, 3.8 to 3.13.
pub const SUPPORTED: std::ops::RangeInclusive<u32> = 8..=13;

fn pyenv_root() -> PathBuf {
    std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".pyenv"))
}

/// The newest pyenv-installed 3.minor, if any.
pub fn pyenv_python(minor: u32) -> Option<PathBuf> {
    let versions = std::fs::read_dir(pyenv_root().join("versions")).ok()?;
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = versions
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let patch: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let exe = e.path().join("bin").join(format!("python3.{minor}"));
            exe.is_file().then_some((patch, exe))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// Every supported interpreter present: pyenv's 3.8–3.13 (shared libpython) and Debian's own
/// `/usr/bin/python3` (libpython linked statically). Prints which are skipped and why. In the
/// fast tier ([`tier`]), one of them: pyenv's 3.11 if present, else the first found.
pub fn pythons() -> Vec<Python> {
    let mut out = Vec::new();
    for minor in SUPPORTED {
        match pyenv_python(minor) {
            Some(path) => out.push(Python {
                label: format!("pyenv 3.{minor}"),
                path,
            }),
            None => tier::skip_here(
                &format!("pyenv 3.{minor}"),
                &format!("not installed under {}", pyenv_root().display()),
            ),
        }
    }
    let debian = Path::new("/usr/bin/python3");
    if debian.is_file() {
        out.push(Python {
            label: "debian static python3".into(),
            path: debian.into(),
        });
    } else {
        tier::skip_here("Debian python3", "/usr/bin/python3 not present");
    }
    assert!(!out.is_empty(), "no supported Python interpreter found");
    if tier::fast() {
        out = vec![main_python(&out)];
    }
    let labels: Vec<&str> = out.iter().map(|p| p.label.as_str()).collect();
    let tier = if tier::fast() {
        " (fast tier: one)"
    } else {
        ""
    };
    eprintln!("interpreters tested{tier}: {}", labels.join(", "));
    out
}

/// Whether `py` imports `module`.
pub fn imports(py: &Python, module: &str) -> bool {
    Command::new(&py.path)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `py` imports pyarrow; if not, says that `test` is skipped: a failure in CI for
/// pyenv's 3.11, where tools/test-deps.sh installs it.
pub fn pyarrow_or_skip(py: &Python, test: &str) -> bool {
    if imports(py, "pyarrow") {
        return true;
    }
    if py.label == "pyenv 3.11" {
        tier::skip(
            test,
            "pyarrow not importable (tools/test-deps.sh installs it into pyenv's 3.11)",
        );
    } else {
        tier::skip_here(test, "pyarrow is installed into pyenv's 3.11 only");
    }
    false
}

/// A test's Python script.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// Kills the child when dropped, so a failing test leaves nothing running.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion with a deadline, collecting its output; panics (after killing it)
/// if it hangs.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    use std::process::Stdio;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, timed_out) = (done.clone(), timed_out.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::Acquire) {
                if start.elapsed() > limit {
                    timed_out.store(true, Ordering::Release);
                    procs::signal(pid, 9);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let out = child.wait_with_output().expect("output");
    done.store(true, Ordering::Release);
    watchdog.join().unwrap();
    assert!(
        !timed_out.load(Ordering::Acquire),
        "command hung for {limit:?}: {cmd:?}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `mprof report FILE --json` plus `args`, parsed.
pub fn report_json(capture: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_with_timeout(
        mprof().arg("report").arg(capture).arg("--json").args(args),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("report --json prints JSON")
}

/// The location objects of a `--by function` report, by function name.
pub fn by_function(
    report: &serde_json::Value,
) -> std::collections::HashMap<String, serde_json::Value> {
    report["locations"]
        .as_array()
        .expect("locations array")
        .iter()
        .map(|l| {
            (
                l["function"].as_str().unwrap_or_default().to_string(),
                l.clone(),
            )
        })
        .collect()
}

/// A fresh temporary directory readable by every user (for targets run as `nobody`).
pub fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// `mprof record OPTIONS -o CAPTURE -- PYTHON tests/py/SCRIPT DIR` with `env` added; asserts
/// that it succeeded and returns its output.
pub fn record_script(
    py: &Python,
    options: &[&str],
    env: &[(&str, &str)],
    capture: &Path,
    script_name: &str,
    dir: &Path,
) -> Output {
    let out = run_with_timeout(
        mprof()
            .envs(env.iter().copied())
            .arg("record")
            .args(options)
            .arg("-o")
            .arg(capture)
            .arg("--")
            .arg(&py.path)
            .arg(script(script_name))
            .arg(dir),
        procs::LIMIT,
    );
    assert!(
        out.status.success(),
        "{}: {}",
        py.label,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The rolling profile files (`*.pb.gz`) of `dir`, oldest first: their names sort by time.
pub fn interval_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    files.sort();
    files
}
