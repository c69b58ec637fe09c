//! Loading the agent into a running process, in three steps that the CLI drives:
//!
//! 1. [`Injector::new`] inspects the target (changes nothing).
//! 2. [`Injector::prepare`] seizes threads one at a time until one is at a safe point (see
//!    `safepoint`), keeps that one stopped, and makes it run single system calls: `mmap` for the
//!    trampoline region (first attach only), `memfd_create` for the agent image (first attach
//!    only; mprof writes the image through `/proc/PID/fd/N`) and for the ring, which mprof opens
//!    the same way and hands to the caller to initialise.
//! 3. [`Prepared::launch`] writes the trampoline, points the thread at it and detaches. From
//!    here on the target needs nothing from mprof: [`Launched::poll`] only reads the result.
//!
//! Between two injected system calls the stopped thread holds registers that resume it as if
//! it had only been interrupted, so mprof dying there leaves at most two open memory files and
//! an unused page in the target. The only windows where mprof's death would hurt the target are
//! the few microseconds of each single-stepped system call.

use crate::error::{other, AttachError};
use crate::ptrace::{self, Regs, Stop};
use crate::remote::{self, Mem};
use crate::safepoint::{self, Resume, Verdict};
use crate::target::Target;
use crate::trampoline::{self, Data};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

const SYS_MMAP: u64 = 9;
const SYS_CLOSE: u64 = 3;
const SYS_MEMFD_CREATE: u64 = 319;
const MFD_CLOEXEC: u64 = 1;
const MFD_EXEC: u64 = 0x10;
/// How long one thread may take to stop after PTRACE_INTERRUPT.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the injected call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A target inspected and ready to be prepared.
pub struct Injector {
    target: Target,
    mem: Mem,
}

impl Injector {
    /// Inspects `pid`: checks that it exists, runs a supported CPython, is not stopped and may
    /// be traced. Changes nothing in the target.
    pub fn new(pid: u32) -> Result<Injector, AttachError> {
        let mut target = Target::inspect(pid)?;
        let status = remote::process_status(pid).map_err(|_| AttachError::Exited(pid))?;
        if status.tracer != 0 {
            return Err(already_traced(pid, status.tracer));
        }
        let mem = Mem::open(pid).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => permission_denied(pid),
            Some(libc::ENOENT) | Some(libc::ESRCH) => AttachError::Exited(pid),
            _ => other("opening the target's memory", e),
        })?;
        target.find_leftovers(&mem)?;
        Ok(Injector { target, mem })
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

    /// Stops one thread at a safe point (waiting up to `deadline` for one) and prepares the
    /// region, the agent image and the ring's memory file.
    pub fn prepare(self, deadline: Duration) -> Result<Prepared, AttachError> {
        let started = Instant::now();
        let chosen = choose_thread(&self.target, &self.mem, deadline)?;
        let chose_in = started.elapsed();
        let mut p = Prepared {
            target: self.target,
            mem: self.mem,
            chosen,
            region: 0,
            slot: 0,
            generation: 0,
            agent_fd: -1,
            ring_fd: -1,
            ring_local: None,
            chose_in,
            launched: false,
        };
        p.set_up()?;
        Ok(p)
    }
}

fn permission_denied(pid: u32) -> AttachError {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid());
    AttachError::PermissionDenied { pid, owner }
}

fn already_traced(pid: u32, tracer: u32) -> AttachError {
    AttachError::AlreadyTraced {
        pid,
        tracer,
        name: remote::thread_name(tracer, tracer),
    }
}

/// The thread that will run the trampoline, stopped.
struct Chosen {
    tid: u32,
    /// Its registers when it stopped.
    regs: Regs,
    /// Registers that resume it as if it had only been interrupted.
    safe_regs: Regs,
    resume: Resume,
    /// Signals that arrived for it while it was stopped, delivered again on release.
    stashed: Vec<i32>,
}

fn gone_or(t: &Target, e: std::io::Error, what: &str) -> AttachError {
    if !remote::alive(t.pid, t.start_time) {
        AttachError::Exited(t.pid)
    } else {
        other(what, e)
    }
}

fn choose_thread(t: &Target, mem: &Mem, deadline: Duration) -> Result<Chosen, AttachError> {
    let started = Instant::now();
    loop {
        let tids = remote::threads(t.pid).map_err(|_| AttachError::Exited(t.pid))?;
        for tid in tids {
            if remote::thread_name(t.pid, tid) == "mprof-agent" {
                continue;
            }
            if let Some(chosen) = try_thread(t, mem, tid)? {
                return Ok(chosen);
            }
        }
        if !remote::alive(t.pid, t.start_time) {
            return Err(AttachError::Exited(t.pid));
        }
        if started.elapsed() >= deadline {
            return Err(AttachError::NoSafePoint {
                pid: t.pid,
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Seizes and stops `tid`; keeps it if it is at a safe point, else lets it go at once.
fn try_thread(t: &Target, mem: &Mem, tid: u32) -> Result<Option<Chosen>, AttachError> {
    let Ok(status) = remote::thread_status(t.pid, tid) else {
        return Ok(None); // gone
    };
    match status.state {
        'T' | 't' => return Err(AttachError::Stopped(t.pid)),
        // Uninterruptible: it would not stop promptly.
        'D' => return Ok(None),
        _ => {}
    }
    if status.tracer != 0 {
        return Err(already_traced(t.pid, status.tracer));
    }
    if let Err(e) = ptrace::seize(tid) {
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            Some(libc::EPERM) | Some(libc::EACCES) => {
                // An exiting process refuses tracing too.
                std::thread::sleep(Duration::from_millis(20));
                if !remote::alive(t.pid, t.start_time) {
                    return Err(AttachError::Exited(t.pid));
                }
                match remote::thread_status(t.pid, tid).map(|s| s.tracer) {
                    Ok(tracer) if tracer != 0 => Err(already_traced(t.pid, tracer)),
                    _ => Err(permission_denied(t.pid)),
                }
            }
            _ => Err(other("PTRACE_SEIZE", e)),
        };
    }
    ptrace::interrupt(tid).map_err(|e| gone_or(t, e, "PTRACE_INTERRUPT"))?;
    let mut stashed = Vec::new();
    if !wait_interrupted(t, tid, &mut stashed)? {
        return Ok(None);
    }
    let regs = ptrace::get_regs(tid).map_err(|e| gone_or(t, e, "PTRACE_GETREGS"))?;
    let status = remote::thread_status(t.pid, tid).unwrap_or(status);
    let safe_regs = safepoint::restartable(&regs, &status);
    match safepoint::judge(t, mem, &regs, &status) {
        Verdict::Safe(resume) if stashed.is_empty() => Ok(Some(Chosen {
            tid,
            regs,
            safe_regs,
            resume,
            stashed,
        })),
        _ => {
            release(tid, &regs, &safe_regs, &stashed);
            Ok(None)
        }
    }
}

/// Lets a stopped thread go: restart registers if they differ, detach, signals delivered.
fn release(tid: u32, regs: &Regs, safe_regs: &Regs, stashed: &[i32]) {
    if safe_regs.rax != regs.rax {
        let _ = ptrace::set_regs(tid, safe_regs);
    }
    let first = stashed.first().copied().unwrap_or(0);
    let _ = ptrace::detach(tid, first);
    for &sig in stashed.iter().skip(1) {
        unsafe { libc::syscall(libc::SYS_tgkill, std::process::id(), tid, sig) };
    }
}

/// Waits for the stop our PTRACE_INTERRUPT asked for, passing on signals that come first.
/// False when the thread is gone.
fn wait_interrupted(t: &Target, tid: u32, stashed: &mut Vec<i32>) -> Result<bool, AttachError> {
    loop {
        let stop = ptrace::wait(tid, STOP_TIMEOUT).map_err(|e| gone_or(t, e, "waitpid"))?;
        match stop {
            Some(Stop::Interrupted) => return Ok(true),
            Some(Stop::Signal(sig)) => {
                // Keep the thread stopped for our interrupt; the signal goes in on release.
                stashed.push(sig);
                ptrace::cont(tid, 0).map_err(|e| gone_or(t, e, "PTRACE_CONT"))?;
            }
            Some(Stop::Group(_)) => {
                let _ = ptrace::detach(tid, 0);
                return Err(AttachError::Stopped(t.pid));
            }
            Some(Stop::Gone) => return Ok(false),
            None => {
                return Err(other(
                    "stopping a thread",
                    format!(
                        "thread {tid} of PID {} did not stop within {STOP_TIMEOUT:?}",
                        t.pid
                    ),
                ))
            }
        }
    }
}

/// A target with one thread stopped at a safe point and everything ready for the trampoline.
pub struct Prepared {
    target: Target,
    mem: Mem,
    chosen: Chosen,
    region: u64,
    slot: usize,
    generation: u64,
    agent_fd: i64,
    ring_fd: i64,
    ring_local: Option<OwnedFd>,
    chose_in: Duration,
    launched: bool,
}

impl Prepared {
    fn pid(&self) -> u32 {
        self.target.pid
    }

    /// Runs one system call in the chosen thread, then puts back registers that resume it
    /// safely and leaves it in an interrupt stop (not a signal stop: were mprof to die, a
    /// thread in a SIGTRAP signal stop would get the SIGTRAP).
    fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64, AttachError> {
        let tid = self.chosen.tid;
        let t = &self.target;
        let gadget = t.libc.syscall;
        let mut r = self.chosen.regs;
        r.rip = gadget;
        r.rax = nr;
        r.orig_rax = u64::MAX;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) =
            (args[0], args[1], args[2], args[3], args[4], args[5]);
        let fail = |e| gone_or(t, e, "injecting a system call");
        ptrace::set_regs(tid, &r).map_err(fail)?;
        let result = loop {
            ptrace::singlestep(tid).map_err(fail)?;
            match ptrace::wait(tid, STOP_TIMEOUT).map_err(fail)? {
                Some(Stop::Signal(libc::SIGTRAP)) | Some(Stop::Interrupted) => {
                    let after = ptrace::get_regs(tid).map_err(fail)?;
                    if after.rip == gadget + 2 {
                        break after.rax as i64;
                    }
                }
                Some(Stop::Signal(sig)) => self.chosen.stashed.push(sig),
                Some(Stop::Group(_)) => return Err(AttachError::Stopped(t.pid)),
                Some(Stop::Gone) => return Err(AttachError::Exited(t.pid)),
                None => return Err(other("injecting a system call", "the thread did not step")),
            }
        };
        ptrace::set_regs(tid, &self.chosen.safe_regs).map_err(fail)?;
        ptrace::interrupt(tid).map_err(fail)?;
        ptrace::cont(tid, 0).map_err(fail)?;
        let mut stashed = std::mem::take(&mut self.chosen.stashed);
        let ok = wait_interrupted(t, tid, &mut stashed);
        self.chosen.stashed = stashed;
        if !ok? {
            return Err(AttachError::Exited(t.pid));
        }
        Ok(result)
    }

    fn set_up(&mut self) -> Result<(), AttachError> {
        self.region = match self.target.region {
            Some(base) => base,
            None => self.map_region()?,
        };
        self.pick_slot()?;
        if self.target.loaded_agent.is_none() {
            self.agent_fd = self.memfd("mprof-agent.so", true)?;
            self.write_agent()?;
        }
        self.ring_fd = self.memfd("mprof-ring", false)?;
        let path = format!("/proc/{}/fd/{}", self.pid(), self.ring_fd);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| other(&format!("opening {path}"), e))?;
        self.ring_local = Some(file.into());
        Ok(())
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
            .map_err(|e| other("writing the trampoline region", e))?;
        Ok(base)
    }

    /// Uses the slot whose last use is older, if its trampoline has finished.
    fn pick_slot(&mut self) -> Result<(), AttachError> {
        let read = |i| {
            trampoline::slot_state(&self.mem, self.region, i)
                .map_err(|e| other("reading the trampoline region", e))
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
                .map_err(|e| other("writing the trampoline region", e))?;
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
            .map_err(|e| other("writing the trampoline region", e))?;
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
        let path = format!("/proc/{}/fd/{}", self.pid(), self.agent_fd);
        let mut file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| other(&format!("opening {path}"), e))?;
        file.write_all(crate::agent::AGENT_SO)
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
        let r = &self.chosen.regs;
        let nr = r.orig_rax as i64;
        safepoint::interrupted_syscall(r).then(|| {
            safepoint::syscall_name(nr).map_or_else(|| format!("system call {nr}"), String::from)
        })
    }

    fn data(&self) -> Result<Data, AttachError> {
        let t = &self.target;
        let c = &self.chosen;
        let mut d = Data::zeroed();
        d.magic = trampoline::MAGIC;
        d.generation = self.generation;
        d.gprs = trampoline::gprs_of(&c.regs);
        d.gprs.rax = c.resume.rax;
        d.rflags = c.regs.eflags;
        d.resume_rip = c.resume.rip;
        d.errno_location = t.libc.errno_location;
        d.ring_fd = self.ring_fd;
        d.agent_fd = self.agent_fd;
        d.xsave_size = trampoline::xsave_size();
        match t.loaded_agent {
            Some(start) => d.start = start,
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
        let data = self.data()?;
        let code = trampoline::code();
        let (base, slot) = (self.region, self.slot);
        let write = |addr, bytes: &[u8]| {
            self.mem
                .write(addr, bytes)
                .map_err(|e| other("writing the trampoline", e))
        };
        write(trampoline::slot_data(base, slot), data.as_bytes())?;
        write(trampoline::slot_code(base, slot), code)?;
        let c = &self.chosen;
        let mut r = c.regs;
        r.rip = trampoline::slot_code(base, slot);
        r.rsp = trampoline::slot_stack(base, slot);
        r.orig_rax = u64::MAX;
        ptrace::set_regs(c.tid, &r).map_err(|e| gone_or(&self.target, e, "PTRACE_SETREGS"))?;
        self.launched = true;
        let first = c.stashed.first().copied().unwrap_or(0);
        let detached = ptrace::detach(c.tid, first);
        for &sig in c.stashed.iter().skip(1) {
            unsafe { libc::syscall(libc::SYS_tgkill, self.target.pid, c.tid, sig) };
        }
        detached.map_err(|e| gone_or(&self.target, e, "PTRACE_DETACH"))?;
        Ok(Launched {
            pid: self.target.pid,
            start_time: self.target.start_time,
            region: base,
            slot,
            loading: data.dlopen != 0,
            mem: Mem::open(self.target.pid).map_err(|_| AttachError::Exited(self.target.pid))?,
            launched_at: Instant::now(),
        })
    }

    /// Undoes what `set_up` did, for an attach abandoned before launch.
    fn abandon(&mut self) {
        for fd in [self.agent_fd, self.ring_fd] {
            if fd >= 0 {
                let _ = self.syscall(SYS_CLOSE, [fd as u64, 0, 0, 0, 0, 0]);
            }
        }
        let c = &self.chosen;
        release(c.tid, &c.safe_regs, &c.safe_regs, &c.stashed);
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.launched {
            self.abandon();
        }
    }
}

/// The trampoline is running in the target.
pub struct Launched {
    pid: u32,
    start_time: u64,
    region: u64,
    slot: usize,
    loading: bool,
    mem: Mem,
    launched_at: Instant,
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
            Err(_) => return Err(AttachError::Exited(self.pid)),
        };
        if !state.done {
            if !remote::alive(self.pid, self.start_time) {
                return Err(AttachError::Exited(self.pid));
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
            .map_err(|_| AttachError::Exited(self.pid))?;
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

/// Tells whether the target is still the process that was attached (not a reused pid).
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    pid: u32,
    start_time: u64,
}

impl Liveness {
    pub fn alive(&self) -> bool {
        remote::alive(self.pid, self.start_time)
    }
}

impl Injector {
    pub fn liveness(&self) -> Liveness {
        Liveness {
            pid: self.target.pid,
            start_time: self.target.start_time,
        }
    }
}
