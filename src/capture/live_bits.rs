//! The writer's count of sampled blocks live now, for each frame's `live` declaration (see
//! [`super::frame`]): a bit per 8-byte granule of memory, grouped by 4 KiB page.
//!
//! A `--rate 1` session passes every allocation and every free of the program through this
//! count while the program runs. A set of addresses scatters them over its table: with the
//! millions of small objects a Python job keeps alive, nearly every insert and remove was a
//! cache miss, and the count took a fifth of all the CPU the profiled job and mprof used.
//! Allocators hand out neighbouring blocks in runs (pymalloc carves a pool of one size class,
//! malloc splits its top chunk), so here a run of samples touches the same 64-byte page entry.
//!
//! The count is exact, as the reader checks it: an address that is not 8-byte aligned (no
//! allocator of a supported CPython returns one, but the addresses come from the profiled
//! process, which is not trusted) is kept in a set of its own.
//!
//! Its memory is bounded: a page's entry goes once its last block is freed, so the table
//! holds at most one page per live block, and past [`MAX_PAGES`] pages and odd addresses (a
//! program with more than 16 GiB of small live blocks sampled at `--rate 1`, or a target
//! sending scattered or odd addresses) the count stops and says so ([`LiveBits::count`] is `None`): the frames then
//! declare the most a declaration can say, and a reader asks for the user's say-so to read
//! them.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Granules of 8 bytes in a page of 4 KiB: 512 bits, one cache line.
const PAGE_SHIFT: u32 = 12;
const GRANULE_SHIFT: u32 = 3;
const WORDS: usize = 1 << (PAGE_SHIFT - GRANULE_SHIFT - 6);

/// The most pages (and odd addresses) the count follows (about 80 bytes each in the table:
/// 320 MiB at most).
pub const MAX_PAGES: usize = 1 << 22;

/// The live granules of one page.
type Page = [u64; WORDS];

/// Hashes a page number (or an odd address): a multiplicative hash whose high bits (hashbrown
/// takes its tag from them) and low bits (the bucket) are both mixed.
#[derive(Default)]
struct PageHasher(u64);

impl Hasher for PageHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, page: u64) {
        self.0 = page;
    }
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }
}

/// Sampled blocks live now, by address (see the module doc).
pub struct LiveBits {
    pages: HashMap<u64, Page, BuildHasherDefault<PageHasher>>,
    /// Addresses that are not 8-byte aligned.
    odd: HashSet<u64, BuildHasherDefault<PageHasher>>,
    len: usize,
    /// The most pages and odd addresses followed ([`MAX_PAGES`]; fewer in tests).
    max_pages: usize,
    /// The count went past `max_pages` and stopped.
    overflowed: bool,
}

impl Default for LiveBits {
    fn default() -> LiveBits {
        LiveBits::bounded(MAX_PAGES)
    }
}

impl LiveBits {
    fn bounded(max_pages: usize) -> LiveBits {
        LiveBits {
            pages: HashMap::default(),
            odd: HashSet::default(),
            len: 0,
            max_pages,
            overflowed: false,
        }
    }

    /// `addr` is live (again, if it was).
    #[inline]
    pub fn insert(&mut self, addr: u64) {
        if self.overflowed {
            return;
        }
        let odd = addr & ((1 << GRANULE_SHIFT) - 1) != 0;
        if self.pages.len() + self.odd.len() >= self.max_pages {
            let known = match odd {
                true => self.odd.contains(&addr),
                false => self.pages.contains_key(&(addr >> PAGE_SHIFT)),
            };
            if !known {
                self.overflowed = true;
                self.pages = HashMap::default();
                self.odd = HashSet::default();
                return;
            }
        }
        if odd {
            self.len += self.odd.insert(addr) as usize;
            return;
        }
        let (word, bit) = granule(addr);
        let page = self.pages.entry(addr >> PAGE_SHIFT).or_insert([0; WORDS]);
        self.len += (page[word] & bit == 0) as usize;
        page[word] |= bit;
    }

    /// `addr` is freed (whether it was live or not).
    #[inline]
    pub fn remove(&mut self, addr: u64) {
        if addr & ((1 << GRANULE_SHIFT) - 1) != 0 {
            self.len -= self.odd.remove(&addr) as usize;
            return;
        }
        let key = addr >> PAGE_SHIFT;
        let Some(page) = self.pages.get_mut(&key) else {
            return;
        };
        let (word, bit) = granule(addr);
        if page[word] & bit == 0 {
            return;
        }
        page[word] &= !bit;
        self.len -= 1;
        if page.iter().all(|&w| w == 0) {
            self.pages.remove(&key);
        }
    }

    /// How many blocks are live, or None once the count has stopped (see the module doc).
    pub fn count(&self) -> Option<usize> {
        (!self.overflowed).then_some(self.len)
    }

    /// The live blocks a frame declares now: the most a declaration says once the count has
    /// stopped.
    #[inline]
    pub fn declared(&self) -> u32 {
        match self.overflowed {
            true => u32::MAX,
            false => u32::try_from(self.len).unwrap_or(u32::MAX),
        }
    }
}

/// The word of a page and the bit in it of an 8-byte aligned address.
#[inline]
fn granule(addr: u64) -> (usize, u64) {
    let g = (addr >> GRANULE_SHIFT) as usize & (WORDS * 64 - 1);
    (g / 64, 1 << (g % 64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count against a plain set of addresses, on the runs an allocator makes (neighbours,
    /// the same address again, frees of addresses never sampled) and on odd addresses.
    #[test]
    fn the_count_is_the_number_of_distinct_live_addresses() {
        let mut bits = LiveBits::default();
        let mut set = HashSet::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200_000 {
            let r = next();
            // Mostly 16-byte blocks in a few pages, some odd addresses, some far away.
            let addr = match r % 10 {
                0 => r >> 16 | 1,
                1 => (r >> 20) << 4,
                _ => 0x7f00_0000_0000 + ((r >> 8) % 20_000) * 16,
            };
            if r >> 62 == 0 {
                bits.remove(addr);
                set.remove(&addr);
            } else {
                bits.insert(addr);
                set.insert(addr);
            }
            assert_eq!(bits.count(), Some(set.len()));
        }
        for addr in set.drain() {
            bits.remove(addr);
        }
        assert_eq!(bits.count(), Some(0));
        assert!(bits.pages.is_empty() && bits.odd.is_empty());
    }

    /// Scattered addresses, a page each, and odd addresses stop the count at its bound instead
    /// of growing it; what it knows already still counts there.
    #[test]
    fn scattered_addresses_stop_the_count_at_its_bound() {
        const MAX: usize = 1000;
        let mut bits = LiveBits::bounded(MAX);
        for page in 0..MAX as u64 - 1 {
            bits.insert(page << PAGE_SHIFT);
        }
        assert_eq!(bits.count(), Some(MAX - 1));
        bits.insert(7 << PAGE_SHIFT | 5);
        assert_eq!(bits.count(), Some(MAX));
        bits.insert(5 << PAGE_SHIFT | 8);
        bits.insert(7 << PAGE_SHIFT | 5);
        assert_eq!(bits.count(), Some(MAX + 1));
        bits.insert((MAX as u64) << PAGE_SHIFT);
        assert_eq!(bits.count(), None);
        assert!(bits.pages.capacity() == 0 && bits.odd.capacity() == 0);
        bits.remove(0);
        assert_eq!(bits.count(), None);
        let mut odd = LiveBits::bounded(MAX);
        for i in 0..MAX as u64 {
            odd.insert(i << 4 | 1);
        }
        assert_eq!(odd.count(), Some(MAX));
        odd.insert(1 << 40 | 3);
        assert_eq!(odd.count(), None);
        assert!(odd.odd.capacity() == 0);
    }
}
