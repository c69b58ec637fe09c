//! The shared-memory ring between the agent (many producer threads) and the CLI (one consumer).
//!
//! ```text
//!  0                                   512          576                 4096
//!  +-----------------------------------+------------+---------------+---+----------- ... ---+
//!  | RingHeader: magic, version, sizes,| head (own  | tail (own     |pad| data: records,    |
//!  | config, state, counters, messages | cache line)| cache line)   |   | data_size bytes    |
//!  +-----------------------------------+------------+---------------+---+----------- ... ---+
//! ```
//!
//! The consumer's side lives in `ring_reader`, which trusts nothing the producers wrote.
//!
//! Producers never wait. A producer reserves `len` bytes by advancing `head` with a CAS; if the
//! reservation would overrun unread data it counts a drop and gives up. It fills the body, then
//! publishes the record by storing its length word with release ordering. A record never
//! straddles the end of the data area: a PAD record fills the gap instead. The consumer reads the
//! record at `tail` once its length word is non-zero, zeroes the bytes it consumed (so stale bytes
//! never look like a published record), then advances `tail`.

use crate::record::{KIND_PAD, PREAMBLE};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Magic bytes at the start of the ring.
pub const RING_MAGIC: [u8; 8] = *b"MPROFRNG";
/// Ring layout version; bumped on any change to `RingHeader`.
pub const RING_VERSION: u32 = 1;
/// Where the data area starts.
pub const HEADER_SIZE: usize = 4096;

/// `state`: the reader made the ring, no agent has claimed it yet.
pub const STATE_WAITING: u32 = 0;
/// `state`: an agent claimed the ring and is sampling.
pub const STATE_ACTIVE: u32 = 1;
/// `state`: the reader asks the agent to stop (detach).
pub const STATE_STOP_REQUESTED: u32 = 2;
/// `state`: the agent stopped (its END record says why).
pub const STATE_STOPPED: u32 = 3;
/// `state`: the agent could not start; `message` says why.
pub const STATE_FAILED: u32 = 4;

/// Where the reader's heartbeat sits in the header (read by a later attach to tell an orphaned
/// session from a running one).
pub const HEARTBEAT_OFFSET: usize = std::mem::offset_of!(RingHeader, reader_heartbeat_ns);

/// The header at the start of the shared-memory region.
#[repr(C)]
pub struct RingHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    /// Size of the data area in bytes: a power of two.
    pub data_size: u64,
    /// Mean bytes between samples (1 = every allocation). Set by the reader.
    pub rate: u64,
    /// Seed for the sampling random numbers (0 = pick one). Set by the reader.
    pub seed: u64,
    /// Deepest Python stack recorded. Set by the reader.
    pub max_depth: u32,
    pub config_flags: u32,
    pub state: AtomicU32,
    /// Process id of the agent that claimed the ring.
    pub agent_pid: AtomicU32,
    /// CLOCK_MONOTONIC nanoseconds of the reader's last sign of life.
    pub reader_heartbeat_ns: AtomicU64,
    pub samples: AtomicU64,
    pub dropped: AtomicU64,
    pub frees: AtomicU64,
    /// NUL-terminated `sys.version`-like string written by the agent before it sets ACTIVE.
    pub py_version: [u8; 64],
    /// NUL-terminated message from the agent (why it failed).
    pub message: [u8; 256],
    _pad0: [u8; 512 - 408],
    pub head: AtomicU64,
    _pad1: [u8; 56],
    pub tail: AtomicU64,
    _pad2: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == 640);
const _: () = assert!(std::mem::size_of::<RingHeader>() <= HEADER_SIZE);

/// Bytes a region needs for a ring with `data_size` bytes of data.
pub fn region_size(data_size: usize) -> usize {
    HEADER_SIZE + data_size
}

/// Rounds a record length up to the ring's 8-byte alignment.
pub fn padded(len: usize) -> usize {
    (len + 7) & !7
}

/// A view of a ring in memory (shared or not). Cheap to copy.
#[derive(Clone, Copy)]
pub struct Ring {
    base: *mut u8,
}

unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// Writes a fresh header into `base` (a zeroed region of `region_size(data_size)` bytes).
    ///
    /// # Safety
    /// `base` must point to at least `region_size(data_size)` writable, zeroed, 8-aligned bytes
    /// that outlive every `Ring` made from it.
    pub unsafe fn init(
        base: *mut u8,
        data_size: usize,
        rate: u64,
        seed: u64,
        max_depth: u32,
        config_flags: u32,
    ) -> Ring {
        assert!(data_size.is_power_of_two() && data_size >= 4096);
        // Raw writes, no reference: in `attach` the target can already reach this memory.
        let h = base as *mut RingHeader;
        std::ptr::addr_of_mut!((*h).magic).write_volatile(RING_MAGIC);
        std::ptr::addr_of_mut!((*h).version).write_volatile(RING_VERSION);
        std::ptr::addr_of_mut!((*h).header_size).write_volatile(HEADER_SIZE as u32);
        std::ptr::addr_of_mut!((*h).data_size).write_volatile(data_size as u64);
        std::ptr::addr_of_mut!((*h).rate).write_volatile(rate);
        std::ptr::addr_of_mut!((*h).seed).write_volatile(seed);
        std::ptr::addr_of_mut!((*h).max_depth).write_volatile(max_depth);
        std::ptr::addr_of_mut!((*h).config_flags).write_volatile(config_flags);
        fence(Ordering::Release);
        Ring { base }
    }

    /// Wraps an existing ring, checking its header.
    ///
    /// # Safety
    /// `base` must point to a mapped region of at least `len` bytes that outlives the `Ring`.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Ring, &'static str> {
        if len < HEADER_SIZE {
            return Err("region smaller than the ring header");
        }
        let h = &*(base as *const RingHeader);
        if h.magic != RING_MAGIC {
            return Err("bad ring magic");
        }
        if h.version != RING_VERSION {
            return Err("ring version mismatch between agent and CLI");
        }
        let data = h.data_size as usize;
        if h.header_size as usize != HEADER_SIZE
            || !data.is_power_of_two()
            || len < region_size(data)
        {
            return Err("ring sizes do not match the region");
        }
        Ok(Ring { base })
    }

    /// The header.
    pub fn header(&self) -> &RingHeader {
        unsafe { &*(self.base as *const RingHeader) }
    }

    fn data(&self) -> *mut u8 {
        unsafe { self.base.add(HEADER_SIZE) }
    }

    fn size(&self) -> u64 {
        self.header().data_size
    }

    fn len_word(&self, pos: u64) -> &AtomicU32 {
        unsafe { &*(self.data().add(pos as usize) as *const AtomicU32) }
    }

    /// Producer side: writes one record of `body_len` bytes whose body `fill` writes.
    /// Returns false (and counts a drop) when the ring has no room. Never blocks.
    pub fn try_write(
        &self,
        kind: u16,
        aux: u16,
        body_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let h = self.header();
        let len = padded(PREAMBLE + body_len) as u64;
        let size = self.size();
        if len > size / 4 {
            h.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let (start, pad) = loop {
            let head = h.head.load(Ordering::Relaxed);
            let tail = h.tail.load(Ordering::Acquire);
            let pos = head & (size - 1);
            let pad = if pos + len > size { size - pos } else { 0 };
            if head + pad + len - tail > size {
                h.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            if h.head
                .compare_exchange_weak(head, head + pad + len, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break (pos, pad);
            }
        };
        if pad > 0 {
            self.publish(start, pad, KIND_PAD, 0);
        }
        let at = (start + pad) & (size - 1);
        let body = unsafe {
            std::slice::from_raw_parts_mut(
                self.data().add(at as usize + PREAMBLE),
                len as usize - PREAMBLE,
            )
        };
        fill(body);
        self.publish(at, len, kind, aux);
        true
    }

    fn publish(&self, pos: u64, len: u64, kind: u16, aux: u16) {
        unsafe {
            let p = self.data().add(pos as usize);
            std::ptr::write(p.add(4) as *mut u16, kind);
            std::ptr::write(p.add(6) as *mut u16, aux);
        }
        self.len_word(pos).store(len as u32, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{decode, Record, KIND_FREE};
    use crate::ring_reader::RingReader;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    struct Region(Vec<u64>);

    impl Region {
        fn new(data_size: usize) -> Region {
            Region(vec![0u64; region_size(data_size) / 8])
        }
        fn ring(&mut self, data_size: usize) -> Ring {
            unsafe { Ring::init(self.0.as_mut_ptr() as *mut u8, data_size, 1, 0, 64, 0) }
        }
    }

    fn write_free(ring: &Ring, addr: u64) -> bool {
        ring.try_write(KIND_FREE, 0, 8, |b| {
            b[..8].copy_from_slice(&addr.to_le_bytes())
        })
    }

    #[test]
    fn records_come_out_in_order_across_the_wrap_point() {
        let mut region = Region::new(4096);
        let ring = ring_of(&mut region);
        let reader = reader_of(&ring, 4096);
        let mut seen = Vec::new();
        for round in 0..100u64 {
            for i in 0..7 {
                assert!(write_free(&ring, round * 10 + i));
            }
            reader
                .drain(|b| match decode(b).unwrap().0 {
                    Record::Free { addr } => seen.push(addr),
                    other => panic!("unexpected {other:?}"),
                })
                .unwrap();
        }
        let want: Vec<u64> = (0..100u64)
            .flat_map(|r| (0..7).map(move |i| r * 10 + i))
            .collect();
        assert_eq!(seen, want);
    }

    fn ring_of(region: &mut Region) -> Ring {
        region.ring(4096)
    }

    fn reader_of(ring: &Ring, data_size: usize) -> RingReader {
        unsafe { RingReader::new(ring.base, data_size) }
    }

    #[test]
    fn release_sees_each_consumed_range_once_before_producers_can_reuse_it() {
        let mut region = Region::new(4096);
        let ring = ring_of(&mut region);
        let reader = reader_of(&ring, 4096);
        let mut released = Vec::new();
        for round in 0..20u64 {
            for i in 0..30 {
                assert!(write_free(&ring, round * 100 + i));
            }
            while reader
                .drain_then(
                    |_| {},
                    |from, to| {
                        assert_eq!(ring.header().tail.load(Ordering::Relaxed), from);
                        released.push((from, to));
                    },
                )
                .unwrap()
                > 0
            {}
        }
        assert!(released.windows(2).all(|w| w[0].1 == w[1].0), "contiguous");
        assert_eq!(released.last().unwrap().1, 20 * 30 * 16);
        assert!(
            released.iter().all(|(a, b)| b - a <= 1024),
            "a quarter at most"
        );
    }

    #[test]
    fn a_full_ring_drops_and_counts_instead_of_blocking() {
        let mut region = Region::new(4096);
        let ring = ring_of(&mut region);
        let mut written = 0;
        for i in 0..1000 {
            if write_free(&ring, i) {
                written += 1;
            }
        }
        assert_eq!(written, 4096 / 16);
        assert_eq!(
            ring.header().dropped.load(Ordering::Relaxed),
            1000 - written as u64
        );
        let reader = reader_of(&ring, 4096);
        let mut n = 0;
        while reader.drain(|_| n += 1).unwrap() > 0 {}
        assert_eq!(n, written);
        assert!(write_free(&ring, 1), "room again after draining");
    }

    #[test]
    fn many_producers_one_consumer_lose_nothing_they_did_not_count() {
        let mut region = Region::new(1 << 16);
        let ring = region.ring(1 << 16);
        let done = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut ok = 0u64;
                    for i in 0..50_000u64 {
                        // Variable lengths exercise padding at the wrap point.
                        let extra = (i % 5) as usize * 8;
                        if ring.try_write(KIND_FREE, 0, 8 + extra, |b| {
                            b[..8].copy_from_slice(&(t << 32 | i).to_le_bytes())
                        }) {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        let consumer = {
            let done = done.clone();
            std::thread::spawn(move || {
                let reader = reader_of(&ring, 1 << 16);
                let mut last = [None::<u64>; 4];
                let mut n = 0u64;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let moved = reader
                        .drain(|b| {
                            let Record::Free { addr } = decode(b).unwrap().0 else {
                                panic!("bad record")
                            };
                            let (t, i) = ((addr >> 32) as usize, addr & 0xffff_ffff);
                            assert!(last[t].is_none_or(|l| l < i), "per-thread order kept");
                            last[t] = Some(i);
                            n += 1;
                        })
                        .unwrap();
                    if finished && moved == 0 {
                        return n;
                    }
                }
            })
        };
        let written: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
        done.store(true, Ordering::Release);
        let read = consumer.join().unwrap();
        assert_eq!(read, written);
        let dropped = ring.header().dropped.load(Ordering::Relaxed);
        assert_eq!(written + dropped, 200_000);
    }
}
