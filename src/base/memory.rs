//! How much memory the current thread holds: mprof's global allocator is the system one with a
//! per-thread count of the bytes allocated and not yet freed. The capture reader uses it to
//! keep a hostile capture from taking more than a bounded multiple of its own size (see
//! `crate::analysis::profile`), and the fuzz test measures with it.
//!
//! The count is per thread (a thread-local, no atomics): a block freed by another thread than
//! the one that allocated it moves bytes between the two counts. The reader allocates and
//! frees on one thread, so its count is exact.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting.
pub struct Counting;

thread_local! {
    static IN_USE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // During thread teardown the count may be gone already: nothing to count then.
    let _ = IN_USE.try_with(|n| {
        let now = n.get() + delta;
        n.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now)
            }
        });
    });
}

// SAFETY: every method hands the call to `System` unchanged (same pointer, layout and size) and
// returns its result, so Counting keeps System's guarantees. The counting beside it only
// touches `const`-initialised thread-locals without destructors (no allocation, no
// re-entry), and `try_with` skips it during thread teardown instead of panicking.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Has the C library give large blocks (128 KiB and more) back to the system as soon as they
/// are freed. glibc raises that threshold as large blocks are freed, up to 32 MiB, after which
/// the tables a capture reader grows and drops (the live blocks of one capture, then the
/// next's) stay in its heap: `diff` of two `--rate 1` captures of 2 million live blocks
/// peaked at 154 MiB instead of 121. Setting the threshold keeps it where it starts.
pub fn return_large_blocks() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of the C library's allocator; it is called before
    // any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Bytes the current thread holds now (allocated by it and not freed). It can be negative
/// after the thread freed blocks that another thread allocated: only differences matter.
pub fn in_use() -> isize {
    IN_USE.with(Cell::get)
}

/// The highest [`in_use`] since the last [`reset_peak`] (or since the thread started).
#[cfg(any(test, fuzzing))]
pub fn peak() -> isize {
    PEAK.with(Cell::get)
}

/// Starts measuring a new peak from what the thread holds now.
#[cfg(any(test, fuzzing))]
pub fn reset_peak() {
    PEAK.with(|p| p.set(IN_USE.with(Cell::get)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_this_thread_holds() {
        let before = in_use();
        reset_peak();
        let v = std::hint::black_box(vec![0u8; 1 << 20]);
        assert!(in_use() >= before + (1 << 20));
        drop(v);
        assert!(in_use() < before + (1 << 20));
        assert!(peak() >= before + (1 << 20));
    }
}
