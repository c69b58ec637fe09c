//! Choosing the thread that runs the injected calls: seize the threads one at a time, keep the
//! first one found at a safe point (see `safepoint`), hijacked (see `hijack`), and let every
//! other go at once as if it had only been interrupted.

use crate::error::{other, AttachError};
use crate::hijack::{self, Hijack};
use crate::ptrace::{self, Regs, Stop};
use crate::remote::{self, Mem};
use crate::safepoint::{self, Verdict};
use crate::target::Process;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long one thread may take to stop after PTRACE_INTERRUPT.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// Stack below the stack pointer that a chosen thread must have for the signal frame.
const MIN_STACK_ROOM: u64 = 64 << 10;

/// Tracing `pid` (or reading its memory) was refused: with its owner and whether mprof may
/// trace anyone, for the message.
pub fn permission_denied(pid: u32) -> AttachError {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid());
    AttachError::PermissionDenied {
        pid,
        owner,
        privileged: may_trace_anyone(),
    }
}

pub fn already_traced(pid: u32, tracer: u32) -> AttachError {
    AttachError::AlreadyTraced {
        pid,
        tracer,
        name: remote::thread_name(tracer, tracer),
    }
}

/// The thread that will run the trampoline.
pub struct Chosen {
    pub tid: u32,
    /// The system call it was blocked in (it re-issues it), if any.
    pub in_syscall: Option<i64>,
}

/// Why a step failed with `e`: the target exited, or exec'd (see [`Process::left`]), or else
/// `what` failed.
pub fn gone_or(t: &Process, e: std::io::Error, what: &str) -> AttachError {
    t.liveness().why_gone(e, what)
}

/// [`gone_or`] for a request about traced thread `tid`, whose death is collected first if it
/// vanished (see [`ptrace::reap`]).
pub fn thread_gone_or(t: &Process, tid: u32, e: std::io::Error, what: &str) -> AttachError {
    if e.raw_os_error() == Some(libc::ESRCH) {
        ptrace::reap(tid);
    }
    gone_or(t, e, what)
}

/// What each thread was doing when it was last looked at, for the message when no thread
/// reached a safe point.
type Sightings = BTreeMap<u32, String>;

/// Stops one thread at a safe point, looking for up to `deadline`, or until `cancelled` says
/// to stop (asked between two threads: a thread being looked at is always let go first).
pub fn choose_thread(
    t: &Process,
    mem: &Mem,
    deadline: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<(Chosen, Hijack), AttachError> {
    let started = Instant::now();
    let mut seen = Sightings::new();
    loop {
        let tids = t
            .proc
            .threads()
            .map_err(|e| gone_or(t, e, "listing the threads"))?;
        for tid in tids {
            if cancelled() {
                return Err(AttachError::Interrupted(t.pid));
            }
            if let Some(left) = t.left() {
                return Err(left);
            }
            if let Some(chosen) = try_thread(t, mem, tid, &mut seen)? {
                return Ok(chosen);
            }
        }
        if let Some(left) = t.left() {
            return Err(left);
        }
        if started.elapsed() >= deadline {
            return Err(AttachError::NoSafePoint {
                pid: t.pid,
                waited: started.elapsed(),
                threads: describe_sightings(seen),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What the threads were doing, for the message: the first few, and how many more.
fn describe_sightings(seen: Sightings) -> Vec<String> {
    const SHOWN: usize = 6;
    let total = seen.len();
    let mut out: Vec<String> = seen
        .into_iter()
        .take(SHOWN)
        .map(|(tid, what)| format!("thread {tid}: {what}"))
        .collect();
    if total > SHOWN {
        out.push(format!("and {} more threads", total - SHOWN));
    }
    out
}

/// Whether this process may trace any process (root, or CAP_SYS_PTRACE).
fn may_trace_anyone() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Why seizing `tid` was refused; `None` when the thread was just exiting (an exiting thread
/// refuses tracing too).
fn seize_refused(t: &Process, tid: u32) -> Option<AttachError> {
    std::thread::sleep(Duration::from_millis(20));
    if let Some(left) = t.left() {
        return Some(left);
    }
    match t.proc.thread_status(tid) {
        Err(_) => return None,
        Ok(s) if matches!(s.state, 'Z' | 'X') => return None,
        Ok(_) => {}
    }
    Some(match t.proc.thread_status(tid).map(|s| s.tracer) {
        Ok(tracer) if tracer != 0 => already_traced(t.pid, tracer),
        // Allowed to trace anyone: someone else was tracing it a moment ago.
        _ if may_trace_anyone() => AttachError::AlreadyTraced {
            pid: t.pid,
            tracer: 0,
            name: String::new(),
        },
        _ => permission_denied(t.pid),
    })
}

/// Seizes and stops `tid`; hijacks it if it is at a safe point, else lets it go at once.
fn try_thread(
    t: &Process,
    mem: &Mem,
    tid: u32,
    seen: &mut Sightings,
) -> Result<Option<(Chosen, Hijack)>, AttachError> {
    let Ok(status) = t.proc.thread_status(tid) else {
        return Ok(None); // gone
    };
    if status.tracer != 0 {
        return Err(already_traced(t.pid, status.tracer));
    }
    match status.state {
        'T' | 't' => return Err(AttachError::Stopped(t.pid)),
        // Uninterruptible: it would not stop promptly.
        'D' => {
            seen.insert(tid, "in uninterruptible sleep (D)".into());
            return Ok(None);
        }
        _ => {}
    }
    if let Err(e) = ptrace::seize(tid) {
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            Some(libc::EPERM) | Some(libc::EACCES) => match seize_refused(t, tid) {
                Some(e) => Err(e),
                None => Ok(None),
            },
            _ => Err(other("PTRACE_SEIZE", e)),
        };
    }
    // The thread seized is this process's (a thread id freed by one of its threads that
    // ended may have gone to a thread of any process since it was listed): the directory held
    // lists only this process's threads, and one traced by mprof keeps its id until mprof
    // has waited for it.
    if !t.proc.has_thread(tid) {
        return let_go(t, tid, 0).map(|()| None);
    }
    ptrace::interrupt(tid).map_err(|e| thread_gone_or(t, tid, e, "PTRACE_INTERRUPT"))?;
    let mut stashed = Vec::new();
    if !wait_interrupted(t, tid, &mut stashed)? {
        return Ok(None);
    }
    let regs = ptrace::get_regs(tid).map_err(|e| thread_gone_or(t, tid, e, "PTRACE_GETREGS"))?;
    let status = t.proc.thread_status(tid).unwrap_or(status);
    let safe_regs = safepoint::restartable(&regs, &status);
    let verdict = if stashed.is_empty() {
        safepoint::judge(t, mem, &regs, &status)
    } else {
        Verdict::Unsafe("a signal arrived")
    };
    let resume = match verdict {
        Verdict::Safe(resume) => resume,
        Verdict::Unsafe(why) => {
            seen.insert(tid, format!("{why} ({})", t.describe(regs.rip)));
            return release(t, tid, &regs, &safe_regs, &stashed).map(|()| None);
        }
    };
    let stack_low = t.mapping_now(regs.rsp).map_or(regs.rsp, |m| m.start);
    if regs.rsp.saturating_sub(stack_low) < MIN_STACK_ROOM {
        seen.insert(tid, "too close to the end of its stack".into());
        return release(t, tid, &regs, &safe_regs, &stashed).map(|()| None);
    }
    let resume_regs = hijack::resume_regs(&regs, resume.rip, resume.rax);
    match Hijack::begin(
        mem,
        t.liveness(),
        tid,
        t.libc.restore_rt,
        resume_regs,
        status.blocked,
        stack_low,
    ) {
        Ok(h) => Ok(Some((
            Chosen {
                tid,
                in_syscall: safepoint::interrupted_syscall(&regs).then_some(regs.orig_rax as i64),
            },
            h,
        ))),
        Err(e) => {
            match ptrace::get_regs(tid) {
                // Nothing changed yet.
                Ok(now) if now.rip == regs.rip && now.rsp == regs.rsp => {
                    let _ = release(t, tid, &regs, &safe_regs, &stashed);
                }
                // Hijacked: let go, it returns through the frame. (If it cannot be let go
                // now, the kernel detaches it when mprof exits, with the same effect.)
                _ => {
                    let _ = ptrace::let_go(t.pid, tid, 0);
                }
            }
            Err(e)
        }
    }
}

/// Lets a stopped thread go: restart registers if they differ, detach, signals delivered.
/// An error when it could not be let go (see [`let_go`]).
pub fn release(
    t: &Process,
    tid: u32,
    regs: &Regs,
    safe_regs: &Regs,
    stashed: &[i32],
) -> Result<(), AttachError> {
    if safe_regs.rax != regs.rax {
        let _ = ptrace::set_regs(tid, safe_regs);
    }
    let first = stashed.first().copied().unwrap_or(0);
    let_go(t, tid, first)?;
    for &sig in stashed.iter().skip(1) {
        ptrace::pass_signal(t.pid, tid, sig);
    }
    Ok(())
}

/// [`ptrace::let_go`], or the error that ends the attach when the thread neither stopped nor
/// ended: seizing another thread then could wait forever on an `exec` that waits for mprof.
fn let_go(t: &Process, tid: u32, sig: i32) -> Result<(), AttachError> {
    if ptrace::let_go(t.pid, tid, sig) {
        return Ok(());
    }
    Err(t.left().unwrap_or_else(|| {
        other(
            "letting a thread go",
            format!("thread {tid} of PID {} neither stopped nor ended", t.pid),
        )
    }))
}

/// Waits for the stop our PTRACE_INTERRUPT asked for, passing on signals that come first.
/// False when the thread is gone.
fn wait_interrupted(t: &Process, tid: u32, stashed: &mut Vec<i32>) -> Result<bool, AttachError> {
    loop {
        let stop = ptrace::wait(tid, STOP_TIMEOUT).map_err(|e| gone_or(t, e, "waitpid"))?;
        match stop {
            Some(Stop::Interrupted) => return Ok(true),
            Some(Stop::Signal(sig)) => {
                // Keep the thread stopped for our interrupt; the signal goes in on release.
                stashed.push(sig);
                ptrace::cont(tid, 0).map_err(|e| thread_gone_or(t, tid, e, "PTRACE_CONT"))?;
            }
            Some(Stop::Syscall) => {
                ptrace::cont(tid, 0).map_err(|e| thread_gone_or(t, tid, e, "PTRACE_CONT"))?;
            }
            Some(Stop::Group(_)) => {
                let _ = ptrace::let_go(t.pid, tid, 0);
                return Err(AttachError::Stopped(t.pid));
            }
            Some(Stop::Exec) => {
                ptrace::let_exec_go(t.pid);
                return Err(t.execed());
            }
            Some(Stop::Gone) if ptrace::exec_stop_of(t.pid, tid, &t.proc) => {
                ptrace::let_exec_go(t.pid);
                return Err(t.execed());
            }
            Some(Stop::Gone) => return t.left().map_or(Ok(false), Err),
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
