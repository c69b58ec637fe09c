//! The CLI's end of a profiling session: it owns the shared-memory ring, drains it into the
//! capture file, keeps the heartbeat the agent watches, and adds what the target should not pay
//! for (RSS readings from /proc, thread names). The ring's memory itself (its size, the sealed
//! memory file, the mapping) is [`ring_mem`]'s.

use crate::analysis::symbols::tracker::ModuleTracker;
use crate::base::clock::{monotonic_ns, record_time_ns};
use crate::capture::file::CaptureWriter;
use crate::sessions::sampling::SamplingArgs;
use anyhow::{Context, Result};
use mprof_common::record::{self, Record, KIND_ALLOC, KIND_END};
use mprof_common::ring::{self, Ring};
use mprof_common::ring_reader::{self, RingReader};
use mprof_common::stacks::{self, KIND_SAMPLE};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

mod ring_mem;
mod smaps;

pub use ring_mem::*;

/// Where a reader reads its process's resident set size: /proc/PID/statm.
///
/// The program's own reader keeps the file open and reads it again from its start: one
/// system call a reading instead of a path lookup, an open, a read and a close (ten readings a
/// second, on the program's core when they share one). The file stays the process's own: if
/// it ends and its pid is reused, the reading fails instead of reading the other process. A
/// followed child's reader opens the file at each reading, as there may be thousands of them
/// and each kept file would count against mprof's limit of open files.
struct Statm {
    path: String,
    kept: Option<std::fs::File>,
    page: u64,
}

impl Statm {
    fn new(pid: u32) -> Statm {
        // SAFETY: sysconf takes an integer name and touches no memory of ours.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Statm {
            path: format!("/proc/{pid}/statm"),
            kept: None,
            page: page.max(1) as u64,
        }
    }

    /// Resident set size in bytes.
    fn rss_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 256];
        let n = match &self.kept {
            Some(file) => file.read_at(&mut buf, 0).ok()?,
            None => {
                use std::io::Read;
                std::fs::File::open(&self.path).ok()?.read(&mut buf).ok()?
            }
        };
        rss_in_statm(std::str::from_utf8(&buf[..n]).ok()?, self.page)
    }
}

/// The resident set size a statm text says, in bytes (`page` bytes a page); `None` for none
/// at all: a process that ended but is not reaped yet (a zombie) reads all zeros, which is no
/// reading of its memory (the timeline's RSS fell to 0 at its end).
fn rss_in_statm(text: &str, page: u64) -> Option<u64> {
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    if pages == 0 {
        return None;
    }
    pages.checked_mul(page)
}

/// How often the program's own reader reads its mappings (see `smaps`) at most (and as the
/// session ends); and never sooner than [`RESIDENT_COST_SHARE`] times what the last reading
/// took: the kernel walks the page tables of every mapping under the program's own lock of its
/// mappings (8 ms for a heap of 200 MB here), which stalls its page faults. Read every second,
/// they cost an allocation-bound program 2.4% (benches/pairs.py --against the build before
/// them); the allocators' figures carry the RSS themselves, and the mappings only add the
/// resident part of sampled `mmap` blocks and the named mappings.
const RESIDENT_EVERY: Duration = Duration::from_secs(5);
const RESIDENT_COST_SHARE: u32 = 100;

/// Threads the reader remembers having named (then it forgets them all and starts again).
const MAX_THREAD_NAMES: usize = 4096;

/// Drains a ring into a capture file.
pub struct Reader<R: std::ops::Deref<Target = RingMem>> {
    ring: R,
    pub capture: CaptureWriter,
    pid: u32,
    tids: HashSet<u32>,
    statm: Statm,
    last_rss: Option<Instant>,
    /// Whether the process's RSS is still this capture's to read (see
    /// [`Reader::program_replaced`]).
    reads_rss: bool,
    /// Whether the agent has said which Python it runs in: before, the pid may still be in
    /// its exec (a reading of one page), so no RSS is read.
    agent_up: bool,
    last_flush: Instant,
    /// The target's module map, for native stacks (`--native`).
    modules: ModuleTracker,
    /// The agent's last request to read the module map that was served (see
    /// `mprof_common::ring`'s map handshake).
    maps_served: u32,
    /// When the process's mappings were last read for a RESIDENT record, if this reader reads
    /// them (the program's own reader: see `smaps`).
    last_resident: Option<Option<Instant>>,
    /// What the last reading of the mappings took.
    resident_cost: Duration,
}

impl<R: std::ops::Deref<Target = RingMem>> Reader<R> {
    /// The ring this reader drains.
    pub fn ring(&self) -> &RingMem {
        &self.ring
    }

    /// The ring this reader drains, as it was handed over (to keep its lifetime).
    pub fn ring_ref(&self) -> &R {
        &self.ring
    }

    pub fn new(ring: R, capture: CaptureWriter, pid: u32) -> Reader<R> {
        let r = Reader {
            ring,
            capture,
            pid,
            tids: HashSet::new(),
            statm: Statm::new(pid),
            last_rss: None,
            reads_rss: true,
            agent_up: false,
            last_flush: Instant::now(),
            modules: ModuleTracker::new(pid),
            maps_served: 0,
            last_resident: None,
            resident_cost: Duration::ZERO,
        };
        r.heartbeat();
        r
    }

    /// The process ran a new program by exec: the RSS of its pid is the new program's from now
    /// on, and is no longer read into this capture.
    pub fn program_replaced(&mut self) {
        self.reads_rss = false;
    }

    /// The program's own reader (not a followed child's): keeps its process's statm file open
    /// for the RSS readings (see `Statm`).
    pub fn keep_statm_open(mut self) -> Self {
        self.statm.kept = std::fs::File::open(&self.statm.path).ok();
        self.last_resident = Some(None);
        self
    }

    /// Writes a RESIDENT record of the process's mappings now, if this reader reads them.
    fn read_resident(&mut self, observe: &mut impl FnMut(&[u8])) -> Result<()> {
        if self.last_resident.is_none() || !self.reads_rss || !self.agent_up {
            return Ok(());
        }
        let start = Instant::now();
        self.last_resident = Some(Some(start));
        let read = smaps::read(self.pid, record_time_ns());
        self.resident_cost = start.elapsed();
        match read {
            Some(resident) => self.add(&Record::Resident(resident), observe),
            None => Ok(()),
        }
    }

    /// Tells the agent the reader is alive.
    pub fn heartbeat(&self) {
        self.ring.heartbeat();
    }

    /// Moves whatever the agent published into the capture; returns the bytes moved.
    pub fn pump(&mut self) -> Result<usize> {
        self.pump_observed(|_| {})
    }

    /// [`Reader::pump`], and `observe` sees every record written to the capture, in file
    /// order: the ring's records byte for byte and the ones the reader adds
    /// (thread names, RSS readings). The driver shows them to the live view from here.
    pub fn pump_observed(&mut self, mut observe: impl FnMut(&[u8])) -> Result<usize> {
        self.heartbeat();
        let mut new_tids = Vec::new();
        let capture = &mut self.capture;
        let tids = &mut self.tids;
        let modules = &mut self.modules;
        let served = &mut self.maps_served;
        let ring: &RingMem = &self.ring;
        let resident_of = (self.last_resident.is_some() && self.reads_rss).then_some(self.pid);
        let mut read_resident = false;
        // Before anything else, and between records: the agent may wait for it at its exit.
        let mut result =
            serve_map_request(ring, modules, served, capture, resident_of, &mut observe)
                .map(|r| read_resident |= r);
        let moved = ring
            .reader()
            .drain_then(
                |bytes| {
                    if result.is_ok() {
                        result = serve_map_request(
                            ring,
                            modules,
                            served,
                            capture,
                            resident_of,
                            &mut observe,
                        )
                        .map(|r| read_resident |= r);
                    }
                    if result.is_err() {
                        return;
                    }
                    if let Ok((_, kind, aux)) = record::preamble(bytes) {
                        // The tid is the first word of these bodies.
                        let names_thread =
                            matches!(kind, KIND_ALLOC | KIND_SAMPLE | stacks::KIND_CONTEXT);
                        if names_thread && bytes.len() >= 12 {
                            let tid = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
                            // The set of threads named is bounded (a hostile target can
                            // invent tids, a server start a thread per request for days):
                            // once full it starts again, and a thread still running is
                            // named again.
                            if tids.len() >= MAX_THREAD_NAMES {
                                tids.clear();
                            }
                            if new_tids.len() < MAX_THREAD_NAMES && tids.insert(tid) {
                                new_tids.push(tid);
                            }
                        }
                        // The modules a native stack reaches go into the capture before it.
                        let before = match kind {
                            KIND_ALLOC => native_addrs(bytes, aux)
                                .map(|addrs| modules.before_sample(&addrs))
                                .unwrap_or_default(),
                            KIND_SAMPLE => bytes
                                .get(record::PREAMBLE..)
                                .and_then(stacks::sample_native_addrs)
                                .map(|addrs| modules.before_sample(&addrs))
                                .unwrap_or_default(),
                            KIND_END => modules.tick(true),
                            _ => Vec::new(),
                        };
                        for module in before {
                            let encoded = record::encode(&module);
                            if let Err(e) = capture.write_raw(&encoded) {
                                result = Err(e);
                                return;
                            }
                            observe(&encoded);
                        }
                    }
                    result = capture.write_raw(bytes);
                    observe(bytes);
                },
                |from, to| ring.release(from, to),
            )
            .map_err(|e| anyhow::anyhow!("the target damaged the ring ({e}); the session ended"))?;
        result?;
        for tid in new_tids {
            self.write_thread_name(tid, &mut observe)?;
        }
        // The agent asked for the mappings as its session ends (a detach): read with the
        // request, at the same moment as its last statistics.
        if read_resident && resident_of.is_some() {
            self.last_resident = Some(Some(Instant::now()));
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

    /// RSS every 100 ms, flush every 200 ms, the module map's changes every
    /// [`crate::analysis::symbols::tracker::RESCAN`] (once native stacks arrive).
    fn tick(&mut self, observe: &mut impl FnMut(&[u8])) -> Result<()> {
        for module in self.modules.tick(false) {
            self.add(&module, observe)?;
        }
        let now = Instant::now();
        if !self.agent_up {
            self.agent_up = !self.ring.python_version().is_empty();
        }
        if self.reads_rss
            && self.agent_up
            && self
                .last_rss
                .is_none_or(|t| now - t >= Duration::from_millis(100))
        {
            self.last_rss = Some(now);
            if let Some(rss) = self.statm.rss_bytes() {
                let rss = Record::Rss {
                    time_ns: record_time_ns(),
                    rss_bytes: rss,
                };
                self.add(&rss, observe)?;
            }
        }
        if let Some(last) = self.last_resident {
            let gap = RESIDENT_EVERY.max(self.resident_cost * RESIDENT_COST_SHARE);
            if last.is_none_or(|t| now - t >= gap) {
                self.read_resident(observe)?;
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
        self.read_resident(&mut |_| {})?;
        let reader = self.ring.reader();
        self.capture.write(&Record::Stats {
            samples: reader.samples(),
            dropped: reader.dropped(),
        })?;
        self.capture.flush()
    }
}

/// Serves the agent's request to read the module map, if it made a new one (the process is
/// about to end or to unload a library, see `mprof_common::ring`): the map is read now, the
/// MODULE records of what it shows are written, and only then is the request answered.
///
/// The same request asks for the process's mappings (a RESIDENT record) when `resident_of`
/// names the process: the agent asks as its session ends, and waits, so that they are read
/// beside its last statistics of the allocators, before the program tears itself down.
/// (Checked before every record the ring gives: the check is inlined, the serving is not.)
#[inline(always)]
fn serve_map_request(
    ring: &RingMem,
    modules: &mut ModuleTracker,
    served: &mut u32,
    capture: &mut CaptureWriter,
    resident_of: Option<u32>,
    observe: &mut impl FnMut(&[u8]),
) -> Result<bool> {
    let wanted = ring.reader().maps_wanted();
    if wanted == *served {
        return Ok(false);
    }
    serve_maps(ring, modules, served, wanted, capture, resident_of, observe)
}

/// [`serve_map_request`] once the agent has asked.
#[inline(never)]
fn serve_maps(
    ring: &RingMem,
    modules: &mut ModuleTracker,
    served: &mut u32,
    wanted: u32,
    capture: &mut CaptureWriter,
    resident_of: Option<u32>,
    observe: &mut impl FnMut(&[u8]),
) -> Result<bool> {
    *served = wanted;
    let mut records = Vec::new();
    if ring.reader().native_stacks() {
        records = modules.read_now();
    }
    if let Some(pid) = resident_of {
        records.extend(smaps::read(pid, record_time_ns()).map(Record::Resident));
    }
    for r in records {
        let encoded = record::encode(&r);
        capture.write_raw(&encoded)?;
        observe(&encoded);
    }
    ring.reader().maps_read(wanted);
    Ok(true)
}

/// The native return addresses of an ALLOC record as the ring holds it (`aux` is its number
/// of Python frames), if it carries a native stack.
fn native_addrs(bytes: &[u8], aux: u16) -> Option<Vec<u64>> {
    let body = bytes.get(record::PREAMBLE..)?;
    let flags = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?);
    record::native_stack(body, aux as usize, flags).map(|n| n.addrs)
}

#[cfg(test)]
mod tests {
    use super::rss_in_statm;

    #[test]
    fn a_zombie_statm_is_no_reading() {
        assert_eq!(
            rss_in_statm("12345 678 90 1 0 300 0\n", 4096),
            Some(678 * 4096)
        );
        assert_eq!(rss_in_statm("0 0 0 0 0 0 0\n", 4096), None);
        assert_eq!(rss_in_statm("", 4096), None);
    }
}
