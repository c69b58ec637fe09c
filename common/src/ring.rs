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
//! There is one producer at a time: the agent writes records only under its session lock, and
//! [`Ring::try_write`] takes `&mut self`. The producer never waits: if a record would overrun
//! unread data it counts a drop and gives up. It fills the body, publishes the record by
//! storing its length word with release ordering, then advances `head`. A record never
//! straddles the end of the data area: a PAD record fills the gap instead. The consumer reads the
//! record at `tail` once its length word is non-zero, zeroes the bytes it consumed (so stale bytes
//! never look like a published record), then advances `tail`.
//!
//! The map handshake (`--native` only). The reader learns which libraries a native stack names
//! from `/proc/PID/maps`, which is empty once the process has ended and has lost a library
//! once it is unloaded. So before the process ends (and before `dlclose`), the agent asks:
//!
//! ```text
//!  agent                                         reader (each record it drains, each round)
//!  maps_wanted += 1  (= n)
//!  [END record, state STOPPED]                   sees maps_wanted = n ≠ last served
//!  waits: maps_read ≥ n, or 1 s, or the          reads /proc/PID/maps, writes MODULE records
//!         heartbeat older than 250 ms            maps_read = n
//!  exits (or unloads)
//! ```
//!
//! The agent never waits on a reader that has stopped beating, nor longer than its bound.

use crate::record::{KIND_PAD, PREAMBLE};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Magic bytes at the start of the ring.
pub const RING_MAGIC: [u8; 8] = *b"MPROFRNG";
/// Ring layout version; bumped on any change to `RingHeader` or to the records the agent
/// writes (3: interned stacks; 4: `maps_wanted` and `maps_read`; 5: CONTEXT and BRIEF). The
/// agent refuses a ring of another version (`Ring::attach`), and so does the CLI a ring a
/// followed child hands over (`RingReader::check_format`): old and new never read each other's
/// headers.
pub const RING_VERSION: u32 = 5;
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

/// `config_flags`: do not hook the C allocator family (`--python-only`).
pub const CONFIG_PYTHON_ONLY: u32 = 1;
/// `config_flags`: unwind and record the native stack of every sample (`--native`).
pub const CONFIG_NATIVE_STACKS: u32 = 2;

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
    /// Where children hand their rings (`record --follow-children`): the name of an abstract
    /// Unix socket, NUL-terminated; empty when children are not followed. Set by the reader.
    pub rendezvous: [u8; 64],
    /// Processes forked by the profiled one that were not followed (each child counts itself
    /// here before it lets the ring go), for the summary's hint.
    pub forked_unfollowed: AtomicU32,
    /// The agent's requests that the reader read the process's memory map now (`--native`):
    /// a counter the agent increments when the process is about to end or to unload a
    /// library, whose code the samples still in the ring may name.
    pub maps_wanted: AtomicU32,
    /// The last value of `maps_wanted` the reader has served: it read `/proc/PID/maps` after
    /// seeing that value and wrote the MODULE records into the capture. The agent waits
    /// (bounded) for it to catch up before the process ends.
    pub maps_read: AtomicU32,
    _pad0: [u8; 512 - 484],
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

/// The producer's end of a ring in memory (shared or not). Not `Clone`: its owner is the one
/// producer, and the geometry is copied out of the header once, when it is made.
pub struct Ring {
    base: *mut u8,
    /// Size of the data area, a power of two.
    size: u64,
}

// SAFETY: a `Ring` owns the producer's role on a region that `attach`'s caller keeps mapped
// while it lives; moving it to another thread moves that role. Shared state is only touched
// through atomics or by the one producer (`try_write` takes `&mut self`).
unsafe impl Send for Ring {}

impl Ring {
    /// Writes a fresh header into `base` (a zeroed region of `region_size(data_size)` bytes).
    ///
    /// # Safety
    /// `base` must point to at least `region_size(data_size)` writable, zeroed, 8-aligned bytes.
    pub unsafe fn init(
        base: *mut u8,
        data_size: usize,
        rate: u64,
        seed: u64,
        max_depth: u32,
        config_flags: u32,
    ) {
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
    }

    /// The producer of an existing ring, after checking its header.
    ///
    /// # Safety
    /// `base` must point to a mapped, 8-aligned region of at least `len` bytes that stays
    /// mapped as long as the returned `Ring` lives, and no other `Ring` may write to that
    /// region meanwhile.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Ring, &'static str> {
        if len < HEADER_SIZE {
            return Err("region smaller than the ring header");
        }
        // SAFETY: at least HEADER_SIZE mapped bytes (checked above), aligned (caller).
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
            || data < 4096
            || len < region_size(data)
        {
            return Err("ring sizes do not match the region");
        }
        Ok(Ring {
            base,
            size: data as u64,
        })
    }

    /// The header.
    pub fn header(&self) -> &RingHeader {
        // SAFETY: `attach` checked that the header is mapped, for as long as `self` lives.
        unsafe { &*(self.base as *const RingHeader) }
    }

    /// A pointer to ring position `pos` (taken modulo the size) of the data area.
    fn at(&self, pos: u64) -> *mut u8 {
        // SAFETY: `pos & (size - 1)` < size, and `attach` checked that header and data area
        // (`region_size(size)` bytes) are mapped.
        unsafe {
            self.base
                .add(HEADER_SIZE + (pos & (self.size - 1)) as usize)
        }
    }

    /// Writes one record of `body_len` bytes whose body `fill` writes. Returns false (and
    /// counts a drop) when the ring has no room. Never blocks.
    pub fn try_write(
        &mut self,
        kind: u16,
        aux: u16,
        body_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let h = self.header();
        let len = padded(PREAMBLE + body_len) as u64;
        let size = self.size;
        if len > size / 4 {
            h.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Only the producer moves `head`; the reader moves `tail` (acquire: the bytes it
        // consumed are zeroed before it lets us reuse them).
        let head = h.head.load(Ordering::Relaxed);
        let tail = h.tail.load(Ordering::Acquire);
        let pos = head & (size - 1);
        let pad = if pos + len > size { size - pos } else { 0 };
        if (head + pad + len).wrapping_sub(tail) > size {
            h.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if pad > 0 {
            self.publish(head, pad, KIND_PAD, 0);
        }
        let start = head + pad;
        // SAFETY: `start` is at a record boundary with `len` bytes to the end of the data
        // area (padding made sure of it), and those bytes are free: the reader is behind.
        let body = unsafe {
            std::slice::from_raw_parts_mut(self.at(start).add(PREAMBLE), len as usize - PREAMBLE)
        };
        fill(body);
        self.publish(start, len, kind, aux);
        self.header()
            .head
            .store(head + pad + len, Ordering::Release);
        true
    }

    /// Writes a record's kind and aux, then its length word (release): the record is now
    /// visible to the reader.
    fn publish(&self, pos: u64, len: u64, kind: u16, aux: u16) {
        let p = self.at(pos);
        // SAFETY: a record's 8-byte preamble at an 8-aligned position inside the data area;
        // the length word is 4-aligned for the atomic.
        unsafe {
            std::ptr::write(p.add(4) as *mut u16, kind);
            std::ptr::write(p.add(6) as *mut u16, aux);
            (*(p as *const AtomicU32)).store(len as u32, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{decode, Record, KIND_FREE};
    use crate::ring_reader::RingReader;
    use std::sync::atomic::AtomicBool;

    struct Region(Vec<u64>);

    impl Region {
        fn new(data_size: usize) -> Region {
            Region(vec![0u64; region_size(data_size) / 8])
        }
        fn ring(&mut self, data_size: usize) -> Ring {
            let base = self.0.as_mut_ptr() as *mut u8;
            // SAFETY: the region is zeroed, aligned and as big as the data size needs; it
            // outlives the ring in every test.
            unsafe {
                Ring::init(base, data_size, 1, 0, 64, 0);
                Ring::attach(base, region_size(data_size)).unwrap()
            }
        }
    }

    fn write_free(ring: &mut Ring, addr: u64) -> bool {
        ring.try_write(KIND_FREE, 0, 8, |b| {
            b[..8].copy_from_slice(&addr.to_le_bytes())
        })
    }

    #[test]
    fn records_come_out_in_order_across_the_wrap_point() {
        let mut region = Region::new(4096);
        let mut ring = ring_of(&mut region);
        let reader = reader_of(&ring, 4096);
        let mut seen = Vec::new();
        for round in 0..100u64 {
            for i in 0..7 {
                assert!(write_free(&mut ring, round * 10 + i));
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
        // SAFETY: the ring's region, alive for the test.
        unsafe { RingReader::new(ring.base, data_size) }
    }

    #[test]
    fn release_sees_each_consumed_range_once_before_producers_can_reuse_it() {
        let mut region = Region::new(4096);
        let mut ring = ring_of(&mut region);
        let reader = reader_of(&ring, 4096);
        let mut released = Vec::new();
        for round in 0..20u64 {
            for i in 0..30 {
                assert!(write_free(&mut ring, round * 100 + i));
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
        let mut ring = ring_of(&mut region);
        let mut written = 0;
        for i in 0..1000 {
            if write_free(&mut ring, i) {
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
        assert!(write_free(&mut ring, 1), "room again after draining");
    }

    /// As in the agent: producer threads take turns under a lock (the agent's session lock),
    /// one consumer drains concurrently. Under Miri (which checks the atomics' orderings and
    /// every access to the shared region, but runs a thousand times slower) the ring is the
    /// smallest, so that it still wraps and fills, with fewer records.
    #[test]
    fn producers_under_a_lock_and_one_consumer_lose_nothing_they_did_not_count() {
        const SIZE: usize = if cfg!(miri) { 4096 } else { 1 << 16 };
        const WRITES: u64 = if cfg!(miri) { 400 } else { 50_000 };
        struct Base(*mut u8);
        // SAFETY: the region outlives both threads; the reader only uses atomics on it.
        unsafe impl Send for Base {}
        let mut region = Region::new(SIZE);
        let ring = region.ring(SIZE);
        let base = Base(ring.base);
        let ring = std::sync::Mutex::new(ring);
        let done = AtomicBool::new(false);
        let (written, read) = std::thread::scope(|s| {
            let producers: Vec<_> = (0..4u64)
                .map(|t| {
                    let ring = &ring;
                    s.spawn(move || {
                        let mut ok = 0u64;
                        for i in 0..WRITES {
                            // Variable lengths exercise padding at the wrap point.
                            let extra = (i % 5) as usize * 8;
                            if ring
                                .lock()
                                .unwrap()
                                .try_write(KIND_FREE, 0, 8 + extra, |b| {
                                    b[..8].copy_from_slice(&(t << 32 | i).to_le_bytes())
                                })
                            {
                                ok += 1;
                            }
                        }
                        ok
                    })
                })
                .collect();
            let done = &done;
            let consumer = s.spawn(move || {
                let base = base;
                // SAFETY: the ring's region, alive until the scope ends.
                let reader = unsafe { RingReader::new(base.0, SIZE) };
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
            });
            let written: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
            done.store(true, Ordering::Release);
            (written, consumer.join().unwrap())
        });
        assert_eq!(read, written);
        let dropped = ring
            .lock()
            .unwrap()
            .header()
            .dropped
            .load(Ordering::Relaxed);
        assert_eq!(written + dropped, 4 * WRITES);
    }
}
