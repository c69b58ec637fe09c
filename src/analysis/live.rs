//! The table of live sampled blocks, by address.
//!
//! At `--rate 1` a reader inserts and removes a block for nearly every record, in a table of
//! millions: with the blocks scattered by a hash, each of those is a cache miss, and the
//! table's size is most of the reader's memory. Two things keep both down:
//! - neighbouring addresses hash to neighbouring buckets ([`GroupHasher`]): a run of samples
//!   through the same pool touches fewer cache lines;
//! - an entry is 24 bytes: the address and a [`Compact`] block, whose rate is an index into
//!   the rates the table has seen (a capture announces a handful).

use crate::analysis::aggregate::Block;
use crate::analysis::names::StackId;
use crate::capture::frame::GroupHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// The largest size a block keeps (48 bits; larger ones, only in crafted captures, are cut).
const MAX_SIZE: u64 = (1 << 48) - 1;

/// A live block as the table keeps it.
#[derive(Clone, Copy)]
struct Compact {
    stack: u32,
    tid: u32,
    size_lo: u32,
    size_hi: u16,
    rate: u16,
}

/// Live blocks by address.
#[derive(Default)]
pub(crate) struct LiveTable {
    blocks: HashMap<u64, Compact, BuildHasherDefault<GroupHasher>>,
    /// The rates of the blocks, by index.
    rates: Vec<u64>,
}

impl LiveTable {
    /// Live blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    fn compact(&mut self, b: &Block) -> Compact {
        let rate = match self.rates.iter().rposition(|&r| r == b.rate) {
            Some(i) => i,
            None if self.rates.len() <= u16::MAX as usize => {
                self.rates.push(b.rate);
                self.rates.len() - 1
            }
            // Only a crafted capture announces 65,536 rates: the last one stands for the rest.
            None => self.rates.len() - 1,
        };
        let size = b.size.min(MAX_SIZE);
        Compact {
            stack: b.stack.0,
            tid: b.tid,
            size_lo: size as u32,
            size_hi: (size >> 32) as u16,
            rate: rate as u16,
        }
    }

    fn block(&self, c: Compact) -> Block {
        Block {
            stack: StackId(c.stack),
            tid: c.tid,
            size: (c.size_hi as u64) << 32 | c.size_lo as u64,
            rate: self.rates[c.rate as usize],
        }
    }

    /// Inserts a block; returns the block it replaced at the same address.
    pub(crate) fn insert(&mut self, addr: u64, block: Block) -> Option<Block> {
        let c = self.compact(&block);
        let old = self.blocks.insert(addr, c)?;
        Some(self.block(old))
    }

    /// Removes the block at `addr`, if there is one.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<Block> {
        let old = self.blocks.remove(&addr)?;
        Some(self.block(old))
    }

    /// The blocks, in no order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = Block> + '_ {
        self.blocks.values().map(|&c| self.block(c))
    }

    /// The blocks, taken out.
    pub(crate) fn into_values(self) -> impl Iterator<Item = Block> {
        let rates = self.rates;
        self.blocks.into_values().map(move |c| Block {
            stack: StackId(c.stack),
            tid: c.tid,
            size: (c.size_hi as u64) << 32 | c.size_lo as u64,
            rate: rates[c.rate as usize],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map, over churn at addresses close together, far apart and colliding, with
    /// sizes and rates kept exact.
    #[test]
    fn it_agrees_with_a_map() {
        let mut t = LiveTable::default();
        let mut m = std::collections::HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = match x % 4 {
                0 => 0x7f00_0000_0000 + (x >> 8) % 4096 * 16,
                1 => ((x >> 8) % 64) << 20,
                2 => x >> 3,
                _ => (x >> 8) % 100,
            };
            let block = Block {
                stack: StackId(i as u32),
                tid: 1,
                size: i << (i % 30),
                rate: 1 + i % 3 * 4096,
            };
            let key = |b: Block| (b.stack, b.size, b.rate);
            if x.is_multiple_of(3) {
                assert_eq!(t.remove(addr).map(key), m.remove(&addr).map(key), "{i}");
            } else {
                let old = t.insert(addr, block).map(key);
                assert_eq!(old, m.insert(addr, block).map(key), "{i}");
            }
            assert_eq!(t.len(), m.len());
        }
        let mut got: Vec<_> = t.values().map(|b| (b.stack, b.size)).collect();
        let mut want: Vec<_> = m.values().map(|b| (b.stack, b.size)).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
