//! The agent's locks, their order, and the fork protocol: the rules, each with its test below,
//! and the fork handlers that follow rule 5.
//!
//! # The locks
//! - `SESSION` (`lifecycle`): the session's state. Taken by every sample and sampled free (the
//!   hooks' slow paths), and by starts and stops. A spin lock: a thread that waits for it
//!   spins, so whatever runs under it must be short and must not wait.
//! - `GOT_LOCK` (`got`): the GOT entries the agent changed. Taken by scans (a session's start,
//!   after each `dlopen`) and restores (after a session's stop), and by the fork handlers.
//!   No hook's fast or slow path takes it.
//! - Not the agent's, but part of the order: the loader's list lock (`dl_load_write_lock`),
//!   held by `dl_iterate_phdr` while its callback runs, and the loader's load lock
//!   (`dl_load_lock`), held by `dlopen`, `dlclose`, `dlsym` and `dladdr`, and during library
//!   constructors and destructors. The allocator's own locks.
//!
//! # The rules
//! 1. **Order: `SESSION`, then `GOT_LOCK`, then the loader's list lock.** No thread takes one
//!    while it holds one that comes after it. Only the fork handler holds the first two at
//!    once; scans and restores call `dl_iterate_phdr` under `GOT_LOCK` alone (a stop under
//!    `SESSION` defers its restore, rule 3). Before, the fork handler took `GOT_LOCK` first
//!    while a stop held `SESSION` and restored under it: a fork during a detach could hang
//!    both threads for ever.
//! 2. **The program's allocation calls never run under an agent lock.** A hook calls the real
//!    allocator before it takes `SESSION` (allocations), after it released it (frees: the FREE
//!    is written first, so that no other thread can record the address reused before it), or,
//!    for a realloc of a sampled block, between the two, the block noted as moving
//!    (`lifecycle::Moving`). The allocator may block (its own locks, page faults, a copy of
//!    hundreds of MiB), and every sampling thread would spin meanwhile. The agent's own
//!    bookkeeping allocates only under `GOT_LOCK`, which nothing that allocates waits for.
//! 3. **Work that needs a lock after `SESSION`, or waits, runs once `SESSION` is released**:
//!    the GOT restore of a stop (deferred with `SpinLock::defer`, run on the same thread), and
//!    the wait for the reader before a library is unloaded (`lifecycle::before_unload`: the
//!    ring it reads is kept mapped while it waits).
//! 4. **Inside a `dl_iterate_phdr` callback, nothing that takes the loader's load lock**
//!    (`dlsym`, `dladdr`, `dlopen`): a thread in `dlopen` holds it and waits for the list
//!    lock to add an object.
//! 5. **Fork protocol.** Prepare: `SESSION`, then `GOT_LOCK` (rule 1), so that the child never
//!    inherits either held by a thread it does not have. Parent: both released. Child: both
//!    released; then, under `SESSION`, the session continues in a ring of the child's own or is
//!    forgotten. The child hands its ring to mprof without blocking (`follow`): a stopped
//!    mprof, or one whose backlog is full, costs the child at most half a second, after which
//!    it runs on unprofiled; its `fork()` never hangs.

use crate::lifecycle::{self, SESSION};
use crate::{follow, got, sampler, sys};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

static FORK_HANDLERS: Once = Once::new();

/// The process that forked, as the child's copy of it says: a child asked for its parent
/// once its parent returned from `fork` may already get init (the parent exited, as a
/// daemon's intermediate process does at once), and mprof could not tell it is one of the
/// program's.
static FORKED_BY: AtomicU32 = AtomicU32::new(0);

/// Rule 5's prepare handler.
extern "C" fn before_fork() {
    // SAFETY: getpid has no preconditions.
    FORKED_BY.store(unsafe { sys::getpid() } as u32, Ordering::Relaxed);
    // The locks' order (rule 1): the session's, then the GOT scans'.
    SESSION.raw_lock();
    got::lock_for_fork();
}

/// Rule 5's handler in the parent.
extern "C" fn after_fork_parent() {
    got::unlock_after_fork();
    // SAFETY: taken by `before_fork` on this thread.
    unsafe { SESSION.raw_unlock() };
}

/// The child of a fork shares the parent's ring but is not the parent: it stops writing there.
/// When children are followed it goes on in a ring of its own, handed to mprof.
extern "C" fn after_fork_child() {
    got::unlock_after_fork();
    // SAFETY: the child's copies of the locks `before_fork` took in the parent.
    unsafe { SESSION.raw_unlock() };
    // The forking thread's cached id is its parent's: the child's records must carry its own.
    let _ = sampler::THREAD.try_with(|t| t.tid.set(0));
    let mut s = SESSION.lock();
    let running = s.mapped.is_some();
    match running
        .then(|| follow::make_and_announce(follow::FORKED, FORKED_BY.load(Ordering::Relaxed)))
        .flatten()
    {
        Some(own) => {
            // SAFETY: the descriptor is not needed once mapped (mprof has its own).
            unsafe { sys::close(own.fd) };
            lifecycle::continue_in_child(&mut s, own.base, own.len);
        }
        None => lifecycle::forget_in_child(&mut s),
    }
}

/// Registers the fork handlers (once a process: they live as long as it does).
pub fn register_fork_handlers() {
    // SAFETY: pthread_atfork with handlers that live as long as the process (never unloaded).
    FORK_HANDLERS.call_once(|| unsafe {
        sys::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    });
}

#[cfg(test)]
mod tests {
    use crate::lifecycle::SESSION;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// Rule 1 (and 5): the fork handler takes `SESSION` before `GOT_LOCK`. While another
    /// thread holds `SESSION` (a stop), a thread in the fork handler waits for it holding
    /// nothing: `GOT_LOCK` stays free for the holder.
    #[test]
    fn the_fork_handler_takes_the_session_lock_first() {
        let _serial = crate::got::TEST_SERIAL.lock().unwrap();
        let held = SESSION.lock();
        let forked = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                super::before_fork();
                forked.store(true, Ordering::Release);
                super::after_fork_parent();
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !forked.load(Ordering::Acquire),
                "the handler waits for SESSION"
            );
            assert!(
                crate::got::lock_is_free(),
                "the handler took GOT_LOCK while waiting for SESSION"
            );
            drop(held);
        });
        assert!(forked.load(Ordering::Acquire));
    }

    /// Rule 3: a stop under `SESSION` leaves the GOT restore to the moment it is released
    /// (a restore under it could wait for the loader, whose lock a thread may hold while it
    /// waits for `SESSION` in a hook).
    #[test]
    fn a_stop_restores_the_got_only_once_the_session_lock_is_released() {
        let _serial = crate::got::TEST_SERIAL.lock().unwrap();
        let serial = crate::got::SERIAL.load(Ordering::Acquire);
        crate::got::want_hooks_for_test();
        let held = SESSION.lock();
        crate::lifecycle::stop_native(true, serial);
        assert!(crate::got::hooks_wanted(), "no restore under SESSION");
        drop(held);
        assert!(
            !crate::got::hooks_wanted(),
            "restored once SESSION was released"
        );
    }

    /// Rule 2: a realloc of a sampled block runs with no agent lock held; the block is out
    /// of the set while it moves, recorded freed if the realloc released it, and live again
    /// if it failed.
    #[test]
    fn a_sampled_realloc_calls_the_allocator_with_no_lock_held() {
        let _serial = crate::got::TEST_SERIAL.lock().unwrap();
        let old = 0x7000_1000usize;
        for fails in [false, true] {
            SESSION.lock().set.insert(old);
            let free_during_call = AtomicBool::new(false);
            // SAFETY: the call is a closure that allocates nothing; RAW domain, layer 0.
            let ptr = unsafe {
                crate::sampling::sampled_realloc(0, 0, old, 64, false, |_| {
                    let free = SESSION.try_lock().is_some();
                    free_during_call.store(free, Ordering::Relaxed);
                    assert!(!SESSION.lock().set.contains(old), "moving: out of the set");
                    if fails {
                        std::ptr::null_mut()
                    } else {
                        0x7000_2000usize as *mut std::ffi::c_void
                    }
                })
            };
            assert!(
                free_during_call.load(Ordering::Relaxed),
                "SESSION held in the call"
            );
            assert_eq!(ptr.is_null(), fails);
            let s = SESSION.lock();
            assert_eq!(s.set.contains(old), fails, "live again only if it failed");
            assert!(!s.moving.any());
            drop(s);
            SESSION.lock().set.remove(old);
        }
    }

    /// Rule 5: a child hands its ring over without blocking: against a listener that takes
    /// nothing (its backlog full), the connect gives up within its bound.
    #[test]
    fn a_child_never_waits_long_for_a_listener_that_takes_nothing() {
        let name = format!("mprof-test-backlog-{}", std::process::id());
        let Some(elapsed) = crate::follow::connect_to_full_backlog_for_test(&name) else {
            eprintln!("SKIPPED: no abstract Unix socket here");
            return;
        };
        assert!(
            elapsed < Duration::from_secs(2),
            "the child waited {elapsed:?} for a listener that takes nothing"
        );
    }
}
