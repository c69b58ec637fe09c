//! The few libc functions and constants the agent needs, declared by hand so the agent builds
//! with a bare `rustc` and no crates.

use std::ffi::{c_char, c_int, c_long, c_void};

pub const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();
#[cfg(test)]
pub const PROT_NONE: c_int = 0;
pub const PROT_READ: c_int = 1;
pub const PROT_WRITE: c_int = 2;
pub const PROT_EXEC: c_int = 4;
pub const O_RDONLY: c_int = 0;
pub const O_CLOEXEC: c_int = 0o2000000;
pub const MAP_SHARED: c_int = 1;
pub const MAP_PRIVATE: c_int = 2;
pub const MAP_ANONYMOUS: c_int = 0x20;
pub const MAP_FAILED: *mut c_void = !0usize as *mut c_void;
pub const CLOCK_MONOTONIC: c_int = 1;
pub const CLOCK_MONOTONIC_COARSE: c_int = 6;
pub const SEEK_END: c_int = 2;
#[cfg(target_arch = "x86_64")]
pub const SYS_GETTID: c_long = 186;
#[cfg(target_arch = "aarch64")]
pub const SYS_GETTID: c_long = 178;

#[repr(C)]
pub struct Timespec {
    pub tv_sec: i64,
    pub tv_nsec: i64,
}

pub const SC_PAGESIZE: c_int = 30;

pub const AF_UNIX: c_int = 1;
pub const SOCK_SEQPACKET: c_int = 5;
pub const SOCK_CLOEXEC: c_int = 0o2000000;
pub const SOL_SOCKET: c_int = 1;
pub const SCM_RIGHTS: c_int = 1;
pub const MSG_NOSIGNAL: c_int = 0x4000;
pub const MSG_DONTWAIT: c_int = 0x40;
pub const SOCK_NONBLOCK: c_int = 0o4000;
pub const EAGAIN: c_int = 11;
pub const F_ADD_SEALS: c_int = 1033;
pub const F_SEAL_SHRINK: c_int = 2;
pub const F_SEAL_GROW: c_int = 4;
pub const MFD_CLOEXEC: c_int = 1;
pub const MFD_ALLOW_SEALING: c_int = 2;
#[cfg(target_arch = "x86_64")]
pub const SYS_MEMFD_CREATE: c_long = 319;
#[cfg(target_arch = "aarch64")]
pub const SYS_MEMFD_CREATE: c_long = 279;

/// `struct sockaddr_un`.
#[repr(C)]
pub struct SockaddrUn {
    pub family: u16,
    pub path: [u8; 108],
}

/// `struct iovec`.
#[repr(C)]
pub struct Iovec {
    pub base: *mut c_void,
    pub len: usize,
}

/// `struct msghdr`.
#[repr(C)]
pub struct Msghdr {
    pub name: *mut c_void,
    pub namelen: u32,
    pub iov: *mut Iovec,
    pub iovlen: usize,
    pub control: *mut c_void,
    pub controllen: usize,
    pub flags: c_int,
}

/// `Dl_info`.
#[repr(C)]
pub struct DlInfo {
    pub fname: *const c_char,
    pub fbase: *mut c_void,
    pub sname: *const c_char,
    pub saddr: *mut c_void,
}

/// `Elf64_Sym`.
#[repr(C)]
pub struct ElfSym {
    pub name: u32,
    pub info: u8,
    pub other: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

/// `dladdr1`'s flag asking for the symbol's table entry.
const RTLD_DL_SYMENT: c_int = 1;

/// Where a data symbol of the process lives and how many bytes it spans, by its dynamic
/// symbol table entry.
pub fn symbol_extent(name: &std::ffi::CStr) -> Option<(usize, usize)> {
    // SAFETY: dlsym with a NUL-terminated name; dladdr1 writes `info` and, with
    // RTLD_DL_SYMENT, a pointer to the loader's own copy of the symbol entry into `sym`.
    unsafe {
        let at = dlsym(RTLD_DEFAULT, name.as_ptr());
        if at.is_null() {
            return None;
        }
        let mut info = std::mem::MaybeUninit::<DlInfo>::uninit();
        let mut sym: *mut c_void = std::ptr::null_mut();
        if dladdr1(at, info.as_mut_ptr(), &mut sym, RTLD_DL_SYMENT) == 0 || sym.is_null() {
            return None;
        }
        let sym = &*(sym as *const ElfSym);
        // The entry found must be the symbol itself, not one before it that it lies in.
        (info.assume_init().saddr == at).then_some((at as usize, sym.size as usize))
    }
}

extern "C" {
    pub fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    pub fn connect(fd: c_int, addr: *const SockaddrUn, len: u32) -> c_int;
    #[cfg(test)]
    pub fn bind(fd: c_int, addr: *const SockaddrUn, len: u32) -> c_int;
    #[cfg(test)]
    pub fn listen(fd: c_int, backlog: c_int) -> c_int;
    pub fn sendmsg(fd: c_int, msg: *const Msghdr, flags: c_int) -> isize;
    pub fn ftruncate(fd: c_int, len: i64) -> c_int;
    pub fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    pub fn getppid() -> c_int;
    pub fn pthread_getspecific(key: u32) -> *mut c_void;
    pub fn pthread_setspecific(key: u32, value: *const c_void) -> c_int;
    pub fn pthread_key_create(
        key: *mut u32,
        destructor: Option<extern "C" fn(*mut c_void)>,
    ) -> c_int;
    pub fn pthread_key_delete(key: u32) -> c_int;
    pub fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    pub fn dlopen(name: *const c_char, flags: c_int) -> *mut c_void;
    pub fn dlclose(handle: *mut c_void) -> c_int;
    pub fn dladdr1(
        addr: *const c_void,
        info: *mut DlInfo,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
    pub fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
    pub fn sysconf(name: c_int) -> c_long;
    pub fn malloc(size: usize) -> *mut c_void;
    pub fn calloc(n: usize, size: usize) -> *mut c_void;
    pub fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void;
    pub fn free(p: *mut c_void);
    pub fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int;
    pub fn aligned_alloc(align: usize, size: usize) -> *mut c_void;
    pub fn memalign(align: usize, size: usize) -> *mut c_void;
    pub fn valloc(size: usize) -> *mut c_void;
    pub fn pvalloc(size: usize) -> *mut c_void;
    pub fn mremap(
        old: *mut c_void,
        old_len: usize,
        new_len: usize,
        flags: c_int,
        ...
    ) -> *mut c_void;
    pub fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    pub fn munmap(addr: *mut c_void, len: usize) -> c_int;
    pub fn getpid() -> c_int;
    pub fn syscall(n: c_long, ...) -> c_long;
    pub fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    pub fn prctl(option: c_int, ...) -> c_int;
    pub fn getenv(name: *const c_char) -> *mut c_char;
    pub fn execve(
        path: *const c_char,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    pub fn posix_spawn(
        pid: *mut c_int,
        path: *const c_char,
        file_actions: *const c_void,
        attr: *const c_void,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    pub fn posix_spawnp(
        pid: *mut c_int,
        file: *const c_char,
        file_actions: *const c_void,
        attr: *const c_void,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    pub fn setenv(name: *const c_char, value: *const c_char, overwrite: c_int) -> c_int;
    pub fn unsetenv(name: *const c_char) -> c_int;
    pub fn close(fd: c_int) -> c_int;
    pub fn open_memstream(buf: *mut *mut c_char, len: *mut usize) -> *mut c_void;
    pub fn fclose(file: *mut c_void) -> c_int;
    #[link_name = "__errno_location"]
    pub fn errno() -> *mut c_int;
    pub fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    pub fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize;
    pub fn lseek(fd: c_int, off: i64, whence: c_int) -> i64;
    pub fn sched_yield() -> c_int;
    pub fn nanosleep(req: *const Timespec, rem: *mut Timespec) -> c_int;
    pub fn pthread_create(
        thread: *mut usize,
        attr: *const c_void,
        start: *const c_void,
        arg: *mut c_void,
    ) -> c_int;
    pub fn pthread_self() -> usize;
    pub fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

/// The monotonic clock in nanoseconds, to the kernel's tick (a few milliseconds): the time
/// of a sample and the session's deadlines. The precise clock cost a sample more than its
/// whole stack walk in a VM (about 50 ns, 8% of the time at `--rate 1`); this one is a read
/// of the kernel's last tick. The reader stamps its records with the same clock.
pub fn now_ns() -> u64 {
    clock_ns(CLOCK_MONOTONIC_COARSE)
}

/// The time-stamp counter's ticks within which [`SampleClock`] gives the same reading again:
/// a millisecond at 1 GHz, less on faster counters, where the coarse clock's tick is 4 ms.
const CLOCK_TICKS: u64 = 1 << 20;
/// Readings given again at most, before the clock is read anyway (a counter that stood still
/// would otherwise stop the time of the samples, and with it the reader's heartbeat checks).
const CLOCK_REUSES: u64 = 4096;

/// [`now_ns`] for a session's samples, read again only once the processor's time-stamp
/// counter (`rdtsc`, one instruction) moved on by [`CLOCK_TICKS`]: at `--rate 1` a thread
/// samples thousands of times a tick of the coarse clock, and `clock_gettime` through the vDSO
/// is some twenty instructions a sample. Never behind a reading it gave before. Used under
/// the session lock.
pub struct SampleClock {
    /// The counter when the clock was last read, moved back by a [`CLOCK_REUSES`]th of
    /// [`CLOCK_TICKS`] at each reading given again: so the clock is read again after that
    /// many readings even when the counter stands still, with one subtraction a reading
    /// instead of a count of its own. [`NEVER_READ`] before the first reading.
    tsc: u64,
    ns: u64,
}

/// [`SampleClock::tsc`] before the clock was read: as far from any counter reading as there
/// is (the counter starts near 0 at boot and takes a century to reach it).
const NEVER_READ: u64 = 1 << 63;

impl SampleClock {
    pub const fn new() -> SampleClock {
        SampleClock {
            tsc: NEVER_READ,
            ns: 0,
        }
    }

    /// The time, to the coarse clock's tick; `tsc`: the calling thread may read the counter
    /// ([`tsc_allowed`]).
    #[inline(always)]
    pub fn now(&mut self, tsc: bool) -> u64 {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if tsc {
            // SAFETY: rdtsc reads a counter; the thread was found allowed to (no PR_SET_TSC
            // fault mode).
            if self.reuse(unsafe { std::arch::x86_64::_rdtsc() }) {
                return self.ns;
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        let _ = tsc;
        // The coarse clock never goes back; the max keeps it so across threads whose readings
        // came at other moments.
        self.ns = self.ns.max(now_ns());
        self.ns
    }

    /// Whether the last reading is given again at counter reading `t` (then counted), or the
    /// clock must be read (then `t` is where the next readings count from).
    #[inline(always)]
    fn reuse(&mut self, t: u64) -> bool {
        if t.wrapping_sub(self.tsc) < CLOCK_TICKS {
            self.tsc = self.tsc.wrapping_sub(CLOCK_TICKS / CLOCK_REUSES);
            return true;
        }
        self.tsc = t;
        false
    }
}

/// Whether the calling thread may read the time-stamp counter: `prctl(PR_SET_TSC,
/// PR_TSC_SIGSEGV)` makes `rdtsc` fault, per thread (inherited by the threads it starts).
pub fn tsc_allowed() -> bool {
    const PR_GET_TSC: c_int = 25;
    const PR_TSC_ENABLE: c_int = 1;
    let mut mode: c_int = 0;
    // SAFETY: PR_GET_TSC writes an int at the address given, a local.
    cfg!(all(target_arch = "x86_64", not(miri)))
        && unsafe { prctl(PR_GET_TSC, &mut mode as *mut c_int) } == 0
        && mode == PR_TSC_ENABLE
}

/// CLOCK_MONOTONIC to the nanosecond (seeding).
pub fn precise_ns() -> u64 {
    clock_ns(CLOCK_MONOTONIC)
}

fn clock_ns(clock: c_int) -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`, a local.
    unsafe { clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps about `ns` nanoseconds (less if a signal comes).
pub fn sleep_ns(ns: u64) {
    let t = Timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i64,
    };
    // SAFETY: nanosleep reads `t`, a local; no remainder is asked for.
    unsafe { nanosleep(&t, std::ptr::null_mut()) };
}

/// The calling thread's thread pointer: an address no other live thread has, read in one
/// instruction (no TLS lookup, no call).
#[inline(always)]
#[cfg(not(miri))]
pub fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the thread pointer register (x86-64: the TCB's self pointer at %fs:0,
    // which glibc and musl set up for every thread); no memory is written.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: reads the thread pointer register; nothing else.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags))
    };
    tp
}

/// Under Miri (no inline assembly): the address of a thread-local, which no other live thread
/// shares either.
#[cfg(miri)]
pub fn thread_pointer() -> usize {
    thread_local!(static ME: u8 = const { 0 });
    ME.with(|m| m as *const u8 as usize)
}

/// Where the C library keeps threads' values of thread-specific keys, when it keeps them in an
/// array inside each thread's own descriptor, at the same distance from every thread's thread
/// pointer (glibc does, for its first 32 keys): the calling thread's value of a key is then
/// one load ([`thread_word`]), where `pthread_getspecific` is a call of some twenty
/// instructions. Found ([`key_slots`]) by giving two keys of the agent's own values that are
/// nowhere else and finding each once just past the thread pointer, at places that make an
/// array of the keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeySlots {
    /// Offset from the thread pointer of key 0's value.
    at: isize,
    /// Bytes between two keys' values.
    stride: isize,
    /// The array holds keys up to this one at least: the two found were in it.
    max_key: u32,
}

impl KeySlots {
    /// The offset from the thread pointer of `key`'s value, if the array holds it.
    pub fn offset(&self, key: u32) -> Option<isize> {
        (key <= self.max_key).then(|| self.at + key as isize * self.stride)
    }
}

/// How far past the thread pointer [`key_slots`] looks (glibc's array starts about 0x310 in).
const KEY_WINDOW: usize = 4096;

/// [`KeySlots`] for this process's C library, or `None` where its values are kept elsewhere
/// (another C library, no room for two more keys) or the window could not be read. Creates
/// and deletes two keys of its own.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub fn key_slots() -> Option<KeySlots> {
    static MARKS: [u8; 2] = [0; 2];
    let marks = [
        &MARKS[0] as *const u8 as usize,
        &MARKS[1] as *const u8 as usize,
    ];
    let mut keys = [0u32; 2];
    let mut made = 0;
    for key in keys.iter_mut() {
        // SAFETY: `key` is ours to write; no destructor.
        if unsafe { pthread_key_create(key, None) } != 0 {
            break;
        }
        made += 1;
    }
    let found = if made == 2 {
        // SAFETY: the keys were made above; their values are addresses, never dereferenced.
        let set = keys
            .iter()
            .zip(marks)
            .all(|(&k, m)| unsafe { pthread_setspecific(k, m as *const c_void) } == 0);
        let found = set.then(|| find_once(thread_pointer(), &marks)).flatten();
        for &k in &keys {
            // SAFETY: as above; the values go back to NULL before the keys go.
            unsafe { pthread_setspecific(k, std::ptr::null()) };
        }
        found
    } else {
        None
    };
    for &k in &keys[..made] {
        // SAFETY: keys made above, used no more.
        unsafe { pthread_key_delete(k) };
    }
    let [pa, pb] = found?;
    let (a, b) = (keys[0] as isize, keys[1] as isize);
    let (dk, dp) = (b - a, pb - pa);
    if dk == 0 || dp % dk != 0 {
        return None;
    }
    let stride = dp / dk;
    let at = pa - a * stride;
    // Key 0's value lies past the thread pointer too, and a value takes a word at least.
    ((8..=64).contains(&stride) && at > 0).then_some(KeySlots {
        at,
        stride,
        max_key: keys[0].max(keys[1]),
    })
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
pub fn key_slots() -> Option<KeySlots> {
    None
}

/// The offsets from `tp` of the one word equal to each of `marks` within [`KEY_WINDOW`] bytes
/// past it, read without a fault (up to the first part that cannot be read); `None` unless
/// each is there exactly once.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn find_once(tp: usize, marks: &[usize; 2]) -> Option<[isize; 2]> {
    let mut at = [None::<isize>; 2];
    let mut chunk = [0usize; 64];
    let bytes = std::mem::size_of_val(&chunk);
    for start in (0..KEY_WINDOW).step_by(bytes) {
        if !read_own(tp + start, &mut chunk) {
            break;
        }
        for (i, &w) in chunk.iter().enumerate() {
            for (slot, &m) in at.iter_mut().zip(marks) {
                if w == m {
                    if slot.is_some() {
                        return None;
                    }
                    *slot = Some((start + i * 8) as isize);
                }
            }
        }
    }
    Some([at[0]?, at[1]?])
}

/// The calling thread's word at `offset` bytes from its thread pointer: one load.
///
/// # Safety
/// `offset` is a [`KeySlots::offset`] (inside every thread's own descriptor).
#[inline(always)]
pub unsafe fn thread_word(offset: isize) -> usize {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let v: usize;
        // SAFETY: a load of one word at `fs:offset`, inside the calling thread's own
        // descriptor (contract); it changes no register but `v`, and no flag.
        unsafe {
            std::arch::asm!(
                "mov {v}, qword ptr fs:[{o}]",
                o = in(reg) offset,
                v = lateout(reg) v,
                options(nostack, readonly, preserves_flags)
            )
        };
        v
    }
    // No KeySlots are found elsewhere, so this is never called there.
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = offset;
        0
    }
}

/// Asks the cache for the line holding `p` ahead of a load from it (a hint: never faults,
/// nothing on targets without one).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever `p` is.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// The calling thread's kernel id.
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { syscall(SYS_GETTID) as u32 }
}

/// Faults in, for writing, every 4 KiB page of the `len` bytes at `p`, so that the first
/// writes there (at a sample) do not each take a page fault, 1.5 to 3 µs here. Each page's first
/// byte is swapped for itself with a compare-and-swap, which needs the page writable and
/// changes nothing: safe beside other threads' atomic loads and stores of those bytes.
///
/// # Safety
/// `p..p + len` is mapped, readable and writable.
pub unsafe fn touch_pages_for_writing(p: *mut u8, len: usize) {
    use std::sync::atomic::{AtomicU8, Ordering};
    for offset in (0..len).step_by(4096) {
        // SAFETY: within the mapping (the caller); any byte may be seen as an AtomicU8.
        let b = unsafe { AtomicU8::from_ptr(p.add(offset)) };
        let v = b.load(Ordering::Relaxed);
        // Failure means another thread wrote the byte: the page is in already.
        let _ = b.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Anonymous private memory straight from the kernel: never from malloc, so never from a hook.
pub fn map_anon(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; failure is checked below.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p as *mut u8
    }
}

#[repr(C)]
struct IoVec {
    base: *mut c_void,
    len: usize,
}

#[cfg(target_arch = "x86_64")]
const SYS_PROCESS_VM_READV: c_long = 310;
#[cfg(target_arch = "aarch64")]
const SYS_PROCESS_VM_READV: c_long = 270;

/// Reads `out.len()` words of this process's memory at `addr`; false (never a fault) when any
/// of it is not mapped.
pub fn read_own(addr: usize, out: &mut [usize]) -> bool {
    let len = std::mem::size_of_val(out);
    let local = IoVec {
        base: out.as_mut_ptr().cast(),
        len,
    };
    let remote = IoVec {
        base: addr as *mut c_void,
        len,
    };
    // SAFETY: `local` is our own buffer of `len` bytes; the kernel checks `remote`.
    let n = unsafe {
        syscall(
            SYS_PROCESS_VM_READV,
            getpid(),
            &local as *const IoVec,
            1usize,
            &remote as *const IoVec,
            1usize,
            0usize,
        )
    };
    n == len as c_long
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    extern "C" {
        fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int;
    }

    /// Which of the `pages` pages at `p` are resident.
    fn resident(p: *mut u8, pages: usize) -> Vec<bool> {
        let mut vec = vec![0u8; pages];
        // SAFETY: `p` maps `pages` pages; `vec` has a byte for each.
        let r = unsafe { mincore(p.cast(), pages * 4096, vec.as_mut_ptr()) };
        assert_eq!(r, 0);
        vec.iter().map(|b| b & 1 != 0).collect()
    }

    /// The C library's key values are found past the thread pointer (this is glibc), and read
    /// there as `pthread_getspecific` answers, in this thread and in another one started
    /// afterwards, for a key made before the search and one made after it.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn key_values_are_read_at_the_thread_pointer() {
        let mut before = 0u32;
        // SAFETY: `before` is ours to write; no destructor.
        assert_eq!(unsafe { pthread_key_create(&mut before, None) }, 0);
        let slots = key_slots().expect("glibc keeps its first keys in the thread descriptor");
        let mut after = 0u32;
        // SAFETY: as above.
        assert_eq!(unsafe { pthread_key_create(&mut after, None) }, 0);
        let check = move |value: usize| {
            for key in [before, after] {
                let Some(offset) = slots.offset(key) else {
                    assert!(key > before, "the key made first is in the array");
                    continue;
                };
                // SAFETY: a key made above; the value is never dereferenced.
                unsafe { pthread_setspecific(key, (value + key as usize) as *const c_void) };
                // SAFETY: an offset the search found.
                assert_eq!(unsafe { thread_word(offset) }, value + key as usize);
                // SAFETY: a key made above.
                let called = unsafe { pthread_getspecific(key) };
                assert_eq!(called as usize, value + key as usize);
            }
        };
        check(0x1000);
        std::thread::spawn(move || check(0x2000)).join().unwrap();
        // SAFETY: the keys made above, used no more.
        unsafe {
            pthread_key_delete(before);
            pthread_key_delete(after);
        }
        assert_eq!(slots.offset(slots.max_key + 1), None);
    }

    /// The search takes a mark only where it is found exactly once, and stops at memory it
    /// cannot read instead of faulting.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn key_marks_count_only_when_found_once() {
        let marks = [0x5151_0000_0001usize, 0x5151_0000_0002];
        let mut words = vec![0usize; KEY_WINDOW / 8];
        words[10] = marks[0];
        words[20] = marks[1];
        let at = words.as_ptr() as usize;
        assert_eq!(find_once(at, &marks), Some([80, 160]));
        words[30] = marks[1];
        assert_eq!(find_once(at, &marks), None, "a mark found twice");
        words[30] = 0;
        words[20] = 0;
        assert_eq!(find_once(at, &marks), None, "a mark not found");
        // A page whose next page is unmapped (both mapped here, the second unmapped again):
        // the window is read up to the first page's end, no further.
        let p = map_anon(2 * 4096);
        assert!(!p.is_null());
        // SAFETY: the two pages mapped above; the second one is unmapped first.
        unsafe {
            munmap(p.add(4096).cast(), 4096);
            (p as *mut usize).add(3).write(marks[0]);
            (p as *mut usize).add(500).write(marks[1]);
        }
        assert_eq!(
            find_once(p as usize + 2048, &marks),
            None,
            "marks before the start"
        );
        assert_eq!(find_once(p as usize, &marks), Some([24, 4000]));
        // SAFETY: the page mapped above, used no more.
        unsafe { munmap(p.cast(), 4096) };
    }

    /// The samples' clock gives the coarse clock's reading, never goes back, and reads it
    /// every time for a thread that may not read the counter.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_sample_clock_follows_the_coarse_clock() {
        let tsc = tsc_allowed();
        assert!(
            tsc,
            "this machine's threads may read the time-stamp counter"
        );
        let mut c = SampleClock::new();
        let first = c.now(tsc);
        assert!(first > 0 && first <= now_ns());
        let mut last = first;
        for _ in 0..3 * CLOCK_REUSES {
            let t = c.now(tsc);
            assert!(t >= last, "the clock went back");
            last = t;
        }
        assert!(last <= now_ns());
        let mut plain = SampleClock::new();
        for _ in 0..10 {
            assert_eq!(plain.now(false), plain.ns);
            assert_eq!(
                plain.tsc, NEVER_READ,
                "a thread without the counter reads the clock"
            );
        }
        // Past the coarse clock's tick the reading moves on.
        sleep_ns(20_000_000);
        assert!(c.now(tsc) > first, "the reading stood still");
    }

    /// A reading is given again [`CLOCK_REUSES`] times while the counter stands still, then the
    /// clock is read; and at once when the counter moved on by [`CLOCK_TICKS`] (or went back).
    #[test]
    fn the_sample_clock_reads_again_after_so_many_reuses() {
        let mut c = SampleClock::new();
        let t = 5_000_000_000;
        assert!(!c.reuse(t), "the first reading is read");
        let given = (0..2 * CLOCK_REUSES).take_while(|_| c.reuse(t)).count();
        assert_eq!(given as u64, CLOCK_REUSES);
        assert!(c.reuse(t + 10), "counted from the new reading");
        assert!(c.reuse(t + CLOCK_TICKS / 2));
        assert!(!c.reuse(t + CLOCK_TICKS + 10), "the counter moved on");
        assert!(!c.reuse(t), "the counter went back");
    }

    /// Page faults the calling thread has taken (getrusage's `ru_minflt`).
    fn faults() -> i64 {
        let mut usage = [0i64; 18];
        // SAFETY: getrusage (98) with RUSAGE_THREAD (1) fills a 144-byte `struct rusage`.
        assert_eq!(unsafe { syscall(98, 1, usage.as_mut_ptr()) }, 0);
        usage[8]
    }

    /// The pages touched are resident afterwards and writable without a fault (a read would
    /// have mapped the shared zero page, and the first write would fault), the others not,
    /// and no byte changed.
    #[test]
    fn touched_pages_are_resident_and_unchanged() {
        let p = map_anon(8 * 4096);
        assert!(!p.is_null());
        assert_eq!(resident(p, 8), vec![false; 8]);
        // SAFETY: the first of the eight pages, mapped above.
        unsafe { p.add(5).write(7) };
        // SAFETY: pages 0..5 of the mapping (the last one partly).
        unsafe { touch_pages_for_writing(p, 4 * 4096 + 1) };
        assert_eq!(
            resident(p, 8),
            [true, true, true, true, true, false, false, false]
        );
        let before = faults();
        for page in 0..5 {
            // SAFETY: within the mapping; the byte's own value written back.
            unsafe {
                p.add(page * 4096)
                    .write_volatile(p.add(page * 4096).read_volatile())
            };
        }
        assert_eq!(faults() - before, 0, "a touched page faulted when written");
        // SAFETY: the mapping's 8 pages, unmapped right after.
        let bytes = unsafe { std::slice::from_raw_parts(p, 8 * 4096) };
        assert!(bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i == 5) as u8 * 7));
        // SAFETY: the mapping made above, used no more.
        unsafe { munmap(p.cast(), 8 * 4096) };
    }
}
