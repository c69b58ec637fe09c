//! The resources mprof itself needs, checked before a session starts: a session that ran out
//! of file descriptors half-way through an attach could only say that a system call failed,
//! and used to call the target "exited" when it was alive.

use anyhow::{bail, Result};

/// File descriptors a session needs (the target's `/proc` files and memory, the ring, the
/// capture, pidfds, the rendezvous, followed children's rings), with room to spare.
pub const SESSION_DESCRIPTORS: u64 = 64;

/// Makes sure `needed` file descriptors may be open: raises the soft limit towards the hard
/// one if it must, or says in one line that the limit is too low.
pub fn ensure_descriptors(needed: u64, what: &str) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limits into `limit`, a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur >= needed
    {
        return Ok(());
    }
    if limit.rlim_max >= needed {
        let raised = libc::rlimit {
            rlim_cur: needed.max(limit.rlim_cur),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads `raised`, a local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(());
        }
    }
    bail!(
        "{what} needs about {needed} file descriptors and `ulimit -n` allows {}; raise it \
         (nothing was done)",
        limit.rlim_cur
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_already_high_enough_is_left_alone() {
        assert!(ensure_descriptors(3, "a test").is_ok());
    }
}
