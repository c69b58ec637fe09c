//! What resident memory is made of: the allocators' own statistics (HEAP, kind 20, written by
//! the agent a few times a second) and the process's mappings and their resident bytes
//! (RESIDENT, kind 21, written by mprof's reader from `/proc/PID/smaps` every 5 seconds at most
//! and at the end).
//! Together with the live sampled blocks they say where a process's RSS is, free memory that
//! the allocators keep included.
//!
//! HEAP body (64 bytes):
//! ```text
//!  0         8             12              16            24            32             40
//!  +---------+-------------+---------------+-------------+-------------+--------------+
//!  | time_ns | malloc_kind | pymalloc_known| malloc_used | malloc_free | malloc_mapped|
//!  | u64     | u32         | u32           | u64         | u64         | u64          |
//!  +---------+-------------+---------------+-------------+-------------+--------------+
//!  | pymalloc_arenas u64 (40) | pymalloc_used u64 (48) | rss u64 (56) |
//!  +--------------------------+------------------------+--------------+
//! ```
//! RESIDENT body:
//! ```text
//!  0         8       16            20            24
//!  +---------+-------+-------------+-------------+------------------------------------+
//!  | time_ns | rss   | nanon u32   | nnamed u32  | nanon × (start u64, end u64, rss u64) |
//!  +---------+-------+-------------+-------------+------------------------------------+
//!  | nnamed × (rss u64, name_len u16, name bytes (UTF-8 as the kernel shows it))      |
//!  +------------------------------------------------------------------------------------+
//! ```
//! The anonymous mappings are listed one by one (the ranges that sampled `mmap` blocks are
//! looked up in); named mappings (files, `[heap]`, `[stack]`...) only by name, their resident
//! bytes added up. Both lists come from the target: readers bound them ([`MAX_ANON`],
//! [`MAX_NAMED`], [`MAX_NAME`]).

/// HEAP's `malloc_kind`: what `malloc` is.
pub const MALLOC_UNKNOWN: u32 = 0;
/// glibc's malloc (figures from `mallinfo2`).
pub const MALLOC_GLIBC: u32 = 1;
/// jemalloc (figures from its `stats.*` controls).
pub const MALLOC_JEMALLOC: u32 = 2;
/// Another allocator, whose figures mprof does not know how to read.
pub const MALLOC_OTHER: u32 = 3;

/// Most anonymous mappings a RESIDENT record lists.
pub const MAX_ANON: usize = 1 << 16;
/// Most named mappings a RESIDENT record lists.
pub const MAX_NAMED: usize = 256;
/// Longest mapping name kept, in bytes.
pub const MAX_NAME: usize = 512;

/// The allocators' statistics at one moment (a HEAP record).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    pub time_ns: u64,
    /// `MALLOC_*`.
    pub malloc_kind: u32,
    /// 1 when pymalloc's figures were read (they are 0 when pymalloc is not the allocator).
    pub pymalloc_known: u32,
    /// Bytes `malloc` holds for the program (in use, its own big mappings included).
    pub malloc_used: u64,
    /// Bytes `malloc` holds that are free (glibc's `fordblks`; jemalloc's resident minus
    /// allocated).
    pub malloc_free: u64,
    /// Bytes in `malloc`'s own mappings of large blocks (part of `malloc_used`).
    pub malloc_mapped: u64,
    /// Bytes in pymalloc's arenas, and in the blocks of them in use.
    pub pymalloc_arenas: u64,
    pub pymalloc_used: u64,
    /// The process's resident bytes (`/proc/self/statm`) read with the figures above, so that
    /// all describe one moment; 0 when it could not be read.
    pub rss: u64,
}

impl HeapStats {
    /// Size of a HEAP body.
    pub const BODY: usize = 64;

    /// Writes the body into `b` (at least [`HeapStats::BODY`] bytes).
    pub fn write(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.time_ns.to_le_bytes());
        b[8..12].copy_from_slice(&self.malloc_kind.to_le_bytes());
        b[12..16].copy_from_slice(&self.pymalloc_known.to_le_bytes());
        for (i, v) in [
            self.malloc_used,
            self.malloc_free,
            self.malloc_mapped,
            self.pymalloc_arenas,
            self.pymalloc_used,
            self.rss,
        ]
        .iter()
        .enumerate()
        {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads a body; `None` if it is too short.
    pub fn read(b: &[u8]) -> Option<HeapStats> {
        if b.len() < Self::BODY {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        Some(HeapStats {
            time_ns: u64_at(0),
            malloc_kind: u32_at(8),
            pymalloc_known: u32_at(12),
            malloc_used: u64_at(16),
            malloc_free: u64_at(24),
            malloc_mapped: u64_at(32),
            pymalloc_arenas: u64_at(40),
            pymalloc_used: u64_at(48),
            rss: u64_at(56),
        })
    }
}

/// One anonymous mapping and its resident bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnonMapping {
    pub start: u64,
    pub end: u64,
    pub rss: u64,
}

/// The process's mappings at one moment (a RESIDENT record).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resident {
    pub time_ns: u64,
    /// The sum of every mapping's resident bytes.
    pub rss: u64,
    /// Anonymous mappings without a name, by address.
    pub anon: Vec<AnonMapping>,
    /// Named mappings (a file's path, `[heap]`, `[stack]`, `[anon:...]`), resident bytes added
    /// up per name.
    pub named: Vec<(String, u64)>,
}

impl Resident {
    /// Appends the body to `body`.
    pub fn encode(&self, body: &mut Vec<u8>) {
        let anon = &self.anon[..self.anon.len().min(MAX_ANON)];
        let named = &self.named[..self.named.len().min(MAX_NAMED)];
        body.extend_from_slice(&self.time_ns.to_le_bytes());
        body.extend_from_slice(&self.rss.to_le_bytes());
        body.extend_from_slice(&(anon.len() as u32).to_le_bytes());
        body.extend_from_slice(&(named.len() as u32).to_le_bytes());
        for m in anon {
            for v in [m.start, m.end, m.rss] {
                body.extend_from_slice(&v.to_le_bytes());
            }
        }
        for (name, rss) in named {
            let name = &name.as_bytes()[..floor_char(name, MAX_NAME)];
            body.extend_from_slice(&rss.to_le_bytes());
            body.extend_from_slice(&(name.len() as u16).to_le_bytes());
            body.extend_from_slice(name);
        }
    }

    /// Reads a body; `None` if it is cut short or declares more than the bounds allow.
    pub fn decode(b: &[u8]) -> Option<Resident> {
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
        };
        let nanon = u32_at(16)? as usize;
        let nnamed = u32_at(20)? as usize;
        if nanon > MAX_ANON || nnamed > MAX_NAMED || b.len() < 24 + nanon * 24 {
            return None;
        }
        let anon = (0..nanon)
            .map(|i| {
                let at = 24 + i * 24;
                Some(AnonMapping {
                    start: u64_at(at)?,
                    end: u64_at(at + 8)?,
                    rss: u64_at(at + 16)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let mut at = 24 + nanon * 24;
        let mut named = Vec::with_capacity(nnamed);
        for _ in 0..nnamed {
            let rss = u64_at(at)?;
            let len = u16::from_le_bytes(b.get(at + 8..at + 10)?.try_into().ok()?) as usize;
            if len > MAX_NAME {
                return None;
            }
            let name = b.get(at + 10..at + 10 + len)?;
            named.push((String::from_utf8_lossy(name).into_owned(), rss));
            at += 10 + len;
        }
        Some(Resident {
            time_ns: u64_at(0)?,
            rss: u64_at(8)?,
            anon,
            named,
        })
    }

    /// Resident bytes of the anonymous mappings within `[start, end)`: each mapping's resident
    /// bytes shared out by how much of it the range covers.
    pub fn resident_in(&self, start: u64, end: u64) -> u64 {
        let first = self.anon.partition_point(|m| m.end <= start);
        self.anon[first..]
            .iter()
            .take_while(|m| m.start < end)
            .map(|m| {
                let overlap = end.min(m.end).saturating_sub(start.max(m.start));
                let len = m.end - m.start;
                if len == 0 {
                    0
                } else {
                    (m.rss as u128 * overlap as u128 / len as u128) as u64
                }
            })
            .sum()
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn floor_char(s: &str, max: usize) -> usize {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_stats_round_trip() {
        let h = HeapStats {
            time_ns: 7,
            malloc_kind: MALLOC_GLIBC,
            pymalloc_known: 1,
            malloc_used: 1 << 30,
            malloc_free: 3,
            malloc_mapped: 4,
            pymalloc_arenas: 5,
            pymalloc_used: 6,
            rss: 8,
        };
        let mut b = [0u8; HeapStats::BODY];
        h.write(&mut b);
        assert_eq!(HeapStats::read(&b), Some(h));
        assert_eq!(HeapStats::read(&b[..10]), None);
    }

    #[test]
    fn resident_round_trips_and_shares_out_mappings() {
        let r = Resident {
            time_ns: 1,
            rss: 9000,
            anon: vec![
                AnonMapping {
                    start: 0x1000,
                    end: 0x5000,
                    rss: 0x2000,
                },
                AnonMapping {
                    start: 0x9000,
                    end: 0xa000,
                    rss: 0x1000,
                },
            ],
            named: vec![("[heap]".into(), 100), ("/usr/lib/libc.so.6".into(), 200)],
        };
        let mut body = Vec::new();
        r.encode(&mut body);
        assert_eq!(Resident::decode(&body), Some(r.clone()));
        assert_eq!(Resident::decode(&body[..body.len() - 1]), None);
        // Half of the first mapping: half its resident bytes; the whole second one.
        assert_eq!(r.resident_in(0x1000, 0x3000), 0x1000);
        assert_eq!(r.resident_in(0x0, 0x10000), 0x3000);
        assert_eq!(r.resident_in(0x5000, 0x9000), 0);
        let mut lying = body.clone();
        lying[16..20].copy_from_slice(&(MAX_ANON as u32 + 1).to_le_bytes());
        assert_eq!(Resident::decode(&lying), None);
    }
}
