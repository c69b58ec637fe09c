//! Which stack created each thread: the agent's SPAWN, SPAWNED and HANDLE records
//! (`mprof_common::record::threads`) paired into thread id → origin, per process.
//!
//! A thread's HANDLE can come before the SPAWNED of its own creation (the new thread may
//! sample before its creator returns), and a `pthread_t` is reused once its thread is joined.
//! So a thread whose HANDLE comes while creations are under way (a SPAWN without its SPAWNED
//! yet) waits for them: its origin is the creation among those that returned its handle, if
//! one did, else the latest creation that had returned its handle before. A creation whose
//! SPAWNED never came (the ring was full) stops counting as under way [`LOST_AFTER`] creations
//! later.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

/// A creation still under way counts as lost once its serial is more than this far behind
/// the latest.
pub const LOST_AFTER: u32 = 4096;
/// Most threads waiting at once; beyond, a thread takes the latest origin of its handle.
pub const MAX_WAITING: usize = 1024;

/// Most creations, handles and waiting threads [`Pairing`] keeps each (a capture is untrusted
/// input); beyond, new ones are left unpaired.
pub const MAX_PAIRING: usize = 1 << 16;

/// A thread whose HANDLE came while creations were under way.
#[derive(Clone, Copy, Debug)]
struct Waiting<T> {
    handle: u64,
    /// The latest creation that had returned `handle` before the HANDLE, if any.
    before: Option<T>,
    /// The highest serial under way then: only a creation up to it can be this thread's.
    upto: u32,
}

/// Pairs threads (by kernel id) with the origin of their creation (`T`: what the reader
/// made of the SPAWN's stack), reading SPAWN, SPAWNED and HANDLE in order (see the module's
/// doc). Memory is bounded by [`MAX_PAIRING`] entries per table, whatever the input.
pub struct Pairing<T> {
    under_way: BTreeMap<u32, T>,
    latest: HashMap<u64, T>,
    waiting: HashMap<u32, Waiting<T>>,
    /// Keyed with the standard hasher: thread ids and handles are the capture's, untrusted.
    paired: HashMap<u32, T>,
    /// The last thread asked for and its answer: samples come in runs of one thread.
    last: Cell<Option<(u32, Option<T>)>>,
}

impl<T> Default for Pairing<T> {
    fn default() -> Self {
        Pairing {
            under_way: BTreeMap::new(),
            latest: HashMap::new(),
            waiting: HashMap::new(),
            paired: HashMap::new(),
            last: Cell::new(None),
        }
    }
}

impl<T: Copy> Pairing<T> {
    /// A SPAWN: creation `serial` of a thread, from `origin`. Creations still under way
    /// [`LOST_AFTER`] serials before it are forgotten.
    pub fn spawn(&mut self, serial: u32, origin: T) {
        let lost = serial.saturating_sub(LOST_AFTER);
        if self
            .under_way
            .first_key_value()
            .is_some_and(|(&s, _)| s < lost)
        {
            self.under_way = self.under_way.split_off(&lost);
            self.settle(None);
        }
        if self.under_way.len() < MAX_PAIRING || self.under_way.contains_key(&serial) {
            self.under_way.insert(serial, origin);
        }
    }

    /// A SPAWNED: creation `serial` returned `handle` (0: it failed).
    pub fn spawned(&mut self, serial: u32, handle: u64) {
        let Some(origin) = self.under_way.remove(&serial) else {
            return;
        };
        if handle == 0 {
            return self.settle(None);
        }
        if self.latest.len() < MAX_PAIRING || self.latest.contains_key(&handle) {
            self.latest.insert(handle, origin);
        }
        self.settle(Some((serial, handle, origin)));
    }

    /// Pairs the waiting threads that can be now: with the creation that just `returned`
    /// (serial, handle, origin) if it is theirs, or with the origin their handle had when
    /// none of the creations they waited for is under way any more.
    fn settle(&mut self, returned: Option<(u32, u64, T)>) {
        let first_under_way = self.under_way.keys().next().copied();
        let mut done = Vec::new();
        for (&tid, w) in &self.waiting {
            match returned {
                Some((serial, handle, origin)) if handle == w.handle && serial <= w.upto => {
                    done.push((tid, Some(origin)));
                }
                _ if first_under_way.is_none_or(|first| first > w.upto) => {
                    done.push((tid, w.before));
                }
                _ => {}
            }
        }
        for (tid, origin) in done {
            self.waiting.remove(&tid);
            self.pair(tid, origin);
        }
    }

    /// A HANDLE: thread `tid` is `handle`, made by creation `serial` if the agent could
    /// tell (0: not known), which pairs it at once while that creation is under way.
    pub fn handle(&mut self, tid: u32, handle: u64, serial: u32) {
        let before = self.latest.get(&handle).copied();
        self.last.set(None);
        self.paired.remove(&tid);
        self.waiting.remove(&tid);
        if let Some(&origin) = self.under_way.get(&serial) {
            return self.pair(tid, Some(origin));
        }
        match self.under_way.keys().next_back() {
            Some(&upto) if self.waiting.len() < MAX_WAITING => {
                let w = Waiting {
                    handle,
                    before,
                    upto,
                };
                self.waiting.insert(tid, w);
            }
            _ => self.pair(tid, before),
        }
    }

    fn pair(&mut self, tid: u32, origin: Option<T>) {
        self.last.set(None);
        match origin {
            Some(o) if self.paired.len() < MAX_PAIRING => {
                self.paired.insert(tid, o);
            }
            _ => {}
        }
    }

    /// The origin of thread `tid`, once known (a thread still waiting has none yet). Asked
    /// for every sample: a capture without origins pays one test.
    #[inline]
    pub fn origin(&self, tid: u32) -> Option<T> {
        if self.paired.is_empty() {
            return None;
        }
        if let Some((last, origin)) = self.last.get() {
            if last == tid {
                return origin;
            }
        }
        let origin = self.paired.get(&tid).copied();
        self.last.set(Some((tid, origin)));
        origin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pairs_with_its_own_creation_in_either_order() {
        let mut p = Pairing::default();
        // In order: created, then sampled.
        p.spawn(1, 'a');
        p.spawned(1, 0x100);
        p.handle(11, 0x100, 0);
        assert_eq!(p.origin(11), Some('a'));
        // The handle is reused; the new thread samples before its creator returns.
        p.spawn(2, 'b');
        p.handle(12, 0x100, 0);
        assert_eq!(p.origin(12), None, "waits for the creation under way");
        p.spawned(2, 0x100);
        assert_eq!(
            p.origin(12),
            Some('b'),
            "not the stale creation of the handle"
        );
    }

    #[test]
    fn a_thread_waiting_for_others_creations_takes_the_latest_of_its_handle() {
        let mut p = Pairing::default();
        p.spawn(1, 'a');
        p.spawned(1, 0x100);
        p.spawn(2, 'b');
        p.spawn(3, 'c');
        p.handle(11, 0x100, 0);
        p.spawned(3, 0x300);
        assert_eq!(p.origin(11), None, "creation 2 is still under way");
        p.spawned(2, 0x200);
        assert_eq!(p.origin(11), Some('a'));
        // A failed creation closes too; a later creation cannot be a running thread's.
        p.spawn(4, 'd');
        p.handle(13, 0x400, 0);
        p.spawned(4, 0);
        p.spawn(5, 'e');
        p.spawned(5, 0x400);
        assert_eq!(p.origin(13), None);
    }

    #[test]
    fn a_thread_that_names_its_creation_is_paired_at_once() {
        let mut p = Pairing::default();
        p.spawn(1, 'a');
        p.spawned(1, 0x100);
        p.spawn(2, 'b');
        p.handle(12, 0x100, 2);
        assert_eq!(p.origin(12), Some('b'));
        p.spawned(2, 0x100);
        assert_eq!(p.origin(12), Some('b'));
        // A creation no longer under way is no hint.
        p.handle(13, 0x100, 1);
        assert_eq!(p.origin(13), Some('b'));
    }

    #[test]
    fn a_lost_creation_stops_holding_threads_back() {
        let mut p = Pairing::default();
        p.spawn(1, 'a');
        p.spawned(1, 0x100);
        p.spawn(2, 'b'); // its SPAWNED is lost
        p.handle(11, 0x100, 0);
        assert_eq!(p.origin(11), None);
        for serial in 3..=LOST_AFTER + 3 {
            p.spawn(serial, 'x');
            p.spawned(serial, 0x900);
        }
        assert_eq!(p.origin(11), Some('a'));
    }

    #[test]
    fn the_tables_stay_bounded() {
        let mut p = Pairing::default();
        for i in 0..(MAX_PAIRING as u32 + 10) {
            p.spawn(i + 1, i);
            p.handle(i, u64::from(i), 0);
        }
        assert!(p.under_way.len() <= MAX_PAIRING && p.waiting.len() <= MAX_WAITING);
        assert!(p.paired.len() <= MAX_PAIRING);
    }
}
