//! Which blocks were sampled, so that their frees are recorded.
//!
//! Every free in the target asks "was this block sampled?". The common answer, "no", costs one
//! multiply and one bit test in `SUMMARY`, 8 KiB that mostly stay in the first level cache
//! (measured with cachegrind on the alloc benchmark: at 32 KiB the summary's own loads missed D1
//! on about a quarter of the frees).
//! Behind it is `FILTER`, a megabyte of counters indexed by the same hash (a counting filter: a
//! zero counter proves the address was not sampled); a summary bit is set while any of the 16
//! counters it covers is non-zero (with 8,000 live samples, 1 GB of live heap at the default
//! rate, about one bit in eight is set). Only a set bit reads the counter, and only a non-zero
//! counter takes the lock and asks the exact set, an open-addressing hash table in memory
//! mapped straight from the kernel. Both are only ever written under the agent lock.

use crate::sys::{map_anon, munmap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// A megabyte of counters; a few KiB under Miri, which interprets every access to them (the
/// logic is the same at any size).
const FILTER_BITS: u32 = if cfg!(miri) { 12 } else { 20 };
const FILTER_LEN: usize = 1 << FILTER_BITS;
/// A counter that reached this value stays there (it can no longer be decremented exactly).
const STUCK: u8 = u8::MAX;

static FILTER: [AtomicU8; FILTER_LEN] = [const { AtomicU8::new(0) }; FILTER_LEN];
/// Counters per summary bit.
const PER_BIT: usize = 16;
/// Bit `i` is set while one of the counters `PER_BIT * i ..` is non-zero.
static SUMMARY: [AtomicU64; FILTER_LEN / PER_BIT / 64] =
    [const { AtomicU64::new(0) }; FILTER_LEN / PER_BIT / 64];

/// Whether the set holds every address (see [`AddrSet::hold_everything`]): read without the
/// lock by the free hooks of sessions that sample every allocation (`hooks::hook_free_every`).
static EVERYTHING: AtomicBool = AtomicBool::new(false);

/// Whether every address counts as sampled now: then every free goes to the slow path.
#[inline(always)]
pub fn holds_everything() -> bool {
    EVERYTHING.load(Ordering::Relaxed)
}

#[inline(always)]
fn summary_bit(slot: usize) -> (usize, u64) {
    let bit = slot / PER_BIT;
    (bit / 64, 1 << (bit % 64))
}

/// Counter `slot` went from zero to one.
fn summary_set(slot: usize) {
    let (word, mask) = summary_bit(slot);
    let w = &SUMMARY[word];
    w.store(w.load(Ordering::Relaxed) | mask, Ordering::Relaxed);
}

/// Counter `slot` went to zero: the bit clears if its neighbours are zero too.
/// Only under the agent lock, which every writer of `FILTER` holds.
fn summary_clear(slot: usize) {
    let first = slot / PER_BIT * PER_BIT;
    let group = FILTER[first..first + PER_BIT]
        .as_ptr()
        .cast::<[u8; PER_BIT]>();
    // SAFETY: the 16 counters are in bounds; the caller holds the lock, so nothing writes
    // them meanwhile, and a plain read beside other threads' atomic loads is no race. One
    // 16-byte read, where 16 atomic byte loads cost about 40 instructions a removal.
    let counters = unsafe { group.read() };
    if u128::from_ne_bytes(counters) == 0 {
        let (word, mask) = summary_bit(slot);
        let w = &SUMMARY[word];
        w.store(w.load(Ordering::Relaxed) & !mask, Ordering::Relaxed);
    }
}

#[inline(always)]
fn slot(addr: usize) -> usize {
    // Fibonacci hashing: the multiply carries the address bits that vary (bit 4 upwards, as
    // blocks are 16-byte aligned) into the top bits kept.
    ((addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS)) as usize
}

/// The free path's question: false proves `addr` was not sampled.
#[inline(always)]
pub fn maybe_sampled(addr: usize) -> bool {
    let slot = slot(addr);
    let (word, mask) = summary_bit(slot);
    SUMMARY[word].load(Ordering::Relaxed) & mask != 0 && FILTER[slot].load(Ordering::Relaxed) != 0
}

/// Faults in the filter's pages (a megabyte), which every session writes at random places
/// from its first samples on: a web server's first 10,000 requests took about 50 of its 256
/// faults, a few microseconds each, inside samples.
pub fn touch_filter() {
    // SAFETY: the filter is a static array of `FILTER_LEN` bytes.
    unsafe { crate::sys::touch_pages_for_writing(FILTER.as_ptr() as *mut u8, FILTER_LEN) }
}

const EMPTY: usize = 0;
const TOMBSTONE: usize = 1;

/// The exact set of sampled addresses. Use only under the agent lock.
pub struct AddrSet {
    table: *mut usize,
    cap: usize,
    used: usize, // live entries + tombstones
    live: usize,
    /// A filter counter got stuck at [`STUCK`] (it may stay non-zero with no address).
    stuck: bool,
    /// Every address counts as sampled (see [`AddrSet::hold_everything`]).
    everything: bool,
}

// SAFETY: the table is anonymous memory owned by the set alone; used under the session lock.
unsafe impl Send for AddrSet {}

impl AddrSet {
    pub const fn new() -> AddrSet {
        AddrSet {
            table: std::ptr::null_mut(),
            cap: 0,
            used: 0,
            live: 0,
            stuck: false,
            everything: false,
        }
    }

    /// At `--rate 1` every block is sampled, and a table of every live block misses the cache
    /// at each insert and removal: instead the set holds every address. The filter passes
    /// every free to the slow path, which records it (a free of a block allocated before the
    /// session is recorded too; readers ignore frees of blocks they never saw). Until
    /// [`AddrSet::clear`].
    pub fn hold_everything(&mut self) {
        self.everything = true;
        self.stuck = true;
        for c in FILTER.iter() {
            c.store(STUCK, Ordering::Relaxed);
        }
        for w in SUMMARY.iter() {
            w.store(u64::MAX, Ordering::Relaxed);
        }
        EVERYTHING.store(true, Ordering::Relaxed);
    }

    fn home(&self, addr: usize) -> usize {
        (addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> 7 & (self.cap - 1)
    }

    /// Entry `i` (`i < cap`).
    fn get(&self, i: usize) -> usize {
        debug_assert!(i < self.cap);
        // SAFETY: `table` maps `cap` words (made by `grow`), and every caller masks `i` with
        // `cap - 1`.
        unsafe { *self.table.add(i) }
    }

    /// Sets entry `i` (`i < cap`).
    fn set(&mut self, i: usize, value: usize) {
        debug_assert!(i < self.cap);
        // SAFETY: as for `get`; `&mut self` makes this the only access.
        unsafe { *self.table.add(i) = value }
    }

    /// Adds `addr`; returns false when memory for the table could not be had.
    pub fn insert(&mut self, addr: usize) -> bool {
        if self.everything {
            return true;
        }
        if (self.used + 1) * 2 > self.cap && !self.grow() {
            return false;
        }
        let mut i = self.home(addr);
        loop {
            let e = self.get(i);
            if e == EMPTY || e == TOMBSTONE {
                if e == EMPTY {
                    self.used += 1;
                }
                self.set(i, addr);
                self.live += 1;
                let slot = slot(addr);
                let c = &FILTER[slot];
                let v = c.load(Ordering::Relaxed);
                if v != STUCK {
                    c.store(v + 1, Ordering::Relaxed);
                    self.stuck |= v + 1 == STUCK;
                }
                if v == 0 {
                    summary_set(slot);
                }
                return true;
            }
            if e == addr {
                return true;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    /// Whether `addr` is in the set.
    #[cfg(test)]
    pub fn contains(&self, addr: usize) -> bool {
        if self.everything {
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        let mut i = self.home(addr);
        loop {
            let e = self.get(i);
            if e == EMPTY {
                return false;
            }
            if e == addr {
                return true;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    /// Removes `addr`; returns whether it was there.
    pub fn remove(&mut self, addr: usize) -> bool {
        if self.everything {
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        let mut i = self.home(addr);
        loop {
            let e = self.get(i);
            if e == EMPTY {
                return false;
            }
            if e == addr {
                self.set(i, TOMBSTONE);
                self.live -= 1;
                let slot = slot(addr);
                let c = &FILTER[slot];
                let v = c.load(Ordering::Relaxed);
                if v != STUCK && v != 0 {
                    c.store(v - 1, Ordering::Relaxed);
                    if v == 1 {
                        summary_clear(slot);
                    }
                }
                return true;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    fn grow(&mut self) -> bool {
        let new_cap = if self.live * 4 < self.cap {
            self.cap.max(1024) // mostly tombstones: rebuild at the same size
        } else {
            (self.cap * 2).max(1024)
        };
        let table = map_anon(new_cap * std::mem::size_of::<usize>()) as *mut usize;
        if table.is_null() {
            return false;
        }
        let stuck = self.stuck;
        let old = std::mem::replace(
            self,
            AddrSet {
                table,
                cap: new_cap,
                used: 0,
                live: 0,
                stuck,
                everything: false,
            },
        );
        for e in old.addresses() {
            self.reinsert(e);
        }
        if !old.table.is_null() {
            // SAFETY: the old table, which nothing refers to any more.
            unsafe { munmap(old.table.cast(), old.cap * std::mem::size_of::<usize>()) };
        }
        true
    }

    /// The addresses in the table.
    fn addresses(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.cap)
            .map(|i| self.get(i))
            .filter(|&e| e != EMPTY && e != TOMBSTONE)
    }

    fn reinsert(&mut self, addr: usize) {
        let mut i = self.home(addr);
        while self.get(i) != EMPTY {
            i = (i + 1) & (self.cap - 1);
        }
        self.set(i, addr);
        self.used += 1;
        self.live += 1;
    }

    /// Forgets every address and zeroes the filter, so that frees take the fast path again.
    /// Every non-zero counter belongs to an address in the table (unless one got stuck): with
    /// a table smaller than the filter, only those are zeroed (the whole filter is a megabyte
    /// to walk, milliseconds at the end of every session).
    pub fn clear(&mut self) {
        EVERYTHING.store(false, Ordering::Relaxed);
        if self.stuck || self.cap > FILTER_LEN / 4 {
            for c in FILTER.iter() {
                if c.load(Ordering::Relaxed) != 0 {
                    c.store(0, Ordering::Relaxed);
                }
            }
        } else {
            for e in self.addresses() {
                FILTER[slot(e)].store(0, Ordering::Relaxed);
            }
        }
        if !self.table.is_null() {
            // SAFETY: the table, forgotten right after.
            unsafe { munmap(self.table.cast(), self.cap * std::mem::size_of::<usize>()) };
        }
        *self = AddrSet::new();
        for w in SUMMARY.iter() {
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter is process-wide: one test at a time uses it.
    static FILTER_USER: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn insert_remove_and_filter_agree() {
        let _one = FILTER_USER.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = AddrSet::new();
        // Enough to grow the table a few times (twice under Miri, which is slow).
        let n = if cfg!(miri) { 3_000 } else { 20_000 };
        let addrs: Vec<usize> = (1..n).map(|i| 0x7f00_0000_0000 + i * 48).collect();
        for &a in &addrs {
            assert!(s.insert(a));
            assert!(maybe_sampled(a));
        }
        for &a in addrs.iter().step_by(2) {
            assert!(s.remove(a));
            assert!(!s.remove(a));
        }
        for &a in addrs.iter().skip(1).step_by(2) {
            assert!(maybe_sampled(a), "a live address always passes the filter");
            assert!(s.remove(a));
        }
        assert!(
            addrs.iter().all(|&a| !maybe_sampled(a)),
            "an emptied set leaves no bit behind"
        );
        assert!(SUMMARY.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        for &a in &addrs[..100] {
            s.insert(a);
        }
        s.clear();
        assert!(addrs.iter().all(|&a| !maybe_sampled(a)));
        assert!(FILTER.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        assert!(SUMMARY.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    /// `--rate 1`: every address is in the set and passes the filter, until it is cleared.
    #[test]
    #[cfg_attr(miri, ignore = "fills the whole filter")]
    fn holding_everything_passes_every_free_until_cleared() {
        let _one = FILTER_USER.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = AddrSet::new();
        s.hold_everything();
        for a in [0x10usize, 0x7f00_0000_1230, usize::MAX & !15] {
            assert!(maybe_sampled(a));
            assert!(s.insert(a) && s.contains(a) && s.remove(a) && s.remove(a));
        }
        assert_eq!(s.cap, 0, "no table is made");
        s.clear();
        assert!(FILTER.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        assert!(SUMMARY.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        assert!(!maybe_sampled(0x10) && !s.contains(0x10));
    }

    /// A counter stuck at its maximum has no address to find it by: clearing walks the filter.
    #[test]
    #[cfg_attr(miri, ignore = "a quarter of a billion hashes")]
    fn a_stuck_counter_is_cleared_too() {
        let _one = FILTER_USER.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = AddrSet::new();
        let target = slot(0x7f00_0000_0000);
        let same: Vec<usize> = (0..)
            .map(|i| 0x7f00_0000_0000 + i * 16)
            .filter(|&a| slot(a) == target)
            .take(STUCK as usize + 5)
            .collect();
        for &a in &same {
            assert!(s.insert(a));
        }
        for &a in &same {
            assert!(s.remove(a));
        }
        assert!(maybe_sampled(same[0]), "a stuck counter stays");
        s.clear();
        assert!(FILTER.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        assert!(!maybe_sampled(same[0]));
    }
}
