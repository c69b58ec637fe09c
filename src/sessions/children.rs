//! Following the child processes of a recorded program (`record --follow-children`).
//!
//! mprof listens on an abstract Unix socket (the rendezvous, see `mprof_common::children`).
//! A forked child of a profiled process, or a Python started by exec under the followed tree,
//! makes a ring of its own and sends its descriptor there; mprof takes the sender's pid from
//! the kernel (`SO_PEERCRED`), accepts only descendants of the program it started, checks the
//! memory file (sealed, the size mprof asked for) and drains it into a capture of its own,
//! `CAPTURE.d/PID.mprof`. The views read the program's capture and those of its children
//! together, or one process alone.

use crate::base::output::OutputDir;
use crate::capture::file::CaptureWriter;
use crate::capture::processes::children_dir;
use crate::sessions::procfs::{command_line, parent_of};
use crate::sessions::reader::{Reader, RingMem};
pub use crate::sessions::rendezvous::{Arrival, Rendezvous};
use anyhow::Result;
use mprof_common::children::BORN_FORKED;
use mprof_common::record::Record;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether `pid` descends from `root`.
fn descends_from(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..128 {
        match parent_of(p) {
            Some(parent) if parent == root => return true,
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// Whether `pid` is still running (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')?
                .1
                .split_whitespace()
                .next()
                .map(String::from)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// One followed child being drained.
struct Child {
    pid: u32,
    /// Its capture's file name in the directory (see `processes::capture_name`).
    name: String,
    reader: Reader<Box<RingMem>>,
    announced_version: bool,
    /// Born by a fork (not by exec, nor attached).
    forked: bool,
    /// Readable once the process has exited (`None`: gone before it was admitted, or no
    /// pidfd on this kernel).
    exit: Option<OwnedFd>,
}

/// What happened to the followed children during one [`Children::pump`], for a live view.
pub enum Event<'a> {
    /// A child was admitted (its pid and command line).
    Started(u32, &'a str),
    /// A record went to the capture of child `pid` (as [`Reader::pump_observed`] shows it).
    Record(u32, &'a [u8]),
    /// Child `pid`'s capture is finished: it exited (or the session ended).
    Ended(u32),
    /// The program itself ran a new Python by exec (the same pid): the new program is taken
    /// on as a child (a `Started` with the program's pid follows). What the old program left in
    /// its ring must be drained first, and its capture ended (`crate::sessions::driver`).
    ProgramReplaced(u32),
}

/// The followed children of a recording.
pub struct Children {
    dir: OutputDir,
    root: u32,
    /// The sampling settings, for the children's metadata.
    sampling: crate::sessions::sampling::SamplingArgs,
    live: Vec<Child>,
    done: usize,
    refused: usize,
    /// The program and every child admitted, with the command each ran (what a fork gone
    /// before it was read ran: its parent's); and the program's user.
    commands: std::collections::HashMap<u32, String>,
    root_uid: Option<u32>,
    /// Bytes written to the captures of children already finished.
    written_done: u64,
    /// Forked children that ended without a sample (most often a fork that ran another
    /// program at once): their captures are not kept.
    empty_forks: usize,
    /// How many captures each pid was given: a followed process that runs a new Python by
    /// exec announces itself again, and its new program gets a capture of its own.
    images: std::collections::HashMap<u32, u32>,
    /// When children without a pidfd were last looked up in /proc.
    last_proc_check: Option<Instant>,
    /// The most bytes each child's capture may hold (`--capture-bytes`).
    capture_limit: Option<u64>,
}

/// Most children one recording follows.
const MAX_CHILDREN: usize = 4096;
/// Refused rings said one by one; the others are counted.
const REFUSALS_SHOWN: usize = 3;
/// How often children without a pidfd are looked up in /proc to see whether they ended.
const PROC_CHECK: Duration = Duration::from_millis(100);

fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// A pidfd of `pid`, readable once it exits; `None` if it is gone already (or the kernel has
/// no `pidfd_open`).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    // SAFETY: a fresh descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

impl Children {
    /// Prepares `CAPTURE.d` (see [`OutputDir::prepare`]), before the program starts or the
    /// target is touched, so that a refusal changes nothing.
    pub fn prepare_dir(capture: &Path) -> Result<OutputDir> {
        Ok(OutputDir::prepare(
            &children_dir(capture),
            "children's capture directory",
        )?)
    }

    /// The children of `root`, once its session has started; their captures go to `dir`
    /// (from [`Children::prepare_dir`]), which is kept from now on. `command`: the one `root`
    /// runs (what /proc may not say yet, or any more).
    pub fn new(
        mut dir: OutputDir,
        root: u32,
        command: String,
        sampling: &crate::sessions::sampling::SamplingArgs,
    ) -> Children {
        dir.keep();
        Children {
            dir,
            root,
            sampling: sampling.clone(),
            live: Vec::new(),
            done: 0,
            refused: 0,
            commands: [(root, command)].into(),
            root_uid: uid_of(root),
            written_done: 0,
            empty_forks: 0,
            // The program's own capture is its first program's.
            images: [(root, 1)].into(),
            last_proc_check: None,
            capture_limit: None,
        }
    }

    /// Each child's capture holds `limit` bytes at most (see [`CaptureWriter::limit`]).
    pub fn limit_captures(&mut self, limit: Option<u64>) {
        self.capture_limit = limit;
    }

    /// Takes the rings children handed over, drains every child's ring, and finishes the
    /// captures of children that ended; `observe` sees what happened. Returns the bytes moved.
    pub fn pump(
        &mut self,
        rendezvous: &Rendezvous,
        observe: &mut dyn FnMut(Event),
    ) -> Result<usize> {
        for arrival in rendezvous.arrivals() {
            let live = self.live.iter().position(|c| c.pid == arrival.pid);
            if live.is_some() && arrival.hello.born == BORN_FORKED {
                self.late_fork(arrival);
                continue;
            }
            // A process that announces itself again has run a new program (exec): the stream
            // of its old image is over (its capture is finished), and the new one gets a
            // capture of its own.
            if let Some(at) = live {
                let old = self.live.swap_remove(at);
                self.end(old, true, observe)?;
            } else if arrival.pid == self.root {
                observe(Event::ProgramReplaced(self.root));
            }
            match self.admit(arrival) {
                Ok((pid, command)) => {
                    observe(Event::Started(pid, &command));
                    self.commands.insert(pid, command);
                }
                Err(e) => {
                    // Anyone may connect to the rendezvous: a stream of refusals must not
                    // flood the terminal (the total is in the end note).
                    self.refused += 1;
                    if self.refused <= REFUSALS_SHOWN {
                        crate::say!("mprof: warning: a child's ring was refused: {e:#}");
                    } else if self.refused == REFUSALS_SHOWN + 1 {
                        crate::say!(
                            "mprof: warning: more rings were refused; they are counted at the end"
                        );
                    }
                }
            }
        }
        let exited = self.exited();
        let mut moved = 0;
        for child in &mut self.live {
            let pid = child.pid;
            moved += child
                .reader
                .pump_observed(|b| observe(Event::Record(pid, b)))?;
            child.announce_version()?;
        }
        for pid in exited {
            if let Some(at) = self.live.iter().position(|c| c.pid == pid) {
                let child = self.live.swap_remove(at);
                self.end(child, false, observe)?;
            }
        }
        Ok(moved)
    }

    /// A fork's announcement that arrived after the program the fork ran by exec had announced
    /// itself: a fork's is a pid's first announcement, but the rendezvous takes a message
    /// that was slow to come after one that was ready (`subprocess` on 3.8 and 3.9 forks, the
    /// child announces itself, runs Python by exec at once, and that Python announces itself
    /// too). Its image is over: its capture is made and finished at once, and the live one
    /// is left alone (before, it was ended as if it had run a new program, and what it did
    /// after went unrecorded). Quietly: the live view, and `commands`, know the pid as the
    /// program it runs.
    fn late_fork(&mut self, arrival: Arrival) {
        if self.admit(arrival).is_ok() {
            if let Some(child) = self.live.pop() {
                if let Err(e) = self.end(child, true, &mut |_: Event| {}) {
                    crate::say!("mprof: warning: a child's capture could not be finished: {e:#}");
                }
            }
        }
    }

    /// The children that have exited (their rings still to be drained), from their pidfds
    /// (one `poll` for all), and from /proc now and then for those without one.
    fn exited(&mut self) -> Vec<u32> {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut pids = Vec::new();
        let check_proc = self
            .last_proc_check
            .is_none_or(|t| t.elapsed() >= PROC_CHECK);
        let mut exited = Vec::new();
        for child in &self.live {
            match &child.exit {
                Some(fd) => {
                    fds.push(libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    pids.push(child.pid);
                }
                None if check_proc && !running(child.pid) => exited.push(child.pid),
                None => {}
            }
        }
        if check_proc {
            self.last_proc_check = Some(Instant::now());
        }
        if !fds.is_empty() {
            // SAFETY: poll on our own array of pollfds, without waiting.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
            if ready > 0 {
                let done = fds.iter().zip(&pids).filter(|(f, _)| f.revents != 0);
                exited.extend(done.map(|(_, &pid)| pid));
            }
        }
        exited
    }

    /// Drains an ended child's ring to the end and finishes its capture (`replaced`: its
    /// program ended by running a new one, by exec, whose RSS is not read into it); a forked
    /// child that took no sample loses its capture (see `empty_forks`). Returns whether it was
    /// kept.
    fn end(
        &mut self,
        mut child: Child,
        replaced: bool,
        observe: &mut dyn FnMut(Event),
    ) -> Result<bool> {
        let pid = child.pid;
        if replaced {
            child.reader.program_replaced();
        }
        while child
            .reader
            .pump_observed(|b| observe(Event::Record(pid, b)))?
            > 0
        {}
        let ending = match (replaced, running(pid)) {
            (true, _) => "ended_by=exec\nexit_unix_ms",
            (false, true) => "detach_unix_ms",
            (false, false) => "exit_unix_ms",
        };
        child.reader.capture.write(&Record::Meta {
            text: format!("{ending}={}\n", crate::base::clock::unix_ms()),
        })?;
        child.reader.finish()?;
        observe(Event::Ended(pid));
        if child.forked && child.reader.ring().reader().samples() == 0 {
            let name = std::mem::take(&mut child.name);
            drop(child);
            self.dir.remove(&name);
            // Its name is free again: a fork that runs a Python by exec at once (`spawn`, or
            // `subprocess` before vfork) gives the Python `PID.mprof`.
            if let Some(n) = self.images.get_mut(&pid) {
                *n -= 1;
            }
            self.empty_forks += 1;
            return Ok(false);
        }
        self.written_done += child.reader.capture.written();
        self.done += 1;
        Ok(true)
    }

    /// Starts the capture of a child whose ring arrived: its pid and command line (the caller
    /// decides whether that is the command the pid runs now, see `late_fork`).
    fn admit(&mut self, arrival: Arrival) -> Result<(u32, String)> {
        let Arrival {
            pid,
            uid,
            hello,
            fd,
        } = arrival;
        if !self.belongs(pid, uid, hello.ppid) {
            anyhow::bail!("PID {pid} is not a descendant of PID {}", self.root);
        }
        if self.profiled() >= MAX_CHILDREN {
            anyhow::bail!("more than {MAX_CHILDREN} children: PID {pid} is not profiled");
        }
        let exit = pidfd(pid);
        let ring = Box::new(RingMem::from_child(fd)?);
        let (mut capture, name) = self.new_capture(pid)?;
        let born = if hello.born == BORN_FORKED {
            "fork"
        } else {
            "exec"
        };
        let mut command = command_line(pid);
        // A fork runs its parent's command. Read after the fork, the command line may be
        // another: the child was gone (or a zombie) before it was looked at, or it had run
        // another program by exec already (its memory no longer maps the agent; read after
        // the command line, so a command read before such an exec is kept). Then the
        // parent's, known if the parent is one of the processes followed; the strays' look
        // (`Strays::due`) then sees that the child's command changed.
        if born == "fork" && (command.is_empty() || !has_agent(pid)) {
            command = [Some(hello.ppid), parent_of(pid)]
                .into_iter()
                .flatten()
                .find_map(|parent| self.commands.get(&parent).cloned())
                .unwrap_or_default();
        }
        capture.write(&Record::Meta {
            text: format!(
                "mode=child\npid={pid}\nppid={}\nborn={born}\nroot_pid={}\ncommand={}\n\
                 start_unix_ms={}\n{}{}",
                hello.ppid,
                self.root,
                command.replace('\n', "\\n"),
                crate::base::clock::unix_ms(),
                self.sampling.meta(),
                self.your_code(pid)
            ),
        })?;
        self.live.push(Child {
            pid,
            name,
            reader: Reader::new(ring, capture, pid),
            announced_version: false,
            forked: born == "fork",
            exit,
        });
        Ok((pid, command))
    }

    /// What counts as `pid`'s own code, as metadata lines (see
    /// `crate::analysis::focus::meta_lines`): read from its command line and directory, as the
    /// program's are, so that `report --pid` of a child run as `python -c` or from standard
    /// input counts `<string>` or `<stdin>`.
    fn your_code(&self, pid: u32) -> String {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        crate::analysis::focus::meta_lines(
            &crate::sessions::procfs::arguments(pid),
            cwd.as_deref(),
            &self.sampling.focus,
        )
    }

    /// The capture of the next program `pid` runs (its first, or one it ran by exec since),
    /// made and placed in the directory; with its file name.
    fn new_capture(&mut self, pid: u32) -> Result<(CaptureWriter, String)> {
        let image = self.images.get(&pid).map_or(1, |n| n + 1);
        let name = crate::capture::processes::capture_name(pid, image);
        let mut capture = CaptureWriter::create_in(&self.dir, &name)?;
        capture.limit(self.capture_limit);
        capture.place()?;
        self.images.insert(pid, image);
        Ok((capture, name))
    }

    /// Takes on a process mprof attached itself (a descendant of the root, under `attach
    /// --follow-children`): its capture goes beside the forked children's.
    pub fn adopt(&mut self, pid: u32, ring: RingMem, meta: &str) -> Result<()> {
        let exit = pidfd(pid);
        let (mut capture, name) = self.new_capture(pid)?;
        let command = command_line(pid);
        capture.write(&Record::Meta {
            text: format!(
                "{meta}root_pid={}\nppid={}\ncommand={}\nstart_unix_ms={}\n{}{}",
                self.root,
                parent_of(pid).unwrap_or(0),
                command.replace('\n', "\\n"),
                crate::base::clock::unix_ms(),
                self.sampling.meta(),
                self.your_code(pid)
            ),
        })?;
        self.commands.insert(pid, command);
        self.live.push(Child {
            pid,
            name,
            reader: Reader::new(Box::new(ring), capture, pid),
            announced_version: false,
            forked: false,
            exit,
        });
        Ok(())
    }

    /// The processes being drained, with their rings (to ask them to stop).
    pub fn rings(&self) -> impl Iterator<Item = (u32, &RingMem)> {
        self.live.iter().map(|c| (c.pid, c.reader.ring()))
    }

    /// How full the fullest child's ring is (0 to 1).
    pub fn fill(&self) -> f64 {
        self.rings().map(|(_, r)| r.fill()).fold(0.0, f64::max)
    }

    /// Bytes written to the children's captures so far.
    pub fn written(&self) -> u64 {
        self.written_done
            + self
                .live
                .iter()
                .map(|c| c.reader.capture.written())
                .sum::<u64>()
    }

    /// After the program ended: drains the children still running for up to `grace`, then
    /// finishes every capture.
    pub fn finish(
        &mut self,
        rendezvous: &Rendezvous,
        grace: Duration,
        observe: &mut dyn FnMut(Event),
    ) -> Result<()> {
        let until = Instant::now() + grace;
        while !self.live.is_empty() && Instant::now() < until {
            if self.pump(rendezvous, observe)? == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.pump(rendezvous, observe)?;
        for child in std::mem::take(&mut self.live) {
            self.end(child, false, observe)?;
        }
        Ok(())
    }

    /// Whether the sender `pid` (user `uid`, saying its parent is `ppid`) is one of the
    /// program's descendants. A child that already exited, or whose parent exited, can no
    /// longer be traced back through /proc: it is accepted if it ran as the program's user and
    /// names as its parent the program or a child already admitted, which is gone.
    fn belongs(&self, pid: u32, uid: u32, ppid: u32) -> bool {
        // The program itself, after an exec: its new program.
        if pid == self.root || descends_from(pid, self.root) {
            return true;
        }
        if !self.commands.contains_key(&ppid) || Some(uid) != self.root_uid {
            return false;
        }
        // Its parent is one admitted before, of the program's user. Either it exited already,
        // or it was orphaned: the parent it names exited and it was reparented (a daemon's
        // double fork: `gunicorn --daemon`, python-daemon, `celery multi`), so that it no
        // longer descends from the program by /proc.
        let now = parent_of(pid);
        let gone = !running(pid) && now.is_none();
        let orphaned = now.is_some_and(|p| p != ppid) && !running(ppid);
        gone || orphaned
    }

    /// How many children were profiled.
    pub fn profiled(&self) -> usize {
        self.done + self.live.len()
    }

    /// How many forked children took no sample (their captures were not kept).
    pub fn empty_forks(&self) -> usize {
        self.empty_forks
    }

    /// How many rings handed over were refused (not a descendant, too many children).
    pub fn refused(&self) -> usize {
        self.refused
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Child {
    /// Writes the interpreter's version into the capture once the agent has said it.
    fn announce_version(&mut self) -> Result<()> {
        if self.announced_version {
            return Ok(());
        }
        let version = self.reader.ring().python_version();
        if !version.is_empty() {
            self.announced_version = true;
            self.reader.capture.write(&Record::Meta {
                text: format!("python={version}\n"),
            })?;
        }
        Ok(())
    }
}

/// Python processes under the program that did not load the agent, under `record
/// --follow-children`: one started with an environment of its own (`subprocess.run(...,
/// env={...})`, `env -i python ...`) has no `LD_PRELOAD` to load it. Looked for four times a
/// second; one found twice in a row without the agent is due to be attached to, as `attach
/// --follow-children` attaches to the processes it finds.
#[derive(Default)]
pub struct Strays {
    last: Option<Instant>,
    /// Seen once without the agent, not yet attached to: their command lines.
    seen: std::collections::BTreeMap<u32, String>,
    /// Attached to.
    attached: Vec<u32>,
    /// Not attached to: they ended first, or the attach failed (why).
    missed: std::collections::BTreeMap<u32, (String, Option<String>)>,
    /// Failed attempts at attaching, by pid.
    attempts: std::collections::HashMap<u32, usize>,
}

/// Attempts at attaching to one stray before it counts as missed.
const STRAY_ATTEMPTS: usize = 3;

impl Strays {
    /// The strays under `root` to attach to now (at most four times a second). `children`
    /// spares the look at the memory of a process it follows that still runs the command it
    /// was followed with.
    pub fn due(&mut self, root: u32, children: &Children) -> Vec<u32> {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(250))
        {
            return Vec::new();
        }
        self.last = Some(Instant::now());
        let pythons = python_descendants(root, 256);
        let now: std::collections::BTreeMap<u32, String> = pythons
            .iter()
            .filter(|(pid, command)| {
                // A forked child mprof follows may have run, by exec, a Python that did not
                // load the agent: its command line changed, and its memory tells.
                !self.attached.contains(pid)
                    && !self.missed.contains_key(pid)
                    && children.commands.get(pid) != Some(command)
                    && !has_agent(*pid)
            })
            .cloned()
            .collect();
        // Seen before and not a stray now: gone (missed), or it has the agent by now (seen in
        // the middle of its exec, before the loader had mapped the agent).
        let left: Vec<u32> = self
            .seen
            .keys()
            .filter(|pid| !now.contains_key(pid))
            .copied()
            .collect();
        for pid in left {
            if let Some(command) = self.seen.remove(&pid) {
                if !pythons.iter().any(|(p, _)| *p == pid) {
                    self.missed.insert(pid, (command, None));
                }
            }
        }
        let due = now
            .keys()
            .filter(|pid| self.seen.contains_key(pid))
            .copied()
            .collect();
        self.seen.extend(now);
        due
    }

    /// `pid` was attached to.
    pub fn attached(&mut self, pid: u32) {
        self.seen.remove(&pid);
        self.attached.push(pid);
    }

    /// Attaching to `pid` failed (`why`); after a few failures it counts as missed.
    pub fn failed(&mut self, pid: u32, why: String) {
        let n = self.attempts.entry(pid).or_insert(0);
        *n += 1;
        if *n >= STRAY_ATTEMPTS {
            let command = self.seen.remove(&pid).unwrap_or_default();
            self.missed.insert(pid, (command, Some(why)));
        }
    }

    /// The strays attached to (to detach them at the end).
    pub fn attached_pids(&self) -> &[u32] {
        &self.attached
    }

    /// What to say of the strays, at the end.
    pub fn hint(&self) -> Option<String> {
        if self.missed.is_empty() {
            return None;
        }
        let named = first_few(
            self.missed.iter().map(|(pid, (cmd, why))| match why {
                Some(why) => format!("{pid} ({}: {why})", short_command(cmd, 80)),
                None => format!("{pid} ({})", short_command(cmd, 80)),
            }),
            self.missed.len(),
        );
        Some(format!(
            "{} Python process(es) under the program ran without the agent and were not \
             profiled: {named}; a process started with an environment of its own (no \
             LD_PRELOAD) is attached to once found, four times a second, unless it ends first",
            self.missed.len(),
        ))
    }
}

/// Whether the agent is loaded in `pid` (its memory file is mapped).
fn has_agent(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("mprof-agent"))
}

/// The Python processes among the descendants of `root` right now (pid and command line), at
/// most `limit` of them: for the hint when children are not followed.
pub fn python_descendants(root: u32, limit: usize) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    let mut seen = 0;
    while let Some(pid) = queue.pop() {
        seen += 1;
        if seen > 10_000 || found.len() >= limit {
            break;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            for child in text
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                queue.push(child);
                if is_python(child) && found.len() < limit {
                    found.push((child, command_line(child)));
                }
            }
        }
    }
    found
}

/// Whether `pid` runs a CPython (libpython mapped, or an executable named python*).
fn is_python(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let name = exe
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    name.starts_with("python")
        || std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|maps| maps.contains("libpython"))
}

/// The first four of `total` items, then how many more: `a, b, c, d and 3 more`.
fn first_few(items: impl Iterator<Item = String>, total: usize) -> String {
    let shown: Vec<String> = items.take(4).collect();
    match total.saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// A command line as the end-of-session hints name it: the program's file name (not the
/// interpreter's whole path, which can fill the line) and its arguments, cut in the middle to
/// at most `max` bytes, terminal controls escaped.
fn short_command(command: &str, max: usize) -> String {
    let command = command.trim();
    let (program, args) = command.split_once(' ').unwrap_or((command, ""));
    let name = program.rsplit('/').next().unwrap_or(program);
    let named = if args.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {args}")
    };
    crate::base::text::printable(&crate::base::text::elide(&named, max)).into_owned()
}

/// Python children seen while a program ran without `--follow-children`, and whether the
/// program itself ran a new program by exec.
#[derive(Default)]
pub struct Unfollowed {
    seen: std::collections::BTreeMap<u32, String>,
    last: Option<Instant>,
    /// The program's command line once the agent ran in it.
    program: Option<Vec<u8>>,
    /// The command line of the program it ran by exec, once seen.
    replaced_by: Option<String>,
}

impl Unfollowed {
    /// Looks at the program's descendants (at most four times a second: each look reads a
    /// file per thread of every descendant, on the program's core when they share one), and
    /// at the program's own command line once `agent_runs` says the agent runs in it.
    pub fn watch(&mut self, root: u32, agent_runs: impl FnOnce() -> bool) {
        if self.program.is_none() {
            // At the first round the agent runs, before the program can have gone on to
            // another (a launcher that runs for less than a round is not seen).
            if agent_runs() {
                self.program = std::fs::read(format!("/proc/{root}/cmdline")).ok();
            }
        }
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(Instant::now());
        for (pid, command) in python_descendants(root, 64) {
            self.seen.entry(pid).or_insert(command);
        }
        if self.replaced_by.is_none() {
            self.look_for_exec(root);
        }
    }

    /// Whether the program ran a new program by exec: its command line changed since the
    /// agent ran in it and the session's ring is no longer in its memory (a program that
    /// rewrites its own command line, as `setproctitle` does, keeps the ring). The agent does
    /// not start in the new program: mprof removed itself from the environment of the program
    /// it started.
    fn look_for_exec(&mut self, root: u32) {
        let Some(before) = &self.program else {
            return;
        };
        let Ok(now) = std::fs::read(format!("/proc/{root}/cmdline")) else {
            return;
        };
        if *before == now || now.is_empty() {
            return;
        }
        let maps = std::fs::read_to_string(format!("/proc/{root}/maps"));
        if maps.is_ok_and(|m| !m.contains("/memfd:mprof-ring")) {
            let command = String::from_utf8_lossy(&now).replace('\0', " ");
            self.replaced_by = Some(command.trim_end().to_owned());
        } else {
            // Rewritten in place: the map is read again only if it changes again.
            self.program = Some(now);
        }
    }

    /// What to say about the program's exec, if it ran one.
    pub fn exec_hint(&self) -> Option<String> {
        let command = self.replaced_by.as_deref()?;
        let command = short_command(command, 120);
        Some(format!(
            "the program ran a new program by exec ({command}), which was not profiled: the \
             figures stop at the exec; record with --follow-children to profile it too"
        ))
    }

    /// The hint for the summary, if Python children were seen or counted (`forked`: forks the
    /// agent counted, which may have been too short-lived to be seen).
    pub fn hint(&self, forked: u32) -> Option<String> {
        if self.seen.is_empty() {
            return (forked > 0).then(|| {
                format!(
                    "the program forked {forked} process(es), which were not profiled; record with \
                     --follow-children to profile them too"
                )
            });
        }
        let named = first_few(
            self.seen
                .iter()
                .map(|(pid, cmd)| format!("{pid} ({})", short_command(cmd, 80))),
            self.seen.len(),
        );
        Some(format!(
            "the program started Python child processes, which were not profiled (at least {}, \
             seen four times a second): {named}; record with --follow-children to profile them \
             too",
            self.seen.len(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{first_few, short_command};

    #[test]
    fn hints_name_the_first_four_and_count_the_rest() {
        let items = |n: usize| (1..=n).map(|i| i.to_string());
        assert_eq!(first_few(items(2), 2), "1, 2");
        assert_eq!(first_few(items(7), 7), "1, 2, 3, 4 and 3 more");
    }

    #[test]
    fn a_command_is_named_by_its_program_file_and_cut_in_the_middle() {
        assert_eq!(
            short_command(
                "/root/.pyenv/versions/3.8.18/bin/python3.8 /w/app.py --port 80",
                120
            ),
            "python3.8 /w/app.py --port 80"
        );
        assert_eq!(short_command("python3", 120), "python3");
        let long = format!("/usr/bin/python3 {} end.py", "x".repeat(300));
        let cut = short_command(&long, 60);
        assert!(cut.len() <= 60 && cut.starts_with("python3 x") && cut.ends_with("end.py"));
        assert!(cut.contains('…'));
        assert_eq!(short_command("/bin/a\x1b[2J b", 120), "a\\u{1b}[2J b");
    }
}
