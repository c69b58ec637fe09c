//! The CLI's end of a profiling session: it owns the shared-memory ring, drains it into the
//! capture file, keeps the heartbeat the agent watches, and adds what the target should not pay
//! for (RSS readings from /proc, thread names).

use crate::capture::CaptureWriter;
use crate::SamplingArgs;
use anyhow::{Context, Result};
use mprof_common::record::{self, Record, KIND_ALLOC};
use mprof_common::ring::{self, Ring, RingHeader};
use std::collections::HashSet;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Size of the ring's data area. Large, to ride out the reader's stalls (a slow disk) at high
/// sample rates; it costs memory only while full, because the reader gives drained pages back
/// (`RingMem::release`).
pub const RING_DATA_SIZE: usize = 256 << 20;

/// A ring in an anonymous memory file, mapped here.
pub struct RingMem {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

impl RingMem {
    /// Makes a ring configured for `sampling`. The memory file is inheritable (no CLOEXEC) when
    /// `inheritable` is set, so that a child can map it.
    pub fn create(sampling: &SamplingArgs, inheritable: bool) -> Result<RingMem> {
        let fd = mprof_injector::agent::memfd_with("mprof-ring", &[], !inheritable)?;
        RingMem::from_fd(fd, sampling)
    }

    /// Makes a ring in the memory file `fd` (for attach: the target's own memfd, opened through
    /// `/proc/PID/fd/N`): sizes it, maps it and writes a fresh header.
    pub fn from_fd(fd: OwnedFd, sampling: &SamplingArgs) -> Result<RingMem> {
        let len = ring::region_size(RING_DATA_SIZE);
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error()).context("sizing the ring");
        }
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the ring");
        }
        let base = base as *mut u8;
        unsafe {
            Ring::init(
                base,
                RING_DATA_SIZE,
                sampling.rate,
                sampling.seed,
                sampling.max_depth,
                0,
            )
        };
        Ok(RingMem { fd, base, len })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Gives the whole pages of a drained range (ring positions `from..to`) back to the kernel,
    /// so the ring's memory, shared with the target, stays resident only while it holds data.
    /// Called before the range is handed back to the producers, so nothing written after it is
    /// lost; the next write there faults in a fresh zero page.
    pub fn release(&self, from: u64, to: u64) {
        const PAGE: u64 = 4096;
        let size = RING_DATA_SIZE as u64;
        let (mut at, end) = (from.div_ceil(PAGE) * PAGE, to / PAGE * PAGE);
        while at < end {
            let offset = at % size;
            let len = (end - at).min(size - offset);
            unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (ring::HEADER_SIZE as u64 + offset) as libc::off_t,
                    len as libc::off_t,
                );
            }
            at += len;
        }
    }

    pub fn ring(&self) -> Ring {
        unsafe { Ring::attach(self.base, self.len) }.expect("a ring we made ourselves")
    }

    pub fn header(&self) -> &RingHeader {
        unsafe { &*(self.base as *const RingHeader) }
    }

    /// The agent's message, if it wrote one.
    pub fn message(&self) -> String {
        c_text(&self.header().message)
    }

    /// The interpreter's version string as the agent read it.
    pub fn python_version(&self) -> String {
        c_text(&self.header().py_version)
    }

    /// Records the agent has dropped so far because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.header().dropped.load(Ordering::Relaxed)
    }

    /// How full the ring is: 0 when the reader has taken everything, 1 when the agent drops.
    pub fn fill(&self) -> f64 {
        let h = self.header();
        let tail = h.tail.load(Ordering::Acquire);
        let head = h.head.load(Ordering::Acquire);
        head.saturating_sub(tail) as f64 / h.data_size.max(1) as f64
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn c_text(bytes: &[u8]) -> String {
    CStr::from_bytes_until_nul(bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// CLOCK_MONOTONIC in nanoseconds, the clock the agent uses too.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Resident set size of `pid` in bytes, from /proc/PID/statm.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64)
}

/// Drains a ring into a capture file.
pub struct Reader<'a> {
    ring: &'a RingMem,
    pub capture: CaptureWriter,
    pid: u32,
    tids: HashSet<u32>,
    last_rss: Option<Instant>,
    last_flush: Instant,
}

impl<'a> Reader<'a> {
    pub fn new(ring: &'a RingMem, capture: CaptureWriter, pid: u32) -> Reader<'a> {
        let r = Reader {
            ring,
            capture,
            pid,
            tids: HashSet::new(),
            last_rss: None,
            last_flush: Instant::now(),
        };
        r.heartbeat();
        r
    }

    /// Tells the agent the reader is alive.
    pub fn heartbeat(&self) {
        self.ring
            .header()
            .reader_heartbeat_ns
            .store(monotonic_ns(), Ordering::Release);
    }

    /// Moves whatever the agent published into the capture; returns the bytes moved.
    pub fn pump(&mut self) -> Result<usize> {
        self.pump_observed(|_| {})
    }

    /// [`Reader::pump`], and `observe` sees every record written to the capture, in file
    /// order: the ring's records byte for byte and the ones the reader adds
    /// (thread names, RSS readings). The live view aggregates from here.
    pub fn pump_observed(&mut self, mut observe: impl FnMut(&[u8])) -> Result<usize> {
        self.heartbeat();
        let mut new_tids = Vec::new();
        let mut result = Ok(());
        let capture = &mut self.capture;
        let tids = &mut self.tids;
        let ring = self.ring;
        let moved = ring
            .ring()
            .drain_then(
                |bytes| {
                    if result.is_err() {
                        return;
                    }
                    if let Ok((_, kind, _)) = record::preamble(bytes) {
                        if kind == KIND_ALLOC && bytes.len() >= 12 {
                            let tid = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
                            if tids.insert(tid) {
                                new_tids.push(tid);
                            }
                        }
                    }
                    result = capture.write_raw(bytes);
                    observe(bytes);
                },
                |from, to| ring.release(from, to),
            )
            .map_err(|e| anyhow::anyhow!("the agent's ring is damaged: {e}"))?;
        result?;
        for tid in new_tids {
            self.write_thread_name(tid, &mut observe)?;
        }
        self.tick(&mut observe)?;
        Ok(moved)
    }

    /// Writes a record the reader adds itself, and shows it to `observe`.
    fn add(&mut self, record: &Record, observe: &mut impl FnMut(&[u8])) -> Result<()> {
        let bytes = record::encode(record);
        self.capture.write_raw(&bytes)?;
        observe(&bytes);
        Ok(())
    }

    fn write_thread_name(&mut self, tid: u32, observe: &mut impl FnMut(&[u8])) -> Result<()> {
        let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", self.pid))
            .unwrap_or_default();
        let mut name = comm.trim().to_string();
        if tid == self.pid {
            name = format!("main ({name})");
        }
        self.add(&Record::Thread { tid, name }, observe)
    }

    /// RSS every 100 ms, flush every 200 ms.
    fn tick(&mut self, observe: &mut impl FnMut(&[u8])) -> Result<()> {
        let now = Instant::now();
        if self
            .last_rss
            .is_none_or(|t| now - t >= Duration::from_millis(100))
        {
            self.last_rss = Some(now);
            if let Some(rss) = rss_bytes(self.pid) {
                let rss = Record::Rss {
                    time_ns: monotonic_ns(),
                    rss_bytes: rss,
                };
                self.add(&rss, observe)?;
            }
        }
        if now - self.last_flush >= Duration::from_millis(200) {
            self.last_flush = now;
            self.capture.flush()?;
        }
        Ok(())
    }

    /// Writes the final counters and flushes.
    pub fn finish(&mut self) -> Result<()> {
        let h = self.ring.header();
        self.capture.write(&Record::Stats {
            samples: h.samples.load(Ordering::Relaxed),
            dropped: h.dropped.load(Ordering::Relaxed),
        })?;
        self.capture.flush()
    }
}
