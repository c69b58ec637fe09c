//! The CPython entry points the agent uses, found with `dlsym` at run time so that one agent
//! serves every version, shared or static libpython alike. None of them allocates.

use crate::sys::{dlsym, RTLD_DEFAULT};
use std::ffi::{c_char, c_int, c_void, CStr};
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
        let dst = std::ptr::addr_of_mut!((*h).py_version) as *mut u8;
        std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n);
    }
}

/// Whether the interpreter has started shutting down (the program itself is done).
pub fn finalizing(api: &Api) -> bool {
    // SAFETY: reads a runtime flag; callable with or without the GIL.
    api.is_finalizing.is_some_and(|f| unsafe { f() } != 0)
}
