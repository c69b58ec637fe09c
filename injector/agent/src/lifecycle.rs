//! The one owner of a profiling session's life: Idle → Active → Stopped (= Idle again).
//!
//! Every transition happens under `SESSION`'s lock, the same lock the slow path of the hooks
//! takes to record, so a record is never written into a ring that is being torn down. Starting
//! installs the hooks before the ring says ACTIVE; stopping restores the allocators, writes the
//! END record and only then says STOPPED, so a reader that sees STOPPED may start the next
//! session at once.
//!
//! There is no thread of the agent's own in the target (a thread would make Python 3.12+ warn
//! on every `fork()`, and would be one more thing to stop). A session ends when:
//! - the reader asks (ring state STOP_REQUESTED): the next sampled event sees it, or, for a
//!   target that allocates nothing, mprof injects a call to `mprof_agent_stop`;
//! - the reader stops beating (mprof died): the next sampled allocation sees it, and a new attach
//!   that finds the old session orphaned takes it over;
//! - the interpreter starts finalizing (record mode): the next sampled event;
//! - the process exits with native stacks on (`exit()`, the agent's destructor: [`at_exit`]).
//!
//! With native stacks, a session that ends because the process ends asks the reader to read
//! the memory map (`map_request`) and keeps its ring mapped until the process exits, when
//! [`at_exit`] waits for the answer, bounded, outside every lock and every hook. [`before_unload`]
//! does the same before a library is unloaded.

use crate::addrset::AddrSet;
use crate::chain::{self, HookTable};
use crate::lock::SpinLock;
use crate::map_request;
use crate::pyframes::CodeKey;
use crate::python;
use crate::sampler;
use crate::stacks::Stacks;
use crate::sys::{self, now_ns};
use mprof_common::layout::{self, PyLayout};
use mprof_common::record::{EndReason, HeapStats, KIND_END, KIND_HEAP};
use mprof_common::ring::{
    Ring, RingHeader, CONFIG_NATIVE_STACKS, CONFIG_PYTHON_ONLY, STATE_ACTIVE, STATE_STOPPED,
    STATE_STOP_REQUESTED,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether a session is running. Read by the slow path only.
pub static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether native allocations are sampled in the running session: set once the GOT entries
/// point at the native hooks (`native::install`), cleared when the session stops.
static NATIVE: AtomicBool = AtomicBool::new(false);

/// Whether the running session samples native allocations (read by the slow path and the
/// native hooks).
pub fn native_on() -> bool {
    NATIVE.load(Ordering::Relaxed)
}

/// How long the reader may stay silent before its session counts as orphaned.
pub const READER_TIMEOUT_NS: u64 = 1_500_000_000;

pub const CODE_CACHE: usize = 1 << 14;
pub const LINE_CACHE: usize = 1 << 14;

/// A remembered line: the code object (by its whole key, so that another code object at a
/// reused address does not match: a module's code is freed after its import, and the next
/// one often takes its place), the instruction offset, and its line; valid only in the
/// session (`generation`) that made it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LineEntry {
    pub generation: u32,
    pub key: CodeKey,
    pub offset: i32,
    pub line: u32,
}

/// The ring of a running session, mapped here: the mapping lives as long as this value (it is
/// unmapped only by `stop_locked`, which takes it out of the session first).
pub struct Mapped {
    pub ring: Ring,
    base: *mut u8,
    len: usize,
    /// The thread and time of the last CONTEXT written to this ring (see
    /// `mprof_common::stacks`): brief samples of that thread at that time need no other.
    /// Thread 0 (no thread's id) until the first: a pair, where an `Option` of it took a
    /// compare more a sample.
    pub context: (u32, u64),
    /// The clock's reading (`now_ns`) when the reader's detach request and heartbeat were
    /// last looked at: they are looked at again once the clock's tick moved on.
    reader_checked: u64,
    /// The samples' clock.
    pub clock: crate::sys::SampleClock,
    /// The session's layout (`Session::layout`, here too: a sample then checks one `Option`,
    /// this one, where checking three took a dozen instructions) and the interpreter's entry
    /// points, as `python::api` found them when the session started.
    pub layout: &'static PyLayout,
    pub api: &'static python::Api,
}

impl Mapped {
    fn new(
        ring: Ring,
        base: *mut u8,
        len: usize,
        layout: &'static PyLayout,
        api: &'static python::Api,
    ) -> Mapped {
        Mapped {
            ring,
            base,
            len,
            layout,
            api,
            context: (0, 0),
            reader_checked: 0,
            clock: crate::sys::SampleClock::new(),
        }
    }
}

/// Arms the countdowns of a session sampling at `rate` in `layer`; at `--rate 1` the sampled
/// set holds every address (see `AddrSet::hold_everything`).
fn configure_sampling(s: &mut Session, rate: u64, seed: u64, layer: usize) {
    sampler::configure(rate, seed);
    chain::arm_countdown(layer);
    if rate <= 1 {
        s.set.hold_everything();
    }
}

/// What the slow path remembers between samples: code objects already announced and lines
/// already computed.
pub struct Caches {
    /// Bumped at every session start: cache entries of older sessions no longer match. (Cheaper
    /// than clearing the caches, which would touch a megabyte of the target's memory.)
    pub generation: u32,
    pub codes: [Option<(u32, CodeKey)>; CODE_CACHE],
    pub lines: [Option<LineEntry>; LINE_CACHE],
}

/// Sampled blocks whose realloc runs now, outside the session lock: out of the set (no free of
/// them is recorded meanwhile), not yet recorded as freed (a realloc that fails leaves its block
/// live). A sample that another thread takes at one of these addresses proves that realloc
/// released the block: that thread writes the block's FREE first (see
/// `sampling::record_alloc_with`).
pub struct Moving {
    len: usize,
    addrs: [usize; Moving::CAP],
}

impl Moving {
    /// At most this many at once (a realloc that finds no room keeps the lock across its call).
    pub const CAP: usize = 16;

    const fn new() -> Moving {
        Moving {
            len: 0,
            addrs: [0; Moving::CAP],
        }
    }

    /// Whether any block is moving: the one test a sample makes.
    #[inline(always)]
    pub fn any(&self) -> bool {
        self.len != 0
    }

    /// Notes `addr` as moving; false when there is no room.
    pub fn add(&mut self, addr: usize) -> bool {
        if self.len == Self::CAP {
            return false;
        }
        self.addrs[self.len] = addr;
        self.len += 1;
        true
    }

    /// Takes `addr` out if it is moving; whether it was.
    pub fn take(&mut self, addr: usize) -> bool {
        let Some(i) = self.addrs[..self.len].iter().position(|&a| a == addr) else {
            return false;
        };
        self.len -= 1;
        self.addrs[i] = self.addrs[self.len];
        true
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// Everything a session owns. Only touched under `SESSION`'s lock.
pub struct Session {
    pub mapped: Option<Mapped>,
    pub layout: Option<&'static PyLayout>,
    /// The runtime's finalizing word, read in place of a call (see `python::finalizing_flag`).
    pub finalizing_flag: Option<&'static AtomicUsize>,
    /// The runtime's words behind the calling thread's state (see `python::this_thread`).
    pub this_thread: Option<python::ThisThread>,
    pub max_depth: usize,
    /// The sampled blocks that are still live.
    pub set: AddrSet,
    pub caches: Caches,
    /// Node ids of the stacks announced so far, and each thread's previous chain.
    pub stacks: Stacks,
    /// The hooks the session installed.
    table: Option<&'static HookTable>,
    /// Samples with a native stack written in this session, and their number when the
    /// reader was last asked to read the memory map (`before_unload`).
    pub native_samples: u64,
    native_samples_mapped: u64,
    /// The ring of a session that ended because the process ends, kept mapped until
    /// [`at_exit`] has waited for the reader's answer to map request `.1`.
    leaving: Option<(Mapped, u32)>,
    /// Rings let go while threads wait in [`before_unload`] on them without the lock: kept
    /// mapped until the last of those threads is done (at most a few: sessions started and
    /// stopped within one bounded wait; one more than fit stays mapped for good).
    parked: [Option<Mapped>; 4],
    /// Sampled blocks being reallocated now, outside the lock (see `sampling::sampled_realloc`).
    pub moving: Moving,
}

// SAFETY: the raw pointers in `Session` (the ring mapping, the address set's table) are
// process-wide memory that only the holder of `SESSION`'s lock uses.
unsafe impl Send for Session {}

pub static SESSION: SpinLock<Session> = SpinLock::new(Session {
    mapped: None,
    layout: None,
    finalizing_flag: None,
    this_thread: None,
    max_depth: 0,
    set: AddrSet::new(),
    caches: Caches {
        generation: 0,
        codes: [None; CODE_CACHE],
        lines: [None; LINE_CACHE],
    },
    stacks: Stacks::new(),
    table: None,
    native_samples: 0,
    native_samples_mapped: 0,
    leaving: None,
    parked: [None, None, None, None],
    moving: Moving::new(),
});

/// Why a session could not start; the text goes into the ring's message.
pub enum StartError {
    NotPython,
    Unsupported(u8, u8),
    BadRing(&'static str),
    Busy,
    Hooks(&'static str),
    /// The interpreter's structures are not laid out as the row for its version says.
    Layout(String),
}

impl StartError {
    pub fn text(&self) -> String {
        match self {
            StartError::NotPython => "not a CPython interpreter".into(),
            StartError::Unsupported(a, b) => {
                let ((a0, b0), (a1, b1)) = layout::supported_range();
                format!("Python {a}.{b} is not supported (mprof supports {a0}.{b0} to {a1}.{b1})")
            }
            StartError::BadRing(why) => why.to_string(),
            StartError::Busy => "a profiling session is already running".into(),
            StartError::Hooks(why) => why.to_string(),
            StartError::Layout(why) => format!(
                "this Python{} is not laid out as mprof expects: {why}",
                python::api().map_or(String::new(), |a| format!(" {}.{}", a.major, a.minor))
            ),
        }
    }
}

/// Writes `text` into the ring header's message (NUL-terminated, cut to fit).
pub fn write_message(h: &RingHeader, text: &str) {
    let h = h as *const RingHeader as *mut RingHeader;
    let bytes = text.as_bytes();
    let n = bytes.len().min(255);
    // SAFETY: `message` is a 256-byte array in the mapped header; the reader only reads it
    // once the state says the agent is done with it.
    unsafe {
        let dst = std::ptr::addr_of_mut!((*h).message) as *mut u8;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, n);
        *dst.add(n) = 0;
    }
}

/// Starts a session writing into the ring mapped at `base` (`len` bytes), with the hooks of
/// `table`, and with native allocations sampled (if the ring asks) once `install_native`
/// (`native::install`) has pointed the GOT at the native hooks. The caller has claimed the
/// ring. A session whose reader died is ended first.
///
/// # Safety
/// `base` must map `len` bytes of a ring made by mprof, owned by this session from now on.
pub unsafe fn start(
    base: *mut u8,
    len: usize,
    table: &'static HookTable,
    install_native: fn(*const std::ffi::c_void, u64) -> bool,
) -> Result<(), StartError> {
    let api = python::api().ok_or(StartError::NotPython)?;
    let layout = layout::for_version(api.major, api.minor)
        .ok_or(StartError::Unsupported(api.major, api.minor))?;
    crate::layout_check::check(api, layout).map_err(StartError::Layout)?;
    // SAFETY: `len` mapped bytes of a ring at `base` (page-aligned), owned by this session
    // from now on (contract): they stay mapped while it keeps the `Ring`, and no other `Ring`
    // writes there.
    let ring = unsafe { Ring::attach(base, len) }.map_err(StartError::BadRing)?;
    touch_for_samples(&ring);
    crate::addrset::touch_filter();
    crate::code_dealloc::wrap(layout, api.code_type);
    // Before any hook is on and with no lock held (see `heap_stats::prepare`).
    crate::heap_stats::prepare();
    let mut s = SESSION.lock();
    if let Some(old) = &s.mapped {
        match reader_stopped(old.ring.header(), READER_TIMEOUT_NS) {
            Some(reason) => stop_locked(&mut s, reason),
            None => return Err(StartError::Busy),
        }
    }
    let h = ring.header();
    // SAFETY: under the session lock, taken above.
    let layer = unsafe { chain::install(api, table, h.rate) }.map_err(StartError::Hooks)?;
    let (max_depth, rate, seed) = (h.max_depth, h.rate, h.seed);
    crate::follow::remember(h);
    let native = h.config_flags & CONFIG_PYTHON_ONLY == 0;
    crate::unwind::configure(h.config_flags & CONFIG_NATIVE_STACKS != 0);
    s.layout = Some(layout);
    s.finalizing_flag = python::finalizing_flag(api, layout);
    s.this_thread = python::this_thread(layout);
    s.max_depth = (max_depth as usize).clamp(1, crate::pyframes::MAX_FRAMES);
    s.caches.generation = s.caches.generation.wrapping_add(1);
    s.stacks.reset();
    s.table = Some(table);
    (s.native_samples, s.native_samples_mapped) = (0, 0);
    configure_sampling(&mut s, rate, seed, layer);
    ENABLED.store(true, Ordering::Release);
    let serial = crate::got::SERIAL.fetch_add(1, Ordering::AcqRel) + 1;
    ring.header().state.store(STATE_ACTIVE, Ordering::Release);
    s.mapped = Some(Mapped::new(ring, base, len, layout, api));
    drop(s);
    // Outside the session lock: the GOT scan takes the loader's lock, which a thread inside
    // `dlopen` holds while it allocates (and may wait for the session lock in a hook).
    if native && install_native(api.get_version, serial) {
        NATIVE.store(true, Ordering::Release);
    }
    // The allocators' statistics as the session starts (an attach: memory allocated before
    // it), and again at the first sample.
    crate::heap_stats::reset();
    read_all_and_write_heap_stats();
    Ok(())
}

/// Faults in the part of `ring` the samples are written to while the reader keeps up (its
/// short laps' window, 512 KiB of a 16 MiB ring), which the reader keeps resident: otherwise
/// the session's first laps take a page fault every 4 KiB, inside samples (on a web server,
/// about 90 in its first 10,000 requests).
fn touch_for_samples(ring: &Ring) {
    let (area, len) = ring.window_area();
    // SAFETY: the window lies in the ring's data area, which `Ring::attach` checked is mapped
    // (shared and writable: the agent writes its records there).
    unsafe { sys::touch_pages_for_writing(area, len) }
}

/// Puts the hooks back in front of the allocators if the interpreter replaced them since the
/// session started: at start-up, `PYTHONMALLOC` and `-X dev` make it reset its allocators
/// after the preloaded agent installed its hooks. Called with the GIL held (from an audit
/// hook), so no allocation runs through the tables while they change.
pub fn reinstall_if_replaced() {
    let mut s = SESSION.lock();
    let (Some(table), Some(api)) = (s.table, python::api()) else {
        return;
    };
    // SAFETY: under the session lock.
    if s.mapped.is_none() || unsafe { chain::still_reached(api, table) } {
        return;
    }
    // SAFETY: under the session lock, with the GIL held.
    match unsafe { chain::install(api, table, sampler::rate()) } {
        Ok(layer) => chain::arm_layer(layer),
        Err(why) => {
            if let Some(m) = &s.mapped {
                write_message(m.ring.header(), why);
            }
            stop_locked(&mut s, EndReason::Detached);
        }
    }
}

/// Ends the running session, if any, for `reason`; returns whether there was one. Called
/// without the session lock: the allocators' statistics are read first (the session's last
/// HEAP record, before its END).
pub fn stop(reason: EndReason) -> bool {
    stop_with_statistics(reason)
}

/// The reason of a stop a sample's slow path asked for, to be made once the session lock is
/// released ([`stop_soon`]); `EndReason as u16 + 1`, 0 when none.
static PENDING_STOP: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// Ends the session from a sample's slow path (the session lock held). A session that ends
/// because the program is done or mprof detaches first reads the allocators' statistics, which
/// may not be read under the lock (see `locks`): sampling stops now, and the stop itself is
/// made once the lock is released, right after ([`SpinLock::defer`]). A session whose reader
/// is gone stops at once (nobody would read them).
pub fn stop_soon(s: &mut Session, reason: EndReason) {
    if reason == EndReason::ReaderGone {
        return stop_locked(s, reason);
    }
    ENABLED.store(false, Ordering::Release);
    if PENDING_STOP.swap(reason as u16 + 1, Ordering::AcqRel) == 0 {
        SESSION.defer(stop_pending);
    }
}

/// The stop [`stop_soon`] asked for, with the allocators' statistics read first.
fn stop_pending() {
    let Some(reason) = EndReason::from_u16(PENDING_STOP.swap(0, Ordering::AcqRel).wrapping_sub(1))
    else {
        return;
    };
    stop_with_statistics(reason);
}

/// Ends the session: sampling off, the allocators restored (unless the interpreter is shutting
/// down), the END record written, STOPPED published, the ring unmapped; or, when the process
/// ends and native stacks are recorded, the reader asked to read the memory map first and the
/// ring kept for [`at_exit`].
pub fn stop_locked(s: &mut Session, reason: EndReason) {
    ENABLED.store(false, Ordering::Release);
    chain::idle();
    let serial = crate::got::SERIAL.fetch_add(1, Ordering::AcqRel) + 1;
    stop_native(reason != EndReason::Finalizing, serial);
    let lost = match (s.table, python::api()) {
        (Some(table), Some(api)) if reason != EndReason::Finalizing => {
            // SAFETY: under the session lock.
            unsafe { chain::uninstall(api, table) }
        }
        _ => chain::Lost::default(),
    };
    if let (Some(layout), Some(api)) = (s.layout, python::api()) {
        crate::code_dealloc::unwrap(layout, api.code_type);
    }
    s.set.clear();
    s.moving.clear();
    s.stacks.release();
    let Some(mut m) = s.mapped.take() else { return };
    if lost.any() {
        let names = ["raw", "mem", "obj"];
        let which: Vec<&str> = (0..3)
            .filter(|&d| lost.domains[d])
            .map(|d| names[d])
            .collect();
        write_message(
            m.ring.header(),
            &format!(
                "the program replaced mprof's hooks on the {} allocator during the session \
                 (tracemalloc.stop() or another allocator hook): allocations after that were \
                 not seen",
                which.join("/")
            ),
        );
    }
    let h = m.ring.header();
    let request =
        (reason == EndReason::Finalizing && map_request::wanted(h)).then(|| map_request::ask(h));
    m.ring.try_write(KIND_END, reason as u16, 8, |b| {
        b[..8].copy_from_slice(&now_ns().to_le_bytes())
    });
    // Only a session the word still shows as running becomes stopped: any other value is
    // something the program wrote there, and it stays for mprof to see as damage.
    let state = &m.ring.header().state;
    for running in [STATE_ACTIVE, STATE_STOP_REQUESTED] {
        let stopped =
            state.compare_exchange(running, STATE_STOPPED, Ordering::AcqRel, Ordering::Acquire);
        if stopped.is_ok() {
            break;
        }
    }
    match request {
        Some(n) => {
            if let Some((old, _)) = s.leaving.replace((m, n)) {
                let_go(s, old);
            }
        }
        None => let_go(s, m),
    }
}

/// Stops sampling native allocations; with `restore`, the patched GOT entries are put back
/// once the session lock is released (the restore takes the loader's list lock, which a thread
/// may hold while it waits for the session lock in a hook). Called with the session lock held,
/// after the session serial moved on to `serial`.
pub fn stop_native(restore: bool, serial: u64) {
    NATIVE.store(false, Ordering::Release);
    if restore {
        RESTORE_SERIAL.store(serial, Ordering::Relaxed);
        SESSION.defer(restore_deferred);
    }
}

/// The session serial a deferred restore is for.
static RESTORE_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Puts the GOT entries back, after the session lock was released (see [`stop_native`]); not
/// if another session started meanwhile.
fn restore_deferred() {
    let serial = RESTORE_SERIAL.load(Ordering::Relaxed);
    // Busy: what the restore allocates is the agent's own.
    let done = sampler::THREAD.try_with(|t| {
        let was = t.busy.replace(true);
        crate::got::restore_all(serial);
        t.busy.set(was);
    });
    if done.is_err() {
        crate::got::restore_all(serial); // a thread whose locals are gone: it is exiting
    }
}

/// Threads waiting in [`before_unload`] without the session lock, on a ring they read: while
/// there are any, a ring the session lets go is parked (`Session::parked`), and the last of
/// them unmaps it. Changed under the session lock.
static UNLOAD_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Unmaps a ring the session lets go, or parks it while a thread may still read it.
fn let_go(s: &mut Session, m: Mapped) {
    if UNLOAD_WAITERS.load(Ordering::Relaxed) == 0 {
        return unmap(m);
    }
    // No room left: the ring stays mapped for good (dropping `m` does not unmap it).
    if let Some(free) = s.parked.iter_mut().find(|p| p.is_none()) {
        *free = Some(m);
    }
}

/// Unmaps a ring the session no longer holds.
fn unmap(m: Mapped) {
    // SAFETY: the mapping made for its session; nothing else uses it once it has left the
    // session (`mapped` and `leaving`).
    unsafe { sys::munmap(m.base.cast(), m.len) };
}

/// The process exits (the agent's destructor, from `exit()`; the loader's lock is not held
/// there): ends a session still running that records native stacks, then, if the reader was
/// asked to read the memory map, waits for its answer (`map_request::wait`, bounded, no lock
/// held). Other sessions end with the process, as they always did.
pub fn at_exit() {
    let mut s = SESSION.lock();
    let native = |m: &Mapped| map_request::wanted(m.ring.header());
    if s.mapped.as_ref().is_some_and(native) {
        stop_locked(&mut s, EndReason::Finalizing);
    }
    let leaving = s.leaving.take();
    drop(s);
    if let Some((m, n)) = leaving {
        map_request::wait(m.ring.header(), n);
        unmap(m);
    }
}

/// A library is about to be unloaded (`dlclose`): if samples with a native stack were written
/// since the reader was last asked, asks it to read the memory map while the library is still
/// there, and waits for its answer (bounded). The wait holds no lock (the other threads'
/// samples go on meanwhile); the ring it reads stays mapped while it waits (see
/// [`UNLOAD_WAITERS`]). The caller is not inside the agent (a hook's `busy` flag is clear).
pub fn before_unload() {
    let mut s = SESSION.lock();
    let Some(m) = &s.mapped else { return };
    if !map_request::wanted(m.ring.header()) || s.native_samples == s.native_samples_mapped {
        return;
    }
    s.native_samples_mapped = s.native_samples;
    drop(ask_reader_and_wait(s, map_request::WAIT_NS));
}

/// Asks the reader to read the maps (and the mappings' resident bytes) and waits for its
/// answer, at most `wait_ns`, without the session lock (`s`, released for the wait and taken
/// again, is returned). The ring stays mapped meanwhile: a session that lets it go parks it
/// ([`UNLOAD_WAITERS`]), and the last waiter unmaps what was parked.
fn ask_reader_and_wait(
    mut s: crate::lock::Guard<'_, Session>,
    wait_ns: u64,
) -> crate::lock::Guard<'_, Session> {
    let Some(m) = &s.mapped else { return s };
    let h = m.ring.header();
    let n = map_request::ask(h);
    let header = h as *const RingHeader;
    UNLOAD_WAITERS.fetch_add(1, Ordering::Relaxed);
    drop(s);
    // SAFETY: the ring stays mapped while UNLOAD_WAITERS counts this thread: a session that
    // lets it go meanwhile parks it instead of unmapping it.
    map_request::wait_at_most(unsafe { &*header }, n, wait_ns);
    s = SESSION.lock();
    if UNLOAD_WAITERS.fetch_sub(1, Ordering::Relaxed) == 1 {
        for m in s.parked.iter_mut().filter_map(Option::take) {
            unmap(m);
        }
    }
    s
}

/// The longest a session's end waits for the reader to read the mappings beside the
/// allocators' last statistics.
const END_WAIT_NS: u64 = 200_000_000;

/// Ends the session for `reason` with its last statistics of the allocators, read first
/// (without the session lock: see `locks`), and the process's mappings read by mprof beside
/// them (the agent waits for it, bounded), so that where the RSS was at the session's end is
/// known before the program tears itself down. Returns whether a session was running.
fn stop_with_statistics(reason: EndReason) -> bool {
    let stats = crate::heap_stats::read_busy();
    let mut s = SESSION.lock();
    let running = s.mapped.is_some();
    if running {
        write_heap_stats(&mut s, stats);
        s = ask_reader_and_wait(s, END_WAIT_NS);
    }
    stop_locked(&mut s, reason);
    running
}

/// Why the session should end now (`now`, from `now_ns`), if it should: the interpreter is
/// finalizing, the reader asked for a detach, or its heartbeat is older than
/// `READER_TIMEOUT_NS`. The reader's words are read once a tick of the clock (about 4 ms):
/// at `--rate 1` a thread takes thousands of samples a tick, and a detach waits a tick at most.
/// Takes the session's parts (its finalizing word, its API, its ring), which the caller holds
/// already.
pub fn stop_reason_at(
    finalizing_flag: Option<&AtomicUsize>,
    api: &python::Api,
    m: &mut Mapped,
    now: u64,
) -> Option<EndReason> {
    if finalizing(finalizing_flag, Some(api)) {
        return Some(EndReason::Finalizing);
    }
    if m.reader_checked == now {
        return None;
    }
    m.reader_checked = now;
    reader_stopped_at(m.ring.header(), READER_TIMEOUT_NS, now)
}

/// [`stop_reason_at`] without the clock: the interpreter is finalizing (the blocks live then
/// are what the program left: their frees must not be recorded) or the reader asked for a
/// detach. A reader gone silent is left to the next sampled allocation.
pub fn must_end(s: &Session) -> Option<EndReason> {
    let m = s.mapped.as_ref()?;
    ends(finalizing(s.finalizing_flag, Some(m.api)), m)
}

/// [`must_end`] for a session that found the runtime's finalizing word (`flag`): it is read in
/// place, and nothing is called.
#[inline(always)]
pub fn must_end_by_word(flag: &AtomicUsize, m: &Mapped) -> Option<EndReason> {
    ends(finalizing(Some(flag), None), m)
}

/// [`must_end`]'s answer, once whether the interpreter is `finalizing` is known.
#[inline(always)]
fn ends(finalizing: bool, m: &Mapped) -> Option<EndReason> {
    if finalizing {
        return Some(EndReason::Finalizing);
    }
    detach_asked(m.ring.header())
}

/// Whether the interpreter has started finalizing: one load when the session found the
/// runtime's word (`flag`, see `python::finalizing_flag`), else a call through the session's
/// `api` (a session runs only in an interpreter whose API resolved).
#[inline(always)]
fn finalizing(flag: Option<&AtomicUsize>, api: Option<&python::Api>) -> bool {
    match flag {
        Some(flag) => flag.load(Ordering::Relaxed) != 0,
        None => api.is_some_and(python::finalizing),
    }
}

fn reader_stopped(h: &RingHeader, timeout_ns: u64) -> Option<EndReason> {
    reader_stopped_at(h, timeout_ns, now_ns())
}

/// Whether the reader asked for a detach or stopped beating for longer than `timeout_ns`.
fn reader_stopped_at(h: &RingHeader, timeout_ns: u64, now: u64) -> Option<EndReason> {
    detach_asked(h).or_else(|| reader_gone_at(h, timeout_ns, now))
}

fn detach_asked(h: &RingHeader) -> Option<EndReason> {
    (h.state.load(Ordering::Acquire) == STATE_STOP_REQUESTED).then_some(EndReason::Detached)
}

fn reader_gone_at(h: &RingHeader, timeout_ns: u64, now: u64) -> Option<EndReason> {
    let beat = h.reader_heartbeat_ns.load(Ordering::Acquire);
    (beat != 0 && now.saturating_sub(beat) > timeout_ns).then_some(EndReason::ReaderGone)
}

/// In a forked child that is followed: go on sampling into the child's own ring (`base`, `len`,
/// made and handed to mprof by `follow`). The parent's ring is left alone (unmapped here),
/// the blocks the parent sampled are forgotten (their frees are the parent's business), code
/// objects are announced again in the new ring, and sample distances are drawn afresh.
pub fn continue_in_child(s: &mut Session, base: *mut u8, len: usize) {
    // SAFETY: the child's own fresh ring, mapped for `len` bytes and kept by the session.
    let Ok(ring) = (unsafe { Ring::attach(base, len) }) else {
        forget_in_child(s);
        return;
    };
    // The parent's session's (the caller continues only a running one).
    let Some((layout, api)) = s.mapped.as_ref().map(|m| (m.layout, m.api)) else {
        forget_in_child(s);
        return;
    };
    touch_for_samples(&ring);
    if let Some(old) = s.mapped.take() {
        // SAFETY: the child's copy of the parent's mapping, which nothing else uses.
        unsafe { sys::munmap(old.base.cast(), old.len) };
    }
    forget_leaving(s);
    s.set.clear();
    s.moving.clear();
    s.caches.generation = s.caches.generation.wrapping_add(1);
    s.stacks.reset();
    (s.native_samples, s.native_samples_mapped) = (0, 0);
    let h = ring.header();
    // SAFETY: getpid has no preconditions.
    h.agent_pid
        .store(unsafe { sys::getpid() } as u32, Ordering::Release);
    configure_sampling(s, h.rate, h.seed, chain::active().min(sampler::LAYERS - 1));
    h.state.store(STATE_ACTIVE, Ordering::Release);
    s.mapped = Some(Mapped::new(ring, base, len, layout, api));
}

/// In a forked child: drop the session without touching the shared ring (it is the parent's)
/// but to count itself as a child that was not followed.
pub fn forget_in_child(s: &mut Session) {
    ENABLED.store(false, Ordering::Release);
    chain::idle();
    if let Some(m) = s.mapped.take() {
        m.ring
            .header()
            .forked_unfollowed
            .fetch_add(1, Ordering::Relaxed);
        // SAFETY: the child's copy of the mapping, which nothing else uses.
        unsafe { sys::munmap(m.base.cast(), m.len) };
    }
    forget_leaving(s);
    s.set.clear();
    s.moving.clear();
    s.stacks.release();
}

/// In a forked child: the parent's ring kept for its exit is the parent's business.
fn forget_leaving(s: &mut Session) {
    if let Some((m, _)) = s.leaving.take() {
        unmap(m);
    }
}

/// Writes `stats` into the session's ring as a HEAP record stamped now, if a session runs.
pub fn write_heap_stats(s: &mut Session, stats: HeapStats) {
    if let Some(m) = s.mapped.as_mut() {
        let stats = HeapStats {
            time_ns: sys::now_ns(),
            ..stats
        };
        m.ring
            .try_write(KIND_HEAP, 0, HeapStats::BODY, |b| stats.write(b));
    }
}

/// Reads the statistics and writes them into the session's ring. Deferred from a sample's
/// slow path: runs with no agent lock held.
pub fn read_and_write_heap_stats() {
    let start = sys::precise_ns();
    let stats = crate::heap_stats::read_busy();
    crate::heap_stats::cost_was(sys::precise_ns().saturating_sub(start));
    write_heap_stats(&mut SESSION.lock(), stats);
}

/// [`read_and_write_heap_stats`] as a session starts (its cost is no periodic reading's).
pub fn read_all_and_write_heap_stats() {
    let stats = crate::heap_stats::read_busy();
    write_heap_stats(&mut SESSION.lock(), stats);
}
