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

/// How long a traced thread that was killed may take to end, or one asked to stop to stop.
const LET_GO_TIMEOUT: Duration = Duration::from_secs(2);

/// Collects the death of traced thread `tid` after a request found it gone (ESRCH): a thread
/// killed while traced stays a zombie until its tracer waits for it, and an `exec` by another
/// thread of the process waits for that before it replaces the program (holding the lock that
/// `PTRACE_SEIZE` takes: mprof must never seize another thread before this). True once
/// collected, false when it did not end within [`LET_GO_TIMEOUT`].
pub fn reap(tid: u32) -> bool {
    let start = Instant::now();
    loop {
        match wait(tid, Duration::from_millis(5)) {
            Ok(Some(Stop::Gone)) | Err(_) => return true,
            // A stop reported late (not ours to act on now) or nothing yet: the kill that
            // ends the thread is on its way.
            Ok(_) if start.elapsed() < LET_GO_TIMEOUT => {}
            Ok(_) => return false,
        }
    }
}

/// Lets traced thread `tid` of process `pid` go, delivering `sig` (0 = none), whatever state
/// it is in: detached from a stop, or collected if it was killed while stopped (an `exec` by
/// another thread kills every other thread, and waits until mprof has collected those it
/// traces), or stopped first if it was seized and never stopped. True when it is no longer
/// mprof's to wait for; false when it neither stopped nor ended within [`LET_GO_TIMEOUT`],
/// after which mprof must not seize another thread of the process (see [`reap`]).
pub fn let_go(pid: u32, tid: u32, sig: i32) -> bool {
    match detach(tid, sig) {
        Ok(()) => return true,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        // Not traced by mprof (EPERM) or no such thread: nothing to let go.
        Err(_) => return true,
    }
    // Not in a stop: running (seized, never stopped) or killed. Ask for a stop; a killed
    // thread reports its end instead.
    let _ = interrupt(tid);
    let start = Instant::now();
    while start.elapsed() < LET_GO_TIMEOUT {
        match wait(tid, Duration::from_millis(5)) {
            Ok(Some(Stop::Gone)) | Err(_) => return true,
            Ok(Some(Stop::Exec)) => {
                let_exec_go(pid);
                return true;
            }
            Ok(Some(Stop::Signal(arrived))) => {
                if detach(tid, arrived).is_ok() {
                    pass_signal(pid, tid, sig);
                    return true;
                }
            }
            Ok(Some(_)) => {
                if detach(tid, sig).is_ok() {
                    return true;
                }
            }
            Ok(None) => {}
        }
    }
    false
}

/// Sends `sig` (if any) to thread `tid` of process `pid`: a signal mprof held back while the
/// thread was stopped.
pub fn pass_signal(pid: u32, tid: u32, sig: i32) {
    if sig != 0 {
        // SAFETY: tgkill sends a signal; no memory is involved.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;

    /// A Python whose threads idle, but one that execs `sleep` when told to.
    const TARGET: &str = r#"
import os, sys, threading
idle = [threading.Thread(target=threading.Event().wait, daemon=True) for _ in range(2)]
for t in idle: t.start()
def replace():
    sys.stdin.readline()
    os.execv("/bin/sleep", ["sleep", "0.5"])
e = threading.Thread(target=replace)
e.start()
print(idle[0].native_id, e.native_id, flush=True)
e.join()
"#;

    fn thread_state(pid: u32, tid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    /// The hang behind a failed CI run: mprof stopped a thread, another thread of the target
    /// exec'd (killing the stopped one), mprof's detach of it failed (no longer in a stop) and
    /// mprof went on to seize the next thread. The exec waits, holding the lock
    /// `PTRACE_SEIZE` takes, until the tracer collects the killed thread: both waited forever.
    /// [`let_go`] collects it, so the exec ends and the next seize returns at once.
    #[test]
    fn a_thread_killed_by_an_exec_while_stopped_is_collected_so_the_next_seize_returns() {
        let Ok(mut child) = Command::new("python3")
            .args(["-c", TARGET])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let pid = child.id();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ids: Vec<u32> = line
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        let (stopped, execing) = (ids[0], ids[1]);

        seize(stopped).unwrap();
        interrupt(stopped).unwrap();
        let stop = wait(stopped, Duration::from_secs(5)).unwrap();
        assert!(matches!(stop, Some(Stop::Interrupted)), "{stop:?}");
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        // The exec kills the stopped thread, which then waits for its tracer as a zombie.
        let start = Instant::now();
        while thread_state(pid, stopped) != Some('Z') {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the exec did not start"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            let_go(pid, stopped, 0),
            "the killed thread was not collected"
        );

        // The next seize, from a thread of its own so that a hang fails the test.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let seized = seize(execing);
            if seized.is_ok() {
                let_go(pid, execing, 0);
            }
            let _ = tx.send(seized.map_err(|e| e.raw_os_error()));
        });
        let seized = rx.recv_timeout(Duration::from_secs(10));
        assert!(
            seized.is_ok(),
            "PTRACE_SEIZE hung: the exec waited on mprof"
        );
        let status = child.wait().unwrap();
        assert!(status.success(), "the exec'd program: {status}");
    }
}
