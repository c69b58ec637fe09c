//! Signals while mprof waits on a profiled program.
//!
//! A Ctrl-C typed in the terminal already reaches the whole foreground process group, the child
//! included, so mprof must not send it a second time. A signal sent to mprof alone (`kill`)
//! must be passed on. The kernel tells the two apart in `si_code`.

use std::sync::atomic::{AtomicI32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let code = unsafe { (*info).si_code };
    // SI_USER (0), SI_QUEUE (-1), SI_TKILL (-6): sent by a process, to mprof only.
    if code <= 0 {
        PENDING.store(sig, Ordering::Relaxed);
    }
}

/// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT instead of dying from them.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// A signal sent to mprof alone that should be passed on to the child, if one came.
pub fn take_forward() -> Option<i32> {
    match PENDING.swap(0, Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}
