//! The consumer's end of the ring (see `ring` for the layout and the protocol), written for a
//! reader that trusts nothing in the shared memory.
//!
//! The producer is the target process, which may be hostile and may write anything anywhere in
//! the region at any moment. So the reader:
//! - takes the geometry (the data size) from whoever made the ring, never from the header;
//! - keeps its own `tail`, and only ever stores it to the header (for the producers to see);
//! - reads `head` and each length word once, into a local, and bounds them before use;
//! - copies each record out of the shared memory before anyone looks at it, so a record cannot
//!   change between being checked and being decoded;
//! - touches the shared memory only through atomic loads and stores (no reference to plain
//!   memory that another process writes, hence no undefined behaviour whatever it does).
//!
//! Nonsense ends the session with a [`RingError`]; nothing here panics on the ring's contents.

use crate::record::{KIND_PAD, PREAMBLE};
use crate::ring::{
    RingHeader, HEADER_SIZE, RING_MAGIC, RING_VERSION, STATE_FAILED, STATE_STOP_REQUESTED,
};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Something in the ring that no agent could have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// `head` is behind the reader or more than twice the ring's size ahead of it.
    Head { head: u64, tail: u64 },
    /// A record length that is not a multiple of 8, too short, or past the data.
    Record { len: u64, at: u64 },
    /// A `state` value the protocol does not have.
    State(u32),
    /// Not a ring of this format: its magic, or its version (`RING_VERSION`).
    Format { version: u32 },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Head { head, tail } => {
                write!(
                    f,
                    "write position {head} is impossible with read position {tail}"
                )
            }
            RingError::Record { len, at } => write!(f, "record length {len} at {at}"),
            RingError::State(s) => write!(f, "unknown state {s}"),
            RingError::Format { version } => write!(
                f,
                "not a ring of this mprof (format version {version}, this mprof reads {})",
                crate::ring::RING_VERSION
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// The reader's view of a ring it made.
pub struct RingReader {
    base: *mut u8,
    data_size: u64,
    tail: Cell<u64>,
    /// Bytes of PAD records consumed so far (see `RingHeader::pad_bytes`).
    pads_read: Cell<u64>,
    record: RefCell<Vec<u8>>,
}

impl RingReader {
    /// A reader of the ring at `base`, whose data area is `data_size` bytes (a power of two,
    /// at least 4096), freshly initialised (nothing consumed yet).
    ///
    /// # Safety
    /// `base` must be 8-aligned and map `HEADER_SIZE + data_size` bytes for as long as the
    /// reader lives. Their contents may change at any time.
    pub unsafe fn new(base: *mut u8, data_size: usize) -> RingReader {
        assert!(data_size.is_power_of_two() && data_size >= 4096);
        RingReader {
            base,
            data_size: data_size as u64,
            tail: Cell::new(0),
            pads_read: Cell::new(0),
            record: RefCell::new(Vec::with_capacity(4096)),
        }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(
            offset.is_multiple_of(4) && offset + 4 <= HEADER_SIZE + self.data_size as usize
        );
        // SAFETY: `offset` is a field of the header, which `new`'s caller keeps mapped; 4-aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(
            offset.is_multiple_of(8) && offset + 8 <= HEADER_SIZE + self.data_size as usize
        );
        // SAFETY: `offset` is a field of the header, which `new`'s caller keeps mapped; 8-aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// The ring's state, checked to be one the protocol knows.
    pub fn state(&self) -> Result<u32, RingError> {
        match self
            .u32_at(offset_of!(RingHeader, state))
            .load(Ordering::Acquire)
        {
            s @ 0..=STATE_FAILED => Ok(s),
            s => Err(RingError::State(s)),
        }
    }

    /// Checks that the ring is of this format (magic and version): for a ring made by the
    /// other side (a followed child's), whose agent could be of another mprof.
    pub fn check_format(&self) -> Result<(), RingError> {
        let magic = self
            .u64_at(offset_of!(RingHeader, magic))
            .load(Ordering::Acquire);
        let version = self
            .u32_at(offset_of!(RingHeader, version))
            .load(Ordering::Acquire);
        if magic.to_ne_bytes() != RING_MAGIC || version != RING_VERSION {
            return Err(RingError::Format { version });
        }
        Ok(())
    }

    /// The agent's latest request that the memory map be read (see `ring`'s map handshake).
    #[inline]
    pub fn maps_wanted(&self) -> u32 {
        self.u32_at(offset_of!(RingHeader, maps_wanted))
            .load(Ordering::Acquire)
    }

    /// Whether the session records native stacks (as mprof set up the ring; the target could
    /// have changed the word since, which only decides whether the module map is read).
    pub fn native_stacks(&self) -> bool {
        self.u32_at(offset_of!(RingHeader, config_flags))
            .load(Ordering::Relaxed)
            & crate::ring::CONFIG_NATIVE_STACKS
            != 0
    }

    /// Tells the agent that its request `n` is served: the map was read after it was made.
    pub fn maps_read(&self, n: u32) {
        self.u32_at(offset_of!(RingHeader, maps_read))
            .store(n, Ordering::Release);
    }

    /// Asks the agent to stop if it is running (`ACTIVE` → `STOP_REQUESTED`).
    pub fn request_stop(&self) {
        let _ = self.u32_at(offset_of!(RingHeader, state)).compare_exchange(
            crate::ring::STATE_ACTIVE,
            STATE_STOP_REQUESTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Tells the agent the reader is alive (CLOCK_MONOTONIC nanoseconds).
    pub fn heartbeat(&self, now_ns: u64) {
        self.u64_at(offset_of!(RingHeader, reader_heartbeat_ns))
            .store(now_ns, Ordering::Release);
    }

    /// Samples the agent says it took (a number it chose: only for display).
    pub fn samples(&self) -> u64 {
        self.u64_at(offset_of!(RingHeader, samples))
            .load(Ordering::Relaxed)
    }

    /// Processes the agent says were forked and not followed (only for display).
    pub fn forked_unfollowed(&self) -> u32 {
        self.u32_at(offset_of!(RingHeader, forked_unfollowed))
            .load(Ordering::Relaxed)
    }

    /// Records the agent says it dropped (only for display).
    pub fn dropped(&self) -> u64 {
        self.u64_at(offset_of!(RingHeader, dropped))
            .load(Ordering::Relaxed)
    }

    /// The agent's version string, copied out (up to its NUL, lossy UTF-8).
    pub fn python_version(&self) -> String {
        self.text(offset_of!(RingHeader, py_version), 64)
    }

    /// The agent's message, copied out (up to its NUL, lossy UTF-8).
    pub fn message(&self) -> String {
        self.text(offset_of!(RingHeader, message), 256)
    }

    fn text(&self, offset: usize, len: usize) -> String {
        let mut bytes = Vec::with_capacity(len);
        for i in 0..len / 8 {
            let word = self.u64_at(offset + 8 * i).load(Ordering::Relaxed);
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// How full the ring is with records, from 0 to 1: unread positions less the unread PADs'
    /// (right after a short lap, a PAD takes most of the ring's positions and holds nothing).
    /// Clamped: the producer's `head` and `pad_bytes` are not trusted.
    pub fn fill(&self) -> f64 {
        let head = self
            .u64_at(offset_of!(RingHeader, head))
            .load(Ordering::Acquire);
        let pads = self
            .u64_at(offset_of!(RingHeader, pad_bytes))
            .load(Ordering::Relaxed);
        let unread_pads = pads.saturating_sub(self.pads_read.get());
        let used = head
            .saturating_sub(self.tail.get())
            .saturating_sub(unread_pads)
            .min(self.data_size);
        used as f64 / self.data_size as f64
    }

    /// Hands every published record (padding excluded) to `sink`, in ring order, until one
    /// that is not yet published; at most a quarter of the ring's worth of records per call.
    /// Each record is a private copy, at least `PREAMBLE` bytes long, whose length word says its
    /// true length. Before the consumed bytes go back to the producers, `release(from, to)` gets
    /// each run of consumed records between PADs, in ring positions (the reader gives those
    /// pages back to the kernel; a PAD's body is never released, as a producer that escaped a
    /// stall may be writing there: see `ring`). Returns the bytes of records moved (padding
    /// excluded), or the first impossible thing found (what came before it was handed over).
    pub fn drain_then(
        &self,
        mut sink: impl FnMut(&[u8]),
        mut release: impl FnMut(u64, u64),
    ) -> Result<usize, RingError> {
        let size = self.data_size;
        let start = self.tail.get();
        let head = self
            .u64_at(offset_of!(RingHeader, head))
            .load(Ordering::Acquire);
        if head < start || head - start > 2 * size {
            return Err(RingError::Head { head, tail: start });
        }
        let mut tail = start;
        let mut run = start;
        let mut moved = 0;
        let mut pads = 0;
        let mut error = None;
        let mut record = self.record.borrow_mut();
        while tail < head && moved < size / 4 {
            let pos = tail & (size - 1);
            let data = HEADER_SIZE + pos as usize;
            let len = self.u32_at(data).load(Ordering::Acquire) as u64;
            if len == 0 {
                break;
            }
            let kind_aux = self.u32_at(data + 4).load(Ordering::Relaxed);
            let pad = kind_aux.to_ne_bytes()[..2] == KIND_PAD.to_le_bytes();
            if len < PREAMBLE as u64
                || !len.is_multiple_of(8)
                || (!pad && len > size / 4)
                || pos + len > size
                || tail + len > head
            {
                error = Some(RingError::Record { len, at: tail });
                break;
            }
            if pad {
                if run < tail {
                    release(run, tail);
                }
                // Only the preamble: the body was never written (or, after an escape, holds
                // records the producer wrote later, which this reader reads in their turn).
                self.u32_at(data + 4).store(0, Ordering::Relaxed);
                self.u32_at(data).store(0, Ordering::Relaxed);
                tail += len;
                run = tail;
                pads += len;
                continue;
            }
            record.clear();
            record.extend_from_slice(&(len as u32).to_le_bytes());
            record.extend_from_slice(&kind_aux.to_ne_bytes());
            for i in 1..len as usize / 8 {
                let word = self.u64_at(data + 8 * i).load(Ordering::Relaxed);
                record.extend_from_slice(&word.to_ne_bytes());
            }
            sink(&record);
            // Zero the record, length word last, so a producer that reuses these bytes never
            // sees a stale non-zero length.
            self.u32_at(data + 4).store(0, Ordering::Relaxed);
            for i in 1..len as usize / 8 {
                self.u64_at(data + 8 * i).store(0, Ordering::Relaxed);
            }
            self.u32_at(data).store(0, Ordering::Relaxed);
            tail += len;
            moved += len;
        }
        if run < tail {
            release(run, tail);
        }
        if tail > start {
            self.pads_read.set(self.pads_read.get() + pads);
            self.tail.set(tail);
            self.u64_at(offset_of!(RingHeader, tail))
                .store(tail, Ordering::Release);
        }
        match error {
            Some(e) => Err(e),
            None => Ok(moved as usize),
        }
    }

    /// [`RingReader::drain_then`] with nothing to release.
    pub fn drain(&self, sink: impl FnMut(&[u8])) -> Result<usize, RingError> {
        self.drain_then(sink, |_, _| {})
    }
}

/// The whole pages of `page` bytes that a consumed run of records (ring positions `from..to`,
/// as `RingReader::drain_then` reports them) lets the reader give back to the kernel, as
/// `give(offset, len)` calls in data-area offsets. The first `keep` bytes (the short laps'
/// window, [`crate::ring::window`]) stay: the producer comes back to them at once, and a fault
/// on a page given back costs more than its memory saves.
pub fn pages_to_give_back(
    size: u64,
    keep: u64,
    page: u64,
    from: u64,
    to: u64,
    mut give: impl FnMut(u64, u64),
) {
    let (mut at, end) = (from.div_ceil(page) * page, to / page * page);
    while at < end {
        let offset = at & (size - 1);
        let len = (end - at).min(size - offset);
        let first = offset.max(keep);
        if first < offset + len {
            give(first, offset + len - first);
        }
        at += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{decode, Record, KIND_FREE};
    use crate::ring::{region_size, Ring, STATE_ACTIVE};

    const SIZE: usize = 4096;

    /// A ring in private memory, its reader, and raw access to scribble on it as a hostile
    /// producer would.
    struct Scribbled {
        mem: Vec<u64>,
    }

    impl Scribbled {
        fn new() -> Scribbled {
            let mut mem = vec![0u64; region_size(SIZE) / 8];
            // SAFETY: a zeroed, aligned region of the right size.
            unsafe { Ring::init(mem.as_mut_ptr() as *mut u8, SIZE, 1, 0, 64, 0) };
            Scribbled { mem }
        }
        fn base(&mut self) -> *mut u8 {
            self.mem.as_mut_ptr() as *mut u8
        }
        fn ring(&mut self) -> Ring {
            // SAFETY: the test's region, initialised by `new`, outlives the ring.
            unsafe { Ring::attach(self.base(), region_size(SIZE)).unwrap() }
        }
        fn reader(&mut self) -> RingReader {
            // SAFETY: the test's region, initialised by `new`, outlives the reader.
            unsafe { RingReader::new(self.base(), SIZE) }
        }
        fn poke_u64(&mut self, offset: usize, v: u64) {
            self.mem[offset / 8] = v;
        }
        fn poke_u32(&mut self, offset: usize, v: u32) {
            let word = &mut self.mem[offset / 8];
            let shift = (offset % 8) * 8;
            *word = (*word & !(0xffff_ffffu64 << shift)) | ((v as u64) << shift);
        }
    }

    /// A ring holding two FREE records (addresses 1 and 2, 16 bytes each), and its reader.
    fn two_frees() -> (Scribbled, RingReader) {
        let mut s = Scribbled::new();
        let mut ring = s.ring();
        free(&mut ring, 1);
        free(&mut ring, 2);
        let reader = s.reader();
        (s, reader)
    }

    fn free(ring: &mut Ring, addr: u64) {
        assert!(ring.try_write(KIND_FREE, 0, 8, |b| b[..8]
            .copy_from_slice(&addr.to_le_bytes())));
    }

    #[test]
    fn impossible_heads_are_errors() {
        for head in [u64::MAX, 2 * SIZE as u64 + 8, 1 << 40] {
            let mut s = Scribbled::new();
            let reader = s.reader();
            s.poke_u64(offset_of!(RingHeader, head), head);
            assert!(matches!(reader.drain(|_| {}), Err(RingError::Head { .. })));
        }
    }

    #[test]
    fn impossible_lengths_are_errors_and_nothing_is_read_past_the_data() {
        for len in [1u32, 7, 12, 2048, 4096, 8192, u32::MAX] {
            let (mut s, reader) = two_frees();
            // The second record's length word claims more than is there.
            s.poke_u32(HEADER_SIZE + 16, len);
            let mut seen = Vec::new();
            let r = reader.drain(|b| seen.push(decode(b).unwrap().0));
            assert!(matches!(r, Err(RingError::Record { .. })), "{len}: {r:?}");
            assert_eq!(seen, [Record::Free { addr: 1 }], "what came before is kept");
        }
    }

    #[test]
    fn a_pad_of_any_length_is_read_but_not_past_the_data_or_the_head() {
        for (len, ok) in [
            (SIZE as u32 - 16, true),
            (SIZE as u32 - 8, false),
            (48, false),
        ] {
            let (mut s, reader) = two_frees();
            // The second record made a PAD (kind 0): from offset 16 to `len` bytes on.
            s.poke_u32(HEADER_SIZE + 16, len);
            s.poke_u32(HEADER_SIZE + 20, 0);
            if ok {
                s.poke_u64(offset_of!(RingHeader, head), SIZE as u64);
            }
            let mut seen = Vec::new();
            let r = reader.drain(|b| seen.push(decode(b).unwrap().0));
            assert_eq!(seen, [Record::Free { addr: 1 }], "{len}");
            if ok {
                assert_eq!(r, Ok(16), "the PAD is consumed, not counted");
            } else {
                assert!(matches!(r, Err(RingError::Record { .. })), "{len}: {r:?}");
            }
        }
    }

    #[test]
    fn a_head_near_the_end_cannot_make_the_reader_cross_the_data() {
        // The reader's local geometry bounds everything, whatever the header says.
        let mut s = Scribbled::new();
        let reader = s.reader();
        s.poke_u64(offset_of!(RingHeader, data_size), 1 << 40);
        s.poke_u64(offset_of!(RingHeader, head), SIZE as u64);
        s.poke_u32(HEADER_SIZE + SIZE - 8, 1 << 20);
        // Every length word in the data area is 0 except the last: nothing is published.
        assert_eq!(reader.drain(|_| panic!("no record")), Ok(0));
    }

    #[test]
    fn unknown_states_are_errors_and_texts_are_bounded() {
        let mut s = Scribbled::new();
        let reader = s.reader();
        assert_eq!(reader.state(), Ok(0));
        s.poke_u32(offset_of!(RingHeader, state), STATE_ACTIVE);
        assert_eq!(reader.state(), Ok(STATE_ACTIVE));
        s.poke_u32(offset_of!(RingHeader, state), 77);
        assert_eq!(reader.state(), Err(RingError::State(77)));
        // No NUL anywhere in the message: it stops at its field's end.
        for i in 0..256 / 8 {
            s.poke_u64(
                offset_of!(RingHeader, message) + 8 * i,
                u64::from_ne_bytes(*b"AAAAAAAA"),
            );
        }
        assert_eq!(reader.message(), "A".repeat(256));
        s.poke_u64(offset_of!(RingHeader, head), u64::MAX);
        assert_eq!(reader.fill(), 1.0);
    }

    #[test]
    fn a_ring_of_another_format_is_refused() {
        let mut s = Scribbled::new();
        let reader = s.reader();
        assert_eq!(reader.check_format(), Ok(()));
        s.poke_u32(offset_of!(RingHeader, version), RING_VERSION - 1);
        assert_eq!(
            reader.check_format(),
            Err(RingError::Format {
                version: RING_VERSION - 1
            })
        );
        s.poke_u32(offset_of!(RingHeader, version), RING_VERSION);
        s.poke_u64(
            offset_of!(RingHeader, magic),
            u64::from_ne_bytes(*b"MPROFRNX"),
        );
        assert!(reader.check_format().is_err());
    }

    #[test]
    fn a_map_request_is_seen_and_answered_through_the_header() {
        let mut s = Scribbled::new();
        let ring = s.ring();
        let reader = s.reader();
        assert_eq!(reader.maps_wanted(), 0);
        ring.header().maps_wanted.fetch_add(1, Ordering::AcqRel);
        assert_eq!(reader.maps_wanted(), 1);
        reader.maps_read(1);
        assert_eq!(ring.header().maps_read.load(Ordering::Acquire), 1);
    }
}
