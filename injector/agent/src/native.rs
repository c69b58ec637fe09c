//! Hooks of the C allocator family (`malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`) and of anonymous
//! memory mappings (`mmap`, `mmap64`, `munmap`, `mremap`), reached through the GOT entries
//! that `got` points here, plus `dlopen` to patch the objects it loads, `dlclose` to have
//! the memory map read before a library goes (`--native`), and `pthread_create` to note which
//! Python stack created each thread (`spawns`).
//!
//! The fast path is the RAW domain's: one per-thread countdown, shared by the allocator family
//! and `mmap` (bytes are bytes), then the real function (the agent's own GOT, never patched).
//! Frees go through the same filter of sampled addresses as Python's. File-backed mappings are
//! not heap: they pass straight through.
//!
//! The hooks are reached only through the GOT entries of the functions they stand for, so
//! they are called as those are, with their arguments, and each passes the call on to the
//! real function with the same arguments (a block it frees or reallocates is the C library's,
//! as the caller's contract with that function says); they run on the calling thread, as a
//! sample requires (`sampling::sampled_alloc`).

use crate::addrset::maybe_sampled;
use crate::got::{self, Hook, Scope};
use crate::lifecycle;
use crate::sampler::{self, THREAD};
use crate::sampling::{self, MMAP, NATIVE};
use crate::sys;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// An address inside the interpreter's image (`Py_GetVersion`), set at install.
static INTERPRETER: AtomicUsize = AtomicUsize::new(0);

#[inline(always)]
fn count_down(size: usize) -> bool {
    THREAD.with(|t| t.busy.get() || sampler::take(&t.native_countdown, size))
}

/// An allocation of `size` bytes (`call` makes it), sampled when the countdown runs out.
///
/// # Safety
/// From a hook, on the allocating thread (see the module's doc).
#[inline(always)]
unsafe fn alloc(size: usize, domain: usize, call: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if count_down(size) {
        return call();
    }
    // SAFETY: this function's contract.
    unsafe { slow_alloc(size, domain, call) }
}

/// The slow path of [`alloc`], out of line: the hooks' fast path keeps nothing across it.
///
/// # Safety
/// As for [`alloc`].
#[cold]
#[inline(never)]
unsafe fn slow_alloc(
    size: usize,
    domain: usize,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    // The native domains ask for the size they were given (see `sampling::asked`).
    // SAFETY: from a hook, on the allocating thread (contract).
    unsafe { sampling::sampled_alloc(domain, 0, size, |_| call()) }
}

#[inline(always)]
fn free_check(ptr: *mut c_void) {
    if maybe_sampled(ptr as usize) {
        record_free(ptr);
    }
}

/// [`sampling::sampled_free`], out of line: the hooks' fast path keeps nothing across it.
#[cold]
#[inline(never)]
fn record_free(ptr: *mut c_void) {
    sampling::sampled_free(ptr as usize);
}

// In the hooks below, "the caller's call" is the call the hook stands in for, passed on to
// the real function with the caller's arguments (see the module's doc).

unsafe extern "C" fn hook_malloc(size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(size, NATIVE, || sys::malloc(size)) }
}

unsafe extern "C" fn hook_calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(n.saturating_mul(size), NATIVE, || sys::calloc(n, size)) }
}

unsafe extern "C" fn hook_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    let ran_out = !count_down(size);
    if ran_out || maybe_sampled(ptr as usize) {
        // SAFETY: from this hook, on the reallocating thread; the caller's call.
        return unsafe {
            sampling::sampled_realloc(NATIVE, 0, ptr as usize, size, ran_out, |_| {
                sys::realloc(ptr, size)
            })
        };
    }
    // SAFETY: the caller's call.
    unsafe { sys::realloc(ptr, size) }
}

unsafe extern "C" fn hook_reallocarray(ptr: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let total = n.saturating_mul(size);
    let ran_out = !count_down(total);
    if ran_out || maybe_sampled(ptr as usize) {
        // SAFETY: from this hook, on the reallocating thread; the caller's call.
        return unsafe {
            sampling::sampled_realloc(NATIVE, 0, ptr as usize, total, ran_out, |_| {
                sys::reallocarray(ptr, n, size)
            })
        };
    }
    // SAFETY: the caller's call.
    unsafe { sys::reallocarray(ptr, n, size) }
}

unsafe extern "C" fn hook_free(ptr: *mut c_void) {
    if maybe_sampled(ptr as usize) {
        // SAFETY: the caller's free of `ptr`.
        return unsafe { slow_free(ptr) };
    }
    // SAFETY: the caller's call.
    unsafe { sys::free(ptr) }
}

/// A free that passed the filter, out of line so that `hook_free` saves no register; the
/// common case calls nothing either (`sampling::sampled_free_here`), and saves none.
///
/// # Safety
/// `ptr` is what a caller of `free` may free.
#[cold]
#[inline(never)]
unsafe fn slow_free(ptr: *mut c_void) {
    if !sampling::sampled_free_here(ptr as usize) {
        // SAFETY: this function's contract.
        return unsafe { slow_free_rest(ptr) };
    }
    // SAFETY: a block the caller may free (contract).
    unsafe { sys::free(ptr) }
}

/// [`slow_free`] when its common case did not apply.
///
/// # Safety
/// As for [`slow_free`].
#[cold]
#[inline(never)]
unsafe fn slow_free_rest(ptr: *mut c_void) {
    sampling::sampled_free(ptr as usize);
    // SAFETY: a block the caller may free (contract).
    unsafe { sys::free(ptr) }
}

unsafe extern "C" fn hook_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    let mut ret = 0;
    // SAFETY: from this hook, on the allocating thread; the caller's call, whose `out` holds
    // the block's address once it succeeded.
    let p = unsafe {
        alloc(size, NATIVE, || {
            ret = sys::posix_memalign(out, align, size);
            if ret == 0 {
                *out
            } else {
                std::ptr::null_mut()
            }
        })
    };
    let _ = p;
    ret
}

unsafe extern "C" fn hook_aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(size, NATIVE, || sys::aligned_alloc(align, size)) }
}

unsafe extern "C" fn hook_memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(size, NATIVE, || sys::memalign(align, size)) }
}

unsafe extern "C" fn hook_valloc(size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(size, NATIVE, || sys::valloc(size)) }
}

unsafe extern "C" fn hook_pvalloc(size: usize) -> *mut c_void {
    // SAFETY: from this hook, on the allocating thread; the caller's call.
    unsafe { alloc(size, NATIVE, || sys::pvalloc(size)) }
}

unsafe extern "C" fn hook_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    let call = || {
        // SAFETY: the caller's call.
        let p = unsafe { sys::mmap(addr, len, prot, flags, fd, off) };
        if p == sys::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p
        }
    };
    let p = if flags & sys::MAP_ANONYMOUS != 0 {
        // SAFETY: from this hook, on the mapping thread.
        unsafe { alloc(len, MMAP, call) }
    } else {
        call()
    };
    if p.is_null() {
        sys::MAP_FAILED
    } else {
        p
    }
}

unsafe extern "C" fn hook_munmap(addr: *mut c_void, len: usize) -> c_int {
    // A mapping is counted as freed when its start is unmapped (all of it, or its head).
    free_check(addr);
    // SAFETY: the caller's call.
    unsafe { sys::munmap(addr, len) }
}

unsafe extern "C" fn hook_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let call = || {
        // SAFETY: the caller's call.
        let p = unsafe { sys::mremap(old, old_len, new_len, flags, new_addr) };
        if p == sys::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p
        }
    };
    let ran_out = !count_down(new_len);
    let p = if ran_out || maybe_sampled(old as usize) {
        // SAFETY: from this hook, on the remapping thread.
        unsafe { sampling::sampled_realloc(MMAP, 0, old as usize, new_len, ran_out, |_| call()) }
    } else {
        call()
    };
    if p.is_null() {
        sys::MAP_FAILED
    } else {
        p
    }
}

unsafe extern "C" fn hook_dlopen(name: *const c_char, flags: c_int) -> *mut c_void {
    // SAFETY: the caller's call.
    let handle = unsafe { sys::dlopen(name, flags) };
    if !handle.is_null() {
        // Whatever it loaded imports the allocator family too.
        THREAD.with(|t| {
            let was = t.busy.replace(true);
            got::rescan(&hooks(), agent(), INTERPRETER.load(Ordering::Relaxed));
            t.busy.set(was);
        });
    }
    handle
}

/// `dlclose`: with native stacks, the reader reads the memory map before the library may go
/// (`lifecycle::before_unload`), so that the samples still in the ring that name its code
/// can be symbolized.
unsafe extern "C" fn hook_dlclose(handle: *mut c_void) -> c_int {
    let inside_agent = THREAD.with(|t| t.busy.get());
    if !inside_agent && lifecycle::native_on() {
        lifecycle::before_unload();
    }
    // SAFETY: the caller's call.
    unsafe { sys::dlclose(handle) }
}

/// `dlsym`: a lookup of a hooked function (ctypes' `libc.malloc`, cffi) gets its hook.
unsafe extern "C" fn hook_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the caller's call.
    let found = unsafe { sys::dlsym(handle, name) };
    if found.is_null() || !lifecycle::native_on() {
        return found;
    }
    real_to_hook()
        .iter()
        .find(|&&(real, _)| real == found as usize)
        .map_or(found, |&(_, hook)| hook as *mut c_void)
}

/// `execve`, `posix_spawn`, `posix_spawnp` of the interpreter and its extension modules: under
/// `record --follow-children`, an environment of the program's own gets the agent and the
/// rendezvous back (see `exec_env`).
unsafe extern "C" fn hook_execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's `envp`, as exec takes it; the caller's call, with it or with the
    // array `with_follow_env` made (as exec takes it too).
    unsafe { crate::exec_env::with_follow_env(envp, |envp| sys::execve(path, argv, envp)) }
}

/// `posix_spawn`, or with `PATH` `posix_spawnp` (which looks `path` up in `PATH`).
unsafe extern "C" fn hook_posix_spawn<const PATH: bool>(
    pid: *mut c_int,
    path: *const c_char,
    file_actions: *const c_void,
    attr: *const c_void,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let real = if PATH {
        sys::posix_spawnp
    } else {
        sys::posix_spawn
    };
    // SAFETY: the caller's `envp`, as exec takes it; the caller's call, with it or with the
    // array `with_follow_env` made (as exec takes it too).
    unsafe {
        crate::exec_env::with_follow_env(envp, |envp| {
            real(pid, path, file_actions, attr, argv, envp)
        })
    }
}

/// `pthread_create`: the creating thread's stack before the call, the new thread's handle
/// after it (see `spawns`); the start routine is passed on as it is.
unsafe extern "C" fn hook_pthread_create(
    thread: *mut usize,
    attr: *const c_void,
    start: *const c_void,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: from this hook, on the creating thread.
    let serial = unsafe { crate::spawns::before_create(thread) };
    // SAFETY: the caller's call.
    let ret = unsafe { sys::pthread_create(thread, attr, start, arg) };
    if serial != 0 {
        // SAFETY: a successful call stored the new thread's handle at `thread`, the caller's
        // word, which the caller may read now too.
        let handle = if ret == 0 { unsafe { *thread } } else { 0 };
        crate::spawns::after_create(serial, handle as u64);
    }
    ret
}

/// The real functions (as the agent itself calls them) and their hooks.
fn real_to_hook() -> [(usize, usize); 12] {
    let p = |f: *const ()| f as usize;
    [
        (p(sys::malloc as *const ()), p(hook_malloc as *const ())),
        (p(sys::calloc as *const ()), p(hook_calloc as *const ())),
        (p(sys::realloc as *const ()), p(hook_realloc as *const ())),
        (
            p(sys::reallocarray as *const ()),
            p(hook_reallocarray as *const ()),
        ),
        (p(sys::free as *const ()), p(hook_free as *const ())),
        (
            p(sys::posix_memalign as *const ()),
            p(hook_posix_memalign as *const ()),
        ),
        (
            p(sys::aligned_alloc as *const ()),
            p(hook_aligned_alloc as *const ()),
        ),
        (p(sys::memalign as *const ()), p(hook_memalign as *const ())),
        (p(sys::valloc as *const ()), p(hook_valloc as *const ())),
        (p(sys::pvalloc as *const ()), p(hook_pvalloc as *const ())),
        (p(sys::mmap as *const ()), p(hook_mmap as *const ())),
        (p(sys::munmap as *const ()), p(hook_munmap as *const ())),
    ]
}

fn hook(name: &'static std::ffi::CStr, addr: usize, scope: Scope) -> Hook {
    let real = real_to_hook()
        .iter()
        .find(|&&(_, h)| h == addr)
        .map_or(0, |&(real, _)| real);
    Hook {
        name,
        addr,
        scope,
        real,
    }
}

/// The hooked functions.
fn hooks() -> [Hook; 21] {
    use Scope::{Everywhere, NotInterpreter, PythonCode};
    [
        hook(c"malloc", hook_malloc as *const () as usize, NotInterpreter),
        hook(c"calloc", hook_calloc as *const () as usize, NotInterpreter),
        hook(
            c"realloc",
            hook_realloc as *const () as usize,
            NotInterpreter,
        ),
        hook(
            c"reallocarray",
            hook_reallocarray as *const () as usize,
            NotInterpreter,
        ),
        hook(c"free", hook_free as *const () as usize, NotInterpreter),
        hook(
            c"posix_memalign",
            hook_posix_memalign as *const () as usize,
            NotInterpreter,
        ),
        hook(
            c"aligned_alloc",
            hook_aligned_alloc as *const () as usize,
            NotInterpreter,
        ),
        hook(
            c"memalign",
            hook_memalign as *const () as usize,
            NotInterpreter,
        ),
        hook(c"valloc", hook_valloc as *const () as usize, NotInterpreter),
        hook(
            c"pvalloc",
            hook_pvalloc as *const () as usize,
            NotInterpreter,
        ),
        hook(c"mmap", hook_mmap as *const () as usize, NotInterpreter),
        hook(c"mmap64", hook_mmap as *const () as usize, NotInterpreter),
        hook(c"munmap", hook_munmap as *const () as usize, NotInterpreter),
        hook(c"mremap", hook_mremap as *const () as usize, NotInterpreter),
        hook(c"dlopen", hook_dlopen as *const () as usize, Everywhere),
        hook(c"dlclose", hook_dlclose as *const () as usize, Everywhere),
        hook(
            c"pthread_create",
            hook_pthread_create as *const () as usize,
            Everywhere,
        ),
        hook(c"dlsym", hook_dlsym as *const () as usize, PythonCode),
        hook(c"execve", hook_execve as *const () as usize, PythonCode),
        hook(
            c"posix_spawn",
            hook_posix_spawn::<false> as *const () as usize,
            PythonCode,
        ),
        hook(
            c"posix_spawnp",
            hook_posix_spawn::<true> as *const () as usize,
            PythonCode,
        ),
    ]
}

/// An address inside the agent.
fn agent() -> usize {
    hook_malloc as *const () as usize
}

/// Points every loaded object's GOT entries at the hooks for the session numbered `serial`;
/// returns whether it did (not if that session ended meanwhile). `interpreter` is an address
/// inside the interpreter's image (`Py_GetVersion`). Called by `lifecycle::start` (which
/// starts sampling native allocations if so) without the session lock held (the scan takes
/// the loader's lock). `lifecycle` stops the sampling and restores the entries.
pub fn install(interpreter: *const c_void, serial: u64) -> bool {
    INTERPRETER.store(interpreter as usize, Ordering::Relaxed);
    got::patch_all(&hooks(), agent(), interpreter as usize, serial)
}
