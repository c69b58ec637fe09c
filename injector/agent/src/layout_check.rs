//! Fail closed: before any hook trusts a layout row, check it against the running interpreter
//! with reads that cannot fault (`process_vm_readv` on this process). A Python built with other
//! options (a debug build, a vendor patch) is refused, never walked with the wrong offsets.
//!
//! What is checked:
//! - `ob_type` sits where the row says: `PyCode_Type` and `PyUnicode_Type` are of type
//!   `PyType_Type` there;
//! - every frame of the calling thread, if it runs Python code, holds a code object whose
//!   file name and name are `str` objects with a plausible compact representation, and whose
//!   first line is plausible.

use crate::python::Api;
use crate::sys::read_own;
use mprof_common::layout::{PyLayout, ABSENT};

/// Frames of the calling thread that are checked at most.
const MAX_CHECKED_FRAMES: usize = 64;

fn word(addr: usize) -> Option<usize> {
    let mut w = [0usize; 1];
    (addr != 0 && read_own(addr, &mut w)).then_some(w[0])
}

fn at(base: usize, off: u16) -> Option<usize> {
    if off == ABSENT {
        return None;
    }
    word(base.checked_add(off as usize)?)
}

fn type_of(l: &PyLayout, obj: usize) -> Option<usize> {
    at(obj, l.object_type)
}

/// Why `l` does not fit the running interpreter, if it does not.
pub fn check(api: &Api, l: &PyLayout) -> Result<(), String> {
    let (code_t, type_t, str_t) = (
        api.code_type as usize,
        api.type_type as usize,
        api.unicode_type as usize,
    );
    if code_t == 0 || type_t == 0 || str_t == 0 {
        return Err(
            "the interpreter does not export PyCode_Type, PyType_Type and PyUnicode_Type".into(),
        );
    }
    for (name, t) in [("PyCode_Type", code_t), ("PyUnicode_Type", str_t)] {
        if type_of(l, t) != Some(type_t) {
            return Err(format!(
                "{name} has no type at offset {} (a debug build, or a patched interpreter?)",
                l.object_type
            ));
        }
    }
    // SAFETY: both functions only read the interpreter's state; no allocation.
    if unsafe { (api.is_initialized)() } == 0 {
        return Ok(());
    }
    // SAFETY: PyGILState_GetThisThreadState reads a thread-local; no GIL needed.
    let tstate = unsafe { (api.this_thread_state)() } as usize;
    if tstate == 0 {
        return Ok(());
    }
    check_frames(l, tstate, code_t, str_t)
}

fn check_frames(l: &PyLayout, tstate: usize, code_t: usize, str_t: usize) -> Result<(), String> {
    let bad = |what: &str| {
        Err(format!(
            "{what} (the interpreter's layout is not the one expected)"
        ))
    };
    let mut f = at(tstate, l.tstate_frame).unwrap_or(0);
    if l.cframe_current_frame != ABSENT && f != 0 {
        f = at(f, l.cframe_current_frame).unwrap_or(0);
    }
    for _ in 0..MAX_CHECKED_FRAMES {
        if f == 0 {
            return Ok(());
        }
        let Some(code) = at(f, l.frame_code) else {
            return bad("a frame cannot be read");
        };
        if code == 0 {
            // Every frame of every supported version has its code (or executable).
            return bad("a frame has no code");
        }
        let owned_by_c = l.owner_cstack != ABSENT
            && at(f, l.frame_owner).map(|w| w as u8 as u16) == Some(l.owner_cstack);
        if !owned_by_c {
            let is_code = type_of(l, code) == Some(code_t);
            if !is_code && l.minor < 13 {
                return bad("a frame's code is not a code object");
            }
            if is_code {
                check_code(l, code, str_t)?;
            }
        }
        f = match at(f, l.frame_back) {
            Some(next) => next,
            None => return bad("a frame's link cannot be read"),
        };
    }
    Ok(())
}

fn check_code(l: &PyLayout, code: usize, str_t: usize) -> Result<(), String> {
    for (what, off) in [("file name", l.code_filename), ("name", l.code_name)] {
        let s = at(code, off).unwrap_or(0);
        if s == 0 || type_of(l, s) != Some(str_t) {
            return Err(format!("a code object's {what} is not a str"));
        }
        let state = at(s, l.unicode_state).unwrap_or(0) as u32;
        let kind = (state >> 2) & 7;
        let length = at(s, l.unicode_length).unwrap_or(usize::MAX);
        if !matches!(kind, 1 | 2 | 4) || length > 1 << 24 {
            return Err(format!("a code object's {what} is not a str as expected"));
        }
    }
    let first = at(code, l.code_firstlineno).unwrap_or(0) as u32;
    if first > 10_000_000 {
        return Err("a code object's first line is implausible".into());
    }
    Ok(())
}
