//! Running system calls in a stopped thread of the target so that, whenever mprof dies, the
//! thread goes on exactly as it would have without mprof.
//!
//! Single-stepping an injected `syscall` instruction leaves the trap flag set in the thread;
//! a tracer that dies then (SIGKILL, the OOM killer) leaves the thread to die of SIGTRAP on its
//! next instruction. Instead, mprof builds a signal frame on the thread's stack (below the red
//! zone) that holds the thread's own registers, signal mask and vector state, and points the
//! thread at `__restore_rt` (`mov $15, %rax; syscall`) with its stack pointer on that frame: run
//! untraced, the thread calls `rt_sigreturn`, which puts back the state in the frame.
//!
//! mprof then works only at system-call stops (`PTRACE_SYSCALL`, reported as `SIGTRAP|0x80`,
//! which is no signal at all if the tracer goes away):
//!
//! ```text
//!  interrupt stop ──set regs: rip=__restore_rt, rsp=frame──► entry stop of rt_sigreturn
//!  entry stop: orig_rax := injected call, rip := __restore_rt ──► exit stop (result in rax)
//!  exit stop ──► entry stop of rt_sigreturn again ... (one round per injected call)
//!  entry stop, left alone ──► exit stop with the thread's own registers back
//! ```
//!
//! At every one of these points the thread, if let go, either runs `rt_sigreturn` on the
//! frame or already has its own registers: there is nothing to undo. Even an injected call
//! that mprof does not see finish returns to `__restore_rt`.

use crate::error::{other, AttachError};
use crate::ptrace::{self, Regs, Stop};
use crate::remote::Mem;
use crate::target::Liveness;
use std::mem::{offset_of, size_of};
use std::time::Duration;

const SYS_RT_SIGRETURN: i64 = 15;
/// Bytes below the stack pointer that the thread's code may be using (x86-64 ABI).
const RED_ZONE: u64 = 128;
const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
/// An `ss_flags` that `sigaltstack` rejects: `rt_sigreturn` then leaves the thread's
/// alternate signal stack as it is (mprof cannot read it to write it back).
const SS_FLAGS_LEAVE_ALONE: i32 = 4;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// Where the software-reserved bytes (`struct _fpx_sw_bytes`) sit in an XSAVE area.
const SW_BYTES: usize = 464;
/// How long a thread may take to reach the next system-call stop.
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Signals delivered to the thread while it is hijacked, before giving up.
const MAX_SIGNALS: usize = 64;

/// `struct sigcontext` of x86-64.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SigContext {
    r8: u64,
    r9: u64,
    r10: u64,
    r11: u64,
    r12: u64,
    r13: u64,
    r14: u64,
    r15: u64,
    rdi: u64,
    rsi: u64,
    rbp: u64,
    rbx: u64,
    rdx: u64,
    rax: u64,
    rcx: u64,
    rsp: u64,
    rip: u64,
    eflags: u64,
    cs: u16,
    gs: u16,
    fs: u16,
    ss: u16,
    err: u64,
    trapno: u64,
    oldmask: u64,
    cr2: u64,
    fpstate: u64,
    reserved: [u64; 8],
}

/// The kernel's `struct rt_sigframe` of x86-64: return address, `ucontext`, `siginfo`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RtSigframe {
    pretcode: u64,
    uc_flags: u64,
    uc_link: u64,
    ss_sp: u64,
    ss_flags: i32,
    ss_pad: i32,
    ss_size: u64,
    mcontext: SigContext,
    sigmask: u64,
    info: [u8; 128],
}

const _: () = assert!(size_of::<SigContext>() == 256);
const _: () = assert!(offset_of!(RtSigframe, mcontext) == 8 + 40);
const _: () = assert!(offset_of!(RtSigframe, sigmask) == 8 + 296);
const _: () = assert!(size_of::<RtSigframe>() == 440);

impl RtSigframe {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C), made only of integers, with no padding (checked by the sizes above).
        unsafe { std::slice::from_raw_parts((self as *const Self).cast(), size_of::<Self>()) }
    }
}

/// The thread's vector state as `rt_sigreturn` reads it, and the `uc_flags` that say which
/// format it is in.
struct FpState {
    bytes: Vec<u8>,
    uc_flags: u64,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn fp_state(tid: u32) -> std::io::Result<FpState> {
    if let Some(mut xsave) = ptrace::get_xstate(tid)? {
        // The kernel fills the software-reserved bytes with the XSAVE layout it uses for
        // signal frames; the frame must end with the second magic right after that size.
        if u32_at(&xsave, SW_BYTES) == Some(FP_XSTATE_MAGIC1) {
            let size = u32_at(&xsave, SW_BYTES + 16).unwrap_or(0) as usize;
            if size >= 576 && size <= xsave.len() {
                xsave.truncate(size);
                xsave.extend_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
                return Ok(FpState {
                    bytes: xsave,
                    uc_flags: UC_FP_XSTATE,
                });
            }
        }
    }
    Ok(FpState {
        bytes: ptrace::get_fxsave(tid)?,
        uc_flags: 0,
    })
}

/// Where the frame goes below `rsp`: (frame address, vector-state address, lowest byte used).
fn layout(rsp: u64, fp_len: usize) -> (u64, u64) {
    let fp = (rsp - RED_ZONE - fp_len as u64) & !63;
    let frame = (fp - size_of::<RtSigframe>() as u64) & !15;
    (frame, fp)
}

/// The stack space the frame needs below the stack pointer.
pub fn frame_span(fp_len: usize) -> u64 {
    RED_ZONE + fp_len as u64 + size_of::<RtSigframe>() as u64 + 128
}

/// A thread of the target, hijacked: it sits at the entry of `rt_sigreturn` on a frame that
/// resumes it as `resume`.
pub struct Hijack {
    pid: u32,
    /// Tells whether the process exited or replaced its program.
    target: Liveness,
    tid: u32,
    /// `__restore_rt`: `mov $15, %rax; syscall`.
    gadget: u64,
    /// The stack pointer while hijacked: just above the frame's return-address slot.
    hop_rsp: u64,
    resume: Regs,
}

/// Registers a thread resumes with: `regs`, restarted at `rip` with `rax`.
pub fn resume_regs(regs: &Regs, rip: u64, rax: u64) -> Regs {
    let mut r = *regs;
    r.rip = rip;
    r.rax = rax;
    r.orig_rax = u64::MAX;
    r
}

impl Hijack {
    /// Hijacks `tid`, which must be in a ptrace stop: writes a frame that resumes it as
    /// `resume` with signal mask `blocked` and sends it to the entry of `rt_sigreturn`.
    /// `stack_low` is the lowest address the frame may use (the bottom of its stack mapping).
    pub fn begin(
        mem: &Mem,
        target: Liveness,
        tid: u32,
        gadget: u64,
        resume: Regs,
        blocked: u64,
        stack_low: u64,
    ) -> Result<Hijack, AttachError> {
        let fp = fp_state(tid).map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                ptrace::reap(tid);
            }
            target.why_gone(e, "reading the thread's vector state")
        })?;
        if resume.rsp < stack_low + frame_span(fp.bytes.len()) {
            return Err(other(
                "controlling the chosen thread",
                format!("thread {tid} has no room on its stack"),
            ));
        }
        let (frame_at, fp_at) = layout(resume.rsp, fp.bytes.len());
        let r = &resume;
        let frame = RtSigframe {
            pretcode: 0,
            uc_flags: fp.uc_flags | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS,
            uc_link: 0,
            ss_sp: 0,
            ss_flags: SS_FLAGS_LEAVE_ALONE,
            ss_pad: 0,
            ss_size: 0,
            mcontext: SigContext {
                r8: r.r8,
                r9: r.r9,
                r10: r.r10,
                r11: r.r11,
                r12: r.r12,
                r13: r.r13,
                r14: r.r14,
                r15: r.r15,
                rdi: r.rdi,
                rsi: r.rsi,
                rbp: r.rbp,
                rbx: r.rbx,
                rdx: r.rdx,
                rax: r.rax,
                rcx: r.rcx,
                rsp: r.rsp,
                rip: r.rip,
                eflags: r.eflags,
                cs: r.cs as u16,
                ss: r.ss as u16,
                fpstate: fp_at,
                ..SigContext::default()
            },
            sigmask: blocked,
            info: [0; 128],
        };
        let write = |at, bytes: &[u8]| {
            mem.write(at, bytes)
                .map_err(|e| target.why_gone(e, "writing a signal frame on the thread's stack"))
        };
        // The frame lies below the red zone, in stack the thread does not use: were mprof to
        // die right here, nothing would have changed.
        write(fp_at, &fp.bytes)?;
        write(frame_at, frame.as_bytes())?;
        let h = Hijack {
            pid: target.pid(),
            target,
            tid,
            gadget,
            hop_rsp: frame_at + 8,
            resume,
        };
        let mut hop = resume;
        hop.rip = gadget;
        hop.rsp = h.hop_rsp;
        hop.orig_rax = u64::MAX;
        ptrace::set_regs(tid, &hop).map_err(|e| h.failed(e))?;
        // From here on, the thread resumed by anyone runs rt_sigreturn on the frame.
        h.to_gadget()?;
        Ok(h)
    }

    fn failed(&self, e: std::io::Error) -> AttachError {
        if e.raw_os_error() == Some(libc::ESRCH) {
            ptrace::reap(self.tid);
        }
        self.target.why_gone(e, "controlling the chosen thread")
    }

    /// Resumes the thread up to its next system-call stop, delivering signals that arrive on
    /// the way (their handlers run on top of the hijacked state and return to it).
    fn step(&self) -> Result<ptrace::SyscallStop, AttachError> {
        let mut sig = 0;
        for _ in 0..MAX_SIGNALS {
            ptrace::syscall(self.tid, sig).map_err(|e| self.failed(e))?;
            match ptrace::wait(self.tid, STEP_TIMEOUT).map_err(|e| self.failed(e))? {
                Some(Stop::Syscall) => {
                    return ptrace::syscall_info(self.tid).map_err(|e| self.failed(e))
                }
                Some(Stop::Signal(s)) => sig = s,
                Some(Stop::Interrupted) => sig = 0,
                Some(Stop::Group(_)) => return Err(AttachError::Stopped(self.pid)),
                // The thread ran a signal handler that exec'd: the new program is let go.
                Some(Stop::Exec) => {
                    ptrace::let_exec_go(self.pid);
                    return Err(self.target.execed());
                }
                // Gone: the process exited or another thread exec'd (which ends this one a
                // moment before the new program is in place), or the thread exited alone.
                Some(Stop::Gone) => {
                    return Err(self
                        .target
                        .left_within(20)
                        .unwrap_or_else(|| self.lost("vanished")))
                }
                None => return Err(self.lost("did not reach a system call")),
            }
        }
        Err(self.lost("keeps receiving signals"))
    }

    fn lost(&self, what: &str) -> AttachError {
        other(
            "controlling the chosen thread",
            format!("thread {} {what}", self.tid),
        )
    }

    /// Resumes the thread until it enters our `rt_sigreturn`. System calls of signal handlers
    /// that run on the way (their own `rt_sigreturn` included: its stack pointer differs) are
    /// let through.
    fn to_gadget(&self) -> Result<(), AttachError> {
        for _ in 0..MAX_SIGNALS * 4 {
            let stop = self.step()?;
            if stop.entry && stop.value == SYS_RT_SIGRETURN && stop.sp == self.hop_rsp {
                return Ok(());
            }
        }
        Err(self.lost("does not come back from signal handlers"))
    }

    /// The exit stop that must follow the entry stop the thread is in.
    fn to_exit(&self) -> Result<i64, AttachError> {
        let stop = self.step()?;
        if stop.entry {
            return Err(self.lost("entered a second system call"));
        }
        Ok(stop.value)
    }

    /// Runs system call `nr` in the thread and returns its result (a negative errno on
    /// failure). The thread comes back to the entry of `rt_sigreturn`.
    pub fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64, AttachError> {
        let mut r = ptrace::get_regs(self.tid).map_err(|e| self.failed(e))?;
        r.orig_rax = nr;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) =
            (args[0], args[1], args[2], args[3], args[4], args[5]);
        // Whether or not mprof sees the call return, the thread goes back to __restore_rt.
        r.rip = self.gadget;
        r.rsp = self.hop_rsp;
        ptrace::set_regs(self.tid, &r).map_err(|e| self.failed(e))?;
        let result = self.to_exit()?;
        self.to_gadget()?;
        Ok(result)
    }

    /// Lets `rt_sigreturn` run: the thread stops at its exit with its own registers back,
    /// still traced. Returns those registers.
    pub fn end(self) -> Result<Regs, AttachError> {
        self.to_exit()?;
        let regs = ptrace::get_regs(self.tid).map_err(|e| self.failed(e))?;
        if regs.rip != self.resume.rip || regs.rsp != self.resume.rsp {
            return Err(self.lost(&format!(
                "came back at {:#x} instead of {:#x}",
                regs.rip, self.resume.rip
            )));
        }
        Ok(regs)
    }

    pub fn tid(&self) -> u32 {
        self.tid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_lies_below_the_red_zone_and_is_aligned() {
        let rsp = 0x7fff_0000_1238;
        let (frame, fp) = layout(rsp, 2700);
        assert_eq!(fp % 64, 0);
        assert_eq!(frame % 16, 0);
        assert!(fp + 2700 <= rsp - RED_ZONE);
        assert!(frame + size_of::<RtSigframe>() as u64 <= fp);
        assert!(rsp - frame <= frame_span(2700));
    }
}
