//! `mprof attach --pid PID`: load the agent into a running CPython process, sample it into a
//! capture file, then switch the agent off and leave the process running as before.
//!
//! The injection itself lives in `mprof_injector::inject`; this module drives it, owns the ring
//! (made in the target's own memory file), and runs the same reader as `record`.

use crate::base::signals::{self, Handler};
use crate::capture::file::CaptureWriter;
use crate::sessions::children::{Children, Rendezvous};
use crate::sessions::continuous::{Continuous, ContinuousArgs};
use crate::sessions::driver::{Followed, Session, Watch};
use crate::sessions::hints;
use crate::sessions::procfs::{arguments, command_line};
use crate::sessions::reader::{Reader, RingMem};
use crate::sessions::sampling::SamplingArgs;
use crate::views::live::{self, Closed};
use crate::views::report;
use anyhow::{bail, Context, Result};
use mprof_common::record::Record;
use mprof_common::ring::{STATE_ACTIVE, STATE_FAILED, STATE_STOPPED};
use mprof_injector::inject::{Injector, Liveness};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long the agent may take to acknowledge a detach.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// How long an allocating target gets to notice a detach request by itself.
const SELF_STOP_WAIT: Duration = Duration::from_millis(50);

static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many stop signals came: one more during a detach gives up waiting for its safe point.
static STOP_SIGNALS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
    STOP_SIGNALS.fetch_add(1, Ordering::Relaxed);
}

/// Whether a stop signal came after `count` had come: what ends a safe-point search begun
/// then (an attach is given up with nothing changed; a detach leaves the stop request to the
/// agent's next sample).
fn stopped_since(count: u32) -> impl Fn() -> bool {
    move || STOP_SIGNALS.load(Ordering::Relaxed) > count
}

/// Notes SIGINT, SIGTERM, SIGHUP and SIGQUIT instead of dying from them: a Ctrl-C (from the
/// terminal or `kill`) ends sampling and detaches cleanly, and never cuts an injection in half.
fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: on_stop_signal only stores into an atomic: async-signal-safe.
        unsafe { signals::set_handler(sig, Handler::Plain(on_stop_signal)) };
    }
}

fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}

/// An agent running in the target, writing into `ring`.
struct Attached {
    ring: RingMem,
    liveness: Liveness,
    took: Duration,
    how: String,
}

/// Loads (or reuses) the agent in `pid` and starts a session on a fresh ring.
fn inject(
    injector: Injector,
    sampling: &SamplingArgs,
    started: Instant,
    timeout: Duration,
    rendezvous: Option<&str>,
) -> Result<Attached> {
    let pid = injector.pid();
    // Decided before anything changes in the target: a target too close to its address-space
    // limit is refused as it is.
    let data_size = crate::sessions::reader::ring_data_size(
        sampling.rate,
        crate::sessions::reader::address_space_headroom(pid),
    )
    .map_err(|why| anyhow::anyhow!("cannot attach to PID {pid}: {why}"))?;
    let liveness = injector.liveness();
    let reused = injector.agent_loaded();
    let mut prepared = injector.prepare(timeout, &stopped_since(0))?;
    let (tid, _) = prepared.chosen();
    let how = match prepared.chosen_in_syscall() {
        Some(call) => format!("thread {tid}, blocked in {call}"),
        None => format!("thread {tid}, running"),
    };
    let fd = prepared.take_ring_fd().context("the ring's descriptor")?;
    let ring = RingMem::from_fd(fd, sampling, data_size)?;
    if let Some(name) = rendezvous {
        // Processes it forks while attached hand their rings there (see crate::sessions::children).
        ring.set_rendezvous(name);
    }
    let beat = || ring.heartbeat();
    beat();
    let launched = prepared.launch()?;
    let outcome = loop {
        beat();
        if let Some(outcome) = launched.poll()? {
            break outcome;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let state = ring.state()?;
    if state == STATE_FAILED || outcome.start_ret != 0 {
        let message = ring.message();
        if message.contains("already running") {
            bail!(
                "PID {pid} is already being profiled (by another mprof attach, mprof record, or \
                 pymprof inside the program)"
            );
        }
        let why = if message.is_empty() {
            format!("start returned {}", outcome.start_ret)
        } else {
            message
        };
        bail!("the mprof agent could not start in PID {pid}: {why}");
    }
    if state != STATE_ACTIVE {
        bail!("the mprof agent in PID {pid} is not active (ring state {state})");
    }
    let how = if reused {
        format!("{how}; agent reused")
    } else {
        how
    };
    Ok(Attached {
        ring,
        liveness,
        took: started.elapsed(),
        how,
    })
}

/// Why sampling ended.
enum Ending {
    Duration,
    Signal,
    TargetExited,
    AgentStopped,
}

/// What ends an attached session besides the target: the duration, a stop signal or the
/// live view closing, the target's exit, the agent stopping by itself.
struct Attachment<'a> {
    a: &'a Attached,
    until: Option<Instant>,
}

impl Watch for Attachment<'_> {
    type Ending = Ending;

    fn check(&mut self, _: &mut Session, closed: Option<Closed>) -> Result<Option<Ending>> {
        if closed.is_some() || stop_signal().is_some() {
            return Ok(Some(Ending::Signal));
        }
        if self.until.is_some_and(|t| Instant::now() >= t) {
            return Ok(Some(Ending::Duration));
        }
        if !self.a.liveness.alive() {
            return Ok(Some(Ending::TargetExited));
        }
        if self.a.ring.state()? != STATE_ACTIVE {
            return Ok(Some(Ending::AgentStopped));
        }
        Ok(None)
    }
}

/// Asks the agent to stop and drains until its END record (bounded). An agent that allocates
/// sees the request at its next sample; for one that does not, mprof injects a call to the
/// agent's stop function.
fn detach(
    reader: &mut Reader<&RingMem>,
    a: &Attached,
    pid: u32,
    timeout: Duration,
) -> Result<bool> {
    a.ring.reader().request_stop();
    if wait_stopped(reader, a, SELF_STOP_WAIT)? {
        return Ok(true);
    }
    if !a.liveness.alive() {
        return Ok(false);
    }
    let signals = STOP_SIGNALS.load(Ordering::Relaxed);
    let launched = Injector::for_stop(pid)
        .and_then(|i| i.prepare(timeout, &stopped_since(signals)))
        .and_then(|p| p.launch());
    match launched {
        Ok(launched) => {
            let start = Instant::now();
            while start.elapsed() < STOP_WAIT {
                reader.pump()?;
                if launched.poll()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // The agent still sees the request at its next sampled allocation.
        Err(e) => crate::say!("mprof: warning: could not stop the agent in PID {pid} at once: {e}"),
    }
    wait_stopped(reader, a, STOP_WAIT)
}

/// Drains until the agent says STOPPED, for at most `limit`.
fn wait_stopped(reader: &mut Reader<&RingMem>, a: &Attached, limit: Duration) -> Result<bool> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let moved = reader.pump()?;
        if a.ring.state()? == STATE_STOPPED {
            while reader.pump()? > 0 {}
            return Ok(true);
        }
        if !a.liveness.alive() {
            break;
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    while reader.pump()? > 0 {}
    Ok(false)
}

/// Attaches to the Python processes under `root` as they are now (`--follow-children`); a
/// process that cannot be attached is skipped with a warning.
fn attach_descendants(
    children: &mut Children,
    root: u32,
    sampling: &SamplingArgs,
    timeout: Duration,
    rendezvous: Option<&str>,
    quiet: bool,
) {
    for (pid, _) in crate::sessions::children::python_descendants(root, 256) {
        let result = follow_by_attach(children, pid, sampling, timeout, rendezvous);
        match result {
            Ok(()) if !quiet => crate::say!("mprof: attached to PID {pid} too (a child of {root})"),
            Ok(()) => {}
            Err(e) => crate::say!("mprof: warning: not following PID {pid}: {e:#}"),
        }
    }
}

/// Attaches to `pid` and follows it in `children` (its ring hands its own children over at
/// `rendezvous`): for `attach --follow-children`, and for the Python processes under a
/// recorded program that did not load the agent (see `crate::sessions::children::Strays`).
pub fn follow_by_attach(
    children: &mut Children,
    pid: u32,
    sampling: &SamplingArgs,
    timeout: Duration,
    rendezvous: Option<&str>,
) -> Result<()> {
    let a = Injector::new(pid)
        .map_err(anyhow::Error::from)
        .and_then(|i| inject(i, sampling, Instant::now(), timeout, rendezvous))?;
    let meta = format!(
        "mode=attach\npid={pid}\nattach_ms={}\npython={}\n",
        a.took.as_millis(),
        a.ring.python_version()
    );
    children.adopt(pid, a.ring, &meta)
}

/// Detaches from every followed process: asks each agent to stop, runs the stop function in
/// those that do not (they allocate nothing), and finishes their captures.
fn detach_children(s: &mut Session, timeout: Duration) -> Result<()> {
    detach_followed(s, None, timeout)
}

/// [`detach_children`] for the followed processes in `only` (all with `None`): a recorded
/// program's processes that loaded the agent themselves stop with it; those mprof attached to
/// are detached.
pub fn detach_followed(s: &mut Session, only: Option<&[u32]>, timeout: Duration) -> Result<()> {
    let Some(f) = s.followed.as_mut() else {
        return Ok(());
    };
    let chosen = |pid: u32| only.is_none_or(|pids| pids.contains(&pid));
    for (_, ring) in f.children.rings().filter(|(pid, _)| chosen(*pid)) {
        ring.reader().request_stop();
    }
    let until = Instant::now() + SELF_STOP_WAIT;
    while Instant::now() < until {
        s.pump_children()?;
        std::thread::sleep(Duration::from_millis(2));
    }
    let Some(f) = s.followed.as_mut() else {
        return Ok(());
    };
    let idle: Vec<u32> = f
        .children
        .rings()
        .filter(|(pid, _)| chosen(*pid))
        .filter(|(_, ring)| ring.state().is_ok_and(|s| s == STATE_ACTIVE || s == 2))
        .map(|(pid, _)| pid)
        .collect();
    let signals = STOP_SIGNALS.load(Ordering::Relaxed);
    for pid in idle {
        let launched = Injector::for_stop(pid)
            .and_then(|i| i.prepare(timeout, &stopped_since(signals)))
            .and_then(|p| p.launch());
        if let Ok(launched) = launched {
            let start = Instant::now();
            while start.elapsed() < STOP_WAIT {
                s.pump_children()?;
                if launched.poll()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    Ok(())
}

/// What became of a target that is no longer the program attached: it exited, or replaced its
/// program (`exec`), which ends the capture too.
fn left_while_attached(liveness: &Liveness, pid: u32) -> String {
    match liveness.left() {
        Some(mprof_injector::AttachError::Execed { from, to, .. }) => format!(
            "mprof: PID {pid} replaced its program while attached ({from} exec'd {to}); the \
             capture ends there"
        ),
        _ => format!("mprof: PID {pid} exited while attached"),
    }
}

/// Whether the target exits within a moment (an agent that stopped by itself usually means the
/// interpreter is shutting down).
fn exits_soon(liveness: &Liveness) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        if !liveness.alive() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// What `mprof attach` was asked to do.
pub struct Options<'a> {
    pub pid: u32,
    /// Seconds to sample (None: until a signal).
    pub duration: Option<f64>,
    /// How long to look for a safe point.
    pub timeout: Duration,
    pub output: &'a Path,
    pub sampling: &'a SamplingArgs,
    pub quiet: bool,
    pub live: bool,
    pub follow_children: bool,
    /// `--every` and where its profiles go.
    pub continuous: &'a ContinuousArgs,
}

/// Attaches to `pid`, samples until `duration` or a signal, detaches and prints the summary.
pub fn run(o: Options) -> Result<ExitCode> {
    crate::base::limits::ensure_descriptors(
        crate::base::limits::SESSION_DESCRIPTORS,
        "mprof attach",
    )?;
    let Options {
        pid,
        duration,
        timeout,
        output,
        sampling,
        quiet,
        live,
        follow_children,
        continuous,
    } = o;
    let started = Instant::now();
    catch_stop_signals();
    if live {
        live::Live::check_terminal()?;
    }
    let capture_limit = continuous.capture_limit();
    let continuous = Continuous::prepare(continuous, sampling.rate)?;
    // Every check that needs no change to the target comes before the capture file exists.
    let injector = hints::noting_a_stale_session(pid, || Injector::new(pid))?;
    let mut capture = CaptureWriter::create(output)?;
    capture.limit(capture_limit);
    let rendezvous = follow_children.then(Rendezvous::listen).transpose()?;
    let children_dir = follow_children
        .then(|| Children::prepare_dir(output))
        .transpose()?;
    let name = rendezvous.as_ref().map(|r| r.name().to_string());
    let attached = inject(injector, sampling, started, timeout, name.as_deref())?;
    // If the attach fails, dropping the capture removes only its temporary file: whatever is
    // at `output` (another session's capture, say) stays.
    capture.place()?;
    let python = attached.ring.python_version();
    capture.write(&Record::Meta {
        text: format!(
            "mode=attach\npid={pid}\nppid={}\n{}start_unix_ms={}\nattach_ms={}\npython={python}\n",
            crate::sessions::procfs::parent_of(pid).unwrap_or(0),
            sampling.meta(),
            crate::base::clock::unix_ms(),
            attached.took.as_millis(),
        ),
    })?;
    // The views show who was profiled: the command line, like record's, and where its code is.
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    let yours =
        crate::analysis::focus::meta_lines(&arguments(pid), cwd.as_deref(), &sampling.focus);
    let command = command_line(pid);
    capture.write(&Record::Meta {
        text: format!("command={}\n{yours}", command.replace('\n', "\\n")),
    })?;
    if !quiet {
        let until = match (duration, live) {
            (Some(s), _) => format!("for {s} s"),
            (None, true) => "until q or Ctrl-C".into(),
            (None, false) => "until Ctrl-C".into(),
        };
        let version = python.split_whitespace().next().unwrap_or("?");
        crate::say!(
            "mprof: attached to PID {pid} (Python {version}) in {} ms ({}); sampling {until}",
            attached.took.as_millis(),
            attached.how
        );
    }
    let followed = match rendezvous.zip(children_dir) {
        Some((rendezvous, children_dir)) => {
            capture.write(&Record::Meta {
                text: crate::capture::processes::children_dir_meta(output),
            })?;
            let mut children = Children::new(children_dir, pid, command, sampling);
            children.limit_captures(capture_limit);
            attach_descendants(
                &mut children,
                pid,
                sampling,
                timeout,
                name.as_deref(),
                quiet,
            );
            Some(Followed {
                rendezvous,
                children,
            })
        }
        None => None,
    };
    let reader = Reader::new(&attached.ring, capture, pid).keep_statm_open();
    // The agent is running: a view that cannot start must not end the session early.
    let focus = crate::analysis::focus::Focus::from_meta_lines(&yours);
    let target = live::Target {
        mode: live::Mode::Attach,
        pid,
        command: command_line(pid),
        rate: sampling.rate,
        capture: output.to_path_buf(),
        program_output: None,
        python_only: sampling.python_only,
        focus,
    };
    let view = match live.then(|| live::Live::start(target)) {
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            crate::say!("mprof: warning: no live view: {e:#}");
            None
        }
        None => None,
    };
    let mut session = Session::new(reader, sampling, view, followed, false);
    session.continuous = continuous.map(|mut c| {
        c.of_process(pid, &arguments(pid));
        c
    });
    let until = duration.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let ending = session.run(&mut Attachment {
        a: &attached,
        until,
    })?;
    session.view = None; // the terminal is restored before anything is printed
    let stopped = match ending {
        Ending::TargetExited | Ending::AgentStopped => {
            session.drain()?;
            true
        }
        Ending::Duration | Ending::Signal => detach(&mut session.reader, &attached, pid, timeout)?,
    };
    let key = if attached.liveness.alive() {
        "detach_unix_ms"
    } else {
        "exit_unix_ms"
    };
    session.reader.capture.write(&Record::Meta {
        text: format!("{key}={}\n", crate::base::clock::unix_ms()),
    })?;
    detach_children(&mut session, timeout)?;
    session.finish(Duration::from_millis(200))?;
    if !quiet {
        if let Some(note) = session.children_note() {
            crate::say!("{note}");
        }
    }
    drop(session);
    match ending {
        Ending::TargetExited => crate::say!("{}", left_while_attached(&attached.liveness, pid)),
        Ending::AgentStopped if exits_soon(&attached.liveness) => {
            crate::say!("{}", left_while_attached(&attached.liveness, pid))
        }
        Ending::AgentStopped => crate::say!("mprof: the agent in PID {pid} stopped by itself"),
        _ if !stopped => crate::say!(
            "mprof: warning: the agent in PID {pid} did not confirm the detach within \
             {STOP_WAIT:?}; it switches itself off at its next sampled allocation"
        ),
        _ => {}
    }
    let note = attached.ring.message();
    if stopped && !note.is_empty() {
        crate::say!("mprof: warning: {note}");
    }
    if !quiet {
        let profile = report::say_summary(output);
        crate::say!("mprof: capture written to {}", output.display());
        if let Some(profile) = profile {
            let allocated = profile.totals().allocated.bytes;
            let children = hints::python_children(pid);
            if let Some(hint) = hints::children_hint(pid, profile.samples, allocated, &children) {
                crate::say!("{hint}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
