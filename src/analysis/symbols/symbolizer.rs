//! Symbolizing one native address of one module: the frames it stands for (inlined functions
//! first, from DWARF), or the function symbol that holds it, or `module+0xoffset`; and what
//! kind of frame it is for the merge with the Python stack ([`Class`]). In a stripped file,
//! an address outside the exported functions is named after the nearest one before it
//! (`exported+0x1a`).
//!
//! Modules are loaded once per build id (or path and size, without one). Loading a module
//! parses debug information of a file on this machine, not of the capture, so the memory it
//! takes is counted apart ([`Symbolizer::held`]) from the capture reader's allowance.

use super::demangle::demangle;
use super::loader::{self, base_name, Loaded};
use mprof_common::record::{Module, MODULE_MAIN};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Most modules loaded by one symbolizer; the others show as `module+0x…`.
pub const MAX_MODULES: usize = 512;
/// Most warnings kept (one per module).
const MAX_WARNINGS: usize = 32;
/// Inlined frames kept per address at most.
const MAX_INLINED: usize = 32;

/// What a native frame is to the merge with the Python stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// CPython's bytecode loop (`_PyEval_EvalFrameDefault`): one activation runs one or more
    /// Python frames, which replace it.
    Eval,
    /// Other code of the interpreter (libpython, or the python executable).
    Interpreter,
    /// mprof's own agent.
    Agent,
    /// The C library's allocator, under the allocation.
    AllocInternal,
    /// Process and thread start-up in the C library (`__libc_start_main`, `start_thread`).
    Start,
    /// Anything else: extensions, libraries, the program.
    Other,
}

/// One frame of a native address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymFrame {
    pub function: String,
    /// The source file, from DWARF.
    pub file: Option<String>,
    /// The source line (0 when unknown).
    pub line: u32,
    /// An inlined function from Python's own headers (`…/include/python3.X/…`), such as
    /// `PyObject_CallOneArg` inlined into an extension: interpreter code, hidden by default.
    pub interpreter: bool,
}

/// A native address, symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbolized {
    /// Innermost (the most deeply inlined function) first; never empty.
    pub frames: Vec<SymFrame>,
    pub class: Class,
}

impl Symbolized {
    /// Heap bytes the value holds (its frames and their strings).
    fn heap_bytes(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<SymFrame>()
            + self
                .frames
                .iter()
                .map(|f| f.function.capacity() + f.file.as_ref().map_or(0, String::capacity))
                .sum::<usize>()
    }
}

/// Loads modules and symbolizes their addresses.
#[derive(Default)]
pub struct Symbolizer {
    loaded: HashMap<Vec<u8>, Option<Rc<Loaded>>>,
    warnings: Vec<String>,
    warned: HashSet<String>,
    held: isize,
}

/// Names of the C library's allocator functions, hidden under an allocation.
const ALLOC_FUNCTIONS: [&str; 14] = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "reallocarray",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "mmap",
    "mmap64",
    "mremap",
    "sysmalloc",
];

impl Symbolizer {
    /// Memory held for loaded debug information (not the capture's).
    pub fn held(&self) -> isize {
        self.held
    }

    /// Modules loaded (or found missing) so far: one per build id (or path and size).
    pub fn modules(&self) -> usize {
        self.loaded.len()
    }

    /// One line per module that could not be symbolized, and why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The frames and class of `addr` (a return address) in `module`.
    pub fn symbolize(&mut self, module: &Module, addr: u64) -> Symbolized {
        let before = crate::base::memory::in_use();
        let loaded = self.module(module);
        let vaddr = addr.wrapping_sub(module.bias);
        let mut frames = loaded
            .as_ref()
            .map(|l| lookup(l, vaddr.wrapping_sub(1)))
            .unwrap_or_default();
        if frames.is_empty() {
            frames.push(SymFrame {
                function: format!("{}+{vaddr:#x}", base_name(&module.path)),
                file: None,
                line: 0,
                interpreter: false,
            });
        }
        let interpreter = match &loaded {
            Some(l) => l.interpreter || named_like_python(module),
            None => named_like_python(module),
        };
        let class = classify(module, interpreter, &frames[frames.len() - 1].function);
        let out = Symbolized { frames, class };
        self.held += crate::base::memory::in_use() - before - out.heap_bytes() as isize;
        out
    }

    /// The loaded symbols of `module`, loading them the first time.
    fn module(&mut self, module: &Module) -> Option<Rc<Loaded>> {
        let key = match module.build_id.is_empty() {
            false => module.build_id.clone(),
            true => format!("{}\0{}", module.path, module.file_size).into_bytes(),
        };
        if let Some(loaded) = self.loaded.get(&key) {
            return loaded.clone();
        }
        let loaded = if self.loaded.len() >= MAX_MODULES {
            self.warn(format!(
                "more than {MAX_MODULES} modules: the others' frames show as module+0x…"
            ));
            None
        } else {
            match loader::load(module) {
                Ok(l) => Some(Rc::new(l)),
                Err(why) => {
                    if !module.path.contains("mprof-agent") {
                        self.warn(why);
                    }
                    None
                }
            }
        };
        self.loaded.insert(key, loaded.clone());
        loaded
    }

    fn warn(&mut self, text: String) {
        if self.warnings.len() < MAX_WARNINGS && self.warned.insert(text.clone()) {
            self.warnings.push(text);
        }
    }
}

/// The frames of `vaddr` (an address of the file) from DWARF, or its symbol.
fn lookup(loaded: &Loaded, vaddr: u64) -> Vec<SymFrame> {
    let mut frames = loaded
        .dwarf
        .as_ref()
        .map(|ctx| dwarf_frames(ctx, vaddr))
        .unwrap_or_default();
    let symbol = || match loaded.symbols.find(vaddr) {
        Some(s) => Some(demangle(s.name)),
        None => loaded
            .symbols
            .nearest_exported(vaddr)
            .map(|(s, offset)| format!("{}+{offset:#x}", demangle(s.name))),
    };
    match frames.last_mut() {
        Some(outer) if outer.function.is_empty() => match symbol() {
            Some(name) => outer.function = name,
            None => frames.clear(),
        },
        Some(_) => {}
        None => frames.extend(symbol().map(|function| SymFrame {
            function,
            file: None,
            line: 0,
            interpreter: false,
        })),
    }
    frames.retain(|f| !f.function.is_empty());
    // The outermost frame is the function itself, never inlined: never hidden as a header's.
    if let Some(outer) = frames.last_mut() {
        outer.interpreter = false;
    }
    frames
}

/// The frames DWARF gives for `vaddr`, innermost first; a frame without a name has an empty
/// `function`.
fn dwarf_frames(ctx: &addr2line::Context<super::elf::Slice>, vaddr: u64) -> Vec<SymFrame> {
    let mut out = Vec::new();
    let Ok(mut iter) = ctx.find_frames(vaddr).skip_all_loads() else {
        return out;
    };
    while let Ok(Some(frame)) = iter.next() {
        if out.len() == MAX_INLINED {
            break;
        }
        let function = frame
            .function
            .as_ref()
            .and_then(|f| f.demangle().ok())
            .map(|n| n.into_owned())
            .unwrap_or_default();
        let (file, line) = match &frame.location {
            Some(l) => (l.file.map(str::to_owned), l.line.unwrap_or(0)),
            None => (None, 0),
        };
        out.push(SymFrame {
            interpreter: file.as_deref().is_some_and(is_python_header),
            function,
            file,
            line,
        });
    }
    out
}

/// Whether `file` is one of Python's installed headers (`…/include/python3.12/…`).
fn is_python_header(file: &str) -> bool {
    file.contains("/include/python3")
}

/// Whether the module's file name says it is the interpreter: `libpython3…`, or the main
/// executable named `python…`.
fn named_like_python(module: &Module) -> bool {
    let name = base_name(&module.path);
    name.starts_with("libpython") || (module.has(MODULE_MAIN) && name.starts_with("python"))
}

/// The class of an address whose outermost (not inlined) function is `function`.
pub fn classify(module: &Module, interpreter: bool, function: &str) -> Class {
    let name = base_name(&module.path);
    if module.path.contains("mprof-agent") {
        return Class::Agent;
    }
    if function.starts_with("_PyEval_EvalFrameDefault") {
        return Class::Eval;
    }
    if interpreter {
        return Class::Interpreter;
    }
    let libc = name.starts_with("libc.so") || name.starts_with("libc-");
    let loader = name.starts_with("ld-linux") || name.starts_with("ld-");
    let plain = function.trim_start_matches('_').trim_start_matches("libc_");
    let plain = plain.strip_prefix("GI___").unwrap_or(plain);
    if libc && (ALLOC_FUNCTIONS.contains(&plain) || function.starts_with("_int_")) {
        return Class::AllocInternal;
    }
    let start = function.contains("libc_start") || function == "_start";
    let thread = function == "start_thread"
        || function.starts_with("clone")
        || function.starts_with("__clone");
    if (libc || loader) && (start || thread) {
        return Class::Start;
    }
    Class::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str, flags: u32) -> Module {
        Module {
            path: path.into(),
            flags,
            ..Module::default()
        }
    }

    #[test]
    fn frames_are_classified_by_module_and_name() {
        let libc = module("/usr/lib/x86_64-linux-gnu/libc.so.6", 0);
        let py = module("/opt/py/lib/libpython3.12.so.1.0", 0);
        let exe = module("/usr/bin/python3.11", MODULE_MAIN);
        let ext = module("/tmp/ext.cpython-311-x86_64-linux-gnu.so", 0);
        let agent = module("/memfd:mprof-agent.so", 0);
        assert_eq!(classify(&py, true, "_PyEval_EvalFrameDefault"), Class::Eval);
        assert_eq!(
            classify(&exe, true, "_PyEval_EvalFrameDefault.cold"),
            Class::Eval
        );
        assert_eq!(classify(&py, true, "PyObject_Malloc"), Class::Interpreter);
        assert_eq!(classify(&libc, false, "malloc"), Class::AllocInternal);
        assert_eq!(
            classify(&libc, false, "__libc_malloc"),
            Class::AllocInternal
        );
        assert_eq!(classify(&libc, false, "_int_malloc"), Class::AllocInternal);
        assert_eq!(
            classify(&libc, false, "__libc_start_call_main"),
            Class::Start
        );
        assert_eq!(classify(&libc, false, "start_thread"), Class::Start);
        assert_eq!(classify(&libc, false, "qsort"), Class::Other);
        assert_eq!(classify(&ext, false, "level2"), Class::Other);
        assert_eq!(classify(&agent, false, "anything"), Class::Agent);
        assert!(named_like_python(&exe) && named_like_python(&py));
        assert!(!named_like_python(&module("/usr/bin/python3.11", 0)));
    }

    #[test]
    fn an_unloadable_module_gives_offsets_and_one_warning() {
        let mut s = Symbolizer::default();
        let m = Module {
            bias: 0x1000,
            ..module("/nonexistent/libgone.so", 0)
        };
        let a = s.symbolize(&m, 0x1234);
        assert_eq!(a.frames[0].function, "libgone.so+0x234");
        assert_eq!(a.class, Class::Other);
        s.symbolize(&m, 0x1300);
        assert_eq!(s.warnings().len(), 1, "{:?}", s.warnings());
    }
}
