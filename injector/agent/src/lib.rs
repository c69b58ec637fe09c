//! The mprof agent: a small library loaded into a CPython process (by `LD_PRELOAD` for
//! `mprof record`, by ptrace for `mprof attach`). It hooks the interpreter's allocators, samples
//! allocations, and streams the samples into a shared-memory ring that mprof drains.
//!
//! It links nothing but libc, finds CPython's symbols with `dlsym`, never calls into Python on
//! the hot path, and is never unloaded.
//!
//! Modules, bottom up: `glibc_floor` (old symbol versions), `sys` (libc), `lock` (the spin
//! lock), `prot` (page protections), `own_name`, `cycles`, `map_request`, `exec_env`, `python`
//! (the interpreter's API), `code_dealloc`, `pyframes` (stack walking), `layout_check`,
//! `stacks`, `addrset` (sampled blocks), `sampler` (countdowns), `chain` (the allocator chain
//! and the hook layers in it), `heap_stats` (the allocators' own figures), `got`, `cfi`,
//! `unwind` (native stacks), `follow` (children), `lifecycle` (the one owner of a session: start, stop), `sample_stack`, `sampling` (the
//! hooks' slow path), `spawns` (where threads come from), `hooks` (the hooks' fast path), `native` (the C allocator's hooks),
//! `locks` (their order, the fork handlers), and here the entry points.
//!
//! Each module imports only modules before it in that list (`injector/agent/tests/layers.rs`
//! checks it).

// Every unsafe operation, in an `unsafe fn` too, sits in an `unsafe` block whose SAFETY comment
// says why it is sound (attributes of the crate root: the agent's bare-rustc build obeys them).
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod addrset;
#[cfg(target_arch = "x86_64")]
mod cfi;
mod chain;
mod code_dealloc;
mod cycles;
mod exec_env;
mod follow;
// The cdylib's own build only: test and Miri builds link (or interpret) without it.
#[cfg(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_env = "gnu",
    not(test),
    not(miri)
))]
mod glibc_floor;
mod got;
mod heap_stats;
mod hooks;
mod layout_check;
mod lifecycle;
mod lock;
mod locks;
mod map_request;
mod native;
mod own_name;
mod prot;
mod pyframes;
mod python;
mod sample_stack;
mod sampler;
mod sampling;
mod spawns;
mod stacks;
mod sys;
mod unwind;

use mprof_common::layout::ABSENT;
use mprof_common::record::EndReason;
use mprof_common::ring::{RingHeader, STATE_FAILED, STATE_WAITING};
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::Ordering;

/// Environment variable naming the inherited ring file descriptor (record mode).
const ENV_RING_FD: &CStr = c"MPROF_RING_FD";
/// Environment variable naming the inherited agent-image descriptor (record mode).
const ENV_AGENT_FD: &CStr = c"MPROF_AGENT_FD";
/// How children are followed (`record --follow-children`), see `mprof_common::children`.
const ENV_FOLLOW: &CStr = c"MPROF_FOLLOW";
/// The `LD_PRELOAD` the user had before mprof prepended the agent ("" if none).
const ENV_SAVED_PRELOAD: &CStr = c"MPROF_SAVED_LD_PRELOAD";

fn env_fd(name: &CStr) -> Option<c_int> {
    // SAFETY: getenv with a NUL-terminated name; the result is read before any setenv.
    let v = unsafe { sys::getenv(name.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    unsafe { CStr::from_ptr(v) }.to_str().ok()?.parse().ok()
}

/// Removes mprof's variables from the environment so that the program and its children see the
/// environment they would have had without mprof.
fn restore_environment() {
    // SAFETY: NUL-terminated names and values; runs in the loader's constructor, before any
    // other thread of the program exists.
    unsafe {
        let saved = sys::getenv(ENV_SAVED_PRELOAD.as_ptr());
        if saved.is_null() || *saved == 0 {
            sys::unsetenv(c"LD_PRELOAD".as_ptr());
        } else {
            sys::setenv(c"LD_PRELOAD".as_ptr(), saved as *const c_char, 1);
        }
        for name in [ENV_SAVED_PRELOAD, ENV_RING_FD, ENV_AGENT_FD] {
            sys::unsetenv(name.as_ptr());
        }
    }
}

/// Maps the ring behind `fd`.
fn map_ring(fd: c_int) -> Option<(*mut u8, usize)> {
    // SAFETY: lseek on a descriptor this process owns; no memory is touched.
    let len = unsafe { sys::lseek(fd, 0, sys::SEEK_END) };
    if len <= 0 {
        return None;
    }
    // SAFETY: a fresh shared mapping of the ring's memory file; failure is checked.
    let p = unsafe {
        sys::mmap(
            std::ptr::null_mut(),
            len as usize,
            sys::PROT_READ | sys::PROT_WRITE,
            sys::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != sys::MAP_FAILED).then_some((p as *mut u8, len as usize))
}

/// Claims the ring at `base` for this process and starts sampling. Returns 0 on success.
///
/// # Safety
/// `base` maps `len` bytes (at least a header) of a ring made by mprof, a mapping of this
/// process's own that nothing else uses: the session owns it from now on, or it is unmapped.
unsafe fn claim_and_start(base: *mut u8, len: usize) -> c_int {
    // SAFETY: the ring's header, mapped (contract); its shared words are atomics.
    let h = unsafe { &*(base as *const RingHeader) };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { sys::getpid() } as u32;
    if h.agent_pid
        .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        // SAFETY: the mapping is this function's to undo (contract); `h` is not used after.
        unsafe { sys::munmap(base.cast(), len) };
        return 3; // another process (our parent, say) took it first
    }
    if python::api().is_some() {
        // SAFETY: the header of the ring this process just claimed, which mprof reads only
        // once a session is active on it.
        unsafe { python::write_version(h as *const RingHeader as *mut RingHeader) };
    }
    locks::register_fork_handlers();
    // SAFETY: the ring's mapping, the session's from now on (contract).
    match unsafe { lifecycle::start(base, len, &hooks::TABLE, native::install) } {
        Ok(()) => 0,
        Err(e) => {
            lifecycle::write_message(h, &e.text());
            h.state.store(STATE_FAILED, Ordering::Release);
            // This ring is the refused one (a running session has its own): never keep it.
            // SAFETY: the refused start kept nothing of the mapping; `h` is not used after.
            unsafe { sys::munmap(base.cast(), len) };
            1
        }
    }
}

/// Record mode: runs when the dynamic loader loads the agent through `LD_PRELOAD`, before
/// `main`, so the hooks are in place before the interpreter runs a line of Python.
extern "C" fn preload_init() {
    own_name::rename();
    let follow_text = env_text(ENV_FOLLOW);
    let follow = follow_text.as_deref().and_then(|text| {
        let (name, ring) = mprof_common::children::parse_follow_env(text)?;
        Some((name.to_string(), ring))
    });
    if let (Some(text), Some(_)) = (&follow_text, &follow) {
        // Children started with environments of their own get the agent and the rendezvous
        // back (see `exec_env`).
        let preload = env_text(c"LD_PRELOAD").unwrap_or_default();
        exec_env::arm(text.as_bytes(), preload.as_bytes());
    }
    let Some(ring_fd) = env_fd(ENV_RING_FD) else {
        // Not the program mprof started: a Python started by exec under a followed tree.
        if let (Some((name, ring)), Some(_)) = (follow, python::api()) {
            follow::remember_env(&name, ring);
            start_own_ring(mprof_common::children::BORN_EXECED);
        }
        return;
    };
    if python::api().is_none() {
        // A shell or launcher on the way to Python: leave the environment for its children.
        return;
    }
    let agent_fd = env_fd(ENV_AGENT_FD);
    if follow.is_some() {
        // Followed: descendants keep the preload and the rendezvous; only this process's own
        // descriptors are forgotten.
        // SAFETY: NUL-terminated names; in the loader's constructor, before any other thread.
        unsafe {
            sys::unsetenv(ENV_RING_FD.as_ptr());
            sys::unsetenv(ENV_AGENT_FD.as_ptr());
        }
    } else {
        restore_environment();
    }
    let mapped = map_ring(ring_fd);
    // SAFETY: descriptors inherited for the agent alone; nothing else in the process uses them.
    unsafe {
        sys::close(ring_fd);
        if let Some(fd) = agent_fd {
            sys::close(fd);
        }
    }
    if let Some((base, len)) = mapped {
        // SAFETY: `map_ring` mapped at least the header (it checked the length).
        let h = unsafe { &*(base as *const RingHeader) };
        if h.state.load(Ordering::Acquire) == STATE_WAITING {
            // SAFETY: the mapping just made, owned by the session from now on.
            if unsafe { claim_and_start(base, len) } == 0 {
                watch_allocator_setup();
            }
        } else {
            // SAFETY: the mapping just made; nothing else uses it.
            unsafe { sys::munmap(base.cast(), len) };
        }
    }
}

/// A followed child without an inherited ring: makes its own, hands it to mprof and starts a
/// session on it.
fn start_own_ring(born: u32) {
    // SAFETY: getppid has no preconditions.
    let Some(own) = follow::make_and_announce(born, unsafe { sys::getppid() } as u32) else {
        return;
    };
    // SAFETY: the ring just made; its mapping belongs to the session from now on, and the
    // descriptor is not needed once mapped (mprof has its own).
    unsafe {
        sys::close(own.fd);
        if claim_and_start(own.base, own.len) == 0 {
            watch_allocator_setup();
        }
    }
}

fn env_text(name: &CStr) -> Option<String> {
    // SAFETY: getenv with a NUL-terminated name; the result is copied at once.
    let v = unsafe { sys::getenv(name.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(v) }.to_str().ok()?.to_string())
}

/// Record mode: the agent installs its hooks before `main`, and the interpreter may reset its
/// allocators while it initialises (`PYTHONMALLOC`, `-X dev`). An audit hook (PEP 578; it may
/// be added before the interpreter exists and survives its initialisation) gets the first
/// event after start-up (`import`, `cpython.run_file`...), with the GIL held: the agent then
/// puts its hooks back if they were replaced, and takes the audit hook out of the
/// interpreter's list (`leave_audit_hooks`).
///
/// The interpreter keeps the hook in a block it allocates now, with the allocator of this
/// moment, and frees at exit with the allocator of that moment; a debug allocator
/// (`PYTHONMALLOC=debug`, `-X dev`) would then find no header and abort the program. So the
/// block is allocated through `escape::capture_raw`, which remembers it, and the RAW hooks free
/// it with the allocator that made it (when the hook could not be taken out of the list; once
/// out, the block is never freed).
fn watch_allocator_setup() {
    let Some(api) = python::api() else { return };
    let Some(add) = api.add_audit_hook else {
        return;
    };
    // SAFETY: still in the loader's constructor: no other thread runs, so the RAW allocator
    // can be swapped around the call; PySys_AddAuditHook may be called before Py_Initialize;
    // the hook lives as long as the process.
    unsafe {
        hooks::escape::capture_raw(api, || {
            add(first_audit_event, std::ptr::null_mut());
        });
    }
}

static AUDITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

unsafe extern "C" fn first_audit_event(
    _event: *const c_char,
    _args: *mut std::ffi::c_void,
    _data: *mut std::ffi::c_void,
) -> c_int {
    if !AUDITED.swap(true, Ordering::AcqRel) {
        lifecycle::reinstall_if_replaced();
        // SAFETY: an audit event runs with the GIL held, which every reader and writer of the
        // interpreter's list of audit hooks holds too.
        unsafe { leave_audit_hooks() };
    }
    0
}

/// Takes the agent's audit hook out of the interpreter's list once it has served. While any
/// hook is in that list the interpreter builds every audit event's arguments (a tuple) to
/// pass them on: about 140 instructions an event, 0.1% of a tornado server's work.
///
/// There is no API to remove a hook, so the list's head is changed in place: the word of
/// `_PyRuntime` at the layout table's `runtime_audit_head` (`audit_hook_head`, from 3.12
/// `audit_hooks.head`). The agent's hook, added before the interpreter initialised, is the
/// first: that word must hold the address of its entry (`_Py_AuditHookEntry`: next, function,
/// data; the block `escape::capture_raw` saw made), and is replaced with the entry's `next`.
/// The entry stays allocated: an event being raised now goes on to `next` from it. If the word
/// holds anything else (an interpreter laid out otherwise than its headers say), or the entry
/// does not name this hook, the hook stays.
///
/// # Safety
/// With the GIL held, from inside the agent's own audit hook.
unsafe fn leave_audit_hooks() {
    let entry = hooks::escape::block();
    if entry == 0 || !entry.is_multiple_of(std::mem::align_of::<usize>()) {
        return;
    }
    let fields = entry as *const usize;
    // SAFETY: the block `escape::capture_raw` saw the interpreter allocate (aligned, checked
    // above): the hook's `_Py_AuditHookEntry`, three words, never freed while the hook is in
    // the list.
    if unsafe { *fields.add(1) } != first_audit_event as python::AuditHook as usize {
        return;
    }
    // The row of this version: the one the session's start checked (the hook is added only
    // once a session started).
    let Some(layout) =
        python::api().and_then(|api| mprof_common::layout::for_version(api.major, api.minor))
    else {
        return;
    };
    let offset = layout.runtime_audit_head as usize;
    let Some((start, len)) = sys::symbol_extent(c"_PyRuntime") else {
        return;
    };
    let word = std::mem::size_of::<usize>();
    let head = start.wrapping_add(offset);
    if layout.runtime_audit_head == ABSENT
        || offset.saturating_add(word) > len
        || !head.is_multiple_of(std::mem::align_of::<usize>())
    {
        return;
    }
    // Volatile: other threads change parts of `_PyRuntime` without the GIL.
    let head = head as *mut usize;
    // SAFETY: an aligned word inside `_PyRuntime` (its symbol's extent: checked above).
    if unsafe { head.read_volatile() } == entry {
        // SAFETY: the list's head, which holds the entry's address: it takes the entry's
        // `next` (the entry is readable, above), with the GIL held (contract) as every change
        // of the list once the interpreter runs is.
        unsafe { head.write_volatile(*fields) };
    }
}

#[used]
#[link_section = ".init_array"]
static PRELOAD_INIT: extern "C" fn() = preload_init;

/// At `exit()` (the loader runs the destructors of every object, the agent's among them,
/// without its lock held): with native stacks, ends the session of a program that is done and
/// gives the reader its bounded moment to read the memory map (`lifecycle::at_exit`).
/// Loaded by `record` or `attach` alike; `_exit` and fatal signals skip it.
extern "C" fn agent_fini() {
    // Not from inside the agent (`exit()` called by a signal handler that interrupted this
    // thread in the slow path, which may hold the session lock).
    let inside_agent = sampler::THREAD.try_with(|t| t.busy.get()).unwrap_or(true);
    if !inside_agent {
        lifecycle::at_exit();
    }
}

#[used]
#[link_section = ".fini_array"]
static AGENT_FINI: extern "C" fn() = agent_fini;

/// Attach mode: maps the ring behind `fd` (a descriptor of this process) and starts sampling.
/// Returns 0 on success; the ring's header says why otherwise. The caller closes `fd`.
///
/// # Safety
/// `fd` must be a descriptor of a ring made by mprof.
#[no_mangle]
pub unsafe extern "C" fn mprof_agent_start(fd: c_int) -> c_int {
    own_name::rename();
    match map_ring(fd) {
        // SAFETY: the ring just mapped from `fd`, a ring made by mprof (contract).
        Some((base, len)) => unsafe { claim_and_start(base, len) },
        None => 2,
    }
}

/// Checks the layout `row` (a `PyLayout`) against the running interpreter, as every session
/// start does with the row of its version; writes why it does not fit into `msg` (NUL
/// terminated, at most `cap` bytes). Returns 0 when it fits. Exported so that a test can hand
/// the agent a deliberately wrong row in a real interpreter.
///
/// # Safety
/// `row` must point to a `PyLayout`; `msg` to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn mprof_agent_check_layout(
    row: *const mprof_common::layout::PyLayout,
    msg: *mut u8,
    cap: usize,
) -> c_int {
    let Some(api) = python::api() else { return 2 };
    // SAFETY: `row` points to a `PyLayout` (contract).
    match layout_check::check(api, unsafe { &*row }) {
        Ok(()) => 0,
        Err(why) => {
            let n = why.len().min(cap.saturating_sub(1));
            // SAFETY: `n < cap` bytes into the `cap` writable bytes at `msg` (contract), from
            // a string of the agent's own.
            unsafe { std::ptr::copy_nonoverlapping(why.as_ptr(), msg, n) };
            if cap > 0 {
                // SAFETY: `n < cap`: the last of those bytes at most.
                unsafe { *msg.add(n) = 0 };
            }
            1
        }
    }
}

/// Attach mode, at detach: ends the running session (restoring the allocators) for a target
/// that allocated nothing since mprof asked it to stop. Returns 0 if a session was stopped, 1
/// if none was running. The argument is unused (the trampoline passes -1).
#[no_mangle]
pub extern "C" fn mprof_agent_stop(_unused: c_int) -> c_int {
    if lifecycle::stop(EndReason::Detached) {
        0
    } else {
        1
    }
}
