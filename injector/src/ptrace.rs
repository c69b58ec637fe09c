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

/// One ptrace request, with errno cleared first.
///
/// # Safety
/// `addr` and `data` are what `req` takes: where it reads or writes mprof's own memory
/// (`PTRACE_GETREGS`' buffer, say), that memory is valid for it.
unsafe fn request(req: libc::c_uint, tid: u32, addr: usize, data: usize) -> io::Result<c_long> {
    // SAFETY: `__errno_location` points to the calling thread's own errno.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: the arguments are valid for `req` (contract).
    check(unsafe { libc::ptrace(req, tid as pid_t, addr, data) })
}

/// Traces `tid` without stopping it (no SIGSTOP is sent). System-call stops report
/// `SIGTRAP | 0x80` (`PTRACE_O_TRACESYSGOOD`): should mprof die while the thread sits in one,
/// the kernel resumes it and finds no valid signal to deliver, where a plain `SIGTRAP` would
/// kill it. An `execve` of the thread stops it in the new program before it runs a line of it
/// (`PTRACE_O_TRACEEXEC`, [`Stop::Exec`]): without it, a thread that mprof seized just as it
/// called `execve` (a setuid program, say) would reach mprof's next stop in the new program,
/// and mprof would work on it with the old program's addresses.
pub fn seize(tid: u32) -> io::Result<()> {
    let options = (libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACEEXEC) as usize;
    // SAFETY: no memory is passed.
    unsafe { request(libc::PTRACE_SEIZE, tid, 0, options) }.map(drop)
}

/// Asks a seized thread to stop; [`wait`] reports the stop.
pub fn interrupt(tid: u32) -> io::Result<()> {
    // SAFETY: no memory is passed.
    unsafe { request(libc::PTRACE_INTERRUPT, tid, 0, 0) }.map(drop)
}

/// Resumes a stopped thread, delivering `sig` (0 = none).
pub fn cont(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: no memory is passed.
    unsafe { request(libc::PTRACE_CONT, tid, 0, sig as usize) }.map(drop)
}

/// Resumes a stopped thread until its next system-call entry or exit, delivering `sig`.
pub fn syscall(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: no memory is passed.
    unsafe { request(libc::PTRACE_SYSCALL, tid, 0, sig as usize) }.map(drop)
}

/// Stops tracing a stopped thread and resumes it, delivering `sig` (0 = none).
pub fn detach(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: no memory is passed.
    unsafe { request(libc::PTRACE_DETACH, tid, 0, sig as usize) }.map(drop)
}

pub fn get_regs(tid: u32) -> io::Result<Regs> {
    // SAFETY: plain registers; all zeroes is a valid value.
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes a `user_regs_struct` into `regs`.
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
    // SAFETY: the kernel reads a `user_regs_struct` from `regs`.
    unsafe { request(libc::PTRACE_SETREGS, tid, 0, regs as *const Regs as usize) }.map(drop)
}

const NT_PRFPREG: usize = 2;
const NT_X86_XSTATE: usize = 0x202;

/// The thread's extended (vector) state in the XSAVE standard format, as the kernel gives it
/// to debuggers; `None` when the CPU or kernel has no XSAVE.
pub fn get_xstate(tid: u32) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 64 << 10];
    match get_regset(tid, NT_X86_XSTATE, &mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The thread's legacy FXSAVE area (512 bytes).
pub fn get_fxsave(tid: u32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 512];
    let n = get_regset(tid, NT_PRFPREG, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn get_regset(tid: u32, kind: usize, buf: &mut [u8]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes at most `iov_len` bytes into `buf`.
    unsafe {
        request(
            libc::PTRACE_GETREGSET,
            tid,
            kind,
            &mut iov as *mut libc::iovec as usize,
        )
    }?;
    Ok(iov.iov_len)
}

const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;

/// What a thread in a system-call stop is doing.
#[derive(Clone, Copy, Debug)]
pub struct SyscallStop {
    /// At the entry (true) or the exit of the call.
    pub entry: bool,
    /// The system call number at the entry, its return value at the exit.
    pub value: i64,
    pub sp: u64,
}

/// Where a thread in a system-call stop is (`PTRACE_GET_SYSCALL_INFO`).
pub fn syscall_info(tid: u32) -> io::Result<SyscallStop> {
    // struct ptrace_syscall_info: op (u8), pad, arch (u32), ip, sp, then for an entry the
    // number and six arguments, for an exit the return value and an error flag.
    let mut info = [0u64; 11];
    // SAFETY: the kernel writes at most `size_of_val(&info)` bytes into `info`.
    unsafe {
        request(
            PTRACE_GET_SYSCALL_INFO,
            tid,
            std::mem::size_of_val(&info),
            info.as_mut_ptr() as usize,
        )
    }?;
    let entry = match info[0] as u8 {
        1 => true,
        2 => false,
        op => {
            return Err(io::Error::other(format!(
                "thread {tid} is not in a system-call stop (op {op})"
            )))
        }
    };
    Ok(SyscallStop {
        entry,
        value: info[3] as i64,
        sp: info[2],
    })
}

/// Why a traced thread stopped (or that it is gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Stopped by our PTRACE_INTERRUPT.
    Interrupted,
    /// At the entry or exit of a system call (after PTRACE_SYSCALL).
    Syscall,
    /// Stopped because a signal is about to be delivered to it; it is ours to pass on.
    Signal(i32),
    /// The whole process is being stopped (SIGSTOP, SIGTSTP...).
    Group(i32),
    /// The thread has just replaced the process's program (`execve`): nothing of what mprof
    /// knew of the process holds any more. It is stopped under the process's id (which the
    /// thread takes if it had another) and must be let go untouched ([`let_exec_go`]).
    Exec,
    /// The thread exited or was killed.
    Gone,
}

const PTRACE_EVENT_STOP: i32 = 128;

fn decode(status: i32) -> Stop {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Stop::Gone;
    }
    let sig = libc::WSTOPSIG(status);
    if status >> 16 == libc::PTRACE_EVENT_EXEC {
        Stop::Exec
    } else if status >> 16 == PTRACE_EVENT_STOP {
        if sig == libc::SIGTRAP {
            Stop::Interrupted
        } else {
            Stop::Group(sig)
        }
    } else if sig == libc::SIGTRAP | 0x80 {
        Stop::Syscall
    } else {
        Stop::Signal(sig)
    }
}

/// Lets the thread that stopped at an `execve` ([`Stop::Exec`]) of process `pid` go on
/// untouched: it is stopped under id `pid` now, whatever id it had. Its registers and memory
/// are the new program's, and mprof neither reads nor writes them.
pub fn let_exec_go(pid: u32) {
    let _ = detach(pid, 0);
}

/// After `tid` seemed to vanish: whether it was a thread of process `pid` (not its main
/// thread) that exec'd, and now waits in [`Stop::Exec`] under id `pid`, traced by mprof.
pub fn exec_stop_of(pid: u32, tid: u32, proc: &crate::remote::Proc) -> bool {
    if tid == pid {
        return false;
    }
    let ours = proc.status().is_ok_and(|s| s.tracer == std::process::id());
    ours && matches!(wait(pid, Duration::from_millis(200)), Ok(Some(Stop::Exec)))
}

/// Collects the death of traced thread `tid` after a request found it gone (ESRCH): a thread
/// killed while traced stays a zombie until its tracer waits for it, and an `exec` by another
/// thread of the process waits for that before it replaces the program.
pub fn reap(tid: u32) {
    for _ in 0..100 {
        match wait(tid, Duration::ZERO) {
            Ok(Some(Stop::Gone)) | Err(_) => return,
            // A stop reported late (not ours to act on now) or nothing yet: the kill that
            // ends the thread is on its way.
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Waits up to `timeout` for the next stop of `tid`; `None` when it did not stop in time.
pub fn wait(tid: u32, timeout: Duration) -> io::Result<Option<Stop>> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes into `status`, a local.
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
