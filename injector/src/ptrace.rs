//! Thin wrappers over the ptrace requests the injector uses. Every call must come from the
//! thread that seized the tracee: mprof does all of it from its main thread.

use libc::{c_long, pid_t, user_regs_struct};
use std::io;
use std::time::{Duration, Instant};

/// The registers of a stopped thread.
pub type Regs = user_regs_struct;

fn check(r: c_long) -> io::Result<c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

unsafe fn request(req: libc::c_uint, tid: u32, addr: usize, data: usize) -> io::Result<c_long> {
    *libc::__errno_location() = 0;
    check(libc::ptrace(req, tid as pid_t, addr, data))
}

/// Traces `tid` without stopping it (no SIGSTOP is sent).
pub fn seize(tid: u32) -> io::Result<()> {
    unsafe { request(libc::PTRACE_SEIZE, tid, 0, 0) }.map(drop)
}

/// Asks a seized thread to stop; [`wait`] reports the stop.
pub fn interrupt(tid: u32) -> io::Result<()> {
    unsafe { request(libc::PTRACE_INTERRUPT, tid, 0, 0) }.map(drop)
}

/// Resumes a stopped thread, delivering `sig` (0 = none).
pub fn cont(tid: u32, sig: i32) -> io::Result<()> {
    unsafe { request(libc::PTRACE_CONT, tid, 0, sig as usize) }.map(drop)
}

/// Executes one instruction of a stopped thread, then stops it again.
pub fn singlestep(tid: u32) -> io::Result<()> {
    unsafe { request(libc::PTRACE_SINGLESTEP, tid, 0, 0) }.map(drop)
}

/// Stops tracing a stopped thread and resumes it, delivering `sig` (0 = none).
pub fn detach(tid: u32, sig: i32) -> io::Result<()> {
    unsafe { request(libc::PTRACE_DETACH, tid, 0, sig as usize) }.map(drop)
}

pub fn get_regs(tid: u32) -> io::Result<Regs> {
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    unsafe {
        request(
            libc::PTRACE_GETREGS,
            tid,
            0,
            &mut regs as *mut Regs as usize,
        )
    }?;
    Ok(regs)
}

pub fn set_regs(tid: u32, regs: &Regs) -> io::Result<()> {
    unsafe { request(libc::PTRACE_SETREGS, tid, 0, regs as *const Regs as usize) }.map(drop)
}

/// Why a traced thread stopped (or that it is gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Stopped by our PTRACE_INTERRUPT (or after a single step with nothing else pending).
    Interrupted,
    /// Stopped because a signal is about to be delivered to it; it is ours to pass on.
    Signal(i32),
    /// The whole process is being stopped (SIGSTOP, SIGTSTP...).
    Group(i32),
    /// The thread exited or was killed.
    Gone,
}

const PTRACE_EVENT_STOP: i32 = 128;

fn decode(status: i32) -> Stop {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Stop::Gone;
    }
    let sig = libc::WSTOPSIG(status);
    if status >> 16 == PTRACE_EVENT_STOP {
        if sig == libc::SIGTRAP {
            Stop::Interrupted
        } else {
            Stop::Group(sig)
        }
    } else {
        Stop::Signal(sig)
    }
}

/// Waits up to `timeout` for the next stop of `tid`; `None` when it did not stop in time.
pub fn wait(tid: u32, timeout: Duration) -> io::Result<Option<Stop>> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        let mut status = 0;
        let r = unsafe { libc::waitpid(tid as pid_t, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid as pid_t {
            return Ok(Some(decode(status)));
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ECHILD) => Ok(Some(Stop::Gone)),
                Some(libc::EINTR) => continue,
                _ => Err(e),
            };
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}
