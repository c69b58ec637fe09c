//! A spin lock for the agent's slow path. It never sleeps in the kernel on a futex the target
//! could be holding, and it is only taken when a sample or a sampled free is recorded.
//!
//! It knows its holder (by thread pointer), so a call that reaches the agent again on the
//! thread that holds it (an allocator call nested in the agent's work, a free made by a fork
//! handler after `raw_lock`) can be told so instead of spinning forever, without a
//! thread-local lookup.

use crate::sys::{sched_yield, thread_pointer};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct SpinLock<T> {
    /// The holder's thread pointer, 0 when free; its lowest bit (a thread pointer is aligned)
    /// says that work was deferred to the release ([`SpinLock::defer`]), which a release reads
    /// on the line it writes anyway.
    holder: AtomicUsize,
    value: UnsafeCell<T>,
    /// The work deferred (a `fn()`), read only when `holder` says there is some: after the
    /// value, where the common release never looks.
    deferred: AtomicUsize,
}

/// `holder`'s bit that says work was deferred.
const DEFERRED: usize = 1;

// SAFETY: the lock gives one thread at a time access to the `T` inside, so sharing the
// lock between threads is sound when `T` may be sent between them.
unsafe impl<T: Send> Sync for SpinLock<T> {}

pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            holder: AtomicUsize::new(0),
            value: UnsafeCell::new(value),
            deferred: AtomicUsize::new(0),
        }
    }

    pub fn lock(&self) -> Guard<'_, T> {
        self.lock_as(thread_pointer())
    }

    /// [`SpinLock::lock`] for the thread whose thread pointer is `me`.
    fn lock_as(&self, me: usize) -> Guard<'_, T> {
        let mut spins = 0u32;
        while self
            .holder
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins > 64 {
                // SAFETY: sched_yield has no preconditions.
                unsafe { sched_yield() };
            } else {
                std::hint::spin_loop();
            }
        }
        Guard { lock: self }
    }

    /// Whether the calling thread holds the lock.
    #[inline]
    pub fn held_by_me(&self) -> bool {
        // Relaxed: only this thread ever stores its own pointer there.
        self.holder.load(Ordering::Relaxed) & !DEFERRED == thread_pointer()
    }

    /// The lock, unless the calling thread holds it already: `None` then (taking it would
    /// never end). One compare-and-swap when the lock is free, which tells the holder too.
    #[inline]
    pub fn lock_unless_mine(&self) -> Option<Guard<'_, T>> {
        let me = thread_pointer();
        match self
            .holder
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Some(Guard { lock: self }),
            // Relaxed is enough: only this thread ever stores its own pointer there.
            Err(holder) if holder & !DEFERRED == me => None,
            Err(_) => Some(self.lock_as(me)),
        }
    }

    /// The lock if it is free: one compare-and-swap, and nothing else (no wait, no call).
    #[inline(always)]
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        match self.holder.compare_exchange(
            0,
            thread_pointer(),
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            // A guard is made only here: one made and dropped would release the lock.
            Ok(_) => Some(Guard { lock: self }),
            Err(_) => None,
        }
    }

    /// Runs `work` on the calling thread, which holds the lock, once it releases it (drops its
    /// guard): for work that must not run with the lock held (it takes a lock that comes
    /// before this one, or waits). A later `defer` before the release replaces it.
    pub fn defer(&self, work: fn()) {
        debug_assert!(self.held_by_me());
        self.deferred.store(work as usize, Ordering::Relaxed);
        // Only the holder stores into `holder` while it holds the lock.
        self.holder
            .store(thread_pointer() | DEFERRED, Ordering::Relaxed);
    }

    /// Takes the lock before `fork()` so that the child never inherits it held.
    pub fn raw_lock(&self) {
        std::mem::forget(self.lock());
    }

    /// Releases a lock taken with `raw_lock`.
    ///
    /// # Safety
    /// Only after `raw_lock` on the same thread (or in the child of a fork made after it).
    pub unsafe fn raw_unlock(&self) {
        self.holder.store(0, Ordering::Release);
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while the lock is held: no other reference to the value.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while the lock is held: no other reference to the value.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // Read while the lock is held: only its holder stores there.
        let deferred = self.lock.holder.load(Ordering::Relaxed) & DEFERRED != 0;
        if !deferred {
            self.lock.holder.store(0, Ordering::Release);
            return;
        }
        let work = self.lock.deferred.swap(0, Ordering::Relaxed);
        self.lock.holder.store(0, Ordering::Release);
        if work != 0 {
            // SAFETY: stored by `defer` from a `fn()`.
            let work: fn() = unsafe { std::mem::transmute::<usize, fn()>(work) };
            work();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads add to a plain (non-atomic) counter under the lock; none of their additions is
    /// lost. Under Miri the data-race detector also checks that the lock orders the accesses.
    #[test]
    fn the_lock_gives_one_thread_at_a_time_the_value() {
        const THREADS: u64 = 4;
        let per_thread: u64 = if cfg!(miri) { 200 } else { 100_000 };
        let lock = SpinLock::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        *lock.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), THREADS * per_thread);
    }

    /// `try_lock` takes a free lock, and leaves a held one held, whoever holds it (a guard
    /// made and dropped on the way would release it).
    #[test]
    fn try_lock_leaves_a_held_lock_held() {
        let lock = SpinLock::new(0u32);
        let guard = lock.try_lock().expect("a free lock is taken");
        assert!(lock.try_lock().is_none(), "held by this thread");
        assert_eq!(lock.holder.load(Ordering::Relaxed), thread_pointer());
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_none(), "held by another thread"));
        });
        assert_eq!(lock.holder.load(Ordering::Relaxed), thread_pointer());
        drop(guard);
        assert_eq!(lock.holder.load(Ordering::Relaxed), 0);
        assert!(lock.try_lock().is_some());
    }

    static RAN: AtomicUsize = AtomicUsize::new(0);
    static FREE_WHEN_RUN: AtomicUsize = AtomicUsize::new(0);
    static LOCK: SpinLock<u32> = SpinLock::new(0);

    fn note_run() {
        RAN.fetch_add(1, Ordering::Relaxed);
        FREE_WHEN_RUN.store(
            (LOCK.holder.load(Ordering::Relaxed) == 0) as usize,
            Ordering::Relaxed,
        );
    }

    /// Work deferred under the lock runs once, after the release, on the releasing thread.
    #[test]
    fn deferred_work_runs_once_after_the_release() {
        let guard = LOCK.lock();
        LOCK.defer(note_run);
        assert_eq!(RAN.load(Ordering::Relaxed), 0);
        drop(guard);
        assert_eq!(RAN.load(Ordering::Relaxed), 1);
        assert_eq!(
            FREE_WHEN_RUN.load(Ordering::Relaxed),
            1,
            "the lock was free"
        );
        drop(LOCK.lock());
        assert_eq!(RAN.load(Ordering::Relaxed), 1, "once");
    }

    /// `raw_lock` holds the lock (as across a fork) until `raw_unlock`.
    #[test]
    fn a_raw_lock_is_held_until_raw_unlock() {
        let lock = SpinLock::new(1u32);
        lock.raw_lock();
        assert_eq!(lock.holder.load(Ordering::Relaxed), thread_pointer());
        assert!(lock.lock_unless_mine().is_none(), "its holder is told");
        // SAFETY: taken with raw_lock just above, on this thread.
        unsafe { lock.raw_unlock() };
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
        let held = lock.lock();
        assert!(lock.lock_unless_mine().is_none());
        drop(held);
        std::thread::scope(|s| {
            let other = s.spawn(|| lock.lock_unless_mine().map(|mut g| *g += 1));
            assert!(other.join().unwrap().is_some(), "another thread takes it");
        });
        assert_eq!(*lock.lock(), 3);
    }
}
