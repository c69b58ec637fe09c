//! Native stacks (`--native`): the instruction addresses of the allocating thread, for sampled
//! allocations only, so the cost follows the sampling rate, not the allocation rate.
//!
//! On x86-64 the agent unwinds by itself, with the call frame information the loader mapped
//! (`crate::cfi`), and reads nothing it has not checked: a saved register only from the
//! thread's own stack, between where the walk started and the stack's top; an instruction
//! address only as a key to look up, never as memory. libgcc's `_Unwind_Backtrace`, used
//! before, trusts the stack: code that switches stacks under the interpreter (greenlet, under
//! gevent and eventlet) allocates while the words above its frames are another greenlet's,
//! stale, and libgcc, following them, read an unmapped address and killed the program (every
//! run of a gevent program under `--native`). Now such a walk ends where the rules lead off
//! the stack or to an address no loaded object covers.
//!
//! It runs before the session lock is taken, allocates nothing and takes no lock of its own:
//! the object of an address is found with glibc's lock-free `_dl_find_object` (2.35+); with an
//! older glibc, `dl_iterate_phdr` takes the loader's lock, which is why no other lock of the
//! agent may be held meanwhile. Frames of the agent itself are left out.
//!
//! Elsewhere (aarch64) libgcc's unwinder is used as before.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
/// The agent's own code, whose frames are left out.
static AGENT_LO: AtomicUsize = AtomicUsize::new(0);
static AGENT_HI: AtomicUsize = AtomicUsize::new(0);

/// Whether samples carry native stacks in the running session.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Switches native stacks on or off for a session (at its start, outside any hook).
pub fn configure(enabled: bool) {
    if enabled && AGENT_HI.load(Ordering::Relaxed) == 0 {
        if let Some((lo, hi)) = own_text() {
            AGENT_LO.store(lo, Ordering::Relaxed);
            AGENT_HI.store(hi, Ordering::Relaxed);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if enabled {
        walk::resolve();
    }
    ON.store(enabled, Ordering::Release);
}

/// The executable mapping that holds this function, from /proc/self/maps.
fn own_text() -> Option<(usize, usize)> {
    let me = own_text as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        if !rest.starts_with("r-x") {
            return None;
        }
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        (lo <= me && me < hi).then_some((lo, hi))
    })
}

/// Keeps `ip` unless it is one of the agent's own leading frames; false once `out` is full.
fn push(out: &mut [MaybeUninit<u64>], n: &mut usize, ip: usize) -> bool {
    let (lo, hi) = (
        AGENT_LO.load(Ordering::Relaxed),
        AGENT_HI.load(Ordering::Relaxed),
    );
    if *n == 0 && lo <= ip && ip < hi {
        return true;
    }
    if *n == out.len() {
        return false;
    }
    out[*n].write(ip as u64);
    *n += 1;
    true
}

/// Fills `out` with the calling thread's instruction addresses, innermost first, from the
/// first frame outside the agent; returns how many (the first that many are written).
/// `stack` keeps the thread's stack extent between calls (see `walk::stack_of`).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn unwind(out: &mut [MaybeUninit<u64>], stack: &Cell<(usize, usize)>) -> usize {
    walk::unwind(out, stack)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(never)]
pub fn unwind(out: &mut [MaybeUninit<u64>], _stack: &Cell<(usize, usize)>) -> usize {
    libgcc::unwind(out)
}

#[cfg(target_arch = "x86_64")]
mod walk {
    use super::push;
    use crate::cfi::{Cfa, Object, Rule};
    use crate::got::{contains, dl_iterate_phdr, DlPhdrInfo, Phdr, PT_LOAD};
    use std::cell::Cell;
    use std::ffi::{c_int, c_void};
    use std::mem::MaybeUninit;
    use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

    /// glibc's `struct dl_find_object`.
    #[repr(C)]
    struct DlFindObject {
        flags: u64,
        map_start: usize,
        map_end: usize,
        link_map: *mut c_void,
        eh_frame: usize,
        reserved: [u64; 7],
    }

    type FindObject = unsafe extern "C" fn(usize, *mut DlFindObject) -> c_int;

    const PT_GNU_EH_FRAME: u32 = 0x6474_e550;

    extern "C" {
        fn pthread_self() -> usize;
        fn pthread_getattr_np(thread: usize, attr: *mut PthreadAttr) -> c_int;
        fn pthread_attr_getstack(
            attr: *const PthreadAttr,
            addr: *mut *mut c_void,
            size: *mut usize,
        ) -> c_int;
        fn pthread_attr_destroy(attr: *mut PthreadAttr) -> c_int;
        fn getrlimit(resource: c_int, limit: *mut u64) -> c_int;
    }

    const RLIMIT_STACK: c_int = 3;

    /// glibc's `pthread_attr_t` on x86-64 (56 bytes).
    #[repr(C, align(8))]
    struct PthreadAttr([u8; 56]);

    /// `_dl_find_object`, where glibc has it (2.35+).
    static FIND: AtomicUsize = AtomicUsize::new(0);
    /// The main thread's stack: its top (`__libc_stack_end`) and as low as it may grow (its
    /// size limit below the top; 1 GiB when unlimited).
    static MAIN_TOP: AtomicUsize = AtomicUsize::new(0);
    static MAIN_LOW: AtomicUsize = AtomicUsize::new(usize::MAX);
    /// The main program's unwinding tables (`.eh_frame_hdr`) and the loaded segment that
    /// holds them, found from its program headers in `resolve`: `_dl_find_object` gives only
    /// the segment of the address asked about when the program's segments leave gaps between
    /// them (then the tables lie outside the code's segment).
    static MAIN_TABLES: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

    extern "C" {
        fn getauxval(kind: u64) -> u64;
    }
    const AT_PHDR: u64 = 3;
    const AT_PHNUM: u64 = 5;
    const PT_PHDR: u32 = 6;

    /// Looks up what the walk uses from the C library (at a session's start, outside hooks).
    pub fn resolve() {
        // SAFETY: dlsym with NUL-terminated names; `__libc_stack_end` is a pointer-sized
        // variable of the loader, read once.
        unsafe {
            let f = crate::sys::dlsym(crate::sys::RTLD_DEFAULT, c"_dl_find_object".as_ptr());
            FIND.store(f as usize, Ordering::Relaxed);
            let end = crate::sys::dlsym(crate::sys::RTLD_DEFAULT, c"__libc_stack_end".as_ptr());
            if !end.is_null() {
                let top = *(end as *const usize);
                let mut limit = [0u64; 2];
                let room = if getrlimit(RLIMIT_STACK, limit.as_mut_ptr()) == 0 {
                    limit[0].min(1 << 30) as usize
                } else {
                    8 << 20
                };
                MAIN_TOP.store(top, Ordering::Relaxed);
                MAIN_LOW.store(top.saturating_sub(room), Ordering::Relaxed);
            }
            let phdr = getauxval(AT_PHDR) as usize;
            let phnum = getauxval(AT_PHNUM) as usize;
            if phdr != 0 && phnum != 0 {
                // SAFETY: the loader maps the main program's headers where AT_PHDR says.
                let headers = std::slice::from_raw_parts(phdr as *const Phdr, phnum);
                if let Some(tables) = main_tables(phdr, headers) {
                    MAIN_TABLES[1].store(tables.start, Ordering::Relaxed);
                    MAIN_TABLES[2].store(tables.end, Ordering::Relaxed);
                    MAIN_TABLES[0].store(tables.eh_frame_hdr, Ordering::Release);
                }
            }
        }
    }

    /// The main program's unwinding tables, from its program `headers`, themselves loaded at
    /// `phdr`.
    fn main_tables(phdr: usize, headers: &[Phdr]) -> Option<Object> {
        let own = headers.iter().find(|h| h.p_type == PT_PHDR)?;
        tables_of(phdr.wrapping_sub(own.p_vaddr as usize), headers)
    }

    /// The main program's tables as `resolve` found them (see `MAIN_TABLES`), if it did.
    fn found_main_tables() -> Option<Object> {
        let hdr = MAIN_TABLES[0].load(Ordering::Acquire);
        (hdr != 0).then(|| Object {
            eh_frame_hdr: hdr,
            start: MAIN_TABLES[1].load(Ordering::Relaxed),
            end: MAIN_TABLES[2].load(Ordering::Relaxed),
        })
    }

    /// The unwinding tables of an object loaded at `bias` with program `headers`, to be read
    /// within the segment that holds them: the object's extent may have gaps between its
    /// segments, which nothing maps.
    fn tables_of(bias: usize, headers: &[Phdr]) -> Option<Object> {
        let hdr = headers.iter().find(|h| h.p_type == PT_GNU_EH_FRAME)?;
        let hdr = bias.wrapping_add(hdr.p_vaddr as usize);
        let (start, end) = segment_of(bias, headers, hdr)?;
        Some(Object {
            eh_frame_hdr: hdr,
            start,
            end,
        })
    }

    /// The loaded segment of an object (at `bias`, with program `headers`) that holds `at`.
    fn segment_of(bias: usize, headers: &[Phdr], at: usize) -> Option<(usize, usize)> {
        headers
            .iter()
            .filter(|h| h.p_type == PT_LOAD)
            .map(|h| {
                let start = bias.wrapping_add(h.p_vaddr as usize);
                (start, start.saturating_add(h.p_memsz as usize))
            })
            .find(|&(start, end)| start <= at && at < end)
    }

    /// The loaded object that holds `pc`, with its unwinding tables.
    fn object_of(pc: usize) -> Option<Object> {
        let find = FIND.load(Ordering::Relaxed);
        if find != 0 {
            // SAFETY: all zeros is a valid `dl_find_object` (integers and null pointers); `find`
            // is glibc's `_dl_find_object` (see `resolve`), which only reads the loader's
            // tables and writes `out`.
            let (found, out) = unsafe {
                let mut out = std::mem::zeroed::<DlFindObject>();
                let found = std::mem::transmute::<usize, FindObject>(find)(pc, &mut out);
                (found, out)
            };
            if found != 0 || out.eh_frame == 0 {
                return None;
            }
            let (start, end) = if out.map_start <= out.eh_frame && out.eh_frame < out.map_end {
                (out.map_start, out.map_end)
            } else if let Some(main) =
                found_main_tables().filter(|main| main.eh_frame_hdr == out.eh_frame)
            {
                // The main program's tables, in a segment of their own (see `MAIN_TABLES`).
                (main.start, main.end)
            } else {
                return None;
            };
            return Some(Object {
                eh_frame_hdr: out.eh_frame,
                start,
                end,
            });
        }
        by_program_headers(pc)
    }

    /// [`object_of`] through `dl_iterate_phdr`, for a glibc before 2.35.
    fn by_program_headers(pc: usize) -> Option<Object> {
        let mut search = Search { pc, found: None };
        // SAFETY: the callback only reads the program headers the loader hands it and writes
        // `search`, which outlives the call.
        unsafe { dl_iterate_phdr(each_object, &mut search as *mut Search as *mut c_void) };
        search.found
    }

    struct Search {
        pc: usize,
        found: Option<Object>,
    }

    unsafe extern "C" fn each_object(
        info: *mut DlPhdrInfo,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` that `by_program_headers` lent the loader for the
        // call; nothing else uses it meanwhile.
        let search = unsafe { &mut *(data as *mut Search) };
        // SAFETY: the loader's description of one object, valid during the callback.
        let info = unsafe { &*info };
        // SAFETY: an object as the loader hands it, during the callback (`phdr` checked).
        if info.phdr.is_null() || !unsafe { contains(info, search.pc) } {
            return 0;
        }
        // SAFETY: the object's `phnum` program headers, mapped with it.
        let headers = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
        search.found = tables_of(info.addr, headers);
        1
    }

    /// The calling thread's stack, `(lowest, top)`, kept in `cached` (`(0, 0)`: not asked
    /// yet; `(1, 1)`: not known). The main thread's goes from the loader's `__libc_stack_end`
    /// down as far as the stack may grow (`MAIN_LOW`); another thread's is asked of
    /// `pthread_getattr_np`, which for those reads no file and allocates nothing. A forked
    /// child keeps its thread's, with its memory.
    fn stack_of(cached: &Cell<(usize, usize)>, sp: usize) -> (usize, usize) {
        if cached.get() == (0, 0) {
            let main = (
                MAIN_LOW.load(Ordering::Relaxed),
                MAIN_TOP.load(Ordering::Relaxed),
            );
            let stack = if main.0 <= sp && sp < main.1 {
                main
            } else if crate::sys::gettid() == std::process::id() {
                // The main thread off its stack (a signal stack, or one the program made):
                // asking would read a file.
                (1, 1)
            } else {
                asked_stack().unwrap_or((1, 1))
            };
            cached.set(stack);
        }
        cached.get()
    }

    fn asked_stack() -> Option<(usize, usize)> {
        let mut attr = PthreadAttr([0; 56]);
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: `attr` is filled by pthread_getattr_np before use and destroyed after; the
        // out-pointers are locals.
        unsafe {
            if pthread_getattr_np(pthread_self(), &mut attr) != 0 {
                return None;
            }
            let got = pthread_attr_getstack(&attr, &mut addr, &mut size);
            pthread_attr_destroy(&mut attr);
            (got == 0 && size > 0).then(|| (addr as usize, (addr as usize).saturating_add(size)))
        }
    }

    /// The registers the walk follows, by DWARF number: the ones a call preserves (rbx, rbp,
    /// r12 to r15), the stack pointer and the return address. The others are lost at the
    /// first call anyway.
    const TRACKED: [u16; 8] = [3, 6, 7, 12, 13, 14, 15, 16];
    const SP: usize = 2;
    const RET: usize = 7;

    /// The registers of the frame being unwound, where known, in the order of `TRACKED`.
    type Regs = [Option<u64>; 8];

    /// How to go from a frame to its caller, for the registers followed: the canonical frame
    /// address (a followed register plus an offset, or not followed) and each register's rule.
    /// Kept in `CACHE` as nine words.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Step {
        cfa: Option<(u8, i32)>,
        rules: [Rule; 8],
    }

    fn slot(reg: u16) -> Option<u8> {
        TRACKED.iter().position(|r| *r == reg).map(|i| i as u8)
    }

    impl Step {
        fn of(row: &crate::cfi::Row) -> Step {
            let small = |v: i64| i32::try_from(v).ok();
            let cfa = match row.cfa {
                Cfa::At(reg, off) => slot(reg).zip(small(off)),
                Cfa::Unknown => None,
            };
            let rules = TRACKED.map(|reg| match row.regs[usize::from(reg)] {
                Rule::At(o) => small(o).map_or(Rule::Unknown, |o| Rule::At(o.into())),
                Rule::ValueAt(o) => small(o).map_or(Rule::Unknown, |o| Rule::ValueAt(o.into())),
                Rule::In(from) => slot(from).map_or(Rule::Unknown, |s| Rule::In(s.into())),
                other => other,
            });
            Step { cfa, rules }
        }

        fn encode(&self) -> [u64; 9] {
            let mut w = [0u64; 9];
            w[0] = match self.cfa {
                Some((s, off)) => 1 | u64::from(s) << 8 | u64::from(off as u32) << 32,
                None => 0,
            };
            for (word, rule) in w[1..].iter_mut().zip(self.rules) {
                let (kind, v): (u64, i64) = match rule {
                    Rule::Same => (0, 0),
                    Rule::Undefined => (1, 0),
                    Rule::At(o) => (2, o),
                    Rule::ValueAt(o) => (3, o),
                    Rule::In(s) => (4, i64::from(s)),
                    Rule::Unknown => (5, 0),
                };
                *word = kind << 32 | u64::from(v as i32 as u32);
            }
            w
        }

        fn decode(w: &[u64; 9]) -> Step {
            let cfa = (w[0] & 1 == 1).then(|| ((w[0] >> 8) as u8, (w[0] >> 32) as u32 as i32));
            let mut rules = [Rule::Unknown; 8];
            for (rule, word) in rules.iter_mut().zip(&w[1..]) {
                let v = i64::from(*word as u32 as i32);
                *rule = match word >> 32 {
                    0 => Rule::Same,
                    1 => Rule::Undefined,
                    2 => Rule::At(v),
                    3 => Rule::ValueAt(v),
                    4 => Rule::In(v as u16),
                    _ => Rule::Unknown,
                };
            }
            Step { cfa, rules }
        }
    }

    /// Steps found, by address and unwinding tables (a library loaded where another was is
    /// told apart by its tables' address): the same call sites come back sample after
    /// sample, and reading the tables costs far more than this look-up. Shared by the
    /// threads, each slot a sequence lock: a reader that sees a writer at work, or finds it
    /// changed under it, unwinds from the tables instead; a writer that finds another at work
    /// leaves the slot to it.
    struct Slot {
        seq: AtomicU64,
        key: [AtomicU64; 2],
        step: [AtomicU64; 9],
    }

    const SLOTS: usize = 1024;
    static CACHE: [Slot; SLOTS] = [const {
        Slot {
            seq: AtomicU64::new(0),
            key: [const { AtomicU64::new(0) }; 2],
            step: [const { AtomicU64::new(0) }; 9],
        }
    }; SLOTS];

    fn slot_of(pc: usize) -> &'static Slot {
        let h = (pc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        &CACHE[h as usize % SLOTS]
    }

    fn cached(pc: usize, tables: usize) -> Option<Step> {
        let slot = slot_of(pc);
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1
            || slot.key[0].load(Ordering::Relaxed) != pc as u64
            || slot.key[1].load(Ordering::Relaxed) != tables as u64
        {
            return None;
        }
        let words = std::array::from_fn(|i| slot.step[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (slot.seq.load(Ordering::Relaxed) == seq).then(|| Step::decode(&words))
    }

    fn keep(pc: usize, tables: usize, step: &Step) {
        let slot = slot_of(pc);
        let seq = slot.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || slot
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        slot.key[0].store(pc as u64, Ordering::Relaxed);
        slot.key[1].store(tables as u64, Ordering::Relaxed);
        for (word, v) in slot.step.iter().zip(step.encode()) {
            word.store(v, Ordering::Relaxed);
        }
        slot.seq.store(seq + 2, Ordering::Release);
    }

    /// The step at `pc` (looked up as is): `None` where no loaded object holds it; a step
    /// with no canonical frame address where its tables say nothing followed.
    fn step_at(pc: usize) -> Option<Step> {
        let object = object_of(pc)?;
        if let Some(step) = cached(pc, object.eh_frame_hdr) {
            return Some(step);
        }
        let step = match object.row(pc) {
            Some(row) => Step::of(&row),
            None => Step {
                cfa: None,
                rules: [Rule::Unknown; 8],
            },
        };
        keep(pc, object.eh_frame_hdr, &step);
        Some(step)
    }

    pub fn unwind(out: &mut [MaybeUninit<u64>], stack: &Cell<(usize, usize)>) -> usize {
        let (pc, sp, bp, bx, r12, r13, r14, r15): (u64, u64, u64, u64, u64, u64, u64, u64);
        // SAFETY: reads this function's own registers and the address of the next
        // instruction; touches no memory.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                "mov {bx}, rbx",
                "mov {r12}, r12",
                "mov {r13}, r13",
                "mov {r14}, r14",
                "mov {r15}, r15",
                pc = out(reg) pc,
                sp = out(reg) sp,
                bp = out(reg) bp,
                bx = out(reg) bx,
                r12 = out(reg) r12,
                r13 = out(reg) r13,
                r14 = out(reg) r14,
                r15 = out(reg) r15,
                options(nomem, nostack, preserves_flags),
            );
        }
        let regs: Regs = [
            Some(bx),
            Some(bp),
            Some(sp),
            Some(r12),
            Some(r13),
            Some(r14),
            Some(r15),
            None,
        ];
        let (low, top) = stack_of(stack, sp as usize);
        if (sp as usize) < low || sp as usize >= top {
            // Not on the thread's own stack (a stack of the program's making, or a signal
            // stack): nothing there is known to be readable.
            return 0;
        }
        walk(out, pc, regs, (sp, top as u64))
    }

    /// Walks from `pc` with `regs`, reading only words in `stack` (`[low, top)`).
    fn walk(out: &mut [MaybeUninit<u64>], mut pc: u64, mut regs: Regs, stack: (u64, u64)) -> usize {
        let read = |at: u64| -> Option<u64> {
            (stack.0 <= at && at.checked_add(8)? <= stack.1).then(|| {
                // SAFETY: `[at, at + 8)` lies between this thread's stack pointer when the walk
                // began and the top of its stack: mapped, and not changing under the walk.
                unsafe { std::ptr::read_unaligned(at as *const u64) }
            })
        };
        let mut n = 0;
        // The first address is where the walk began; the others are return addresses, looked
        // up one byte back (the call, not what follows it).
        let mut back = 0;
        for _ in 0..4096 {
            let found = step_at(pc.wrapping_sub(back) as usize);
            // A return address that no loaded object holds is no frame: stale words.
            if found.is_none() && back == 1 {
                break;
            }
            if !push(out, &mut n, pc as usize) {
                break;
            }
            let Some(Step {
                cfa: Some((reg, off)),
                rules,
            }) = found
            else {
                break;
            };
            let Some(cfa) = regs[usize::from(reg)].and_then(|v| v.checked_add_signed(off.into()))
            else {
                break;
            };
            // The caller's frame lies above this one, on the stack.
            if cfa <= regs[SP].unwrap_or(0) || cfa > stack.1 {
                break;
            }
            let Rule::At(at) = rules[RET] else {
                break;
            };
            let Some(ra) = cfa
                .checked_add_signed(at)
                .and_then(read)
                .filter(|ra| *ra != 0)
            else {
                break;
            };
            let mut next: Regs = regs;
            for (r, rule) in rules.iter().enumerate() {
                next[r] = match *rule {
                    Rule::Same => regs[r],
                    Rule::Undefined | Rule::Unknown => None,
                    Rule::At(o) => cfa.checked_add_signed(o).and_then(read),
                    Rule::ValueAt(o) => cfa.checked_add_signed(o),
                    Rule::In(from) => regs.get(usize::from(from)).copied().flatten(),
                };
            }
            next[SP] = Some(cfa);
            next[RET] = None;
            regs = next;
            pc = ra;
            back = 1;
        }
        n
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Unwinds this very test's stack (compiled with unwind tables, as every Rust test
        /// is): the walk goes from `unwind` through the test's frames up to the harness.
        #[test]
        #[inline(never)]
        #[cfg_attr(miri, ignore = "calls into the C library and reads registers")]
        fn walks_its_own_stack() {
            resolve();
            let mut out = [const { MaybeUninit::<u64>::uninit() }; 64];
            let stack = Cell::new((0, 0));
            let n = unwind(&mut out, &stack);
            assert!(n >= 3, "{n} frames");
            let me = walks_its_own_stack as *const () as usize as u64;
            // SAFETY: the first `n` were written.
            let ips: Vec<u64> = out[..n]
                .iter()
                .map(|v| unsafe { v.assume_init() })
                .collect();
            assert!(
                ips.iter().any(|ip| (me..me + 4096).contains(ip)),
                "the test's own frame is not among {ips:x?}"
            );
        }

        /// Both ways of finding an address's object agree (the program headers' is the one
        /// glibc before 2.35 takes).
        #[test]
        #[cfg_attr(miri, ignore = "calls into the C library")]
        fn objects_are_found_either_way() {
            resolve();
            assert_ne!(
                FIND.load(Ordering::Relaxed),
                0,
                "a glibc without _dl_find_object"
            );
            for pc in [
                objects_are_found_either_way as *const () as usize,
                resolve as *const () as usize + 1,
            ] {
                let (a, b) = (object_of(pc).unwrap(), by_program_headers(pc).unwrap());
                assert_eq!(a.eh_frame_hdr, b.eh_frame_hdr);
                for o in [&a, &b] {
                    assert!(o.start <= o.eh_frame_hdr && o.eh_frame_hdr < o.end);
                }
                let row = a.row(pc);
                assert!(row.is_some(), "no row at {pc:#x}");
                assert_eq!(row, b.row(pc));
            }
            assert!(by_program_headers(8).is_none());
        }

        /// The main program's tables are read within the segment that holds them, found from
        /// its program headers: here two segments with a gap between them, the tables in the
        /// first, loaded 0x5000 above their addresses.
        #[test]
        fn the_main_programs_tables_are_bounded_by_their_segment() {
            let h = |p_type, p_vaddr, p_memsz| Phdr::new(p_type, p_vaddr, p_memsz);
            let headers = [
                h(PT_PHDR, 0x40, 0x1c0),
                h(PT_LOAD, 0, 0x2ffc),
                h(PT_LOAD, 0x4000, 0x1000),
                h(PT_GNU_EH_FRAME, 0x2b00, 0x100),
            ];
            let found = |o: Object| (o.eh_frame_hdr, o.start, o.end);
            assert_eq!(
                main_tables(0x5040, &headers).map(found),
                Some((0x7b00, 0x5000, 0x7ffc))
            );
            assert_eq!(segment_of(0x5000, &headers, 0x9000), Some((0x9000, 0xa000)));
            assert_eq!(segment_of(0x5000, &headers, 0x8000), None, "the gap");
            assert!(main_tables(0x5040, &headers[1..]).is_none(), "no PT_PHDR");
        }

        /// `resolve` finds this test program's own tables from its program headers: the
        /// `.eh_frame_hdr` the loader's list gives for it, inside the segment found.
        #[test]
        fn resolve_finds_the_main_programs_tables() {
            resolve();
            let pc = resolve_finds_the_main_programs_tables as *const () as usize;
            let tables = found_main_tables().expect("resolve found the main program's tables");
            let (hdr, start, end) = (tables.eh_frame_hdr, tables.start, tables.end);
            assert_eq!(Some(hdr), by_program_headers(pc).map(|o| o.eh_frame_hdr));
            assert!(
                start <= hdr && hdr < end,
                "{hdr:#x} outside {start:#x}..{end:#x}"
            );
            assert!(tables.row(pc).is_some(), "no row at {pc:#x}");
        }

        /// Steps come out of the cache as they went in, negative offsets and all.
        #[test]
        fn steps_keep_through_the_cache() {
            let step = Step {
                cfa: Some((1, -16)),
                rules: [
                    Rule::Same,
                    Rule::At(-16),
                    Rule::ValueAt(8),
                    Rule::In(1),
                    Rule::Undefined,
                    Rule::Unknown,
                    Rule::At(i64::from(i32::MIN)),
                    Rule::At(-8),
                ],
            };
            assert_eq!(Step::decode(&step.encode()), step);
            let pc = steps_keep_through_the_cache as *const () as usize;
            keep(pc, 12345, &step);
            assert_eq!(cached(pc, 12345), Some(step));
            assert_eq!(cached(pc, 12346), None);
        }

        /// A stack of garbage (addresses into nowhere, into code, small numbers) and a frame
        /// pointer into it: the walk stops without reading outside the stack it is given.
        #[test]
        #[cfg_attr(miri, ignore = "calls into the C library")]
        fn garbage_stops_the_walk() {
            resolve();
            let mut words = [0u64; 64];
            for (i, w) in words.iter_mut().enumerate() {
                *w = match i % 3 {
                    0 => 0xdead_0000_0000 + i as u64,
                    1 => garbage_stops_the_walk as *const () as usize as u64 + 3,
                    _ => i as u64,
                };
            }
            let lo = words.as_ptr() as u64;
            let top = lo + 8 * 64;
            for start in [
                garbage_stops_the_walk as *const () as usize as u64 + 5,
                walk as *const () as usize as u64 + 1,
            ] {
                let mut regs: Regs = [None; 8];
                regs[SP] = Some(lo);
                regs[1] = Some(lo + 16);
                let mut out = [const { MaybeUninit::<u64>::uninit() }; 64];
                let n = walk(&mut out, start, regs, (lo, top));
                assert!(n <= 64);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod libgcc {
    use super::push;
    use std::ffi::{c_int, c_void};
    use std::mem::MaybeUninit;

    const URC_NO_REASON: c_int = 0;
    const URC_END_OF_STACK: c_int = 5;

    extern "C" {
        fn _Unwind_Backtrace(
            trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
            arg: *mut c_void,
        ) -> c_int;
        fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
    }

    struct Walk<'a> {
        out: &'a mut [MaybeUninit<u64>],
        n: usize,
    }

    unsafe extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the `Walk` that `unwind` lent `_Unwind_Backtrace` for the call;
        // nothing else uses it meanwhile.
        let w = unsafe { &mut *(arg as *mut Walk) };
        // SAFETY: `ctx` is the unwinder's context of this step, valid during the callback.
        let ip = unsafe { _Unwind_GetIP(ctx) };
        if ip == 0 || !push(w.out, &mut w.n, ip) {
            return URC_END_OF_STACK;
        }
        URC_NO_REASON
    }

    pub fn unwind(out: &mut [MaybeUninit<u64>]) -> usize {
        let mut w = Walk { out, n: 0 };
        // SAFETY: `step` only writes into `w`, which outlives the call.
        unsafe { _Unwind_Backtrace(step, &mut w as *mut Walk as *mut c_void) };
        w.n
    }
}
