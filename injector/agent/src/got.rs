//! Redirecting other objects' calls of the C allocator family to the agent: the entries of
//! `malloc`, `free`, `mmap`... in the global offset table (GOT) of every loaded ELF object are
//! pointed at the native hooks, and put back when the session ends.
//!
//! - Every loaded object is found with `dl_iterate_phdr`; its dynamic section gives the
//!   relocations (`DT_JMPREL` for PLT calls, `DT_RELA` for `-fno-plt` calls and address-taken
//!   functions) and the symbols they name. Among the latter, a word of data that holds an
//!   allocator function (a function pointer a library calls through: libxml2's `xmlMalloc`,
//!   glib's and libcurl's tables) is redirected too, while it still holds that function.
//! - Entries under RELRO are read-only once relocated: the page is made writable for the write
//!   and given back the protection it had (as `/proc/self/maps` shows it, read at the scan)
//!   after it.
//! - Racing the loader: another thread's `dlopen` lists an object before it relocates it, and
//!   writes its GOT and makes its RELRO read-only only then. A scan (inside `dl_iterate_phdr`,
//!   whose lock keeps every listed object mapped and the list as it is) leaves an object whose
//!   RELRO is still writable alone: the loader is still relocating it (making that page
//!   read-only under the loader killed the process with SIGSEGV in `ld.so`). An entry is
//!   redirected only while it holds the address of code (relocated: a function, or the
//!   object's own lazy-binding stub), never a value the loader has not written yet.
//! - Objects loaded later are caught by the hook of `dlopen`, which scans again; a scan leaves
//!   entries that already point to a hook alone, so it can run any number of times.
//! - Entries are put back inside `dl_iterate_phdr` too, only in objects still listed and only
//!   inside their own segments (an object unloaded since may have another, of another size, in
//!   its place, and the pages around it may be going away under another thread's `dlclose`),
//!   and never with the session lock held (it
//!   runs once that lock is released, see `lock::Guard::defer`).
//! - Not patched: the agent itself, the dynamic loader, and, for the allocator family, the
//!   interpreter's own image (libpython, or the executable of a static Python): its calls of
//!   `malloc` serve `PyMem_RawMalloc` and pymalloc's arenas, which the PEP 445 hooks count
//!   already. Its `dlopen` is patched, to see extension modules being imported.
//!
//! `GOT_LOCK` serializes scans and restores. It is never taken under the loader's lock (scans
//! call `dl_iterate_phdr` with it held, never the other way round), nor under the session lock,
//! and the hooks' fast and slow paths never take it (see `locks.rs` for the order).

use crate::lock::SpinLock;
use crate::prot::Protections;
use crate::sys;
use std::ffi::{c_char, c_int, c_void, CStr};

const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_STRSZ: i64 = 10;
const DT_JMPREL: i64 = 23;
#[cfg(target_arch = "x86_64")]
const R_GLOB_DAT: u32 = 6;
#[cfg(target_arch = "x86_64")]
const R_JUMP_SLOT: u32 = 7;
/// A word of data that holds a symbol's address (plus an addend): a function pointer in a
/// library's data, `static void *(*alloc)(size_t) = malloc;`.
#[cfg(target_arch = "x86_64")]
const R_ABS64: u32 = 1;
#[cfg(target_arch = "aarch64")]
const R_ABS64: u32 = 257;
#[cfg(target_arch = "aarch64")]
const R_GLOB_DAT: u32 = 1025;
#[cfg(target_arch = "aarch64")]
const R_JUMP_SLOT: u32 = 1026;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    p_offset: u64,
    pub p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    pub p_memsz: u64,
    p_align: u64,
}

impl Phdr {
    /// A header of this type and extent (the rest zero), as tests make them.
    #[cfg(test)]
    pub fn new(p_type: u32, p_vaddr: u64, p_memsz: u64) -> Phdr {
        Phdr {
            p_type,
            p_flags: 0,
            p_offset: 0,
            p_vaddr,
            p_paddr: 0,
            p_filesz: p_memsz,
            p_memsz,
            p_align: 0,
        }
    }
}

#[repr(C)]
pub struct DlPhdrInfo {
    pub addr: usize,
    name: *const c_char,
    pub phdr: *const Phdr,
    pub phnum: u16,
    /// Objects loaded and unloaded in the process so far (glibc, musl): only there when the
    /// callback's `size` covers them.
    adds: u64,
    subs: u64,
}

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Which objects a hook is installed in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every object but the interpreter's image (the allocator family).
    NotInterpreter,
    /// Every object.
    Everywhere,
    /// The interpreter's image and CPython extension modules only (`dlsym`: nobody there asks
    /// for `RTLD_NEXT`, whose answer depends on the caller).
    PythonCode,
}

/// A hooked function: its name and the hook's address.
pub struct Hook {
    pub name: &'static CStr,
    pub addr: usize,
    pub scope: Scope,
    /// The function hooked, as the agent calls it: a data word that holds it (a function
    /// pointer a library keeps, `xmlMalloc = malloc`) is pointed at the hook too. 0: data
    /// words are left alone.
    pub real: usize,
}

/// Whether an object's file name is that of a CPython extension module.
fn is_extension_module(name: &[u8]) -> bool {
    let has = |needle: &[u8]| name.windows(needle.len()).any(|w| w == needle);
    name.ends_with(b".so") && (has(b".cpython-") || has(b".abi3.") || has(b"/lib-dynload/"))
}

/// A GOT entry the agent changed: where it is, what it held, and the object it is in (its
/// load address and program headers, as the loader lists it).
#[derive(Clone, Copy)]
struct Slot {
    object: (usize, usize),
    addr: usize,
    original: usize,
    hook: usize,
}

struct Patched {
    slots: Vec<Slot>,
    /// Whether entries should point to the hooks (a session with native hooks runs).
    wanted: bool,
    /// Objects that need no other scan (see [`Seen`]).
    seen: Seen,
}

/// Which loaded objects a scan may skip. Every `dlopen` scans again, and an application that
/// loads a few hundred libraries (numpy, pandas, torch) would otherwise walk every relocation
/// of every object loaded before at each of them: time quadratic in the number of objects,
/// spent at import (61 extension modules of the standard library: 8 ms, 4.5% of the run).
///
/// An object is scanned by the first two scans that find it at the same place and skipped by
/// the later ones: the first may have met it mapped but still being relocated by another
/// thread's `dlopen` (the loader lists an object before it relocates it), whose own hook scans
/// again after. Any unload (glibc's and musl's count of them moved) may have put another object
/// where one was, so it forgets them all; without that count nothing is ever skipped.
struct Seen {
    /// (load address, program headers) of the objects found by an earlier scan, and whether
    /// they were found twice.
    objects: Vec<(usize, usize, bool)>,
    /// The count of unloads when they were found.
    unloads: Option<u64>,
    /// Where in `objects` the next object of this scan is likely to be: the loader lists
    /// objects in the order they were loaded, which is the order they were found in, so a scan
    /// checks each object in one step (a search through them all at every object of every scan
    /// would be cubic in their number again).
    next: usize,
}

impl Seen {
    const fn new() -> Seen {
        Seen {
            objects: Vec::new(),
            unloads: None,
            next: 0,
        }
    }

    /// A scan starts: with `unloads` (None if the loader does not count them) other than when
    /// the objects were found, none of them is known any more.
    fn start(&mut self, unloads: Option<u64>) {
        if unloads.is_none() || unloads != self.unloads {
            self.objects.clear();
        }
        self.unloads = unloads;
        self.next = 0;
    }

    /// Whether the object at `key` is to be scanned, noting that this scan found it.
    fn must_scan(&mut self, key: (usize, usize)) -> bool {
        if self.unloads.is_none() {
            return true;
        }
        let is = |o: &(usize, usize, bool)| (o.0, o.1) == key;
        let found = match self.objects.get(self.next) {
            Some(o) if is(o) => Some(self.next),
            _ => self.objects.iter().position(is),
        };
        let Some(i) = found else {
            self.objects.push((key.0, key.1, false));
            self.next = self.objects.len();
            return true;
        };
        self.next = i + 1;
        let twice = &mut self.objects[i].2;
        !std::mem::replace(twice, true)
    }

    fn forget(&mut self) {
        self.objects.clear();
        self.unloads = None;
    }
}

static GOT_LOCK: SpinLock<Patched> = SpinLock::new(Patched {
    slots: Vec::new(),
    wanted: false,
    seen: Seen::new(),
});

/// What a scan needs to know besides the hooks.
struct Scan<'a> {
    hooks: &'a [Hook],
    /// An address inside the agent and one inside the interpreter's image.
    agent: usize,
    interpreter: usize,
    slots: &'a mut Vec<Slot>,
    seen: &'a mut Seen,
    /// Whether the first object was met (the scan's count of unloads is known then).
    started: bool,
    /// The pages' protections, read when the first object was met.
    prot: Option<Protections>,
}

pub const PT_LOAD: u32 = 1;

/// Whether `addr` lies in one of the object's loaded segments.
///
/// # Safety
/// `info` describes an object as `dl_iterate_phdr` hands it, during the callback: `phdr`
/// points to its `phnum` program headers, mapped with it.
pub unsafe fn contains(info: &DlPhdrInfo, addr: usize) -> bool {
    // SAFETY: the object's program headers (contract).
    unsafe { std::slice::from_raw_parts(info.phdr, info.phnum as usize) }
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .any(|p| {
            let lo = info.addr + p.p_vaddr as usize;
            lo <= addr && addr < lo + p.p_memsz as usize
        })
}

/// The session that wants the hooks: bumped (under the session lock) at every start and stop.
pub static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Points every hookable GOT entry of every loaded object at its hook, and keeps them so from
/// now on (`dlopen` calls `rescan`), unless session `serial` is over already (then it returns
/// false). `agent` and `interpreter` are addresses inside the agent and the interpreter's image.
pub fn patch_all(hooks: &[Hook], agent: usize, interpreter: usize, serial: u64) -> bool {
    let mut p = GOT_LOCK.lock();
    if SERIAL.load(std::sync::atomic::Ordering::Acquire) != serial {
        return false;
    }
    p.wanted = true;
    // Entries put back by `restore_all` or never patched: every object is scanned.
    p.seen.forget();
    scan(&mut p, hooks, agent, interpreter);
    true
}

/// Patches the objects loaded since the last scan, if hooks are wanted.
pub fn rescan(hooks: &[Hook], agent: usize, interpreter: usize) {
    let mut p = GOT_LOCK.lock();
    if p.wanted {
        scan(&mut p, hooks, agent, interpreter);
    }
}

fn scan(p: &mut Patched, hooks: &[Hook], agent: usize, interpreter: usize) {
    let Patched { slots, seen, .. } = p;
    let mut s = Scan {
        hooks,
        agent,
        interpreter,
        slots,
        seen,
        started: false,
        prot: None,
    };
    // SAFETY: the callback only reads the program headers and dynamic sections the loader
    // hands it, and writes GOT entries it found there.
    unsafe { dl_iterate_phdr(visit, &mut s as *mut Scan as *mut c_void) };
}

/// Puts back every entry that still points to a hook, unless session `serial` is over already
/// (a later session wants them), in the objects the loader still lists; entries of objects
/// unloaded since are forgotten. Called without the session lock.
pub fn restore_all(serial: u64) {
    let mut p = GOT_LOCK.lock();
    if SERIAL.load(std::sync::atomic::Ordering::Acquire) != serial {
        return;
    }
    p.wanted = false;
    p.seen.forget();
    let mut slots = std::mem::take(&mut p.slots);
    slots.sort_unstable_by_key(|s| (s.object, s.addr));
    let mut r = Restore {
        slots: &slots,
        prot: None,
        started: false,
    };
    // SAFETY: the callback only reads the program headers the loader hands it and writes
    // entries the agent wrote itself, of objects the loader lists (and so keeps mapped).
    unsafe { dl_iterate_phdr(restore_visit, &mut r as *mut Restore as *mut c_void) };
}

/// What a restore needs: the entries changed, sorted by object.
struct Restore<'a> {
    slots: &'a [Slot],
    prot: Option<Protections>,
    started: bool,
}

unsafe extern "C" fn restore_visit(info: *mut DlPhdrInfo, _: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Restore` that `restore_all` lent the loader for the call; nothing
    // else uses it meanwhile.
    let r = unsafe { &mut *(data as *mut Restore) };
    if !r.started {
        r.started = true;
        r.prot = Protections::read();
    }
    let Some(prot) = &r.prot else {
        return 1; // no protections known: nothing is written
    };
    // SAFETY: the loader's description of one object, valid during the callback.
    let info = unsafe { &*info };
    let key = (info.addr, info.phdr as usize);
    let from = r.slots.partition_point(|s| s.object < key);
    let to = r.slots.partition_point(|s| s.object <= key);
    // SAFETY: an object as the loader hands it, during the callback.
    if from == to || unsafe { relocating(info, prot) } {
        return 0;
    }
    for slot in &r.slots[from..to] {
        // Another object may sit where the patched one was (unloaded since, and a different
        // library loaded at the same address has the same key): only an entry inside this
        // object's own segments is read. The maps read at the start may still show pages of an
        // object another thread's `dlclose` has unlisted and is unmapping now; a listed object
        // stays mapped while the loader's list lock is held.
        // SAFETY: the object as the loader hands it, during the callback.
        if !unsafe { contains(info, slot.addr) } {
            continue;
        }
        let Some(page) = prot.at(slot.addr) else {
            continue;
        };
        // SAFETY: an entry the agent patched, an aligned word inside an object the loader lists
        // (so keeps mapped).
        if unsafe { std::ptr::read_volatile(slot.addr as *const usize) } == slot.hook {
            // SAFETY: that entry, still pointing at the hook: it takes back the function it
            // held, relocated, not being relocated (checked above).
            unsafe { write_entry(slot.addr, slot.original, page.prot(), page.write) };
        }
    }
    0
}

/// Serializes the unit tests that change the agent's global state (the session, the GOT).
#[cfg(test)]
pub static TEST_SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether `GOT_LOCK` is free now (for the lock-order tests).
#[cfg(test)]
pub fn lock_is_free() -> bool {
    GOT_LOCK.try_lock().is_some()
}

/// Whether a session wants the hooks (for the tests).
#[cfg(test)]
pub fn hooks_wanted() -> bool {
    GOT_LOCK.lock().wanted
}

/// Says that hooks are wanted, without a scan (for the tests).
#[cfg(test)]
pub fn want_hooks_for_test() {
    GOT_LOCK.lock().wanted = true;
}

/// Holds the lock across `fork()` (from the prepare handler), so that the child never inherits
/// it taken by a thread that does not exist there.
pub fn lock_for_fork() {
    GOT_LOCK.raw_lock();
}

/// Releases the lock taken by `lock_for_fork`, in the parent and in the child.
pub fn unlock_after_fork() {
    // SAFETY: taken by `lock_for_fork` before the fork, on this thread (or its copy in the
    // child).
    unsafe { GOT_LOCK.raw_unlock() };
}

extern "C" {
    pub fn dl_iterate_phdr(
        callback: unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int,
        data: *mut c_void,
    ) -> c_int;
}

unsafe extern "C" fn visit(info: *mut DlPhdrInfo, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Scan` that `scan` lent the loader for the call; nothing else uses
    // it meanwhile.
    let s = unsafe { &mut *(data as *mut Scan) };
    // SAFETY: the loader's description of one object, valid during the callback.
    let info = unsafe { &*info };
    if !s.started {
        s.started = true;
        let counted = size >= std::mem::offset_of!(DlPhdrInfo, subs) + 8;
        s.seen.start(counted.then_some(info.subs));
        // Read under the loader's list lock: every object listed stays mapped, and an
        // object's RELRO only goes from writable (being relocated) to read-only meanwhile.
        s.prot = Protections::read();
    }
    let Some(prot) = &s.prot else {
        return 1; // the protections cannot be read: nothing is patched
    };
    // Being relocated by another thread's `dlopen`: left for the scan its `dlopen` hook makes
    // once it returns (not noted as seen).
    // SAFETY: an object as the loader hands it, during the callback.
    if unsafe { relocating(info, prot) } {
        return 0;
    }
    if !s.seen.must_scan((info.addr, info.phdr as usize)) {
        return 0;
    }
    let name = if info.name.is_null() {
        &[][..]
    } else {
        // SAFETY: a non-null `dlpi_name` is the loader's NUL-terminated name of the object.
        unsafe { CStr::from_ptr(info.name) }.to_bytes()
    };
    // SAFETY: an object as the loader hands it, during the callback.
    let skip = unsafe { contains(info, s.agent) }
        || name.windows(7).any(|w| w == b"ld-linux")
        || name.windows(7).any(|w| w == b"ld-musl")
        || name.starts_with(b"linux-vdso")
        || name.starts_with(b"linux-gate");
    if !skip {
        // SAFETY: an object as the loader hands it, during the callback, relocated (checked
        // above) and not the agent or the loader.
        unsafe { patch_object(s, info, is_extension_module(name)) };
    }
    0
}

/// The dynamic section's pointers, relocated (glibc has already added the load address to most
/// of them; musl has not).
fn fix(ptr: u64, bias: usize) -> usize {
    if (ptr as usize) < bias {
        ptr as usize + bias
    } else {
        ptr as usize
    }
}

/// The part of an object's RELRO region the loader makes read-only once it has relocated the
/// object (whole pages: the last partial page stays writable), if any.
///
/// # Safety
/// As for [`contains`].
unsafe fn relro_pages(info: &DlPhdrInfo) -> Option<(usize, usize)> {
    // SAFETY: the object's program headers (contract).
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, info.phnum as usize) };
    let p = phdrs.iter().find(|p| p.p_type == PT_GNU_RELRO)?;
    let mask = !(page_size() - 1);
    let start = (info.addr + p.p_vaddr as usize) & mask;
    let end = (info.addr + (p.p_vaddr + p.p_memsz) as usize) & mask;
    (start < end).then_some((start, end))
}

/// Whether the loader is still relocating the object: it has a RELRO region that is not
/// read-only yet.
///
/// # Safety
/// As for [`contains`].
unsafe fn relocating(info: &DlPhdrInfo, prot: &Protections) -> bool {
    // SAFETY: this function's contract.
    unsafe { relro_pages(info) }.is_some_and(|(start, end)| !prot.read_only(start, end))
}

/// Points the object's hookable GOT entries at their hooks and notes them in `s.slots`.
///
/// # Safety
/// As for [`contains`], under the loader's list lock (in its callback): the object stays
/// mapped meanwhile, and the loader has relocated it (not [`relocating`]).
unsafe fn patch_object(s: &mut Scan, info: &DlPhdrInfo, extension: bool) {
    // SAFETY: the object's program headers (contract).
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, info.phnum as usize) };
    let bias = info.addr;
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return;
    };
    let Some(prot) = &s.prot else {
        return;
    };
    let (mut strtab, mut strsz, mut symtab) = (0, 0, 0);
    let (mut jmprel, mut pltrelsz, mut rela, mut relasz) = (0, 0, 0, 0);
    let mut d = (bias + dynamic.p_vaddr as usize) as *const Dyn;
    // SAFETY: the loaded object's dynamic section (its PT_DYNAMIC segment, mapped with it),
    // an array of entries that ends with DT_NULL: `d` never goes past that end.
    while unsafe { (*d).tag } != DT_NULL {
        // SAFETY: as above.
        let v = unsafe { (*d).val };
        // SAFETY: as above.
        match unsafe { (*d).tag } {
            DT_STRTAB => strtab = fix(v, bias),
            DT_STRSZ => strsz = v as usize,
            DT_SYMTAB => symtab = fix(v, bias),
            DT_JMPREL => jmprel = fix(v, bias),
            DT_PLTRELSZ => pltrelsz = v as usize,
            DT_RELA => rela = fix(v, bias),
            DT_RELASZ => relasz = v as usize,
            _ => {}
        }
        // SAFETY: `d` was not the DT_NULL end: the next entry is in the section too.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return;
    }
    // SAFETY: this function's contract.
    let in_interpreter = unsafe { contains(info, s.interpreter) };
    for (table, size) in [(jmprel, pltrelsz), (rela, relasz)] {
        if table == 0 {
            continue;
        }
        // SAFETY: the relocation table the dynamic section names, `size` bytes of it, mapped
        // with the object.
        let relocs = unsafe {
            std::slice::from_raw_parts(table as *const Rela, size / std::mem::size_of::<Rela>())
        };
        for r in relocs {
            let kind = (r.info & 0xffff_ffff) as u32;
            let data = kind == R_ABS64;
            if kind != R_JUMP_SLOT && kind != R_GLOB_DAT && !data {
                continue;
            }
            // SAFETY: the symbol the relocation names, in the object's symbol table.
            let sym = unsafe { &*(symtab as *const Sym).add((r.info >> 32) as usize) };
            if sym.name as usize >= strsz || sym.shndx != 0 {
                continue; // defined here, not imported
            }
            // SAFETY: an offset inside the object's string table (`< strsz`, checked above),
            // where a NUL-terminated name starts.
            let name = unsafe { CStr::from_ptr((strtab + sym.name as usize) as *const c_char) };
            let Some(hook) = s.hooks.iter().find(|h| {
                h.name == name
                    && match h.scope {
                        Scope::NotInterpreter => !in_interpreter,
                        Scope::Everywhere => true,
                        Scope::PythonCode => in_interpreter || extension,
                    }
            }) else {
                continue;
            };
            let addr = bias + r.offset as usize;
            // SAFETY: the object as the loader hands it, during the callback.
            if !unsafe { contains(info, addr) } {
                continue;
            }
            let Some(page) = prot.at(addr) else {
                continue;
            };
            // SAFETY: the relocation's target, an aligned word in the object on a page that
            // is mapped (`prot` has it).
            let original = unsafe { std::ptr::read_volatile(addr as *const usize) };
            if original == hook.addr {
                continue; // patched by an earlier scan
            }
            // A data word is redirected only while it holds the function itself: the program
            // may have stored another allocator there since (`xmlMemSetup`).
            if data && (r.addend != 0 || hook.real == 0 || original != hook.real) {
                continue;
            }
            // Only an entry the loader has relocated: it holds the address of code (the
            // function, or the object's own lazy-binding stub). An entry not relocated yet
            // holds nothing, or an offset in its file. (Not "the function the process resolves
            // for the name": a static Python's executable exports a stub of its own for
            // `malloc`, which lookups answer, while the other objects call the C library's.)
            if !prot.at(original).is_some_and(|r| r.exec) {
                continue;
            }
            // SAFETY: a relocated GOT entry (or data word) that holds the function the hook
            // stands for, whose callers may call the hook instead.
            unsafe { write_entry(addr, hook.addr, page.prot(), page.write) };
            s.slots.retain(|slot| slot.addr != addr);
            s.slots.push(Slot {
                object: (info.addr, info.phdr as usize),
                addr,
                original,
                hook: hook.addr,
            });
        }
    }
}

/// Writes a GOT entry (an aligned word: threads calling through it see the old or the new
/// function, never a mix). A page that is not `writable` is made writable for the time of the
/// write and given back its protection `prot` after it.
///
/// # Safety
/// `addr` is an aligned word of a loaded object on a mapped page whose protection is `prot`
/// (`writable` when it includes writing), which the object's code reads as a function's
/// address and may find `value`, a function that stands for it, in.
unsafe fn write_entry(addr: usize, value: usize, prot: c_int, writable: bool) {
    let page = (addr & !(page_size() - 1)) as *mut c_void;
    // SAFETY: the page of `addr`, mapped (contract): made writable, with the protections it
    // had besides.
    if !writable && unsafe { sys::mprotect(page, page_size(), prot | sys::PROT_WRITE) } != 0 {
        return;
    }
    // SAFETY: an aligned word on a writable page (contract, or made so just above) that may
    // take `value` (contract).
    unsafe { std::ptr::write_volatile(addr as *mut usize, value) };
    if !writable {
        // SAFETY: the same page, given back the protection it had.
        unsafe { sys::mprotect(page, page_size(), prot) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { sys::sysconf(sys::SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of a loaded object other than the test binary (the C library's).
    fn a_listed_object() -> (usize, usize) {
        unsafe extern "C" fn find(info: *mut DlPhdrInfo, _: usize, data: *mut c_void) -> c_int {
            // SAFETY: the loader hands a valid entry and its NUL-terminated name for the time
            // of the callback; `data` is the key the caller passed.
            unsafe {
                let info = &*info;
                let name = if info.name.is_null() {
                    &[][..]
                } else {
                    CStr::from_ptr(info.name).to_bytes()
                };
                if name.windows(4).any(|w| w == b"libc") {
                    *(data as *mut (usize, usize)) = (info.addr, info.phdr as usize);
                    return 1;
                }
            }
            0
        }
        let mut key = (0, 0);
        // SAFETY: the callback writes the key it was handed.
        unsafe { dl_iterate_phdr(find, &mut key as *mut (usize, usize) as *mut c_void) };
        assert_ne!(key, (0, 0), "no C library listed");
        key
    }

    /// An entry kept from an object unloaded since, whose place (and key) another object took:
    /// it lies outside the new one's segments, in pages that may be another thread's
    /// `dlclose` unmapping (here: pages that cannot be read at all). The restore leaves it
    /// alone; reading it killed targets of the dlopen storm with SIGSEGV (1 in 40 on CI).
    #[test]
    fn a_restore_reads_no_entry_outside_the_object_listed_under_its_key() {
        let _serial = TEST_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let page = page_size();
        // SAFETY: a fresh private mapping, no access, unmapped at the end of the test.
        let gone = unsafe {
            sys::mmap(
                std::ptr::null_mut(),
                page,
                sys::PROT_NONE,
                sys::MAP_PRIVATE | sys::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(gone, sys::MAP_FAILED);
        let serial = SERIAL.load(std::sync::atomic::Ordering::Acquire);
        GOT_LOCK.lock().slots.push(Slot {
            object: a_listed_object(),
            addr: gone as usize,
            original: 0,
            hook: 1,
        });
        restore_all(serial);
        assert!(GOT_LOCK.lock().slots.is_empty());
        // SAFETY: mapped above, used by nobody else.
        unsafe { sys::munmap(gone, page) };
    }

    #[test]
    fn an_object_is_skipped_from_its_third_scan_until_something_is_unloaded() {
        let mut seen = Seen::new();
        let (a, b) = ((0x1000, 0x1040), (0x9000, 0x9040));
        // Found by a first and a second scan: scanned both times (the first may have met it
        // before its relocation), skipped from then on.
        for _ in 0..2 {
            seen.start(Some(0));
            assert!(seen.must_scan(a));
        }
        seen.start(Some(0));
        assert!(!seen.must_scan(a));
        assert!(seen.must_scan(b), "an object loaded since is scanned");
        // An unload: whatever is at a known place may be another object now.
        seen.start(Some(1));
        assert!(seen.must_scan(a));
        assert!(seen.must_scan(b));
        // A loader that counts no unloads: every object, every time.
        for _ in 0..3 {
            seen.start(None);
            assert!(seen.must_scan(a));
        }
        // Found in another order than they were first (the hint misses): still known.
        let c = (0x5000, 0x5040);
        for _ in 0..2 {
            seen.start(Some(1));
            for key in [a, b, c] {
                seen.must_scan(key);
            }
        }
        seen.start(Some(1));
        assert!(!seen.must_scan(c));
        assert!(!seen.must_scan(a));
        assert!(!seen.must_scan(b));
        // A new session's full scan.
        seen.forget();
        seen.start(Some(1));
        assert!(seen.must_scan(b));
    }
}
