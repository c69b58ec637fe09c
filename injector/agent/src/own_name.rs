//! The name the agent is known by in the loader's list of objects.
//!
//! The agent is loaded from a memory file through the name `/proc/self/fd/N` (N the descriptor
//! the loading process had for it, closed since). The loader keeps that name, and debuggers
//! read it from the loader's list (`r_debug`) and open it *in their own process*: there,
//! `/proc/self/fd/N` is whatever the debugger has open under N, such as one of its own pipes,
//! and `gdb -p PID` blocked reading it for ever, leaving the process stopped (so did memray's
//! attach, which drives gdb). So the agent renames itself, once loaded, to the name its memory
//! file has in the process's memory map: the same in every process, and never a file anyone
//! can open (a debugger warns that it has no symbols for it and goes on).

use crate::sys;
use std::ffi::{c_char, c_void};

/// The name the agent takes: its memory file's, as `/proc/PID/maps` shows it.
const NAME: &[u8] = b"/memfd:mprof-agent.so (deleted)\0";

/// The public head of glibc's and musl's `struct link_map`.
#[repr(C)]
struct LinkMap {
    addr: usize,
    name: *mut c_char,
}

/// `dladdr1`'s flag asking for the object's `struct link_map`.
const RTLD_DL_LINKMAP: i32 = 2;

/// Renames the agent in the loader's list, if it is loaded under a `/proc/self/fd/` name.
pub fn rename() {
    let here = rename as *const c_void;
    let mut info = std::mem::MaybeUninit::<sys::DlInfo>::uninit();
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 writes `info` and, with RTLD_DL_LINKMAP, the agent's own link map into
    // `map`; an address inside the agent is always inside a loaded object.
    if unsafe { sys::dladdr1(here, info.as_mut_ptr(), &mut map, RTLD_DL_LINKMAP) } == 0
        || map.is_null()
    {
        return;
    }
    let map = map as *mut LinkMap;
    // SAFETY: the loader's link map of this object: its name is a NUL-terminated string
    // (possibly empty), valid while the object is loaded (for ever: the agent is never
    // unloaded).
    let old = unsafe { std::ffi::CStr::from_ptr((*map).name) };
    if !old.to_bytes().starts_with(b"/proc/self/fd/") {
        return;
    }
    // The loader frees an object's name when it unloads it: the new one comes from the same
    // allocator. The old one is left as it is (a reader may hold it).
    // SAFETY: a fresh allocation of NAME's length, filled before it is published.
    unsafe {
        let copy = sys::malloc(NAME.len()) as *mut u8;
        if copy.is_null() {
            return;
        }
        std::ptr::copy_nonoverlapping(NAME.as_ptr(), copy, NAME.len());
        // One aligned pointer store: readers of the list (`dl_iterate_phdr` in other threads)
        // see the old name or the new, both valid.
        std::ptr::write_volatile(std::ptr::addr_of_mut!((*map).name), copy as *mut c_char);
    }
}
