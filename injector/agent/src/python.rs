//! The CPython entry points the agent uses, found with `dlsym` at run time so that one agent
//! serves every version, shared or static libpython alike. None of them allocates.

use crate::sys::{dlsym, RTLD_DEFAULT};
use mprof_common::layout::PyLayout;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicIsize, AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `PyMemAllocatorEx`, identical in 3.8–3.13.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Allocator {
    pub ctx: *mut c_void,
    pub malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    pub calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    pub realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    pub free: unsafe extern "C" fn(*mut c_void, *mut c_void),
}

// SAFETY: function pointers and an opaque `ctx` the interpreter owns; the agent never
// dereferences `ctx` itself.
unsafe impl Send for Allocator {}
// SAFETY: as for Send: the agent only copies and passes these values.
unsafe impl Sync for Allocator {}

pub struct Api {
    /// `Py_GetVersion`: an address inside the interpreter's image.
    pub get_version: *const c_void,
    pub major: u8,
    pub minor: u8,
    pub version: &'static CStr,
    pub get_allocator: GetAllocator,
    pub set_allocator: SetAllocator,
    pub this_thread_state: NoArgPtr,
    pub addr2line: Addr2Line,
    pub is_initialized: NoArgInt,
    pub is_finalizing: Option<NoArgInt>,
    /// `&PyCode_Type`: every code object's type (checked per frame).
    pub code_type: *mut c_void,
    /// `PySys_AddAuditHook` (3.8+), callable before the interpreter is initialised.
    pub add_audit_hook: Option<AddAuditHook>,
    /// `&PyType_Type` and `&PyUnicode_Type`, to check a layout against the interpreter.
    pub type_type: *mut c_void,
    pub unicode_type: *mut c_void,
    /// `_PyMem_GetCurrentAllocatorName` (3.8+): "pymalloc" when the three domains hold
    /// CPython's default allocators.
    pub allocator_name: Option<NoArgName>,
    /// `PyInterpreterState_Main` (3.8+): the main interpreter, which threads of other
    /// interpreters (with GILs of their own from 3.12) are told from.
    pub main_interpreter: Option<NoArgPtr>,
}

// SAFETY: function pointers and addresses of interpreter globals, valid for the life of
// the process (libpython is never unloaded while it runs).
unsafe impl Send for Api {}
// SAFETY: as for Send: read-only after `resolve`.
unsafe impl Sync for Api {}

static API: OnceLock<Option<Api>> = OnceLock::new();

fn sym(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { dlsym(RTLD_DEFAULT, name.as_ptr()) }
}

/// Looks up a function by name, as a function pointer of type `$ty`; returns None from the
/// enclosing function if the symbol is missing.
macro_rules! func {
    ($name:literal as $ty:ty) => {{
        let p = sym($name);
        if p.is_null() {
            return None;
        }
        // SAFETY: the symbol is the named CPython function, whose C signature is `$ty`.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// `Py_AuditHookFunction`.
pub type AuditHook = unsafe extern "C" fn(*const c_char, *mut c_void, *mut c_void) -> c_int;
type AddAuditHook = unsafe extern "C" fn(AuditHook, *mut c_void) -> c_int;

type GetAllocator = unsafe extern "C" fn(c_int, *mut Allocator);
type SetAllocator = unsafe extern "C" fn(c_int, *const Allocator);
type NoArgPtr = unsafe extern "C" fn() -> *mut c_void;
type Addr2Line = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type NoArgInt = unsafe extern "C" fn() -> c_int;
type NoArgName = unsafe extern "C" fn() -> *const c_char;

/// Parses "3.11.7 (main, ...)" into (3, 11).
pub fn parse_version(v: &[u8]) -> Option<(u8, u8)> {
    let text = std::str::from_utf8(v).ok()?;
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn resolve() -> Option<Api> {
    let get_version = func!(c"Py_GetVersion" as unsafe extern "C" fn() -> *const c_char);
    // SAFETY: Py_GetVersion returns a static NUL-terminated string; it allocates nothing.
    let version = unsafe { CStr::from_ptr(get_version()) };
    let (major, minor) = parse_version(version.to_bytes())?;
    let finalizing = {
        let p = sym(c"Py_IsFinalizing");
        let p = if p.is_null() {
            sym(c"_Py_IsFinalizing")
        } else {
            p
        };
        // SAFETY: Py_IsFinalizing / _Py_IsFinalizing take no argument and return an int.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, NoArgInt>(p) })
    };
    Some(Api {
        get_version: get_version as *const c_void,
        major,
        minor,
        version,
        get_allocator: func!(c"PyMem_GetAllocator" as GetAllocator),
        set_allocator: func!(c"PyMem_SetAllocator" as SetAllocator),
        this_thread_state: func!(c"PyGILState_GetThisThreadState" as NoArgPtr),
        addr2line: func!(c"PyCode_Addr2Line" as Addr2Line),
        is_initialized: func!(c"Py_IsInitialized" as NoArgInt),
        is_finalizing: finalizing,
        code_type: sym(c"PyCode_Type"),
        add_audit_hook: {
            let p = sym(c"PySys_AddAuditHook");
            // SAFETY: PySys_AddAuditHook's C signature is `AddAuditHook`.
            (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, AddAuditHook>(p) })
        },
        type_type: sym(c"PyType_Type"),
        unicode_type: sym(c"PyUnicode_Type"),
        allocator_name: {
            let p = sym(c"_PyMem_GetCurrentAllocatorName");
            // SAFETY: the function takes no argument and returns a static string or NULL.
            (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, NoArgName>(p) })
        },
        main_interpreter: {
            let p = sym(c"PyInterpreterState_Main");
            // SAFETY: the function takes no argument and returns a pointer.
            (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, NoArgPtr>(p) })
        },
    })
}

/// The interpreter's API, or None when this process is not a CPython interpreter.
pub fn api() -> Option<&'static Api> {
    API.get_or_init(resolve).as_ref()
}

/// Writes the interpreter's version (`Py_GetVersion`, cut to 63 bytes) into a ring's header,
/// for mprof to put in the capture. Only once the API was resolved (at the agent's start): a
/// forked child's new ring is made where resolving it would not be safe.
///
/// # Safety
/// `h` points to the header of a ring this process owns, which mprof does not read yet.
pub unsafe fn write_version(h: *mut mprof_common::ring::RingHeader) {
    if let Some(Some(api)) = API.get() {
        let v = api.version.to_bytes();
        let n = v.len().min(63);
        // SAFETY: `h` is a ring header this process owns (contract), whose `py_version` holds
        // 64 bytes: `n <= 63` of them are written, from a string that does not overlap it.
        unsafe {
            let dst = std::ptr::addr_of_mut!((*h).py_version) as *mut u8;
            std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n);
        }
    }
}

/// Whether the interpreter has started shutting down (the program itself is done).
pub fn finalizing(api: &Api) -> bool {
    // SAFETY: reads a runtime flag; callable with or without the GIL.
    api.is_finalizing.is_some_and(|f| unsafe { f() } != 0)
}

/// The runtime's words behind `PyGILState_GetThisThreadState`, read in place of the call (three
/// calls into the interpreter around the C library's `pthread_getspecific`). Trusted once they
/// answered as the call did for a thread that has a state: from then on the session asks the
/// key straight away (the interpreter deletes it only after finalization has started, which
/// ends the session first), and where the C library keeps the key's values at the thread
/// pointer (`sys::KeySlots`) and the value read there was the call's too, reads it there: one
/// load where `pthread_getspecific` took about twenty instructions a sample. Until then, and
/// for good if they ever answer otherwise, the call is made.
pub struct ThisThread {
    /// `Py_tss_t`: `_is_initialized` (an `int`) and `_key`.
    initialized: &'static AtomicI32,
    key: &'static AtomicU32,
    /// ≤3.11: `autoInterpreterState`, NULL while the key is not to be read.
    auto_interp: Option<&'static AtomicUsize>,
    /// The key plus one once the words are trusted; 0 until then; [`UNTRUSTED`] if they
    /// answered otherwise than the call.
    trusted: AtomicU32,
    /// Where this C library keeps key values, if it keeps them at the thread pointer.
    slots: Option<crate::sys::KeySlots>,
    /// The key's value's offset from the thread pointer once it was read there as the call
    /// answered, in the low 32 bits, tagged above them with this `ThisThread`'s generation (a
    /// thread's word verified for another session's key does not match); 0 until then, and for
    /// good where it cannot be read there.
    slot: AtomicIsize,
    /// Which `ThisThread` of the process this is (see `slot`).
    generation: u32,
}

/// Whether the calling thread's word at the tagged `slot` is `value`.
///
/// # Safety
/// `slot`'s low 32 bits are an offset of `sys::KeySlots` (inside every thread's own
/// descriptor).
unsafe fn holds(slot: isize, value: *mut c_void) -> bool {
    // SAFETY: an offset of `KeySlots` (contract), inside the calling thread's descriptor.
    unsafe { crate::sys::thread_word(slot as u32 as isize) == value as usize }
}

/// `ThisThread`s made so far.
static GENERATIONS: AtomicU32 = AtomicU32::new(0);

const UNTRUSTED: u32 = u32::MAX;

impl ThisThread {
    /// The calling thread's state, or NULL, as `PyGILState_GetThisThreadState` answers: NULL
    /// before the interpreter sets up its thread states and after it tears them down.
    /// `verified`: the calling thread's own word (`ThreadState::key_slot`), the offset at which
    /// its value was found as the call answered it.
    ///
    /// The value at the thread pointer is read only in a thread where it was once found, after
    /// the call, as the call answered: a thread may hold there a value it gave a key deleted
    /// since, whose slot the interpreter's key took over, and which would be no thread state.
    /// The C library's call does not answer it (it checks the key's sequence number) and
    /// clears it. Once the two agreed, the slot holds the key's own value: only
    /// `pthread_setspecific` changes it.
    #[inline]
    pub fn get(&self, api: &Api, verified: &Cell<isize>) -> *mut c_void {
        let slot = self.slot.load(Ordering::Relaxed);
        if slot != 0 && verified.get() == slot {
            // SAFETY: an offset of `KeySlots` (the low 32 bits), inside every thread's own
            // descriptor, where this thread's value was found as the call answered.
            return unsafe { crate::sys::thread_word(slot as u32 as isize) } as *mut c_void;
        }
        match self.trusted.load(Ordering::Relaxed) {
            0 | UNTRUSTED => self.check(api, verified),
            key => Self::called(key - 1, slot, verified),
        }
    }

    /// The key's value as the C library answers it; `verified` takes `slot` (tagged, or 0) if
    /// this thread's value is there too.
    fn called(key: u32, slot: isize, verified: &Cell<isize>) -> *mut c_void {
        // SAFETY: the interpreter's key (see above); its value is the thread's state or NULL.
        let called = unsafe { crate::sys::pthread_getspecific(key) };
        // SAFETY: a non-zero `slot` is one `check` tagged, from an offset of `KeySlots`.
        if slot != 0 && unsafe { holds(slot, called) } {
            verified.set(slot);
        }
        called
    }

    /// The call's answer, compared with the words' until they are trusted or not.
    #[cold]
    fn check(&self, api: &Api, verified: &Cell<isize>) -> *mut c_void {
        // SAFETY: PyGILState_GetThisThreadState has no preconditions.
        let called = unsafe { (api.this_thread_state)() };
        if self.trusted.load(Ordering::Relaxed) != 0 {
            return called;
        }
        let key = self.key.load(Ordering::Relaxed);
        let readable = self.initialized.load(Ordering::Relaxed) != 0
            && self
                .auto_interp
                .is_none_or(|a| a.load(Ordering::Relaxed) != 0)
            && key < UNTRUSTED - 1;
        let read = if readable {
            // SAFETY: a key the interpreter created and has not deleted (it is initialized).
            unsafe { crate::sys::pthread_getspecific(key) }
        } else {
            std::ptr::null_mut()
        };
        if read != called {
            self.trusted.store(UNTRUSTED, Ordering::Relaxed);
        } else if !called.is_null() {
            let offset = self.slots.and_then(|s| s.offset(key));
            if let Some(offset) = offset.filter(|&o| o > 0 && o <= u32::MAX as isize) {
                let tagged = offset | (self.generation as isize) << 32;
                // SAFETY: `offset` is one of `KeySlots`, in the low 32 bits.
                if unsafe { holds(tagged, called) } {
                    self.slot.store(tagged, Ordering::Relaxed);
                    verified.set(tagged);
                }
            }
            self.trusted.store(key + 1, Ordering::Relaxed);
        }
        called
    }
}

/// The runtime's words behind `PyGILState_GetThisThreadState` (see [`ThisThread`]), when this
/// interpreter exports `_PyRuntime` and the words read without a fault; else `None`, and the
/// call is made.
pub fn this_thread(l: &PyLayout) -> Option<ThisThread> {
    use mprof_common::layout::ABSENT;
    let runtime = sym(c"_PyRuntime") as usize;
    if runtime == 0 || l.runtime_tss == ABSENT || l.tss_key == ABSENT {
        return None;
    }
    let tss = runtime.checked_add(l.runtime_tss as usize)?;
    let key = tss.checked_add(l.tss_key as usize)?;
    let mut words = [0usize; 1];
    if tss % 4 != 0 || key % 4 != 0 || !crate::sys::read_own(tss & !7, &mut words) {
        return None;
    }
    let auto_interp = if l.runtime_auto_interp == ABSENT {
        None
    } else {
        let at = runtime.checked_add(l.runtime_auto_interp as usize)?;
        if at % 8 != 0 || !crate::sys::read_own(at, &mut words) {
            return None;
        }
        // SAFETY: an aligned word of the runtime's static state, read above without a fault.
        Some(unsafe { &*(at as *const AtomicUsize) })
    };
    // SAFETY: aligned words of the runtime's static state (one 8-byte read around them did not
    // fault), which lives as long as the process.
    unsafe {
        Some(ThisThread {
            initialized: &*(tss as *const AtomicI32),
            key: &*(key as *const AtomicU32),
            auto_interp,
            trusted: AtomicU32::new(0),
            slots: crate::sys::key_slots(),
            slot: AtomicIsize::new(0),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed).wrapping_add(1),
        })
    }
}

/// Where the runtime keeps the thread state that finalizes it (NULL until finalization
/// starts), for a session to read in place of calling [`finalizing`] at every sample and
/// every recorded free (two calls into the interpreter, about 15 instructions each). Only
/// when the interpreter exports `_PyRuntime` and, read without a fault, the word there is
/// NULL while the interpreter says it is not finalizing; else `None`, and the call is made.
pub fn finalizing_flag(api: &Api, l: &PyLayout) -> Option<&'static AtomicUsize> {
    if l.runtime_finalizing == mprof_common::layout::ABSENT || finalizing(api) {
        return None;
    }
    let runtime = sym(c"_PyRuntime") as usize;
    let addr = runtime.checked_add(l.runtime_finalizing as usize)?;
    let mut word = [usize::MAX];
    if runtime == 0 || addr % std::mem::align_of::<usize>() != 0 {
        return None;
    }
    if !crate::sys::read_own(addr, &mut word) || word[0] != 0 {
        return None;
    }
    // SAFETY: an aligned word of the interpreter's static runtime state, which lives as long
    // as the process; the interpreter stores it with atomic (or plain, aligned) stores.
    Some(unsafe { &*(addr as *const AtomicUsize) })
}

#[cfg(all(test, target_arch = "x86_64", not(miri)))]
mod tests {
    use super::*;
    use crate::sys::{key_slots, pthread_key_create, pthread_key_delete, pthread_setspecific};

    /// A thread that gave a value to a key deleted since holds it still where the next key made
    /// takes the same slot, and a read there before any call in that thread would take it for
    /// the new key's; the call answers NULL for it and clears it, and only then, in that
    /// thread, is the slot trusted.
    #[test]
    fn a_value_left_by_a_deleted_key_is_not_read() {
        let slots = key_slots().expect("glibc keeps its first keys in the thread descriptor");
        let mut old = 0u32;
        // SAFETY: `old` is ours to write; no destructor.
        assert_eq!(unsafe { pthread_key_create(&mut old, None) }, 0);
        let (tell, told) = std::sync::mpsc::channel::<u32>();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: a key made above; the value is never dereferenced.
            unsafe { pthread_setspecific(old, 0x5eed as *const c_void) };
            done.send(()).unwrap();
            let key = told.recv().unwrap();
            let offset = slots.offset(key).expect("the key is in the array");
            let tagged = offset | 7 << 32;
            let verified = Cell::new(0);
            // SAFETY: an offset of `KeySlots`.
            let before = unsafe { crate::sys::thread_word(offset) };
            assert_eq!(before, 0x5eed, "the value stayed");
            // The call answers NULL for it, and (glibc) clears it: the slot holds the key's
            // own value from then on, which `verified` may now say.
            assert!(ThisThread::called(key, tagged, &verified).is_null());
            // SAFETY: as above.
            let after = unsafe { crate::sys::thread_word(offset) };
            assert_eq!(after, 0, "the value was left");
            assert!(verified.get() == 0 || verified.get() == tagged);
            // SAFETY: as above.
            unsafe { pthread_setspecific(key, 0xbeef as *const c_void) };
            assert_eq!(ThisThread::called(key, tagged, &verified) as usize, 0xbeef);
            assert_eq!(
                verified.get(),
                tagged,
                "the value the call answers is trusted"
            );
        });
        finished.recv().unwrap();
        // SAFETY: the key made above; the thread's value stays in its slot.
        unsafe { pthread_key_delete(old) };
        let mut new = 0u32;
        // SAFETY: as above.
        assert_eq!(unsafe { pthread_key_create(&mut new, None) }, 0);
        assert_eq!(new, old, "glibc hands out the lowest free key");
        tell.send(new).unwrap();
        thread.join().unwrap();
        // SAFETY: the key made above, used no more.
        unsafe { pthread_key_delete(new) };
    }
}
