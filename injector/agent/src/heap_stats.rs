//! What the process's allocators hold, free memory included: the C library's `malloc` (glibc's
//! `mallinfo2`, or jemalloc's own statistics) and pymalloc's arenas. These are global figures,
//! so they cover memory allocated before an attach too. They explain resident memory that no
//! live object holds (why RSS stays high after the program freed most of what it made).
//!
//! Looked at every [`SAMPLES_BETWEEN_CHECKS`] samples and [`FREES_BETWEEN_CHECKS`] sampled
//! frees, and read when the last reading is [`INTERVAL_NS`] old, or [`MIN_GAP_NS`] old after
//! many sampled events ([`BURST_EVENTS`]: a burst of allocations or frees, whose end the
//! statistics should see, as the program may go idle right after it); never sooner than
//! [`COST_SHARE`] times what the last reading took. Read from a slow path
//! once the session lock is released (`lock::SpinLock::defer`): the allocators' statistics
//! take the allocators' own locks, which no agent lock may be held around (see `locks`), and
//! the hooks call into the real allocator only before or after their own work, so no
//! allocator lock is held there either. pymalloc's figures need the GIL: they are read with a
//! reading made on a thread that holds it (they walk every pool, which the reading's cost, and
//! so the gap [`due`] leaves after it, says). Also read as a session starts and ends.
//! Written as one HEAP record (see `mprof_common::record::HeapStats`) with the RSS read in the
//! same call, so that all its figures describe one moment.

use crate::sys;
use mprof_common::record::{HeapStats, MALLOC_GLIBC, MALLOC_JEMALLOC, MALLOC_OTHER};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Time between two readings when the program allocates at an even pace.
pub const INTERVAL_NS: u64 = 250_000_000;
/// Time between two readings at least, in a burst.
pub const MIN_GAP_NS: u64 = 20_000_000;
/// Readings are at least this many times what the last one took apart, so that they take at
/// most 1% of the program's time (pymalloc's figures walk every pool: milliseconds for a heap
/// of hundreds of megabytes; with a gap of four times that, they cost an allocation-bound
/// program 15%).
pub const COST_SHARE: u64 = 100;
/// Sampled events since the last reading that make a burst (at the default rate, 256 of them
/// stand for about 32 MiB allocated or freed).
pub const BURST_EVENTS: u64 = 256;
/// Samples between two looks at whether a reading is due.
pub const SAMPLES_BETWEEN_CHECKS: u64 = 64;
/// Sampled frees between two looks at `--rate` below [`SPARSE_RATE`]; at that rate and above,
/// every sampled free looks.
pub const FREES_BETWEEN_CHECKS: u64 = 32;
pub const SPARSE_RATE: u64 = 4096;

/// How long the last reading took, in nanoseconds.
static LAST_COST: AtomicU64 = AtomicU64::new(0);

/// When the last reading was asked for (the coarse monotonic clock), and the sampled events
/// counted since.
static LAST: AtomicU64 = AtomicU64::new(0);
static EVENTS: AtomicU64 = AtomicU64::new(0);

/// Whether a reading is due at `now`, `events` sampled events after the last look; the
/// caller then defers [`read_and_write`]. One thread wins each reading.
pub fn due(now: u64, events: u64) -> bool {
    let seen = EVENTS.fetch_add(events, Ordering::Relaxed) + events;
    let last = LAST.load(Ordering::Relaxed);
    let gap = now.wrapping_sub(last);
    let floor = COST_SHARE.saturating_mul(LAST_COST.load(Ordering::Relaxed));
    let due =
        gap >= INTERVAL_NS.max(floor) || (seen >= BURST_EVENTS && gap >= MIN_GAP_NS.max(floor));
    if due
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        EVENTS.store(0, Ordering::Relaxed);
        return true;
    }
    false
}

/// A reading is due at the next look (a session starts).
pub fn reset() {
    LAST.store(0, Ordering::Relaxed);
}

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Default)]
struct Mallinfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

type Mallinfo2Fn = unsafe extern "C" fn() -> Mallinfo2;
type MallctlFn =
    unsafe extern "C" fn(*const c_char, *mut c_void, *mut usize, *mut c_void, usize) -> c_int;
type DebugStatsFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GilCheckFn = unsafe extern "C" fn() -> c_int;
/// `PyInterpreterState_Head`/`_Main`, and the thread-state functions: a pointer, no argument.
type PointerFn = unsafe extern "C" fn() -> *mut c_void;

/// The statistics functions this process has.
struct Sources {
    malloc: Malloc,
    /// `_PyObject_DebugMallocStats`: pymalloc's arenas and blocks, printed.
    pymalloc: Option<DebugStatsFn>,
    gil_check: Option<GilCheckFn>,
    /// What [`holds_the_only_gil`] asks: `PyInterpreterState_Head` and `_Main`, the thread
    /// state that runs now (`PyThreadState_GetUnchecked`, `_PyThreadState_UncheckedGet`
    /// before 3.13) and the calling thread's own (`PyGILState_GetThisThreadState`).
    gil_owner: Option<[PointerFn; 4]>,
}

enum Malloc {
    Glibc(Mallinfo2Fn),
    Jemalloc(MallctlFn),
    Other,
}

static SOURCES: OnceLock<Sources> = OnceLock::new();

/// Finds the statistics functions, once per process: called as a session starts, before its
/// hooks are on, with no agent lock held. Never from a hook: `dlsym` takes the loader's lock,
/// which a thread inside `dlclose` holds while its library's destructors free through hooked
/// GOT entries, and such a hook would wait here for the thread that waits for the loader.
pub fn prepare() {
    let _ = sources_now();
}

/// The statistics functions, if [`prepare`] found them (no waiting).
fn sources() -> Option<&'static Sources> {
    SOURCES.get()
}

fn sources_now() -> &'static Sources {
    SOURCES.get_or_init(|| {
        let sym = |name: &CStr| {
            // SAFETY: dlsym with a NUL-terminated name.
            unsafe { sys::dlsym(sys::RTLD_DEFAULT, name.as_ptr()) }
        };
        // jemalloc first: a preloaded jemalloc leaves glibc's mallinfo2 in place, reporting
        // on a heap that nobody uses.
        let mallctl = sym(c"mallctl");
        let mallinfo2 = sym(c"mallinfo2");
        let malloc = if !mallctl.is_null() {
            // SAFETY: jemalloc's `mallctl`, with its C signature.
            Malloc::Jemalloc(unsafe { std::mem::transmute::<*mut c_void, MallctlFn>(mallctl) })
        } else if !mallinfo2.is_null() && malloc_is_glibcs() {
            // SAFETY: glibc's `mallinfo2`, with its C signature.
            Malloc::Glibc(unsafe { std::mem::transmute::<*mut c_void, Mallinfo2Fn>(mallinfo2) })
        } else {
            Malloc::Other
        };
        let stats = sym(c"_PyObject_DebugMallocStats");
        let gil = sym(c"PyGILState_Check");
        let running = match sym(c"PyThreadState_GetUnchecked") {
            p if p.is_null() => sym(c"_PyThreadState_UncheckedGet"),
            p => p,
        };
        let owner = [
            sym(c"PyInterpreterState_Head"),
            sym(c"PyInterpreterState_Main"),
            running,
            sym(c"PyGILState_GetThisThreadState"),
        ];
        Sources {
            malloc,
            // SAFETY: CPython's functions, with their C signatures.
            pymalloc: (!stats.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut c_void, DebugStatsFn>(stats) }),
            // SAFETY: as above.
            gil_check: (!gil.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut c_void, GilCheckFn>(gil) }),
            gil_owner: owner.iter().all(|p| !p.is_null()).then(|| {
                owner.map(|p| {
                    // SAFETY: CPython's functions, each taking nothing and returning a pointer.
                    unsafe { std::mem::transmute::<*mut c_void, PointerFn>(p) }
                })
            }),
        }
    })
}

/// Whether `malloc` is the C library's (not a preloaded allocator's): its code lies in libc, or
/// (a static Python's executable answers for `malloc` with a stub of its own) no other
/// allocator's own entry points are there (tcmalloc, mimalloc, rpmalloc, a prefixed jemalloc).
fn malloc_is_glibcs() -> bool {
    let sym = |name: &CStr| {
        // SAFETY: dlsym with a NUL-terminated name.
        unsafe { sys::dlsym(sys::RTLD_DEFAULT, name.as_ptr()) }
    };
    let others = [c"tc_malloc", c"mi_malloc", c"rpmalloc", c"je_malloc"];
    if others.iter().any(|name| !sym(name).is_null()) {
        return false;
    }
    let malloc = sym(c"malloc");
    let mut info = std::mem::MaybeUninit::<sys::DlInfo>::uninit();
    // SAFETY: dladdr1 writes `info`; flags 0 asks for nothing more.
    let found = unsafe {
        sys::dladdr1(
            malloc as *const c_void,
            info.as_mut_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    if malloc.is_null() || found == 0 {
        return false;
    }
    // SAFETY: dladdr1 filled `info`; its file name is a NUL-terminated string or null.
    let name = unsafe { info.assume_init().fname };
    if name.is_null() {
        return false;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    // The main program's name is empty in the loader's list, or its path: then it is a stub.
    name.windows(7).any(|w| w == b"libc.so") || !name.windows(3).any(|w| w == b".so")
}

/// Reads the statistics now. Must run with no agent lock held.
pub fn read() -> HeapStats {
    let mut out = HeapStats::default();
    let Some(s) = sources() else {
        out.rss = resident_bytes();
        return out;
    };
    match s.malloc {
        Malloc::Glibc(mallinfo2) => {
            // SAFETY: glibc's mallinfo2 takes no argument and returns the struct by value.
            let m = unsafe { mallinfo2() };
            out.malloc_kind = MALLOC_GLIBC;
            out.malloc_used = (m.uordblks + m.hblkhd) as u64;
            out.malloc_free = m.fordblks as u64;
            out.malloc_mapped = m.hblkhd as u64;
        }
        Malloc::Jemalloc(mallctl) => {
            out.malloc_kind = MALLOC_JEMALLOC;
            // SAFETY: jemalloc's documented controls, each read into a size_t of ours.
            unsafe {
                let mut epoch = 1u64;
                mallctl(
                    c"epoch".as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    (&mut epoch as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                );
                let read = |name: &CStr| {
                    let mut v = 0usize;
                    let mut len = std::mem::size_of::<usize>();
                    let ok = mallctl(
                        name.as_ptr(),
                        (&mut v as *mut usize).cast(),
                        &mut len,
                        std::ptr::null_mut(),
                        0,
                    ) == 0;
                    if ok {
                        v as u64
                    } else {
                        0
                    }
                };
                let allocated = read(c"stats.allocated");
                let resident = read(c"stats.resident");
                out.malloc_used = allocated;
                out.malloc_free = resident.saturating_sub(allocated);
                out.malloc_mapped = read(c"stats.mapped");
            }
        }
        Malloc::Other => out.malloc_kind = MALLOC_OTHER,
    }
    // Only once the interpreter runs, until it is torn down (PyGILState_Check reads its
    // state): initialised, or finalizing (no longer "initialised" then).
    let running = crate::python::api().is_some_and(|api| {
        // SAFETY: Py_IsInitialized and Py_IsFinalizing take nothing and may be called at any
        // time.
        let up = unsafe { (api.is_initialized)() } != 0;
        // SAFETY: as above.
        up || api.is_finalizing.is_some_and(|f| unsafe { f() } != 0)
    });
    let holds_gil = running && holds_the_only_gil(s);
    if let (Some(print), true) = (s.pymalloc, holds_gil) {
        with_pymalloc_current(|| read_pymalloc(print, &mut out));
    }
    out.rss = resident_bytes();
    out
}

/// The process's resident bytes now (the second figure of `/proc/self/statm`, in pages); 0 if
/// it cannot be read. No allocation: a buffer on the stack.
fn resident_bytes() -> u64 {
    // SAFETY: open with a NUL-terminated path; the result is checked.
    let fd = unsafe { sys::open(c"/proc/self/statm".as_ptr(), sys::O_RDONLY | sys::O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    let mut buf = [0u8; 128];
    // SAFETY: read writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { sys::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: the descriptor opened above.
    unsafe { sys::close(fd) };
    if n <= 0 {
        return 0;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { sys::sysconf(sys::SC_PAGESIZE) }.max(0) as u64;
    parse_statm(&buf[..n as usize]).saturating_mul(page)
}

/// The resident pages of a statm line ("size resident shared ...").
fn parse_statm(text: &[u8]) -> u64 {
    let field = text.split(|&b| b == b' ').nth(1).unwrap_or(&[]);
    let mut pages = 0u64;
    for &b in field.iter().take_while(|b| b.is_ascii_digit()) {
        pages = pages.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    pages
}

/// Whether the calling thread holds the GIL, and it is the process's only one: one
/// interpreter runs (the list's head is the main one: a new interpreter goes to the head),
/// `PyGILState_Check` says so, and the thread state that runs is this thread's own.
/// `PyGILState_Check` alone answers yes to every thread once a process has made a
/// subinterpreter (it stops checking then, for good), and from 3.12 an interpreter may have a
/// GIL of its own, whose threads allocate while [`with_pymalloc_current`] has the object
/// domain's allocator, which is the process's, stepped aside. With the GIL held, no other
/// interpreter can be made meanwhile.
fn holds_the_only_gil(s: &Sources) -> bool {
    let (Some(check), Some([head, main, running, own])) = (s.gil_check, s.gil_owner) else {
        return false;
    };
    // SAFETY: CPython's functions, taking nothing: the interpreters' list head and the main
    // interpreter (pointers of the runtime's, not dereferenced), whether this thread holds the
    // GIL, the thread state that runs now (the GIL holder's before 3.12, this thread's
    // attached one from 3.12) and this thread's own.
    unsafe {
        head() == main() && check() == 1 && {
            let now = running();
            !now.is_null() && now == own()
        }
    }
}

/// Runs `f` with the allocator the sampling layer wraps in the object domain (pymalloc's) as
/// that domain's allocator: `_PyObject_DebugMallocStats` prints nothing unless pymalloc is the
/// object allocator itself, and while a session runs the layer's hooks are. The caller holds
/// the GIL, without which no thread allocates in that domain, and the allocator that was
/// current is put back as it was, whatever it is.
fn with_pymalloc_current(f: impl FnOnce()) {
    const OBJ: i32 = 2;
    let layer = crate::chain::active();
    let Some(api) = crate::python::api() else {
        return f();
    };
    if layer == crate::chain::NONE {
        return f();
    }
    let mut current = std::mem::MaybeUninit::<crate::python::Allocator>::uninit();
    // SAFETY: PyMem_GetAllocator fills the struct for an existing domain.
    let current = unsafe {
        (api.get_allocator)(OBJ, current.as_mut_ptr());
        current.assume_init()
    };
    let wrapped = *crate::chain::prev(layer, OBJ as usize);
    // SAFETY: PyMem_SetAllocator copies the struct; the wrapped allocator (pymalloc's, or what
    // was below the layer) lives as long as the process; the GIL is held (see above).
    unsafe { (api.set_allocator)(OBJ, &wrapped) };
    f();
    // SAFETY: as above: the allocator that was current, copied back.
    unsafe { (api.set_allocator)(OBJ, &current) };
}

/// pymalloc's arenas and blocks, from what `_PyObject_DebugMallocStats` prints (to a memory
/// file). It prints nothing (and returns 0) when pymalloc is not the allocator
/// (`PYTHONMALLOC=malloc`): then the figures are zero, known.
fn read_pymalloc(print: DebugStatsFn, out: &mut HeapStats) {
    let mut buf: *mut c_char = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: open_memstream writes its buffer's address and size into the locals; the
    // stream is closed below before they are read.
    let file = unsafe { sys::open_memstream(&mut buf, &mut len) };
    if file.is_null() {
        return;
    }
    // SAFETY: the GIL is held (checked by the caller); the stream is a valid FILE.
    let printed = unsafe { print(file) } != 0;
    // SAFETY: the stream opened above; closing it makes `buf` and `len` final.
    unsafe { sys::fclose(file) };
    if buf.is_null() {
        return;
    }
    // SAFETY: open_memstream's buffer holds `len` bytes (and a NUL after them).
    let text = unsafe { std::slice::from_raw_parts(buf as *const u8, len) };
    out.pymalloc_known = 1;
    if printed {
        let (arenas, used) = parse_pymalloc(text);
        out.pymalloc_arenas = arenas;
        out.pymalloc_used = used;
    }
    // SAFETY: the buffer open_memstream allocated with malloc, no longer used.
    unsafe { sys::free(buf.cast()) };
}

/// (bytes in arenas, bytes in allocated blocks) from `_PyObject_DebugMallocStats`' text: the
/// lines "N arenas * M bytes/arena = T" and "# bytes in allocated blocks = X" (3.8–3.13
/// print both; digits may be grouped with commas).
fn parse_pymalloc(text: &[u8]) -> (u64, u64) {
    let number = |s: &[u8]| -> u64 {
        s.iter().filter(|b| b.is_ascii_digit()).fold(0u64, |n, &b| {
            n.saturating_mul(10).saturating_add((b - b'0') as u64)
        })
    };
    fn after_eq(line: &[u8]) -> Option<&[u8]> {
        line.iter()
            .rposition(|&b| b == b'=')
            .map(|i| &line[i + 1..])
    }
    let (mut arenas, mut used) = (0, 0);
    for line in text.split(|&b| b == b'\n') {
        let has = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
        if has(b"bytes/arena") {
            arenas = after_eq(line).map_or(0, number);
        } else if has(b"# bytes in allocated blocks") {
            used = after_eq(line).map_or(0, number);
        }
    }
    (arenas, used)
}

/// [`read`] on a thread marked busy: what the reading allocates is the agent's own. With no
/// agent lock held.
pub fn read_busy() -> HeapStats {
    let stats = crate::sampler::THREAD.try_with(|t| {
        let was = t.busy.replace(true);
        let s = read();
        t.busy.set(was);
        s
    });
    // A thread whose locals are gone (it is exiting) reads them unmarked.
    stats.unwrap_or_else(|_| read())
}

/// The cost of the latest periodic reading (for [`due`]'s gap), set by its caller.
pub fn cost_was(ns: u64) {
    LAST_COST.store(ns, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pymalloc_figures_are_read_from_its_text() {
        let text = b"Small block threshold = 512, in 32 size classes.\n\
            # arenas allocated total           =                1,093\n\
            # arenas reclaimed                 =                1,031\n\
            # arenas highwater mark            =                   62\n\
            # arenas allocated current         =                   62\n\
            62 arenas * 1048576 bytes/arena    =           65,011,712\n\
            \n\
            # bytes in allocated blocks        =           63,497,696\n\
            # bytes in available blocks        =              412,928\n";
        assert_eq!(parse_pymalloc(text), (65_011_712, 63_497_696));
        assert_eq!(parse_pymalloc(b""), (0, 0));
    }

    #[test]
    fn statm_s_resident_pages_are_its_second_figure() {
        assert_eq!(parse_statm(b"5120 1234 300 1 0 900 0\n"), 1234);
        assert_eq!(parse_statm(b"garbage"), 0);
        assert!(resident_bytes() > 0);
    }

    #[test]
    fn this_process_s_malloc_is_read() {
        prepare();
        let s = read();
        // The test binary runs on glibc here (or with another malloc, said so).
        assert!(s.malloc_kind == MALLOC_GLIBC || s.malloc_kind == MALLOC_OTHER);
        if s.malloc_kind == MALLOC_GLIBC {
            assert!(s.malloc_used > 0);
        }
        assert_eq!(s.pymalloc_known, 0, "no Python here");
    }
}
