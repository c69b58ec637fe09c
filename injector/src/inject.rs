//! Loading the agent into a running process, in three steps that the CLI drives:
//!
//! 1. [`Injector::new`] inspects the target (changes nothing).
//! 2. [`Injector::prepare`] seizes threads one at a time until one is at a safe point (see
//!    `safepoint`), hijacks that one (see `hijack`) and makes it run single system calls: `mmap`
//!    for the trampoline region (first attach only), `memfd_create` for the agent image (first
//!    attach only) and for the ring. mprof takes its own descriptors of the two memory files
//!    with `pidfd_getfd` and checks that they are the fresh memory files it asked for before
//!    writing anything: a descriptor number in the target is the target's to change.
//! 3. [`Prepared::launch`] writes the trampoline, points the thread at it and detaches. From
//!    here on the target needs nothing from mprof: [`Launched::poll`] only reads the result.
//!
//! At every moment, a thread that mprof lets go, or that the kernel lets go because mprof
//! died, goes on as if it had only been interrupted (or runs the self-contained trampoline):
//! the worst mprof's death can leave is two open memory files and an unused page.

use crate::choose::{
    self, already_traced, choose_thread, gone_or, permission_denied, thread_gone_or, Chosen,
};
use crate::error::{other, AttachError};
use crate::hijack::Hijack;
use crate::ptrace::{self, Regs};
use crate::remote::{Mem, Proc};
use crate::safepoint;
pub use crate::target::Liveness;
use crate::target::Process;
use crate::trampoline::{self, Data};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SYS_MMAP: u64 = 9;
const SYS_CLOSE: u64 = 3;
const SYS_MEMFD_CREATE: u64 = 319;
const MFD_CLOEXEC: u64 = 1;
const MFD_EXEC: u64 = 0x10;
/// How long the injected call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the injected call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    /// Load the agent if needed and start a session on a new ring.
    Start,
    /// End the running session (`mprof_agent_stop`).
    Stop,
}

/// A target inspected and ready to be prepared.
pub struct Injector {
    target: Process,
    mem: Arc<Mem>,
    job: Job,
}

impl Injector {
    /// Inspects `pid`: checks that it exists, runs a supported CPython, is not stopped and may
    /// be traced. Changes nothing in the target.
    pub fn new(pid: u32) -> Result<Injector, AttachError> {
        let injector = Injector::open(pid, Job::Start)?;
        if injector.target.session_running(&injector.mem) {
            return Err(AttachError::Busy(pid));
        }
        Ok(injector)
    }

    /// Prepares a call of the loaded agent's stop function, for a detach the agent has not
    /// acted on by itself (a target that allocates nothing never runs the agent's code).
    pub fn for_stop(pid: u32) -> Result<Injector, AttachError> {
        let injector = Injector::open(pid, Job::Stop)?;
        if injector.target.loaded_agent.is_none() || injector.target.region.is_none() {
            return Err(other("detaching", format!("no mprof agent in PID {pid}")));
        }
        Ok(injector)
    }

    /// Takes hold of process `pid` first (every later step reaches this process or fails,
    /// never another that reused its PID), opens its memory, then inspects it.
    fn open(pid: u32, job: Job) -> Result<Injector, AttachError> {
        let proc = Arc::new(Proc::open(pid).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) | Some(libc::ENOENT) => AttachError::NoSuchProcess(pid),
            Some(libc::ENOSYS) => other(
                "pidfd_open",
                "this kernel is too old for mprof attach (Linux 5.6 or newer is needed)",
            ),
            _ => other("opening the process", out_of_descriptors(e)),
        })?);
        let mem = open_mem(&proc)?;
        let mem = Arc::new(mem);
        let mut target = Process::inspect(proc, mem.clone())?;
        let status = target
            .proc
            .status()
            .map_err(|e| choose::gone_or(&target, e, "reading the status"))?;
        if status.tracer != 0 {
            return Err(already_traced(pid, status.tracer));
        }
        target.find_leftovers(&mem)?;
        if let Some(left) = target.left() {
            return Err(left);
        }
        Ok(Injector { target, mem, job })
    }

    /// The interpreter version read from the library or executable name, if it says.
    pub fn python_version(&self) -> Option<(u8, u8)> {
        self.target.python.version
    }

    /// Whether an earlier attach (or `record`) left the agent loaded.
    pub fn agent_loaded(&self) -> bool {
        self.target.loaded_agent.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.target.pid
    }

    /// Stops one thread at a safe point (waiting up to `deadline` for one, or until
    /// `cancelled` says to stop: nothing is changed then) and prepares the region, the agent
    /// image and the ring's memory file.
    pub fn prepare(
        self,
        deadline: Duration,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Prepared, AttachError> {
        let started = Instant::now();
        let (chosen, hijack) = choose_thread(&self.target, &self.mem, deadline, cancelled)?;
        let chose_in = started.elapsed();
        let mut p = Prepared {
            target: self.target,
            mem: self.mem,
            job: self.job,
            chosen,
            hijack: Some(hijack),
            region: 0,
            slot: 0,
            generation: 0,
            agent_fd: -1,
            ring_fd: -1,
            ring_local: None,
            chose_in,
        };
        p.set_up()?;
        Ok(p)
    }
}

/// Opens the process's memory. A main thread that is a zombie for the moment (an `exec` from
/// another thread is replacing it) has none to open: that is waited out, briefly.
fn open_mem(proc: &Proc) -> Result<Mem, AttachError> {
    let pid = proc.pid;
    let mut tries = 0;
    loop {
        let e = match proc.mem() {
            Ok(mem) => return Ok(mem),
            Err(e) => e,
        };
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => return Err(permission_denied(pid)),
            Some(libc::ENOENT) | Some(libc::ESRCH) if proc.exited() => {
                return Err(AttachError::Exited(pid))
            }
            Some(libc::ENOENT) | Some(libc::ESRCH) if tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return Err(other("opening the target's memory", out_of_descriptors(e))),
        }
    }
}

/// An error that says so when mprof ran out of file descriptors.
fn out_of_descriptors(e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => format!(
            "{e}: mprof ran out of file descriptors (it needs a few dozen; raise `ulimit -n`)"
        ),
        _ => e.to_string(),
    }
}

/// A target with one thread hijacked at a safe point and everything ready for the trampoline.
pub struct Prepared {
    target: Process,
    mem: Arc<Mem>,
    job: Job,
    chosen: Chosen,
    /// `None` once the thread was launched (or let go).
    hijack: Option<Hijack>,
    region: u64,
    slot: usize,
    generation: u64,
    agent_fd: i64,
    ring_fd: i64,
    ring_local: Option<OwnedFd>,
    chose_in: Duration,
}

impl Prepared {
    fn pid(&self) -> u32 {
        self.target.pid
    }

    /// Runs one system call in the chosen thread.
    fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64, AttachError> {
        let h = self
            .hijack
            .as_mut()
            .ok_or_else(|| other("attaching", "the chosen thread was let go"))?;
        h.syscall(nr, args)
    }

    fn set_up(&mut self) -> Result<(), AttachError> {
        self.region = match self.target.region {
            Some(base) => base,
            None => self.map_region()?,
        };
        self.pick_slot()?;
        if self.job == Job::Stop {
            return Ok(());
        }
        if self.target.loaded_agent.is_none() {
            self.agent_fd = self.memfd("mprof-agent.so", true)?;
            self.write_agent()?;
        }
        self.ring_fd = self.memfd("mprof-ring", false)?;
        self.ring_local = Some(self.take_fd(self.ring_fd, "mprof-ring")?);
        Ok(())
    }

    /// A descriptor of the memory file that the target holds as `fd`, checked to be the
    /// fresh memory file named `name` that mprof just had it create. The target could have put
    /// anything under that number since (a hostile one: a root-only file opened with O_PATH):
    /// mprof never reopens `/proc/PID/fd/N`, and writes nothing before this check.
    fn take_fd(&self, fd: i64, name: &str) -> Result<OwnedFd, AttachError> {
        // SAFETY: pidfd_getfd on our pidfd; the result is checked.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_getfd,
                self.target.proc.pidfd().as_raw_fd(),
                fd,
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return Err(gone_or(&self.target, e, "taking the target's memory file"));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(r as i32) };
        check_fresh_memfd(&owned, name).map_err(|why| AttachError::Hostile {
            pid: self.pid(),
            what: format!("descriptor {fd} is no longer the memory file mprof created: {why}"),
        })?;
        Ok(owned)
    }

    fn map_region(&mut self) -> Result<u64, AttachError> {
        let prot = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let size = trampoline::REGION_SIZE as u64;
        let r = self.syscall(SYS_MMAP, [0, size, prot, flags, u64::MAX, 0])?;
        if (-4095..0).contains(&r) {
            return Err(AttachError::NoExecMemory {
                pid: self.pid(),
                errno: -r as i32,
            });
        }
        let base = r as u64;
        let mut data = Data::zeroed();
        data.magic = trampoline::MAGIC;
        self.mem
            .write(trampoline::slot_data(base, 0), data.as_bytes())
            .map_err(|e| gone_or(&self.target, e, "writing the trampoline region"))?;
        Ok(base)
    }

    /// Uses the slot whose last use is older, if its trampoline has finished.
    fn pick_slot(&mut self) -> Result<(), AttachError> {
        let read = |i| {
            trampoline::slot_state(&self.mem, self.region, i)
                .map_err(|e| gone_or(&self.target, e, "reading the trampoline region"))
        };
        let states = [read(0)?, read(1)?];
        let slot = if states[0].generation <= states[1].generation {
            0
        } else {
            1
        };
        let slot = [slot, 1 - slot]
            .into_iter()
            .find(|&i| states[i].free())
            .ok_or_else(|| {
                other(
                    "attaching",
                    format!(
                        "an earlier attach to PID {} has not finished its call",
                        self.pid()
                    ),
                )
            })?;
        self.slot = slot;
        self.generation = states[0].generation.max(states[1].generation) + 1;
        // Mark the slot as not entered, so a stale `done` is never read as ours.
        let zero = [0u8; 8];
        for off in [trampoline::OFF_STAGE, trampoline::OFF_DONE] {
            self.mem
                .write(trampoline::field(self.region, slot, off), &zero)
                .map_err(|e| gone_or(&self.target, e, "writing the trampoline region"))?;
        }
        Ok(())
    }

    /// Creates a memory file in the target; returns its descriptor there.
    fn memfd(&mut self, name: &str, exec: bool) -> Result<i64, AttachError> {
        let at = trampoline::field(self.region, self.slot, trampoline::OFF_SCRATCH);
        let mut bytes = name.as_bytes().to_vec();
        bytes.push(0);
        self.mem
            .write(at, &bytes)
            .map_err(|e| gone_or(&self.target, e, "writing the trampoline region"))?;
        let mut r = if exec {
            self.syscall(SYS_MEMFD_CREATE, [at, MFD_CLOEXEC | MFD_EXEC, 0, 0, 0, 0])?
        } else {
            -libc::EINVAL as i64
        };
        if r == -libc::EINVAL as i64 {
            // Kernels before 6.3 know no MFD_EXEC (and need none).
            r = self.syscall(
                SYS_MEMFD_CREATE,
                [at, MFD_CLOEXEC | libc::MFD_ALLOW_SEALING as u64, 0, 0, 0, 0],
            )?;
        }
        if r < 0 {
            return Err(other(
                "memfd_create in the target",
                std::io::Error::from_raw_os_error(-r as i32),
            ));
        }
        Ok(r)
    }

    fn write_agent(&mut self) -> Result<(), AttachError> {
        let fd = self.take_fd(self.agent_fd, "mprof-agent.so")?;
        File::from(fd)
            .write_all(crate::agent::AGENT_SO)
            .map_err(|e| other("writing the agent image", e))
    }

    /// The ring's memory file, opened in mprof (once).
    pub fn take_ring_fd(&mut self) -> Option<OwnedFd> {
        self.ring_local.take()
    }

    /// The thread that was chosen, and how long choosing it took.
    pub fn chosen(&self) -> (u32, Duration) {
        (self.chosen.tid, self.chose_in)
    }

    /// The system call the chosen thread was blocked in (it re-issues it), if any.
    pub fn chosen_in_syscall(&self) -> Option<String> {
        self.chosen.in_syscall.map(|nr| {
            safepoint::syscall_name(nr).map_or_else(|| format!("system call {nr}"), String::from)
        })
    }

    /// The trampoline's inputs, for a thread that resumes as `resume`.
    fn data(&self, resume: &Regs) -> Result<Data, AttachError> {
        let t = &self.target;
        let mut d = Data::zeroed();
        d.magic = trampoline::MAGIC;
        d.generation = self.generation;
        d.gprs = trampoline::gprs_of(resume);
        d.rflags = resume.eflags;
        d.resume_rip = resume.rip;
        d.errno_location = t.libc.errno_location;
        d.ring_fd = self.ring_fd;
        d.agent_fd = self.agent_fd;
        d.xsave_size = trampoline::xsave_size();
        match t.loaded_agent {
            Some(agent) if self.job == Job::Stop => d.start = agent.stop,
            Some(agent) => d.start = agent.start,
            None => {
                let elf = crate::elf::Elf::parse(crate::agent::AGENT_SO)
                    .map_err(|e| other("reading the agent", e))?;
                let start = elf
                    .symbol("mprof_agent_start")
                    .ok_or_else(|| other("reading the agent", "no mprof_agent_start"))?;
                d.start = start.value - elf.first_vaddr;
                d.dlopen = t.libc.dlopen;
                d.dlopen_flags = t.libc.dlopen_flags;
                d.dlerror = t.libc.dlerror;
                let path = format!("/proc/self/fd/{}", self.agent_fd);
                d.path[..path.len()].copy_from_slice(path.as_bytes());
            }
        }
        Ok(d)
    }

    /// Writes the trampoline, sends the chosen thread into it and lets it go. Past this point
    /// the target finishes the attach on its own.
    pub fn launch(mut self) -> Result<Launched, AttachError> {
        let hijack = self
            .hijack
            .take()
            .ok_or_else(|| other("attaching", "the chosen thread was let go"))?;
        let tid = hijack.tid();
        // The thread gets its own registers back (still stopped); the trampoline resumes it
        // with them.
        let resume = hijack.end()?;
        let data = self.data(&resume)?;
        let code = trampoline::code();
        let (base, slot) = (self.region, self.slot);
        let write = |addr, bytes: &[u8]| {
            self.mem
                .write(addr, bytes)
                .map_err(|e| gone_or(&self.target, e, "writing the trampoline"))
        };
        let written = write(trampoline::slot_data(base, slot), data.as_bytes())
            .and_then(|()| write(trampoline::slot_code(base, slot), code));
        if let Err(e) = written {
            let _ = ptrace::let_go(self.target.pid, tid, 0);
            return Err(e);
        }
        let mut r = resume;
        r.rip = trampoline::slot_code(base, slot);
        r.rsp = trampoline::slot_stack(base, slot);
        r.orig_rax = u64::MAX;
        ptrace::set_regs(tid, &r)
            .map_err(|e| thread_gone_or(&self.target, tid, e, "PTRACE_SETREGS"))?;
        ptrace::detach(tid, 0)
            .map_err(|e| thread_gone_or(&self.target, tid, e, "PTRACE_DETACH"))?;
        Ok(Launched {
            pid: self.target.pid,
            region: base,
            slot,
            loading: data.dlopen != 0,
            mem: self.mem.clone(),
            launched_at: Instant::now(),
            target: self.target.liveness(),
        })
    }

    /// Undoes what `set_up` did, for an attach abandoned before launch.
    fn abandon(&mut self) {
        for fd in [self.agent_fd, self.ring_fd] {
            if fd >= 0 {
                let _ = self.syscall(SYS_CLOSE, [fd as u64, 0, 0, 0, 0, 0]);
            }
        }
        if let Some(h) = self.hijack.take() {
            let tid = h.tid();
            // Should this fail, the thread still returns through the frame once let go.
            let _ = h.end();
            let _ = ptrace::let_go(self.target.pid, tid, 0);
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if self.hijack.is_some() {
            self.abandon();
        }
    }
}

/// Checks that `fd` is a fresh, empty, writable memory file named `name` (what
/// `memfd_create` just returned in the target), not some other file.
fn check_fresh_memfd(fd: &OwnedFd, name: &str) -> Result<(), String> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 || flags & libc::O_PATH != 0 || flags & libc::O_ACCMODE != libc::O_RDWR {
        return Err("not open for reading and writing".into());
    }
    // Only memory files (and tmpfs files) know seals.
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(raw, libc::F_GET_SEALS) } < 0 {
        return Err("not a memory file".into());
    }
    // SAFETY: `stat` is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, a local.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 0 || st.st_size != 0 {
        return Err("not a fresh anonymous file".into());
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{raw}")).map_err(|e| e.to_string())?;
    if !link
        .to_string_lossy()
        .starts_with(&format!("/memfd:{name}"))
    {
        return Err(format!("it is {}", link.display()));
    }
    Ok(())
}

/// The trampoline is running in the target.
pub struct Launched {
    pid: u32,
    region: u64,
    slot: usize,
    loading: bool,
    mem: Arc<Mem>,
    launched_at: Instant,
    target: Liveness,
}

/// What the trampoline reports.
#[derive(Debug)]
pub struct Outcome {
    /// `mprof_agent_start`'s return value: 0 started; otherwise the ring's header says why.
    pub start_ret: i64,
}

impl Launched {
    /// `Some` once the trampoline has finished: the agent's start result, or the loader's
    /// error.
    pub fn poll(&self) -> Result<Option<Outcome>, AttachError> {
        let state = trampoline::slot_state(&self.mem, self.region, self.slot);
        let state = match state {
            Ok(s) => s,
            Err(e) => return Err(self.target.why_gone(e, "reading the trampoline's result")),
        };
        if !state.done {
            if let Some(left) = self.target.left() {
                return Err(left);
            }
            if self.launched_at.elapsed() > CALL_TIMEOUT {
                return Err(AttachError::Timeout {
                    pid: self.pid,
                    stage: state.stage,
                });
            }
            return Ok(None);
        }
        let data = trampoline::read_data(&self.mem, self.region, self.slot)
            .map_err(|e| self.target.why_gone(e, "reading the trampoline's result"))?;
        if self.loading && data.handle == 0 {
            let message = std::ffi::CStr::from_bytes_until_nul(&data.error)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(AttachError::Dlopen {
                pid: self.pid,
                message: if message.is_empty() {
                    "dlopen failed".into()
                } else {
                    message
                },
            });
        }
        Ok(Some(Outcome {
            start_ret: data.start_ret,
        }))
    }
}

impl Injector {
    pub fn liveness(&self) -> Liveness {
        self.target.liveness()
    }
}
