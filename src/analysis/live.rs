//! The table of live sampled blocks, by address.
//!
//! At `--rate 1` a reader inserts and removes a block for nearly every record, in a table of
//! millions: each of those that misses the cache costs more than everything else a sample
//! does, and the table is most of the reader's memory. So the table is laid out for it:
//! - an entry is 16 bytes: the address and, packed in one word, the block's *site* (its
//!   stack, thread and rate, interned: a capture has a handful per stack) and its size (a
//!   block of 4 GiB or more keeps its size in a side table);
//! - open addressing with linear probing, the entries in the table itself (no separate
//!   control bytes), and removal by shifting the entries after it back (no tombstones);
//! - the four 16-byte granules of each 64 bytes of memory have four neighbouring slots, one
//!   cache line of the table, and the groups are scattered by a multiplicative hash: a
//!   program allocates and frees in runs through the same pools, so a run of samples touches
//!   few lines, and a block freed and allocated again finds its line in the cache.
//!
//! The table grows (doubles) at five eighths full: at three quarters, linear probes and the
//! shifts of removals ran long enough to cost 9% more instructions per insertion, 18% per
//! removal (callgrind, a `--rate 1` capture of 2 M samples).

use crate::analysis::estimate::Sample;
use crate::analysis::names::{FastMap, StackId};

/// A live sampled block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub stack: StackId,
    pub tid: u32,
    pub(crate) size: u64,
    pub(crate) rate: u64,
    /// What it stands for, worked out once: every table a block is in takes it back.
    sample: Sample,
}

impl Block {
    #[inline(always)]
    pub fn new(stack: StackId, tid: u32, size: u64, rate: u64) -> Block {
        Block {
            stack,
            tid,
            size,
            rate,
            sample: Sample::new(size, rate),
        }
    }

    /// What the block stands for.
    #[inline(always)]
    pub fn sample(&self) -> Sample {
        self.sample
    }
}

/// A block's size that does not fit the entry: the size is in [`LiveTable::big`].
const BIG: u32 = u32::MAX;
/// Slots of the first table.
const FIRST_SLOTS: usize = 1 << 10;
/// Sites interned before the first compaction ([`LiveTable::compact_sites`]).
const FIRST_SITES: usize = 1 << 16;

/// An entry: an address (0: the slot is free; a block at address 0 is kept apart) and its
/// block, the site in the high half of `block` and the size in the low half.
#[derive(Clone, Copy, Default)]
struct Entry {
    addr: u64,
    block: u64,
}

/// Four entries: the table's unit, one cache line.
#[derive(Clone, Copy, Default)]
#[repr(align(64))]
struct Line([Entry; 4]);

/// What a site stands for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Site {
    stack: u32,
    tid: u32,
    rate: u64,
}

/// Live blocks by address.
pub(crate) struct LiveTable {
    lines: Vec<Line>,
    /// Slots minus one (slots are a power of two).
    mask: usize,
    /// 64 minus the bits of a line's index: the shift that takes them from a hash.
    shift: u32,
    len: usize,
    /// The block at address 0, which a real capture never has.
    zero: Option<u64>,
    /// Sizes of blocks of 4 GiB or more, by address.
    big: FastMap<u64, u64>,
    sites: Vec<Site>,
    site_ids: FastMap<Site, u32>,
    /// Per stack id, the last site of that stack plus one (0: none yet): most samples find
    /// their site here without hashing.
    last_site: Vec<u32>,
}

impl Default for LiveTable {
    fn default() -> LiveTable {
        LiveTable::with_slots(FIRST_SLOTS)
    }
}

/// [`LiveTable::shift`] for a table of `slots` slots.
fn line_shift(slots: usize) -> u32 {
    64 - (slots / 4).trailing_zeros()
}

/// The multiplier of Fibonacci hashing (2^64 over the golden ratio).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl LiveTable {
    /// A table of `slots` slots (a power of two, at least 8).
    fn with_slots(slots: usize) -> LiveTable {
        debug_assert!(slots.is_power_of_two() && slots >= 8);
        LiveTable {
            lines: vec![Line::default(); slots / 4],
            mask: slots - 1,
            shift: line_shift(slots),
            len: 0,
            zero: None,
            big: FastMap::default(),
            sites: Vec::new(),
            site_ids: FastMap::default(),
            last_site: Vec::new(),
        }
    }

    /// Live blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The home slot of `addr`: its 64-byte group's line (the group scattered by the high
    /// bits of a multiplicative hash), and in it the slot of its 16-byte granule.
    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        let line = ((addr >> 6).wrapping_mul(GOLDEN) >> self.shift) as usize;
        (line * 4 + (addr >> 4 & 3) as usize) & self.mask
    }

    #[inline(always)]
    fn slot(&self, i: usize) -> &Entry {
        &self.lines[i / 4].0[i % 4]
    }

    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.lines[i / 4].0[i % 4]
    }

    /// Brings the table's line where `addr` would be into the cache, without waiting for it
    /// (for an address a later call will look up: see `crate::capture::records::Records::upcoming`).
    #[inline(always)]
    pub(crate) fn prefetch(&self, addr: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let line: *const Line = &self.lines[self.home(addr) / 4];
            // SAFETY: a prefetch is a hint that reads nothing the program sees, and SSE, which
            // it needs, is part of x86-64; `line` points into the table anyway.
            unsafe { _mm_prefetch(line as *const i8, _MM_HINT_T0) };
        }
    }

    /// The slot holding `addr`, or the free slot where it would go.
    #[inline(always)]
    fn find(&self, addr: u64) -> (usize, bool) {
        let mut i = self.home(addr);
        loop {
            let e = self.slot(i);
            if e.addr == addr {
                return (i, true);
            }
            if e.addr == 0 {
                return (i, false);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline(always)]
    fn site(&mut self, b: &Block) -> u32 {
        let site = Site {
            stack: b.stack.0,
            tid: b.tid,
            rate: b.rate,
        };
        if let Some(&last) = self.last_site.get(b.stack.0 as usize) {
            if self.sites.get((last as usize).wrapping_sub(1)) == Some(&site) {
                return last - 1;
            }
        }
        self.new_site(site)
    }

    /// [`LiveTable::site`] of a site not the last of its stack.
    #[inline(never)]
    fn new_site(&mut self, site: Site) -> u32 {
        if self.sites.len() >= FIRST_SITES.max(self.len * 4) && !self.site_ids.contains_key(&site) {
            self.compact_sites();
        }
        let at = site.stack as usize;
        let sites = &mut self.sites;
        let id = *self.site_ids.entry(site).or_insert_with(|| {
            sites.push(site);
            sites.len() as u32 - 1
        });
        if self.last_site.len() <= at {
            self.last_site.resize(at + 1, 0);
        }
        self.last_site[at] = id + 1;
        id
    }

    /// Keeps only the sites of blocks still live, renumbered: a session that starts a thread
    /// per request for days interns a site per stack and thread, most of them with no block
    /// left. Run when the sites outnumber four times the blocks, so its cost is spread over
    /// the sites interned since the last one.
    #[cold]
    fn compact_sites(&mut self) {
        let mut renumbered: FastMap<u32, u32> = FastMap::default();
        let mut sites = Vec::new();
        let mut keep = |packed: u64| -> u64 {
            let old = (packed >> 32) as u32;
            let new = *renumbered.entry(old).or_insert_with(|| {
                sites.push(self.sites[old as usize]);
                sites.len() as u32 - 1
            });
            (new as u64) << 32 | (packed & 0xffff_ffff)
        };
        for line in &mut self.lines {
            for e in line.0.iter_mut().filter(|e| e.addr != 0) {
                e.block = keep(e.block);
            }
        }
        if let Some(p) = self.zero {
            self.zero = Some(keep(p));
        }
        self.site_ids = sites
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, i as u32))
            .collect();
        self.sites = sites;
        self.last_site.clear();
    }

    #[inline(always)]
    fn pack(&mut self, addr: u64, b: &Block) -> u64 {
        let size = if b.size >= BIG as u64 {
            self.keep_big(addr, b.size)
        } else {
            b.size as u32
        };
        (self.site(b) as u64) << 32 | size as u64
    }

    /// Keeps the size of a block of 4 GiB or more apart: [`BIG`].
    #[cold]
    fn keep_big(&mut self, addr: u64, size: u64) -> u32 {
        self.big.insert(addr, size);
        BIG
    }

    /// The size of a block of 4 GiB or more (see [`LiveTable::keep_big`]).
    #[cold]
    fn big_size(&self, addr: u64) -> u64 {
        self.big.get(&addr).copied().unwrap_or(BIG as u64)
    }

    /// The block `packed` stands for at `addr`.
    #[inline(always)]
    fn block_of(&self, addr: u64, packed: u64) -> Block {
        let site = self.sites[(packed >> 32) as usize];
        let mut size = packed as u32 as u64;
        if size == BIG as u64 {
            size = self.big_size(addr);
        }
        Block::new(StackId(site.stack), site.tid, size, site.rate)
    }

    /// The block `packed` stands for at `addr`, which leaves the table.
    #[inline(always)]
    fn take(&mut self, addr: u64, packed: u64) -> Block {
        let block = self.block_of(addr, packed);
        if block.size >= BIG as u64 {
            self.forget_big(addr);
        }
        block
    }

    /// Forgets the size kept apart for a block that leaves the table.
    #[cold]
    fn forget_big(&mut self, addr: u64) {
        self.big.remove(&addr);
    }

    /// Inserts a block; returns the block it replaced at the same address.
    pub(crate) fn insert(&mut self, addr: u64, block: Block) -> Option<Block> {
        if addr == 0 {
            let old = self.zero.map(|p| self.take(0, p));
            self.len += old.is_none() as usize;
            self.zero = Some(self.pack(0, &block));
            return old;
        }
        let (mut i, found) = self.find(addr);
        let old = if found {
            let p = self.slot(i).block;
            Some(self.take(addr, p))
        } else {
            self.len += 1;
            if self.len * 8 > (self.mask + 1) * 5 {
                self.grow();
                i = self.find(addr).0;
            }
            None
        };
        let packed = self.pack(addr, &block);
        *self.slot_mut(i) = Entry {
            addr,
            block: packed,
        };
        old
    }

    /// Removes the block at `addr`, if there is one.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<Block> {
        if addr == 0 {
            let p = self.zero.take()?;
            self.len -= 1;
            return Some(self.take(0, p));
        }
        let (mut hole, found) = self.find(addr);
        if !found {
            return None;
        }
        let packed = self.slot(hole).block;
        self.len -= 1;
        // Shift back the entries after the hole that may live there (their home is not
        // between the hole and where they are).
        let mut i = hole;
        loop {
            i = (i + 1) & self.mask;
            let e = *self.slot(i);
            if e.addr == 0 {
                break;
            }
            let home = self.home(e.addr);
            if (i.wrapping_sub(home) & self.mask) >= (i.wrapping_sub(hole) & self.mask) {
                *self.slot_mut(hole) = e;
                hole = i;
            }
        }
        *self.slot_mut(hole) = Entry::default();
        Some(self.take(addr, packed))
    }

    /// Doubles the slots, moving every entry to its place in the new table.
    fn grow(&mut self) {
        let slots = (self.mask + 1) * 2;
        let old = std::mem::replace(&mut self.lines, vec![Line::default(); slots / 4]);
        self.mask = slots - 1;
        self.shift = line_shift(slots);
        for e in old.iter().flat_map(|line| line.0).filter(|e| e.addr != 0) {
            let (i, _) = self.find(e.addr);
            *self.slot_mut(i) = e;
        }
    }

    /// The blocks, in no order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = Block> + '_ {
        let zero = self.zero.map(|p| self.block_of(0, p));
        (0..=self.mask)
            .filter_map(|i| {
                let e = *self.slot(i);
                (e.addr != 0).then(|| self.block_of(e.addr, e.block))
            })
            .chain(zero)
    }

    /// The blocks, taken out.
    pub(crate) fn into_values(self) -> impl Iterator<Item = Block> {
        let zero = self.zero.map(|p| self.block_of(0, p));
        (0..=self.mask)
            .filter_map(move |i| {
                let e = *self.slot(i);
                (e.addr != 0).then(|| self.block_of(e.addr, e.block))
            })
            .chain(zero)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map, over churn at addresses close together, far apart, colliding and at 0,
    /// through growth, with sizes (4 GiB and more among them), threads and rates kept exact.
    #[test]
    fn it_agrees_with_a_map() {
        let mut t = LiveTable::default();
        let mut m = std::collections::HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..400_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = match x % 5 {
                0 => 0x7f00_0000_0000 + (x >> 8) % 4096 * 16,
                1 => ((x >> 8) % 64) << 20,
                2 => x >> 3,
                3 if i < 200_000 => 0x5500_0000_0000 + i * 16,
                _ => (x >> 8) % 100,
            };
            let block = Block::new(
                StackId((i % 1000) as u32),
                (x >> 40) as u32 % 3,
                i << (i % 40),
                1 + i % 3 * 4096,
            );
            let key = |b: Block| (b.stack, b.tid, b.size, b.rate);
            if x.is_multiple_of(3) {
                assert_eq!(t.remove(addr).map(key), m.remove(&addr).map(key), "{i}");
            } else {
                let old = t.insert(addr, block).map(key);
                assert_eq!(old, m.insert(addr, block).map(key), "{i}");
            }
            assert_eq!(t.len(), m.len());
        }
        assert!(t.len() > 50_000, "{}", t.len());
        let key = |b: Block| (b.stack, b.tid, b.size, b.rate);
        let mut got: Vec<_> = t.values().map(key).collect();
        let mut want: Vec<_> = m.values().copied().map(key).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        let mut taken: Vec<_> = t.into_values().map(key).collect();
        taken.sort_unstable();
        assert_eq!(taken, want);
    }

    /// A thread per request: a million threads, each with a block that lives a while. The
    /// sites interned stay a few times the blocks live, and every block keeps its own.
    #[test]
    fn sites_of_blocks_gone_are_forgotten() {
        let mut t = LiveTable::default();
        let mut m = std::collections::HashMap::new();
        let key = |b: Block| (b.stack, b.tid, b.size, b.rate);
        for tid in 0..1_000_000u32 {
            let addr = 0x5500_0000_0000 + (tid as u64 % 5_000) * 64;
            let block = Block::new(StackId(tid % 7), tid, 100 + tid as u64 % 9, 4096);
            assert_eq!(
                t.insert(addr, block).map(key),
                m.insert(addr, block).map(key),
                "{tid}"
            );
            if tid % 3 == 0 {
                let gone = 0x5500_0000_0000 + (tid as u64 * 7 % 5_000) * 64;
                assert_eq!(t.remove(gone).map(key), m.remove(&gone).map(key), "{tid}");
            }
            assert!(t.sites.len() <= FIRST_SITES.max(t.len() * 4) + 1, "{tid}");
        }
        let mut got: Vec<_> = t.values().map(key).collect();
        let mut want: Vec<_> = m.values().copied().map(key).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    /// An entry takes 16 bytes, four to a cache line.
    #[test]
    fn entries_are_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        assert_eq!(std::mem::size_of::<Line>(), 64);
    }
}
