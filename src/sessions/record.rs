//! `mprof record`: run a command with the agent preloaded and profile it from its first line.

use crate::base::signals;
use crate::capture::file::CaptureWriter;
use crate::sessions::continuous::{Continuous, ContinuousArgs};
use crate::sessions::driver::{Followed, Session, Watch};
use crate::sessions::reader::{Reader, RingMem};
use crate::sessions::sampling::SamplingArgs;
use crate::views::live::{self, Closed, Live};
use crate::views::report;
use anyhow::{bail, Context, Result};
use mprof_common::record::Record;
use mprof_common::ring::{STATE_FAILED, STATE_WAITING};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::Duration;

/// Finds `program` the way `execvp` would, so that a missing command is reported before
/// anything starts.
fn resolve(program: &str) -> Result<PathBuf> {
    let candidate = Path::new(program);
    if program.contains('/') {
        if candidate.is_file() {
            return Ok(candidate.to_path_buf());
        }
        bail!("command not found: {program}");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("command not found: {program}"))
}

/// Where the program's stdout and stderr go under `--live`: `CAPTURE.out`, beside the capture.
pub fn program_output_path(capture: &Path) -> PathBuf {
    let mut name = capture.as_os_str().to_owned();
    name.push(".out");
    PathBuf::from(name)
}

/// Starts `command`; with `output`, its stdout and stderr go to that file (created private and
/// still pending: the caller puts it in place once the program runs) and its stdin is
/// /dev/null, so that it neither garbles nor reads the live view's terminal.
fn spawn(
    command: &[String],
    ring: &RingMem,
    agent: &std::os::fd::OwnedFd,
    output: Option<&Path>,
    follow: Option<String>,
) -> Result<(Child, Option<crate::base::output::Pending>)> {
    resolve(&command[0])?;
    let mut cmd = Command::new(&command[0]);
    let mut pending = None;
    if let Some(path) = output {
        let (file, p) = crate::base::output::create(
            path,
            "program output",
            crate::base::output::Access::Private,
        )?;
        pending = Some(p);
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
    }
    let saved = std::env::var("LD_PRELOAD").unwrap_or_default();
    // Followed descendants load the agent too, after `close_fds` and from any directory:
    // through mprof's own descriptor, which mprof keeps open while it records.
    let ours = match &follow {
        Some(_) => format!("/proc/{}/fd/{}", std::process::id(), agent.as_raw_fd()),
        None => mprof_injector::agent::inherited_path(agent),
    };
    let preload = if saved.is_empty() {
        ours
    } else {
        format!("{ours}:{saved}")
    };
    if let Some(follow) = follow {
        cmd.env(mprof_common::children::ENV_FOLLOW, follow);
    }
    let child = cmd
        .args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env("MPROF_SAVED_LD_PRELOAD", saved)
        .env("MPROF_RING_FD", ring.fd().as_raw_fd().to_string())
        .env("MPROF_AGENT_FD", agent.as_raw_fd().to_string())
        .spawn()
        .with_context(|| format!("cannot run {}", command[0]))?;
    Ok((child, pending))
}

/// The exit code mprof returns for a child's exit status: its code, or 128+N for signal N.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        _ => 1,
    }
}

/// The Meta lines that say how the program ended: `exit_code=N`, or `exit_signal=N` when a
/// signal killed it (the views say so, see `crate::views::about::ending_text`).
fn exit_meta(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit_code={code}\n"),
        (None, Some(sig)) => format!("exit_signal={sig}\n"),
        _ => String::new(),
    }
}

/// The program's exit status as mprof passes it on: `2`, or `killed by SIGKILL: 137`.
fn status_text(status: ExitStatus) -> String {
    match status.signal() {
        Some(sig) => format!(
            "killed by {}: {}",
            crate::base::signals::name(sig),
            exit_code(status)
        ),
        None => exit_code(status).to_string(),
    }
}

/// What mprof says when the live view closes before the program ends, and does about it.
fn view_closed(closed: Closed, pid: u32, command: &str) {
    match closed {
        Closed::Quit => crate::say!(
            "mprof: live view closed; recording {command} (PID {pid}) until it ends \
             (Ctrl-C stops it)"
        ),
        Closed::Interrupt => {
            crate::say!("mprof: live view closed; interrupting {command} (SIGINT to PID {pid})");
            // SAFETY: kill takes integers and touches no memory. `pid` is our child, not yet
            // reaped (`Program::check` waits for it only after this), so it names no other
            // process.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        }
        Closed::Failed(e) => {
            // The terminal may be gone: a failed write must not end the recording.
            let _ = writeln!(
                std::io::stderr(),
                "mprof: warning: the live view stopped ({e:#}); recording goes on"
            );
        }
    }
}

/// The file name of the program, as the messages name it.
fn command_name(program: &str) -> String {
    let name = Path::new(program).file_name().unwrap_or_default();
    name.to_string_lossy().into_owned()
}

/// What ends a recording: the program's exit. Meanwhile signals sent to mprof alone are
/// passed on to it, and a closed live view is explained (see [`view_closed`]).
struct Program<'a> {
    pid: u32,
    /// The program's peak resident set in bytes, from the kernel when it was reaped.
    max_rss: Option<u64>,
    name: String,
    /// Python children seen, when they are not followed (for the hint at the end).
    unfollowed: Option<crate::sessions::children::Unfollowed>,
    /// Python processes under the program that did not load the agent, when children are
    /// followed: attached to.
    strays: Option<crate::sessions::children::Strays>,
    sampling: &'a SamplingArgs,
    quiet: bool,
}

/// How long an attach to a stray may look for a safe point: the loop drains no ring
/// meanwhile, and the agents give up on a reader silent for 1.5 s. A stray not attached to in
/// time is tried again at the next look.
const STRAY_TIMEOUT: Duration = Duration::from_millis(400);

impl Program<'_> {
    /// Attaches to the strays due (see `crate::sessions::children::Strays`).
    fn follow_strays(&mut self, s: &mut Session) {
        let (Some(strays), Some(f)) = (self.strays.as_mut(), s.followed.as_mut()) else {
            return;
        };
        for pid in strays.due(self.pid, &f.children) {
            let name = f.rendezvous.name().to_string();
            let followed = crate::sessions::attach::follow_by_attach(
                &mut f.children,
                pid,
                self.sampling,
                STRAY_TIMEOUT,
                Some(&name),
            );
            match followed {
                Ok(()) => {
                    strays.attached(pid);
                    if !self.quiet {
                        crate::say!(
                            "mprof: attached to PID {pid}, a Python under the program that did \
                             not load the agent (started with an environment of its own)"
                        );
                    }
                }
                Err(e) => strays.failed(pid, format!("{e:#}")),
            }
        }
    }
}

impl Watch for Program<'_> {
    type Ending = ExitStatus;

    fn check(&mut self, s: &mut Session, closed: Option<Closed>) -> Result<Option<ExitStatus>> {
        let pid = self.pid;
        if let Some(closed) = closed {
            view_closed(closed, pid, &self.name);
        }
        if let Some(sig) = signals::take_forward() {
            if s.view.take().is_some() {
                crate::say!("mprof: live view closed by signal {sig}; passing it on to PID {pid}");
            }
            // SAFETY: kill takes integers and touches no memory; `pid` is our child, not yet
            // reaped (`reap` below comes after), so it names no other process.
            unsafe { libc::kill(pid as i32, sig) };
        }
        if let Some(unfollowed) = self.unfollowed.as_mut() {
            unfollowed.watch(pid, || !s.ring().python_version().is_empty());
        }
        self.follow_strays(s);
        self.reap()
    }
}

impl Program<'_> {
    /// The program's exit status once it has ended, and its peak resident set with it: the
    /// kernel's high-water mark, which no reading every 100 ms can match (a spike between two
    /// readings, a program killed before the next). As `time -v` reports it: the program's
    /// own, or that of a child it waited for if higher.
    fn reap(&mut self) -> Result<Option<ExitStatus>> {
        use std::os::unix::process::ExitStatusExt;
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of the plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: `pid` is our child, reaped only here (std's `Child` is never waited for
            // after the session starts); status and usage are locals.
            let got =
                unsafe { libc::wait4(self.pid as i32, &mut status, libc::WNOHANG, &mut usage) };
            if got == 0 {
                return Ok(None);
            }
            if got < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("waiting for the program");
            }
            // ru_maxrss is in KiB on Linux.
            self.max_rss = u64::try_from(usage.ru_maxrss)
                .ok()
                .and_then(|kib| kib.checked_mul(1024));
            return Ok(Some(ExitStatus::from_raw(status)));
        }
    }
}

/// Runs `command` under the profiler; returns the child's exit status as mprof's. With `live`,
/// a live view shows the allocation sites while the program runs (see `crate::views::live`).
pub fn run(
    command: &[String],
    output: &Path,
    sampling: &SamplingArgs,
    quiet: bool,
    live: bool,
    follow_children: bool,
    continuous: &ContinuousArgs,
) -> Result<ExitCode> {
    crate::base::limits::ensure_descriptors(
        crate::base::limits::SESSION_DESCRIPTORS,
        "mprof record",
    )?;
    let capture_limit = continuous.capture_limit();
    let continuous = Continuous::prepare(continuous, sampling.rate)?;
    if live {
        Live::check_terminal()?;
    }
    let rendezvous = follow_children
        .then(crate::sessions::children::Rendezvous::listen)
        .transpose()?;
    let program_output = live.then(|| program_output_path(output));
    let mut capture = CaptureWriter::create(output)?;
    capture.limit(capture_limit);
    let children_dir = rendezvous
        .as_ref()
        .map(|_| crate::sessions::children::Children::prepare_dir(output))
        .transpose()?;
    let data_size = crate::sessions::reader::ring_data_size(
        sampling.rate,
        crate::sessions::reader::inherited_headroom(),
    )
    .map_err(|why| anyhow::anyhow!("cannot profile under this address-space limit: {why}"))?;
    let ring = RingMem::create(sampling, true, data_size)?;
    let follow = rendezvous.as_ref().map(|r| {
        ring.set_rendezvous(r.name());
        mprof_common::children::follow_env(
            r.name(),
            &mprof_common::children::ChildRing {
                data_size: data_size as u64,
                rate: sampling.rate,
                seed: sampling.seed,
                max_depth: sampling.max_depth,
                config_flags: sampling.config_flags(),
            },
        )
    });
    let agent = mprof_injector::agent::agent_memfd()?;
    signals::install();
    let (mut child, program_output_file) =
        spawn(command, &ring, &agent, program_output.as_deref(), follow)?;
    // Followed children load the agent through this descriptor until the end.
    let agent = rendezvous.is_some().then_some(agent);
    let pid = child.id();
    // The program runs: its capture (and output) take their final names.
    let placed = capture.place().and_then(|()| match program_output_file {
        Some(mut p) => Ok(p.place()?),
        None => Ok(()),
    });
    if let Err(e) = placed {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let command_text = command.join(" ");
    let children = children_dir.map(|dir| {
        let mut children =
            crate::sessions::children::Children::new(dir, pid, command_text.clone(), sampling);
        children.limit_captures(capture_limit);
        children
    });
    let cwd = std::env::current_dir().ok();
    let yours = crate::analysis::focus::meta_lines(command, cwd.as_deref(), &sampling.focus);
    capture.write(&Record::Meta {
        text: format!(
            "mode=record\ncommand={}\npid={pid}\nppid={}\n{}start_unix_ms={}\n{yours}",
            command_text.replace('\n', "\\n"),
            std::process::id(),
            sampling.meta(),
            crate::base::clock::unix_ms()
        ),
    })?;
    if children.is_some() {
        capture.write(&Record::Meta {
            text: crate::capture::processes::children_dir_meta(output),
        })?;
    }
    let view = match program_output.as_ref().map(|out| {
        Live::start(live::Target {
            mode: live::Mode::Record,
            pid,
            command: command_text.clone(),
            rate: sampling.rate,
            capture: output.to_path_buf(),
            program_output: Some(out.clone()),
            python_only: sampling.python_only,
            focus: crate::analysis::focus::Focus::from_meta_lines(&yours),
        })
    }) {
        None => None,
        Some(Ok(view)) => Some(view),
        Some(Err(e)) => {
            // The program runs already: it is recorded on without the view (its output still
            // goes to the file), rather than killed half-way through what it does.
            crate::say!(
                "mprof: warning: no live view: {e:#}; recording goes on, the program's output \
                 is in {}",
                program_output
                    .as_ref()
                    .map_or(String::new(), |o| o.display().to_string())
            );
            None
        }
    };
    let reader = Reader::new(&ring, capture, pid).keep_statm_open();
    let followed = rendezvous
        .zip(children)
        .map(|(rendezvous, children)| Followed {
            rendezvous,
            children,
        });
    let following = followed.is_some();
    let mut session = Session::new(reader, sampling, view, followed, true);
    session.continuous = continuous.map(|mut c| {
        c.of_process(pid, command);
        c
    });
    let mut watch = Program {
        pid,
        name: command_name(&command[0]),
        max_rss: None,
        unfollowed: (!following).then(crate::sessions::children::Unfollowed::default),
        strays: following.then(crate::sessions::children::Strays::default),
        sampling,
        quiet,
    };
    let status = session.run(&mut watch)?;
    // The processes mprof attached to are detached: the program's own stop with it.
    if let Some(strays) = watch
        .strays
        .as_ref()
        .filter(|s| !s.attached_pids().is_empty())
    {
        crate::sessions::attach::detach_followed(
            &mut session,
            Some(strays.attached_pids()),
            STRAY_TIMEOUT * 5,
        )?;
    }
    // The terminal is the user's again before anything is printed; whatever the agent
    // published before the child ended is still in the ring.
    session.drain()?;
    let max_rss = watch
        .max_rss
        .map(|b| format!("max_rss={b}\n"))
        .unwrap_or_default();
    session.reader.capture.write(&Record::Meta {
        text: format!(
            "exit_unix_ms={}\n{max_rss}{}",
            crate::base::clock::unix_ms(),
            exit_meta(status)
        ),
    })?;
    // Children may outlive the program a moment (a pool's workers exiting with it).
    session.finish(Duration::from_secs(2))?;
    let children_note = session.children_note();
    let stopped = session.reader.capture.stopped().cloned();
    drop(session);
    drop(agent);
    let state = ring.state()?;
    if state == STATE_FAILED {
        bail!(
            "the agent could not start in {}: {}",
            command[0],
            ring.message()
        );
    }
    let no_python = state == STATE_WAITING;
    if no_python {
        crate::say!(
            "mprof: {} did not start a Python that mprof can profile (CPython 3.8 to 3.13: the \
             mprof agent never ran in it), so nothing was sampled; mprof exits with its status \
             ({})",
            command[0],
            status_text(status)
        );
    }
    if !quiet && !no_python {
        report::say_summary(output);
        crate::say!("mprof: capture written to {}", output.display());
        if let Some(note) = children_note {
            crate::say!("{note}");
        }
        if let Some(u) = &watch.unfollowed {
            for hint in [u.exec_hint(), u.hint(ring.forked_unfollowed())]
                .into_iter()
                .flatten()
            {
                crate::say!("mprof: {hint}");
            }
        }
        if let Some(hint) = watch.strays.as_ref().and_then(|s| s.hint()) {
            crate::say!("mprof: {hint}");
        }
    }
    if let Some(out) = &program_output {
        crate::say!("mprof: the program's output is in {}", out.display());
    }
    if let Some(s) = stopped {
        crate::say!(
            "mprof: warning: the capture stopped at {} ({}): {} of records from then on were \
             lost; the program ran to its end, and its exit status is mprof's",
            crate::base::units::human_bytes(s.kept as f64),
            s.why,
            crate::base::units::human_bytes(s.lost as f64)
        );
    }
    Ok(ExitCode::from(exit_code(status)))
}
