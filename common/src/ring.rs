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
//! never look like a published record), then advances `tail`. A PAD's body is never written,
//! read, or zeroed: only its 8-byte preamble.
//!
//! Short laps. The reader gives drained pages back to the kernel, and a write to a page given
//! back faults in a fresh zeroed page (2–3 µs each). At `--rate 1` a producer that went round
//! the whole ring would fault every 4 KiB. So while the reader keeps up (at most half a
//! [`window`] unread), the producer stays in the data area's first `window` bytes, whose pages
//! the reader keeps: a record that would reach past the window starts the next lap, after a PAD
//! to the end of the data area.
//!
//! ```text
//!  lap k:    [ records ......... |PAD ................................................]
//!  lap k+1:  [ records ..|                 (tail still before the PAD: reader stalled)
//!  escape:   [ records ..|PAD ........................|  records written over the old PAD's body
//!                        ^head          unread lap k ^ ^ the old PAD's preamble, kept
//! ```
//!
//! Counted in positions, a lap that starts right after such a PAD finds the ring nearly full
//! (the PAD takes most of it) until the reader passes the PAD. If the reader stalls then, the
//! producer escapes: it writes a PAD that jumps over the unread records of the last lap and the
//! old PAD's preamble, and writes on over the old PAD's body, which holds nothing, up to the end
//! of the data area. `head` may then be up to two sizes ahead of `tail`.
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
/// writes (3: interned stacks; 4: `maps_wanted` and `maps_read`; 5: CONTEXT and BRIEF; 6: short
/// laps, PADs of any length, `head` up to two sizes ahead, `pad_bytes`; 7: SPAWN, SPAWNED and
/// HANDLE). The
/// agent refuses a ring of another version (`Ring::attach`), and so does the CLI a ring a
/// followed child hands over (`RingReader::check_format`): old and new never read each other's
/// headers.
pub const RING_VERSION: u32 = 7;
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
    _pad_a: u32,
    /// Bytes of PAD records the producer has written, all told: how much of `head - tail` is
    /// padding, not records (right after a short lap, most of it). Only for the reader's
    /// [`crate::ring_reader::RingReader::fill`].
    pub pad_bytes: AtomicU64,
    _pad0: [u8; 512 - 496],
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

/// Largest data area: positions must fit the length word of a PAD.
pub const MAX_DATA_SIZE: usize = 1 << 31;

/// The part of a ring of `size` data bytes the producer keeps to while the reader keeps up (see
/// the module's short laps): a thirty-second of it, or all of a ring under 2 MiB.
pub fn window(size: usize) -> usize {
    if size < 2 << 20 {
        size
    } else {
        size / 32
    }
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
    /// The short laps' extent ([`window`]).
    window: u64,
    /// The position of the last short lap's PAD, while the reader has not passed it.
    lap_pad: Option<u64>,
    /// How far `head` may go with the common case's room checked by one compare: the end of
    /// the short lap `head` was in, or 8 bytes short of a size past `tail`, whichever is
    /// lower, as `head` and `tail` were when it was found (see `room_at_head`). `tail` only
    /// moves on, so an old bound is a safe one.
    room_until: u64,
}

/// Room for one record found by [`Ring::room_here`]: its position and padded length.
pub struct Here {
    start: u64,
    len: u64,
}

/// Where a record goes: an optional PAD first (position, length), then the record's position.
struct Place {
    pad: Option<(u64, u64)>,
    start: u64,
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
        assert!(data_size.is_power_of_two() && (4096..=MAX_DATA_SIZE).contains(&data_size));
        // Raw writes, no reference: in `attach` the target can already reach this memory.
        let h = base as *mut RingHeader;
        // SAFETY: the caller gives `region_size(data_size)` writable, 8-aligned bytes, which
        // hold the header: every field written is in bounds and aligned.
        unsafe {
            std::ptr::addr_of_mut!((*h).magic).write_volatile(RING_MAGIC);
            std::ptr::addr_of_mut!((*h).version).write_volatile(RING_VERSION);
            std::ptr::addr_of_mut!((*h).header_size).write_volatile(HEADER_SIZE as u32);
            std::ptr::addr_of_mut!((*h).data_size).write_volatile(data_size as u64);
            std::ptr::addr_of_mut!((*h).rate).write_volatile(rate);
            std::ptr::addr_of_mut!((*h).seed).write_volatile(seed);
            std::ptr::addr_of_mut!((*h).max_depth).write_volatile(max_depth);
            std::ptr::addr_of_mut!((*h).config_flags).write_volatile(config_flags);
        }
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
        let h = unsafe { &*(base as *const RingHeader) };
        if h.magic != RING_MAGIC {
            return Err("bad ring magic");
        }
        if h.version != RING_VERSION {
            return Err("ring version mismatch between agent and CLI");
        }
        let data = h.data_size as usize;
        if h.header_size as usize != HEADER_SIZE
            || !data.is_power_of_two()
            || !(4096..=MAX_DATA_SIZE).contains(&data)
            || len < region_size(data)
        {
            return Err("ring sizes do not match the region");
        }
        Ok(Ring {
            base,
            size: data as u64,
            window: window(data) as u64,
            lap_pad: None,
            room_until: 0,
        })
    }

    /// The same ring with short laps of `window` bytes: for tests of the laps on rings small
    /// enough for Miri.
    #[cfg(test)]
    pub(crate) fn with_window(self, window: u64) -> Ring {
        assert!(window.is_multiple_of(8) && window <= self.size);
        Ring { window, ..self }
    }

    /// The data area's first [`window`] bytes, where the producer writes while the reader
    /// keeps up (see the module's short laps): their start and length.
    pub fn window_area(&self) -> (*mut u8, usize) {
        (self.at(0), self.window as usize)
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
    /// counts a drop) when the ring has no room. Never blocks. Always inlined: the agent's
    /// sample path writes two or three records, and the compiler's choice to call one of them
    /// out of line cost about 45 instructions a sample (`benches/sample_cost.py`).
    #[inline(always)]
    pub fn try_write(
        &mut self,
        kind: u16,
        aux: u16,
        body_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        // SAFETY: as in `header` (inlined whatever the crate boundary).
        let dropped = &unsafe { &*(self.base as *const RingHeader) }.dropped;
        let Some(len) = self.record_len(body_len) else {
            dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let start = match self.room_at_head(len) {
            Ok(start) => start,
            Err((head, tail)) => match self.place_padded(head, tail, len) {
                Some(start) => start,
                None => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            },
        };
        // SAFETY: `start` is where a record of `len` bytes goes (`room_at_head` or `place`).
        unsafe { self.write_at(start, len, kind, aux, fill) };
        true
    }

    /// Where a record of `body_len` bytes goes in the common case (room before the window's
    /// end), for [`Ring::write_here`]; `None`, with nothing counted, otherwise. With it a
    /// caller that has a way of its own for the rest calls nothing, and keeps no register
    /// across a call.
    #[inline(always)]
    pub fn room_here(&mut self, body_len: usize) -> Option<Here> {
        let len = self.record_len(body_len)?;
        self.room_at_head(len).ok().map(|start| Here { start, len })
    }

    /// The padded length of a record of `body_len` bytes, if it is one the ring takes: at most
    /// a quarter of the data area.
    #[inline(always)]
    fn record_len(&self, body_len: usize) -> Option<u64> {
        let len = padded(PREAMBLE + body_len) as u64;
        (len <= self.size / 4).then_some(len)
    }

    /// Writes a record where [`Ring::room_here`] found room (its body by `fill`).
    ///
    /// # Safety
    /// `here` is this ring's, and nothing was written to the ring since it was found.
    #[inline(always)]
    pub unsafe fn write_here(
        &mut self,
        here: Here,
        kind: u16,
        aux: u16,
        fill: impl FnOnce(&mut [u8]),
    ) {
        // SAFETY: the caller's `here`: room for `len` bytes at `start`, still free.
        unsafe { self.write_at(here.start, here.len, kind, aux, fill) }
    }

    /// Where a record of `len` bytes (padded, at most a quarter of the data area) goes in the
    /// common case: `head`, when there is room before the window's end, and 8 bytes more than
    /// the record (what `place` keeps for an escape's PAD in the lap after a short one, so
    /// this holds whether or not the reader has passed that lap's PAD; after an escape `head`
    /// is more than a size ahead and this fails). Otherwise `(head, tail)` for [`Ring::place`].
    /// Checked against [`Ring::room_until`] first: one compare, where the reader's `tail` and
    /// the lap's end took about ten instructions a record.
    #[inline(always)]
    fn room_at_head(&mut self, len: u64) -> Result<u64, (u64, u64)> {
        // SAFETY: as in `header` (inlined whatever the crate boundary).
        let h = unsafe { &*(self.base as *const RingHeader) };
        // Only the producer moves `head`.
        let head = h.head.load(Ordering::Relaxed);
        if head + len <= self.room_until {
            return Ok(head);
        }
        // The reader moves `tail` (acquire: the bytes it consumed are zeroed before it lets us
        // reuse them).
        let tail = h.tail.load(Ordering::Acquire);
        let lap_end = head - (head & (self.size - 1)) + self.window;
        // `head` is never more than two sizes ahead of `tail`, so this does not wrap; a bound
        // below `head` (a ring that is full) lets nothing through.
        self.room_until = lap_end.min(tail + self.size - 8);
        if head + len <= self.room_until {
            Ok(head)
        } else {
            Err((head, tail))
        }
    }

    /// Writes a record of `len` bytes at `start` (its body by `fill`) and makes it visible.
    ///
    /// # Safety
    /// `start` is at a record boundary with `len` bytes to the end of the data area, and
    /// those bytes are free: the reader is behind (as `room_at_head` and `place` find it).
    #[inline(always)]
    unsafe fn write_at(
        &mut self,
        start: u64,
        len: u64,
        kind: u16,
        aux: u16,
        fill: impl FnOnce(&mut [u8]),
    ) {
        // In locals: `fill` writes through a raw pointer, after which fields read through
        // `self` would be loaded again.
        let (base, size) = (self.base, self.size);
        // SAFETY: the caller's `start`, inside the data area.
        let record = unsafe { base.add(HEADER_SIZE + (start & (size - 1)) as usize) };
        // SAFETY: the record's bytes after its preamble, as above.
        let body = unsafe {
            std::slice::from_raw_parts_mut(record.add(PREAMBLE), len as usize - PREAMBLE)
        };
        fill(body);
        // SAFETY: the record's preamble, as above.
        unsafe { write_preamble(record, len, kind, aux) };
        // SAFETY: as in `header`.
        let h = unsafe { &*(base as *const RingHeader) };
        h.head.store(start + len, Ordering::Release);
    }

    /// [`Ring::place`], with the PAD it asks for written and counted: where the record goes.
    /// Out of line, so that the common write stays small.
    #[inline(never)]
    fn place_padded(&mut self, head: u64, tail: u64, len: u64) -> Option<u64> {
        let Place { pad, start } = self.place(head, tail, len)?;
        if let Some((at, pad)) = pad {
            self.publish(at, pad, KIND_PAD, 0);
            let padded = &self.header().pad_bytes;
            padded.store(padded.load(Ordering::Relaxed) + pad, Ordering::Relaxed);
        }
        Some(start)
    }

    /// Where a record of `len` bytes goes with the reader at `tail`, or `None` if it would
    /// overwrite unread data.
    fn place(&mut self, head: u64, tail: u64, len: u64) -> Option<Place> {
        let size = self.size;
        let pos = head & (size - 1);
        let lap_start = head - pos;
        if let Some(pad_at) = self.lap_pad {
            // The PAD runs to the end of the data area; `head` is in the lap after it.
            let next_lap = (pad_at | (size - 1)) + 1;
            if tail > pad_at {
                // The reader passed the PAD: every position it took is free again.
                self.lap_pad = None;
            } else if head > pad_at + size {
                // Escaped: up to the end of the data area, never round again before the
                // reader passes the PAD.
                return (head + len <= next_lap + size).then_some(Place {
                    pad: None,
                    start: head,
                });
            } else {
                // In the lap after the PAD: keep room for the escape's PAD.
                if (head + len + 8).wrapping_sub(tail) <= size {
                    return Some(Place {
                        pad: None,
                        start: head,
                    });
                }
                let start = pad_at + size + 8;
                let fits = (head + 8).wrapping_sub(tail) <= size && start + len <= next_lap + size;
                return fits.then_some(Place {
                    pad: Some((head, start - head)),
                    start,
                });
            }
        }
        let next_lap = lap_start + size;
        let window = self.window;
        if window < size
            && pos != 0
            && pos + len > window
            && head.wrapping_sub(tail) <= window / 2
            && (next_lap + len).wrapping_sub(tail) <= size
        {
            self.lap_pad = Some(head);
            return Some(Place {
                pad: Some((head, next_lap - head)),
                start: next_lap,
            });
        }
        let pad = if pos + len > size { size - pos } else { 0 };
        ((head + pad + len).wrapping_sub(tail) <= size).then_some(Place {
            pad: (pad > 0).then_some((head, pad)),
            start: head + pad,
        })
    }

    /// Writes a record's kind and aux, then its length word (release): the record is now
    /// visible to the reader.
    fn publish(&self, pos: u64, len: u64, kind: u16, aux: u16) {
        // SAFETY: a record's preamble at an 8-aligned position inside the data area.
        unsafe { write_preamble(self.at(pos), len, kind, aux) }
    }
}

/// Writes a record's 8-byte preamble at `p`, its length last (release: the reader sees the
/// length only after the rest of the record).
///
/// # Safety
/// `p` is an 8-aligned record position inside a mapped data area.
unsafe fn write_preamble(p: *mut u8, len: u64, kind: u16, aux: u16) {
    // SAFETY: the preamble's 8 bytes are the caller's; the length word is 4-aligned for the
    // atomic.
    unsafe {
        std::ptr::write(p.add(4) as *mut u16, kind);
        std::ptr::write(p.add(6) as *mut u16, aux);
        (*(p as *const AtomicU32)).store(len as u32, Ordering::Release);
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

    /// A ring with short laps of `window` bytes whose reader gives pages of 64 bytes back as
    /// the CLI does, checking that they hold nothing but zeroes (what the kernel gives for them
    /// when they are used again).
    struct Laps {
        region: Region,
        ring: Ring,
        reader: RingReader,
        size: usize,
        window: u64,
        next: u64,
        seen: Vec<u64>,
        given_back: u64,
    }

    const PAGE: u64 = 64;

    impl Laps {
        fn new(size: usize, window: u64) -> Laps {
            let mut region = Region::new(size);
            let ring = region.ring(size).with_window(window);
            let reader = reader_of(&ring, size);
            Laps {
                region,
                ring,
                reader,
                size,
                window,
                next: 0,
                seen: Vec::new(),
                given_back: 0,
            }
        }

        /// Writes the next record (16 to 48 bytes); false if it was dropped.
        fn write(&mut self) -> bool {
            let n = self.next;
            let extra = (n % 5) as usize * 8;
            let ok = self.ring.try_write(KIND_FREE, 0, 8 + extra, |b| {
                b[..8].copy_from_slice(&n.to_le_bytes())
            });
            if ok {
                self.next += 1;
            }
            ok
        }

        fn head(&self) -> u64 {
            self.ring.header().head.load(Ordering::Relaxed)
        }

        /// Drains everything published, giving pages back as the CLI does.
        fn drain(&mut self) {
            let (size, window) = (self.size as u64, self.window);
            let data = self.region.0.as_mut_ptr() as *mut u8;
            let seen = &mut self.seen;
            let given_back = &mut self.given_back;
            while self
                .reader
                .drain_then(
                    |b| match decode(b).unwrap().0 {
                        Record::Free { addr } => seen.push(addr),
                        other => panic!("unexpected {other:?}"),
                    },
                    |from, to| {
                        crate::ring_reader::pages_to_give_back(
                            size,
                            window,
                            PAGE,
                            from,
                            to,
                            |offset, len| {
                                *given_back += len / PAGE;
                                // The kernel gives zeroed pages for these: nothing unread may
                                // be there, and the reader left zeroes behind.
                                for at in (offset..offset + len).step_by(8) {
                                    // SAFETY: `at` is an 8-aligned offset in the data area
                                    // of the region, which outlives the ring; no other thread.
                                    let word = unsafe {
                                        std::ptr::read(
                                            data.add(HEADER_SIZE + at as usize) as *const u64
                                        )
                                    };
                                    assert_eq!(word, 0, "a page given back holds data");
                                }
                            },
                        )
                    },
                )
                .unwrap()
                > 0
            {}
            assert_eq!(
                self.reader_tail(),
                self.head(),
                "everything published was read"
            );
        }

        fn reader_tail(&self) -> u64 {
            self.ring.header().tail.load(Ordering::Relaxed)
        }

        /// Every record written came out, in order, and the data area is all zeroes again.
        fn check_all_read(&mut self) {
            self.drain();
            assert!(
                self.seen.iter().copied().eq(0..self.next),
                "records lost or out of order"
            );
            let words = &self.region.0[HEADER_SIZE / 8..];
            assert!(words.iter().all(|&w| w == 0), "stale bytes left behind");
        }
    }

    /// Under Miri the ring is tiny and the runs short: the same paths, fewer times.
    const LAP_SIZE: usize = if cfg!(miri) { 4096 } else { 1 << 16 };
    const LAP_WINDOW: u64 = LAP_SIZE as u64 / 16;

    #[test]
    fn short_laps_stay_in_the_window_while_the_reader_keeps_up() {
        let mut laps = Laps::new(LAP_SIZE, LAP_WINDOW);
        let writes = if cfg!(miri) { 600 } else { 20_000 };
        for i in 0..writes {
            assert!(laps.write());
            let end = laps.head() & (LAP_SIZE as u64 - 1);
            assert!(end <= LAP_WINDOW, "record {i} ends at {end}");
            // Two records (96 bytes) at most are unread, under half the window; a lap's PAD,
            // unread too, does not count as full.
            let unread = laps.reader.fill() * LAP_SIZE as f64;
            assert!(
                unread <= 96.0,
                "record {i}: fill says {unread} bytes unread"
            );
            if i % 2 == 1 {
                laps.drain();
            }
        }
        assert!(laps.head() > 10 * LAP_SIZE as u64, "many laps");
        assert_eq!(
            laps.given_back, 0,
            "no page given back, so none faulted in again"
        );
        laps.check_all_read();
    }

    #[test]
    fn short_laps_leave_a_reader_that_stalls_anywhere_nearly_the_whole_ring() {
        let stalls = if cfg!(miri) { 6 } else { 300 };
        let mut laps = Laps::new(LAP_SIZE, LAP_WINDOW);
        for stall in 0..stalls {
            // Keep up for a while: the stall begins at a different point of a lap each time,
            // right after a short lap's PAD among them.
            for _ in 0..(stall * 7) % 61 {
                assert!(laps.write());
                laps.drain();
            }
            let (before, head) = (laps.next, laps.head());
            let mut bytes = 0;
            while laps.write() {
                bytes += 16 + ((laps.next - 1) % 5) * 8;
            }
            let dropped_before = laps.ring.header().dropped.load(Ordering::Relaxed);
            for _ in 0..3 {
                assert!(!laps.write(), "full");
            }
            assert_eq!(
                laps.ring.header().dropped.load(Ordering::Relaxed),
                dropped_before + 3,
                "every refusal counted"
            );
            let room = LAP_SIZE as u64 - 2 * LAP_WINDOW - 64;
            assert!(
                bytes >= room,
                "stall {stall} at {head}: only {bytes} bytes of room ({} records)",
                laps.next - before
            );
            laps.drain();
        }
        laps.check_all_read();
    }
}
