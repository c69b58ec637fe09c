//! Signals while mprof waits on a profiled program.
//!
//! A Ctrl-C typed in the terminal already reaches the whole foreground process group, the child
//! included, so mprof must not send it a second time. A signal sent to mprof alone (`kill`)
//! must be passed on. The kernel tells the two apart in `si_code`.
//!
//! Every signal handler of the CLI is installed through [`set_handler`].

use std::sync::atomic::{AtomicI32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);

/// A signal handler: plain, or given the `siginfo_t` (`SA_SIGINFO`).
pub enum Handler {
    Plain(extern "C" fn(libc::c_int)),
    Info(extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)),
}

/// Installs `handler` for `sig`, with `SA_RESTART` (so mprof's own blocking calls are not cut
/// short) and nothing blocked while it runs.
///
/// # Safety
///
/// `handler` runs at any point of any thread: it must be async-signal-safe (touch only atomics,
/// never allocate or take a lock).
pub unsafe fn set_handler(sig: libc::c_int, handler: Handler) {
    let (address, flags) = match handler {
        Handler::Plain(f) => (f as usize, libc::SA_RESTART),
        Handler::Info(f) => (f as usize, libc::SA_RESTART | libc::SA_SIGINFO),
    };
    // SAFETY: libc::sigaction is a C struct of integers and a sigset; all zeroes is valid.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = address;
    action.sa_flags = flags;
    // SAFETY: sigemptyset initialises the sigset inside `action`, a live local; sigaction
    // reads `action` and writes no old action (null). The handler's type matches `flags`
    // (SA_SIGINFO exactly for the three-argument one), and the caller vouches that it is
    // async-signal-safe.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: installed with SA_SIGINFO, so the kernel passes a valid siginfo_t for this
    // delivery, readable for the handler's duration.
    let code = unsafe { (*info).si_code };
    // SI_USER (0), SI_QUEUE (-1), SI_TKILL (-6): sent by a process, to mprof only.
    if code <= 0 {
        PENDING.store(sig, Ordering::Relaxed);
    }
}

/// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT instead of dying from them.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: on_signal reads its siginfo and stores into an atomic: async-signal-safe.
        unsafe { set_handler(sig, Handler::Info(on_signal)) };
    }
}

/// A signal sent to mprof alone that should be passed on to the child, if one came.
pub fn take_forward() -> Option<i32> {
    match PENDING.swap(0, Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}

/// The name of signal `sig` (`SIGKILL`), or `signal N` for one without a usual name.
pub fn name(sig: i32) -> String {
    let known = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    match known.iter().find(|(n, _)| *n == sig) {
        Some((_, name)) => (*name).to_owned(),
        None => format!("signal {sig}"),
    }
}
