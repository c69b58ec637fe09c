//! Target processes and `mprof attach` runs, for the attach tests: each one is killed when
//! its guard is dropped, and every wait has a deadline.

use super::{mprof, run_with_timeout, script, ChildGuard};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// A small deterministic generator, so a failing trial can be replayed from its seed.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The deadline of every wait.
pub const LIMIT: Duration = Duration::from_secs(60);
const SIGINT: i32 = 2;

/// Sends `sig` to the process `pid` (one the test started, or a child of one).
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill takes two integers and touches no memory of this process, so no pid or
    // signal can make the call unsound; the tests pass pids of processes they started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Lines a child writes on one of its pipes, as they come.
pub fn lines(pipe: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line containing `needle` within `limit`, keeping the others in `seen`.
pub fn wait_line(
    rx: &Receiver<String>,
    needle: &str,
    limit: Duration,
    seen: &mut Vec<String>,
) -> Option<String> {
    let end = Instant::now() + limit;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return Some(line),
            Ok(line) => seen.push(line),
            Err(_) => return None,
        }
    }
    None
}

/// A target process: a Python script that printed "ready PID ...".
pub struct Target {
    pub guard: ChildGuard,
    pub pid: u32,
    pub ready: Vec<String>,
    pub out: Receiver<String>,
}

impl Target {
    pub fn start(cmd: &mut Command) -> Target {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn target");
        let out = lines(child.stdout.take().unwrap());
        let guard = ChildGuard(child);
        let line = wait_line(&out, "ready", LIMIT, &mut Vec::new()).expect("target never ready");
        let ready: Vec<String> = line.split_whitespace().map(String::from).collect();
        Target {
            guard,
            pid: ready[1].parse().unwrap(),
            ready,
            out,
        }
    }

    pub fn python(py: &Path, script_name: &str, args: &[&str]) -> Target {
        Target::start(Command::new(py).arg(script(script_name)).args(args))
    }

    /// Waits for the target to exit; its status and everything it printed since "ready".
    pub fn finish(mut self, limit: Duration) -> (ExitStatus, Vec<String>) {
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.guard.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < end,
                "target {} did not finish in {limit:?}",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = Vec::new();
        while let Ok(line) = self.out.recv_timeout(Duration::from_secs(2)) {
            out.push(line);
        }
        (status, out)
    }

    pub fn alive(&mut self) -> bool {
        self.guard.0.try_wait().unwrap().is_none()
    }

    pub fn maps(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap_or_default()
    }
}

/// `attach_workload.py` running under `py` (it waits for files in `dir`), with `mprof attach
/// --rate 1` attached to it and writing `capture` in `dir`. Fields drop in order: the
/// processes are killed before the directory goes.
pub struct AttachedWorkload {
    pub target: Target,
    pub attach: Attach,
    pub capture: std::path::PathBuf,
    pub dir: tempfile::TempDir,
}

pub fn attached_workload(py: &Path) -> AttachedWorkload {
    let dir = super::tempdir();
    let capture = dir.path().join("c.mprof");
    let target = Target::python(py, "attach_workload.py", &[dir.path().to_str().unwrap()]);
    let mut attach = Attach::start(
        target.pid,
        &["--rate", "1", "-o", capture.to_str().unwrap()],
    );
    attach.attached();
    AttachedWorkload {
        target,
        attach,
        capture,
        dir,
    }
}

/// A running `mprof attach`, its stderr read line by line.
pub struct Attach {
    pub guard: ChildGuard,
    pub err: Receiver<String>,
    pub seen: Vec<String>,
    pub started: Instant,
}

impl Attach {
    pub fn start(pid: u32, args: &[&str]) -> Attach {
        Attach::start_cmd(
            mprof()
                .arg("attach")
                .arg("--pid")
                .arg(pid.to_string())
                .args(args),
        )
    }

    pub fn start_cmd(cmd: &mut Command) -> Attach {
        let started = Instant::now();
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mprof");
        let err = lines(child.stderr.take().unwrap());
        Attach {
            guard: ChildGuard(child),
            err,
            seen: Vec::new(),
            started,
        }
    }

    /// Waits for "attached"; returns the time from the command's start.
    pub fn attached(&mut self) -> Duration {
        let line = wait_line(&self.err, "attached to PID", LIMIT, &mut self.seen);
        let took = self.started.elapsed();
        self.seen
            .push(line.unwrap_or_else(|| panic!("mprof did not attach: {:?}", self.seen)));
        took
    }

    /// Waits for mprof to exit; its status and stderr.
    pub fn finish(mut self) -> (ExitStatus, String) {
        let end = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.guard.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < end, "mprof attach hung: {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(line) = self.err.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }

    pub fn detach(self) -> String {
        signal(self.guard.0.id(), SIGINT);
        let (status, err) = self.finish();
        assert!(status.success(), "mprof attach failed ({status}): {err}");
        err
    }
}

pub fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").unwrap();
}

pub fn wait_file(path: &Path, limit: Duration) {
    let end = Instant::now() + limit;
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `mprof attach` run to completion with its output.
pub fn attach_once(pid: u32, args: &[&str]) -> (ExitStatus, String) {
    let out = run_with_timeout(
        mprof()
            .arg("attach")
            .arg("--pid")
            .arg(pid.to_string())
            .args(args),
        LIMIT,
    );
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cmd`, run as `nobody` (uid and gid 65534, no supplementary groups) through `setpriv`.
pub fn as_nobody(cmd: &Command) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    c
}

/// Whether the tests run as root (the hostile-target tests need to).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// The milliseconds an attach took, from mprof's "attached to PID ... in N ms" line.
pub fn attached_ms(err: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.contains("attached to PID"))
        .expect("attached line");
    let ms = line
        .split(" in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap();
    ms.parse().unwrap()
}
