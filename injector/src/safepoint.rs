//! Is a stopped thread at a point where it may call `dlopen` and the agent's start function?
//!
//! Those take the dynamic loader's lock and the allocator's locks. A thread may hold either one
//! only while it runs C library code (or a callback that the C library called with the lock
//! held: a library constructor, a `dl_iterate_phdr` callback, a signal handler that interrupted
//! `malloc`). So a thread is at a safe point when:
//!
//! - no signal handler is running on its stack (a return address to `__restore_rt` proves one
//!   is), nor the agent's slow path (it holds the agent's lock), and no signal is about to be
//!   delivered to it; and either
//! - it is blocked in a system call that the allocator and the loader never make while holding
//!   a lock, interrupted by our PTRACE_INTERRUPT before it returned (the trampoline re-issues
//!   it), or waiting for the GIL (a futex inside `_PyRuntime`), and the call has not replaced
//!   its signal mask for the time being; or
//! - it runs interpreter code (libpython's, outside the few functions that take locks), or the
//!   code of an extension module. When the interpreter image defines `malloc` itself, only the
//!   bytecode loop `_PyEval_EvalFrameDefault` counts; or
//! - it runs any other native library (OpenSSL for hashlib, a BLAS) that defines no `malloc`,
//!   and no return address into the loader, the unwinder or `dl_iterate_phdr` is on its whole
//!   live stack. (The C library's own frames are on every stack, where threads start.)

use crate::ptrace::Regs;
use crate::remote::{Mem, ThreadStatus};
use crate::target::Process;
use crate::unwind::Frames;

const EINTR: i64 = 4;
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;

const SYS_FUTEX: i64 = 202;
const SYS_RT_SIGSUSPEND: i64 = 130;
const SYS_PSELECT6: i64 = 270;
const SYS_PPOLL: i64 = 271;
const SYS_EPOLL_PWAIT: i64 = 281;
const SYS_EPOLL_PWAIT2: i64 = 441;
const FUTEX_WAIT: u64 = 0;
const FUTEX_WAIT_BITSET: u64 = 9;
const FUTEX_CMD_MASK: u64 = !(128 | 256);

/// Blocking system calls during which the thread holds no lock of the loader or allocator
/// (x86-64 numbers): reads and writes on pipes and sockets, waits for events, sleeps, waits for
/// children and signals.
const BLOCKING_SYSCALLS: &[(i64, &str)] = &[
    (0, "read"),
    (1, "write"),
    (7, "poll"),
    (19, "readv"),
    (20, "writev"),
    (23, "select"),
    (34, "pause"),
    (35, "nanosleep"),
    (42, "connect"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (61, "wait4"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (247, "waitid"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (307, "sendmmsg"),
    (441, "epoll_pwait2"),
];

/// The name of a system call a thread may be chosen in, for messages.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    if nr == SYS_FUTEX {
        return Some("futex");
    }
    BLOCKING_SYSCALLS
        .iter()
        .find(|&&(n, _)| n == nr)
        .map(|&(_, name)| name)
}

/// Where the thread goes once the trampoline is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    pub rip: u64,
    pub rax: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Safe(Resume),
    Unsafe(&'static str),
}

/// Whether `regs.rax` says the system call was interrupted before it completed.
pub fn interrupted_syscall(regs: &Regs) -> bool {
    let rax = regs.rax as i64;
    (regs.orig_rax as i64) >= 0
        && matches!(
            -rax,
            EINTR | ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
        )
}

/// Registers that make the kernel restart an interrupted system call when the thread resumes,
/// as if it had never been interrupted (used for threads we looked at but did not choose, and
/// whenever mprof's death could resume the chosen one). A plain EINTR (epoll_wait) is turned
/// into a restart: no signal handler ran, so the target must not see it.
pub fn restartable(regs: &Regs, status: &ThreadStatus) -> Regs {
    let mut r = *regs;
    if interrupted_syscall(regs) && regs.rax as i64 == -EINTR && status.deliverable() == 0 {
        r.rax = (-ERESTARTNOINTR) as u64;
    }
    r
}

pub fn judge(t: &Process, mem: &Mem, regs: &Regs, status: &ThreadStatus) -> Verdict {
    if status.deliverable() != 0 {
        return Verdict::Unsafe("a signal is about to be delivered");
    }
    let busy = busy_code(t);
    let frames = t.frames(mem, regs, &busy);
    if let Some(why) = busy_stack(t, mem, &frames, &busy) {
        return Verdict::Unsafe(why);
    }
    if (regs.orig_rax as i64) >= 0 {
        return judge_syscall(t, mem, regs, &frames);
    }
    judge_pc(t, mem, regs, &frames)
}

fn judge_syscall(t: &Process, mem: &Mem, regs: &Regs, frames: &Frames) -> Verdict {
    if !interrupted_syscall(regs) {
        return Verdict::Unsafe("returning from a system call");
    }
    let nr = regs.orig_rax as i64;
    let allowed = if nr == SYS_FUTEX {
        waits_for_the_gil(t, regs) || waits_for_a_python_lock(t, regs, frames)
    } else {
        BLOCKING_SYSCALLS.iter().any(|&(n, _)| n == nr)
    };
    if !allowed {
        return Verdict::Unsafe("in a system call that may hold a lock");
    }
    if has_temporary_sigmask(mem, regs) {
        // The kernel puts the thread's own mask back only as the call returns: a frame
        // written now could not hold it.
        return Verdict::Unsafe("in a system call with a temporary signal mask");
    }
    let mut insn = [0u8; 2];
    if mem.read(regs.rip.wrapping_sub(2), &mut insn).is_err() || insn != [0x0f, 0x05] {
        return Verdict::Unsafe("not stopped after a syscall instruction");
    }
    Verdict::Safe(Resume {
        rip: regs.rip - 2,
        rax: regs.orig_rax,
    })
}

/// Whether the interrupted call replaced the thread's signal mask for its duration
/// (`rt_sigsuspend`, or `ppoll`/`pselect6`/`epoll_pwait` with a mask argument).
fn has_temporary_sigmask(mem: &Mem, regs: &Regs) -> bool {
    match regs.orig_rax as i64 {
        SYS_RT_SIGSUSPEND => true,
        SYS_PPOLL => regs.r10 != 0,
        SYS_EPOLL_PWAIT | SYS_EPOLL_PWAIT2 => regs.r8 != 0,
        // The sixth argument points to {const sigset_t *mask, size_t size}.
        SYS_PSELECT6 => regs.r9 != 0 && mem.read_u64(regs.r9).map_or(true, |mask| mask != 0),
        _ => false,
    }
}

fn waits_for_the_gil(t: &Process, regs: &Regs) -> bool {
    let cmd = regs.rsi & FUTEX_CMD_MASK;
    let in_runtime = t
        .python
        .runtime
        .is_some_and(|(lo, hi)| lo <= regs.rdi && regs.rdi < hi);
    (cmd == FUTEX_WAIT || cmd == FUTEX_WAIT_BITSET) && in_runtime
}

/// How many of a lock waiter's innermost interpreter frames may come before the interpreter's
/// lock function that called the C library's wait: its own static helpers (3.13's
/// `_PySemaphore_PlatformWait` under `_PySemaphore_Wait`), which no exported symbol covers.
const LOCK_HELPERS: usize = 2;

/// Whether a thread in `futex` waits for a Python lock (`threading.Lock`, `queue.get()`,
/// `Thread.join()`, `Event.wait()`, the import lock): blocked in the C library's semaphore,
/// condition or mutex wait (which hold none of the C library's own locks while they wait),
/// called by the interpreter's lock functions, with the whole stack known and nothing on it
/// that holds a lock the agent's start needs (the allocator lock of 3.12+, the loader's).
/// Such a thread is as safe as one waiting for the GIL, and a program whose threads all wait
/// on queues and joins has no other.
fn waits_for_a_python_lock(t: &Process, regs: &Regs, frames: &Frames) -> bool {
    let cmd = regs.rsi & FUTEX_CMD_MASK;
    if !(cmd == FUTEX_WAIT || cmd == FUTEX_WAIT_BITSET) || frames.stopped_at.is_some() {
        return false;
    }
    let inside =
        |ranges: &[(u64, u64)], pc: u64| ranges.iter().any(|&(lo, hi)| lo <= pc && pc < hi);
    if !inside(&t.libc.text, regs.rip) {
        return false;
    }
    let mut callers = frames
        .returns
        .iter()
        .skip_while(|&&ra| inside(&t.libc.text, ra))
        .take(LOCK_HELPERS + 1)
        .take_while(|&&ra| inside(&t.python.text, ra));
    callers.any(|&ra| inside(&t.python.locks, ra))
        && !frames.any_in(&t.python.allocator_setup)
        && !frames.any_in(&t.locking.on_stack)
}

fn judge_pc(t: &Process, mem: &Mem, regs: &Regs, frames: &Frames) -> Verdict {
    let pc = regs.rip;
    let here = Verdict::Safe(Resume {
        rip: pc,
        rax: regs.rax,
    });
    let inside = |ranges: &[(u64, u64)]| ranges.iter().any(|&(lo, hi)| lo <= pc && pc < hi);
    let py = &t.python;
    if py.eval_loop.is_some_and(|(lo, hi)| lo <= pc && pc < hi) {
        return here;
    }
    if py.defines_malloc {
        return Verdict::Unsafe("outside the bytecode loop of an interpreter with its own malloc");
    }
    if inside(&py.text) {
        if inside(&py.excluded) {
            return Verdict::Unsafe("in an interpreter function that takes locks");
        }
        return here;
    }
    if inside(&t.locking.pc) {
        return Verdict::Unsafe("in the C library, the loader or the unwinder");
    }
    if t.in_extension_module(pc) {
        return here;
    }
    if t.in_allocator(pc) {
        return Verdict::Unsafe("in a library with its own malloc");
    }
    // Any other native library (OpenSSL inside hashlib, a BLAS): safe unless the loader or
    // the unwinder is active below it, which only the whole live stack can tell.
    match on_the_stack(t, mem, frames, FULL_STACK, &t.locking.on_stack) {
        Scan::Clean => here,
        Scan::Found => Verdict::Unsafe("in native code called by the loader or the unwinder"),
        Scan::Unreadable => Verdict::Unsafe("in native code, with a stack mprof cannot read"),
    }
}

/// Whether a return address into `ranges` is on the stack: among the frames the unwind found,
/// and, above where it stopped (if it did), anywhere in the stack's memory (at most `limit`
/// bytes of it), where old return addresses left in locals count too.
fn on_the_stack(
    t: &Process,
    mem: &Mem,
    frames: &Frames,
    limit: u64,
    ranges: &[(u64, u64)],
) -> Scan {
    if frames.any_in(ranges) {
        return Scan::Found;
    }
    match frames.stopped_at {
        None => Scan::Clean,
        Some(sp) => scan_stack(t, mem, sp, limit, ranges),
    }
}

/// Most of a stack that is scanned for a signal frame or an active agent call.
const STACK_SCAN: u64 = 1 << 20;
/// Most of a stack scanned to prove that native code runs on its own.
const FULL_STACK: u64 = 16 << 20;

enum Scan {
    Clean,
    Found,
    Unreadable,
}

/// Looks for a return address into `ranges` on the live part of a stack (from `sp` up to the
/// end of its mapping, at most `limit` bytes).
fn scan_stack(t: &Process, mem: &Mem, sp: u64, limit: u64, ranges: &[(u64, u64)]) -> Scan {
    let sp = sp & !7;
    let Some(end) = t.mapping_now(sp).map(|m| m.end) else {
        return Scan::Unreadable;
    };
    if end - sp > limit {
        return Scan::Unreadable;
    }
    let mut at = sp;
    let mut buf = vec![0u8; 64 << 10];
    while at < end {
        let n = ((end - at) as usize).min(buf.len());
        if mem.read(at, &mut buf[..n]).is_err() {
            return Scan::Unreadable;
        }
        let found = buf[..n].chunks_exact(8).any(|w| {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            ranges.iter().any(|&(lo, hi)| lo <= v && v < hi)
        });
        if found {
            return Scan::Found;
        }
        at += n as u64;
    }
    Scan::Clean
}

/// Code whose frame on a stack rules the thread out: `__restore_rt` (a signal handler is
/// running, maybe on top of `malloc`) and the agent (its slow path holds the agent's lock while
/// it calls into libpython).
fn busy_code(t: &Process) -> Vec<(u64, u64)> {
    let restore = t.libc.restore_rt;
    let mut ranges = vec![(restore, restore + 1)];
    ranges.extend(t.agent_text());
    ranges
}

/// Why the thread's stack rules it out, if it does: a frame of `busy` code (see [`busy_code`]).
fn busy_stack(
    t: &Process,
    mem: &Mem,
    frames: &Frames,
    busy: &[(u64, u64)],
) -> Option<&'static str> {
    match on_the_stack(t, mem, frames, STACK_SCAN, busy) {
        Scan::Clean => None,
        Scan::Found => Some("a signal handler or the agent is running"),
        // Deeper than the scan: assume the worst.
        Scan::Unreadable => Some("its stack is too deep or unreadable"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(orig_rax: i64, rax: i64) -> Regs {
        // SAFETY: plain registers; all zeroes is a valid value.
        let mut r: Regs = unsafe { std::mem::zeroed() };
        r.orig_rax = orig_rax as u64;
        r.rax = rax as u64;
        r.rip = 0x1002;
        r
    }

    #[test]
    fn only_interrupted_calls_count_as_interrupted() {
        assert!(interrupted_syscall(&regs(232, -4)));
        assert!(interrupted_syscall(&regs(230, -516)));
        assert!(
            !interrupted_syscall(&regs(232, 1)),
            "epoll_wait returned an event"
        );
        assert!(!interrupted_syscall(&regs(-1, -4)), "not in a system call");
    }

    #[test]
    fn a_plain_eintr_becomes_a_restart_unless_a_signal_waits() {
        let quiet = ThreadStatus::default();
        let r = restartable(&regs(232, -4), &quiet);
        assert_eq!(r.rax as i64, -ERESTARTNOINTR);
        let signalled = ThreadStatus {
            pending: 2,
            ..quiet
        };
        assert_eq!(restartable(&regs(232, -4), &signalled).rax as i64, -4);
        assert_eq!(restartable(&regs(7, -514), &quiet).rax as i64, -514);
    }
}
