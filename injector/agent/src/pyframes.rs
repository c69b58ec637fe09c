//! Walks the allocating thread's own Python frames with plain loads: no GIL, no allocation, no
//! call that could create a frame object. Offsets come from the generated layout table.

use crate::python::Api;
use mprof_common::layout::{PyLayout, ABSENT};
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// Deepest stack the agent ever records.
pub const MAX_FRAMES: usize = 256;

/// The `T` at `off` bytes into the object at `base`.
///
/// # Safety
/// Those `size_of::<T>()` bytes must be inside the object, readable, and hold a `T` (at any
/// alignment).
unsafe fn read<T: Copy>(base: *const c_void, off: u16) -> T {
    // SAFETY: the caller's contract: in bounds of one object, readable, a valid `T`.
    unsafe { std::ptr::read_unaligned((base as *const u8).add(off as usize) as *const T) }
}

/// The innermost frame of the thread whose state is `tstate`.
///
/// # Safety
/// `tstate` must be the calling thread's own live thread state and `l` the layout of the
/// running interpreter (the session checked it at its start).
unsafe fn top_frame(l: &PyLayout, tstate: *const c_void) -> *const c_void {
    // SAFETY: `tstate_frame` is a pointer field of the live thread state `tstate` in this
    // interpreter's layout.
    let f: *const c_void = unsafe { read(tstate, l.tstate_frame) };
    if l.cframe_current_frame == ABSENT || f.is_null() {
        f
    } else {
        // SAFETY: 3.11–3.12: `f` is the thread's `cframe` (not null here), a live `_PyCFrame`
        // whose `current_frame` pointer is at `cframe_current_frame`.
        unsafe { read(f, l.cframe_current_frame) }
    }
}

/// What a frame holds.
pub enum Found {
    /// A code object and the byte offset of its current instruction.
    Code(*mut c_void, i32),
    /// A frame to skip: owned by the C stack, or (3.13) running no code object.
    Skip,
    /// A frame to skip whose `at` does not tell it from a frame not to skip: not started yet
    /// (a generator's frame at the same instruction is not skipped), or with no code at all.
    /// A thread's cached chain never goes past it.
    Unstarted,
    /// Not a code object where one must be: the layout does not fit this interpreter, or the
    /// frame is being torn down. The walk ends here.
    Broken,
}

/// What frame `f` runs (see [`Found`]).
///
/// # Safety
/// `f` must be a live frame of the calling thread (not null), and `l` the layout of the
/// running interpreter.
pub unsafe fn code_and_offset(api: &Api, l: &PyLayout, f: *const c_void) -> Found {
    // SAFETY: `f` is a live frame (contract); `frame_code` is its code (or executable) pointer.
    let code: *mut c_void = unsafe { read(f, l.frame_code) };
    if code.is_null() {
        return Found::Unstarted;
    }
    // SAFETY: a live frame's non-null `f_code`/`f_executable` is a live object: the frame
    // holds a reference to it.
    if !unsafe { is_code(api, l, code) } {
        // 3.13's f_executable may hold other objects; before, f_code is always a code object.
        return if l.minor >= 13 {
            Found::Skip
        } else {
            Found::Broken
        };
    }
    if l.frame_owner == ABSENT {
        // 3.8–3.10: PyFrameObject with an int f_lasti (in code units from 3.10).
        // SAFETY: `f` is a live `PyFrameObject` (contract), `frame_instr` its int `f_lasti`.
        let lasti: i32 = unsafe { read(f, l.frame_instr) };
        let offset = if lasti < 0 || l.minor < 10 {
            lasti
        } else {
            lasti * 2
        };
        return Found::Code(code, offset);
    }
    // SAFETY: 3.11+: `f` is a live `_PyInterpreterFrame` (contract) and `frame_owner` its
    // `owner` byte.
    let owner: u8 = unsafe { read(f, l.frame_owner) };
    if l.owner_cstack != ABSENT && owner as u16 == l.owner_cstack {
        return Found::Skip;
    }
    // SAFETY: the same live frame; `frame_instr` is its instruction pointer.
    let instr: usize = unsafe { read(f, l.frame_instr) };
    let start = code as usize + l.code_adaptive as usize;
    // SAFETY: `code` is a live code object (checked just above); `_co_firsttraceable` is an
    // int field of it.
    let first_traceable: i32 = unsafe { read(code, l.code_firsttraceable) };
    let incomplete = instr < start + first_traceable as usize * 2;
    if owner as u16 != l.owner_generator && incomplete {
        return Found::Unstarted;
    }
    Found::Code(code, instr as isize as i32 - start as i32)
}

/// A frame as the walk finds it: its code object and the byte offset of its instruction. A
/// null code marks where the walk stopped at something it could not read as a frame.
#[derive(Clone, Copy)]
pub struct RawFrame {
    pub code: *mut c_void,
    pub offset: i32,
    /// The first frame a C-level call of the bytecode loop ran (see `is_entry`).
    pub entry: bool,
}

/// Whether frame `f` (running a code object) was the first one its C-level call of the
/// bytecode loop ran: every frame before 3.11; `is_entry` in 3.11; from 3.12 the frame right
/// above one owned by the C stack (or the outermost).
///
/// # Safety
/// As for [`code_and_offset`].
pub unsafe fn is_entry(l: &PyLayout, f: *const c_void) -> bool {
    if l.frame_owner == ABSENT {
        return true;
    }
    if l.frame_is_entry != ABSENT {
        // SAFETY: 3.11: `f` is a live `_PyInterpreterFrame` (contract); `is_entry` is its bool.
        return unsafe { read::<u8>(f, l.frame_is_entry) } != 0;
    }
    // SAFETY: `f` is a live interpreter frame (contract); `previous` is its link outward.
    let prev: *const c_void = unsafe { read(f, l.frame_back) };
    prev.is_null()
        || (l.owner_cstack != ABSENT
            // SAFETY: a non-null `previous` of a live frame of this thread is a live frame
            // too; `owner` is its byte.
            && unsafe { read::<u8>(prev, l.frame_owner) } as u16 == l.owner_cstack)
}

/// A frame's `at` that cannot be told exactly (a 3.8–3.10 frame whose `f_lasti` does not
/// fit): it and the frames inside it are worked out afresh at every sample.
pub const UNCOMPARABLE: usize = usize::MAX;

/// Fills the end of `out` with what the calling thread's frames run, one word per frame (its
/// `at`), outermost first: the innermost frame's is the last word; and `first` with the
/// addresses of the innermost [`FIRST`] frames, innermost first (as many as there are). Plain
/// loads, no checks. Returns how many and whether the chain ended (false: longer than `out`).
///
/// What a thread's previous sample is compared with to find the frames that did not change
/// (see `stacks`). A frame's `at`, with the `at`s of the frames outside it, says which node
/// it is: from 3.11 the instruction pointer points into the code object (so it names the code
/// and the instruction). 3.11 marks entry frames with a byte of their own: a frame running the
/// same instruction can still differ in it (a C function between it and its caller), so it
/// goes into the pointer's lowest bit. The byte is a C `bool` (0 or 1) and the pointer is
/// even (code units are two bytes), so the pair is told exactly; an OR where the top byte took
/// it took a shift more a frame (testing it for zero made the walk branch at every frame).
/// Only when `entries` (the nodes carry entry marks, which only native stacks need): without
/// them the same instruction makes the same node either way, and the byte is not read.
/// From 3.12 those C functions leave a frame of their own in the chain, whose `at` is the
/// shim's. Before 3.11, `f_lasti` is an index and goes above the code object's address.
/// [`UNCOMPARABLE`] never matches (no user-space address has its top bits set).
///
/// # Safety
/// As for [`walk`].
#[inline(always)]
pub unsafe fn ats(
    l: &PyLayout,
    tstate: *const c_void,
    entries: bool,
    out: &mut [MaybeUninit<usize>],
    first: &mut [MaybeUninit<usize>; FIRST],
) -> (usize, bool) {
    // SAFETY: as for `walk` (the caller's contract).
    let f = unsafe { top_frame(l, tstate) };
    let (back, instr) = (l.frame_back, l.frame_instr);
    // In the three calls of `chain` below, `f` is the calling thread's top frame or null (the
    // caller's contract) and each frame's link outward is at `back`. `chain` calls the closure
    // on the chain's links alone, live frames of this interpreter, and the closure reads
    // fields of that frame where `l` places them.
    if l.frame_owner == ABSENT {
        let code = l.frame_code;
        // SAFETY: see above; the closure reads a `PyFrameObject`'s int `f_lasti` and its
        // `f_code` pointer.
        unsafe {
            chain(f, back, out, first, |f| {
                let lasti = read::<i32>(f, instr) as u32 as usize;
                if lasti < 1 << 16 {
                    read::<usize>(f, code) | lasti << 47
                } else {
                    UNCOMPARABLE
                }
            })
        }
    } else if l.frame_is_entry != ABSENT && entries {
        let entry = l.frame_is_entry;
        // SAFETY: see above; the closure reads a 3.11 `_PyInterpreterFrame`'s `prev_instr`
        // pointer and its `is_entry` bool.
        unsafe {
            chain(f, back, out, first, |f| {
                read::<usize>(f, instr) | read::<u8>(f, entry) as usize
            })
        }
    } else {
        // SAFETY: see above; the closure reads an `_PyInterpreterFrame`'s instruction pointer.
        unsafe { chain(f, back, out, first, |f| read(f, instr)) }
    }
}

/// The innermost frames whose addresses [`ats`] keeps: between two samples of a thread the
/// frames that changed are nearly always among them, and they are not walked again.
pub const FIRST: usize = 4;

/// Walks the chain from `f` for [`ats`] (see there), calling `at` on each link.
///
/// # Safety
/// `f` must be null or a live frame whose pointer at `back` links to the next live frame
/// (null ends the chain); `at` must be sound to call on any such frame.
#[inline(always)]
unsafe fn chain(
    mut f: *const c_void,
    back: u16,
    out: &mut [MaybeUninit<usize>],
    first: &mut [MaybeUninit<usize>; FIRST],
    at: impl Fn(*const c_void) -> usize,
) -> (usize, bool) {
    // Eight links a round while eight slots are left: a deep chain is most of a sample's walk.
    // `room`: the slots not written yet, at the start of `out`. The first round also keeps
    // the frames' addresses.
    let end = out.len();
    let out = out.as_mut_ptr();
    let kept = FIRST.min(end);
    for (k, slot) in first[..kept].iter_mut().enumerate() {
        if f.is_null() {
            return (k, true);
        }
        slot.write(f as usize);
        // SAFETY: `k < kept <= end`: the slot is inside `out`.
        unsafe { (*out.add(end - 1 - k)).write(at(f)) };
        // SAFETY: `f` is a non-null link: a live frame with its link at `back` (contract).
        f = unsafe { read(f, back) };
    }
    let mut room = end - kept;
    while room >= 8 {
        for k in 1..=8 {
            if f.is_null() {
                return (end - room + k - 1, true);
            }
            // SAFETY: `1 <= k <= 8 <= room <= end`: the slot is inside `out`.
            unsafe { (*out.add(room - k)).write(at(f)) };
            // SAFETY: `f` is a non-null link: a live frame with its link at `back` (contract).
            f = unsafe { read(f, back) };
        }
        room -= 8;
    }
    while room > 0 && !f.is_null() {
        room -= 1;
        // SAFETY: `room < end`: the slot is inside `out`.
        unsafe { (*out.add(room)).write(at(f)) };
        // SAFETY: `f` is a non-null link: a live frame with its link at `back` (contract).
        f = unsafe { read(f, back) };
    }
    (end - room, f.is_null())
}

/// Fills `out` with the addresses of the calling thread's innermost `out.len()` frames,
/// innermost first (the chain must be at least that long, as [`ats`] found it).
///
/// # Safety
/// As for [`walk`].
pub unsafe fn innermost(l: &PyLayout, tstate: *const c_void, out: &mut [MaybeUninit<usize>]) {
    // SAFETY: as for `walk` (the caller's contract).
    let mut f = unsafe { top_frame(l, tstate) };
    for slot in out {
        slot.write(f as usize);
        // SAFETY: the chain has at least `out.len()` links (contract): `f` is a live frame of
        // the calling thread, with its link outward at `frame_back`.
        f = unsafe { read(f, l.frame_back) };
    }
}

/// Where a thread's stack is cut at `max` Python frames (see [`cut`]).
pub enum Cut {
    /// The innermost this many links hold the innermost `max` Python frames (and the links
    /// that are no Python frame right outside the last of them); a Python frame lies outside.
    At(usize),
    /// The stack has `max` Python frames or fewer: nothing is cut.
    Whole,
    /// Not to be told here: a link that is no frame the walk can read, or a chain longer than
    /// the links looked at with no Python frame beyond the `max`-th among them.
    Unknown,
}

/// Where the calling thread's stack is cut when it has more than `max` Python frames, looking
/// at its innermost `links` links (its whole chain when `whole`). The cut falls where [`walk`]
/// puts it.
///
/// # Safety
/// As for [`walk`]; the chain has at least `links` links.
pub unsafe fn cut(
    api: &Api,
    l: &PyLayout,
    tstate: *const c_void,
    links: usize,
    whole: bool,
    max: usize,
) -> Cut {
    // SAFETY: as for `walk` (the caller's contract).
    let mut f = unsafe { top_frame(l, tstate) };
    let mut python = 0;
    for k in 0..links {
        // SAFETY: `k < links`, and the chain has at least `links` links (contract): `f` is a
        // live frame of the calling thread.
        match unsafe { code_and_offset(api, l, f) } {
            Found::Code(..) if python == max => return Cut::At(k),
            Found::Code(..) => python += 1,
            Found::Broken => return Cut::Unknown,
            Found::Skip | Found::Unstarted => {}
        }
        // SAFETY: the same live frame; `frame_back` is its link outward.
        f = unsafe { read(f, l.frame_back) };
    }
    if whole {
        Cut::Whole
    } else {
        Cut::Unknown
    }
}

/// Fills `out` with the calling thread's Python frames, innermost first. Returns how many and
/// whether the stack was deeper than `max`.
///
/// # Safety
/// `tstate` must be the calling thread's own thread state (its frames cannot change under us),
/// and `l` the layout of the running interpreter (the session checked it at its start).
pub unsafe fn walk(
    api: &Api,
    l: &PyLayout,
    tstate: *const c_void,
    out: &mut [MaybeUninit<RawFrame>],
    max: usize,
) -> (usize, bool) {
    let max = max.min(out.len());
    let mut n = 0;
    // SAFETY: the caller's contract.
    let mut f = unsafe { top_frame(l, tstate) };
    let mut guard = 0;
    while !f.is_null() && guard < 100_000 {
        guard += 1;
        // SAFETY: `f` is a non-null link of the calling thread's own chain: a live frame.
        let (code, offset) = match unsafe { code_and_offset(api, l, f) } {
            Found::Code(code, offset) => (code, offset),
            Found::Skip | Found::Unstarted => {
                // SAFETY: the same live frame; `frame_back` is its link outward.
                f = unsafe { read(f, l.frame_back) };
                continue;
            }
            Found::Broken => (std::ptr::null_mut(), 0),
        };
        if n == max {
            return (n, true);
        }
        // SAFETY: the same live frame of the calling thread.
        let entry = !code.is_null() && unsafe { is_entry(l, f) };
        out[n].write(RawFrame {
            code,
            offset,
            entry,
        });
        n += 1;
        if code.is_null() {
            break;
        }
        // SAFETY: the same live frame; `frame_back` is its link outward.
        f = unsafe { read(f, l.frame_back) };
    }
    (n, false)
}

/// The source line of an instruction. Allocation-free, but scans the line table: callers cache.
///
/// # Safety
/// `code` must be a live code object.
pub unsafe fn line_of(api: &Api, l: &PyLayout, code: *mut c_void, offset: i32) -> u32 {
    let line = if offset < 0 {
        // SAFETY: `code` is a live code object (contract); `co_firstlineno` is its int.
        unsafe { read::<i32>(code, l.code_firstlineno) }
    } else {
        // SAFETY: `PyCode_Addr2Line` on a live code object (contract); it allocates nothing.
        unsafe { (api.addr2line)(code, offset) }
    };
    line.max(0) as u32
}

/// What identifies a code object's announcement: its address, the strings it names, and what
/// tells two code objects of the same name and file apart. A module's code is freed after its
/// import and the next module's (or the next `exec`'s of a template) often takes its place:
/// one of these differs and it is announced again, and no line or node of the one before is
/// taken for it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeKey {
    pub code: usize,
    pub name: usize,
    pub filename: usize,
    /// `co_version` from 3.12 (each new code object takes the next number); before, how many
    /// code objects were freed at its address (see `code_dealloc::freed_at`), or where they are
    /// not counted, the first line and a print of the line table (see `line_table_print`).
    pub instance: usize,
}

/// Reads the key of a code object.
///
/// # Safety
/// `code` must be a live code object.
pub unsafe fn code_key(l: &PyLayout, code: *const c_void) -> CodeKey {
    let name_off = if l.code_qualname != ABSENT {
        l.code_qualname
    } else {
        l.code_name
    };
    let instance = if l.code_version != ABSENT {
        // SAFETY: `code` is a live code object (contract); 3.12+: `co_version` is its u32.
        unsafe { read::<u32>(code, l.code_version) as usize }
    } else {
        match crate::code_dealloc::freed_at(code as usize) {
            Some(freed) => freed as usize,
            // SAFETY: `code` is a live code object (contract).
            None => unsafe { printed_instance(l, code) },
        }
    };
    CodeKey {
        code: code as usize,
        // SAFETY: `code` is a live code object (contract); `co_qualname` or `co_name` is a
        // pointer field of it.
        name: unsafe { read(code, name_off) },
        // SAFETY: the same live code object; `co_filename` is a pointer field of it.
        filename: unsafe { read(code, l.code_filename) },
        instance,
    }
}

/// What tells a code object from another at its address before 3.12 when the frees of code
/// objects are not counted: the first line (a comprehension's table is empty when it fits on
/// its line) and a print of the line table. Out of line: counted, they are the common case.
///
/// # Safety
/// `code` must be a live code object.
#[cold]
#[inline(never)]
unsafe fn printed_instance(l: &PyLayout, code: *const c_void) -> usize {
    // SAFETY: `code` is a live code object (contract): its line table (`co_lnotab` or
    // `co_linetable`) is NULL or a bytes object it holds alive; `co_firstlineno` is an int.
    unsafe {
        line_table_print(l, read(code, l.code_linetable))
            ^ (read::<i32>(code, l.code_firstlineno) as u32 as usize).rotate_left(20)
    }
}

/// What tells a code object's line table (a bytes object) from another's before 3.12: its
/// address, its length, and its first and last eight bytes (all of it when shorter). Template
/// code compiled again and again under one file name often takes the address of the code
/// before it and of its line table too; its lines differ in the table's bytes.
///
/// # Safety
/// `table` is NULL or a live bytes object.
unsafe fn line_table_print(l: &PyLayout, table: *const c_void) -> usize {
    if table.is_null() {
        return 0;
    }
    // SAFETY: `table` is a live bytes object (contract, not null here); `ob_size` is its length.
    let len: isize = unsafe { read(table, l.bytes_size) };
    let mut print = table as usize ^ (len as usize).rotate_left(40);
    // SAFETY: `ob_sval`, the first byte of the same object.
    let data = unsafe { (table as *const u8).add(l.bytes_data as usize) };
    if len >= 8 {
        // SAFETY: the bytes object holds `len >= 8` bytes from `data`: its first and last eight.
        let first = unsafe { std::ptr::read_unaligned(data as *const u64) };
        // SAFETY: as above.
        let last = unsafe { std::ptr::read_unaligned(data.add(len as usize - 8) as *const u64) };
        print ^= (first ^ last.rotate_left(29)) as usize;
    } else {
        for i in 0..len.max(0) as usize {
            // SAFETY: `i < len`: one of the object's bytes.
            print ^= (unsafe { *data.add(i) } as usize) << (8 * i);
        }
    }
    print
}

/// The key of the code object frame `f` runs, or the default key (no code object's) if it
/// runs none (unstarted, or 3.13's other executables).
///
/// # Safety
/// `f` must be a live frame of the calling thread.
pub unsafe fn live_code_key(api: &Api, l: &PyLayout, f: *const c_void) -> CodeKey {
    // SAFETY: `f` is a live frame (contract); `frame_code` is its code (or executable) pointer.
    let code: *const c_void = unsafe { read(f, l.frame_code) };
    // SAFETY: a live frame's non-null code or executable is a live object it holds.
    if code.is_null() || !unsafe { is_code(api, l, code) } {
        return CodeKey::default();
    }
    // SAFETY: a live code object (checked just above).
    unsafe { code_key(l, code) }
}

/// Whether the live object `obj` (a frame's code or executable) is a code object.
///
/// # Safety
/// `obj` must be a live object.
unsafe fn is_code(api: &Api, l: &PyLayout, obj: *const c_void) -> bool {
    // SAFETY: `obj` is a live object (contract); `ob_type` is its type pointer.
    unsafe { read::<*mut c_void>(obj, l.object_type) == api.code_type }
}

/// The first line of a code object.
///
/// # Safety
/// `code` must be a live code object.
pub unsafe fn first_line(l: &PyLayout, code: *const c_void) -> u32 {
    // SAFETY: `code` is a live code object (contract); `co_firstlineno` is its int.
    unsafe { read::<i32>(code, l.code_firstlineno) }.max(0) as u32
}

/// Copies a `str` object's text into `buf` as UTF-8 (cut at the buffer's end); returns the
/// length. Reads the compact representations directly: nothing is allocated or cached.
///
/// # Safety
/// `s` must be null or a live `str` object.
pub unsafe fn read_str(l: &PyLayout, s: *const c_void, buf: &mut [u8]) -> usize {
    if s.is_null() {
        return 0;
    }
    // SAFETY: `s` is a live `str` (contract, not null here); `state` is its bit-field word.
    let state: u32 = unsafe { read(s, l.unicode_state) };
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact {
        buf[0] = b'?';
        return 1;
    }
    // SAFETY: the same live `str`; `length` is its length in characters.
    let len: isize = unsafe { read(s, l.unicode_length) };
    // SAFETY: a compact string's characters follow its header (`PyASCIIObject` when ASCII,
    // `PyCompactUnicodeObject` otherwise) in the same block.
    let data =
        unsafe { (s as *const u8).add(if ascii { l.ascii_size } else { l.compact_size } as usize) };
    let mut n = 0;
    for i in 0..len.max(0) as usize {
        // SAFETY: `i < len`: character `i` of the compact string, `kind` bytes wide.
        let c = unsafe {
            match kind {
                1 => *data.add(i) as u32,
                2 => std::ptr::read_unaligned((data as *const u16).add(i)) as u32,
                _ => std::ptr::read_unaligned((data as *const u32).add(i)),
            }
        };
        let ch = char::from_u32(c).unwrap_or('\u{fffd}');
        if n + ch.len_utf8() > buf.len() {
            break;
        }
        n += ch.encode_utf8(&mut buf[n..]).len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `links` frames of two words each (the `at`, then the link outside it), walked
    /// into `room` slots: the innermost `room` links, outermost first, and whether that was all.
    #[test]
    fn the_chain_walk_keeps_the_innermost_links_whatever_the_room() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Frame {
            at: usize,
            outer: *mut Frame,
        }
        for links in 0..11usize {
            let mut frames = vec![
                Frame {
                    at: 0,
                    outer: std::ptr::null_mut()
                };
                links
            ];
            // Every link from one base pointer: the frames are not reborrowed after.
            let base = frames.as_mut_ptr();
            for i in (0..links).rev() {
                // SAFETY: `i` and `i + 1` (when a frame) are inside `frames`.
                unsafe {
                    let outer = if i + 1 < links {
                        base.add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    };
                    base.add(i).write(Frame { at: 100 + i, outer });
                }
            }
            let top = if links == 0 { std::ptr::null() } else { base };
            let top = top.cast::<c_void>();
            for room in 0..11usize {
                let mut out = vec![MaybeUninit::<usize>::uninit(); room];
                let mut first = [MaybeUninit::<usize>::uninit(); FIRST];
                // SAFETY: the frames above, whose second word links outward (0 ends).
                let (n, whole) = unsafe { chain(top, 8, &mut out, &mut first, |f| read(f, 0)) };
                assert_eq!(n, links.min(room), "{links} links in {room} slots");
                assert_eq!(whole, links <= room, "{links} links in {room} slots");
                // SAFETY: `chain` wrote the last `n`, outermost first.
                let got: Vec<usize> = out[room - n..]
                    .iter()
                    .map(|w| unsafe { w.assume_init() })
                    .collect();
                let want: Vec<usize> = (0..n).rev().map(|i| 100 + i).collect();
                assert_eq!(got, want, "{links} links in {room} slots");
                // The innermost frames' addresses, innermost first.
                let kept = n.min(FIRST);
                // SAFETY: `chain` wrote the first `min(n, FIRST)`.
                let got: Vec<usize> = first[..kept]
                    .iter()
                    .map(|w| unsafe { w.assume_init() })
                    .collect();
                let want: Vec<usize> = (0..kept).map(|i| base.wrapping_add(i) as usize).collect();
                assert_eq!(got, want, "{links} links in {room} slots: kept frames");
            }
        }
    }
}
