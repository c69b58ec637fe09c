//! What mprof learns about a target before it stops anything: is it Python, which version,
//! where its interpreter code and data lie, where `dlopen` is, and whether an agent or a
//! trampoline region from an earlier attach is already there.

use crate::elf::{Elf, Sym};
use crate::error::{other, AttachError};
use crate::mapped_file::{load_elf, MappedFile};
use crate::procmaps::{self, Mapping};
use crate::remote::{self, Mem, Proc};
use crate::trampoline;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// `mov $15, %rax; syscall`: the body of `__restore_rt`, where a signal handler returns to
/// (glibc and musl alike).
const RESTORE_RT: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// A ring whose reader has not beaten for this long belongs to a dead mprof (the agent itself
/// gives up after 1.5 s).
const ORPHAN_AFTER_NS: u64 = 2_000_000_000;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`, a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `dlopen` flag that `__libc_dlopen_mode` needs on glibc before 2.34.
const RTLD_DLOPEN_PRIVATE: u64 = 0x8000_0000;
const RTLD_NOW: u64 = 2;

/// Interpreter functions that take the lock the agent's start needs (the allocator lock of
/// 3.12+): a thread with one of them on its stack is not at a safe point.
const ALLOCATOR_SETUP_PREFIXES: &[&str] = &[
    "PyMem_GetAllocator",
    "PyMem_SetAllocator",
    "PyMem_SetupDebugHooks",
];
/// The interpreter's lock functions: a thread stopped inside them is not at a safe point, but
/// one blocked in the C library's wait they called is (see `safepoint`).
const LOCK_PREFIXES: &[&str] = &[
    "PyThread_",
    "PyMutex_",
    "_PyMutex_",
    "_PyParkingLot_",
    "_PySemaphore_",
];

/// The interpreter image: libpython, or the executable when libpython is linked in statically.
pub struct Python {
    pub version: Option<(u8, u8)>,
    /// Executable ranges of the image.
    pub text: Vec<(u64, u64)>,
    /// Ranges of functions that hold or wait on locks.
    pub excluded: Vec<(u64, u64)>,
    /// Ranges of the functions that take the allocator lock (3.12+), a subset of `excluded`.
    pub allocator_setup: Vec<(u64, u64)>,
    /// Ranges of the interpreter's lock functions (`PyThread_acquire_lock_timed`, 3.13's
    /// parking lot), a subset of `excluded`.
    pub locks: Vec<(u64, u64)>,
    /// `_PyRuntime`, which holds the GIL (a thread waiting for the GIL waits on a futex there).
    pub runtime: Option<(u64, u64)>,
    /// The bytecode loop.
    pub eval_loop: Option<(u64, u64)>,
    /// The image defines `malloc` itself: only the bytecode loop then proves that no allocator
    /// lock is held.
    pub defines_malloc: bool,
}

/// The C library entry points the trampoline calls.
pub struct Libc {
    pub dlopen: u64,
    pub dlopen_flags: u64,
    pub dlerror: u64,
    pub errno_location: u64,
    /// `__restore_rt` (`mov $15, %rax; syscall`): a return address to it on a stack marks a
    /// running signal handler, and injected system calls return through it (see `hijack`).
    pub restore_rt: u64,
    /// Executable ranges of the C library (and of libpthread, where glibc still has one).
    pub text: Vec<(u64, u64)>,
}

/// Code that takes locks the attach needs (the allocator's, the loader's) or calls out while
/// holding them: a thread stopped inside it, or with a frame of it on its stack, is not at a
/// safe point.
#[derive(Default)]
pub struct LockingCode {
    /// A thread's program counter must not be here: the C library, the dynamic loader, the
    /// unwinder, the agent.
    pub pc: Vec<(u64, u64)>,
    /// A return address into these, anywhere on a thread's live stack, means they are active
    /// below it: the loader, the unwinder (it holds the loader's lock in `dl_iterate_phdr`
    /// callbacks), `dl_iterate_phdr` itself, and the agent (its slow path holds its lock).
    pub on_stack: Vec<(u64, u64)>,
}

/// Entry points of an agent loaded in the target.
#[derive(Clone, Copy, Debug)]
pub struct LoadedAgent {
    pub start: u64,
    pub stop: u64,
}

pub struct Process {
    pub pid: u32,
    /// The process itself, held since the first look (see [`Proc`]).
    pub proc: Arc<Proc>,
    /// The program it ran when first looked at (an `exec` since is noticed by the ptrace
    /// events and by the memory file, which no longer reads; this names it in messages).
    pub exe: String,
    /// The memory of the program it ran when first looked at: after an `exec` it no longer
    /// reads (see [`Process::left`]).
    pub mem: Arc<Mem>,
    comm: String,
    pub maps: Vec<Mapping>,
    pub python: Python,
    pub libc: Libc,
    pub locking: LockingCode,
    /// An agent an earlier attach (or `record`) loaded.
    pub loaded_agent: Option<LoadedAgent>,
    /// The trampoline region of an earlier attach.
    pub region: Option<u64>,
    extensions: RefCell<HashMap<(String, u64), bool>>,
    allocators: RefCell<HashMap<(String, u64), bool>>,
    /// The unwind tables read so far (see `unwind`).
    unwind_tables: RefCell<crate::unwind::Cache>,
}

fn io_error(pid: u32, what: &str, e: io::Error) -> AttachError {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => AttachError::NoSuchProcess(pid),
        Some(libc::EACCES) | Some(libc::EPERM) => crate::choose::permission_denied(pid),
        _ => other(what, e),
    }
}

/// "libpython3.11.so.1.0" with prefix "libpython" → (3, 11); "python3.7m" → (3, 7).
pub fn version_in_name(name: &str, prefix: &str) -> Option<(u8, u8)> {
    let rest = name.strip_prefix(prefix)?;
    let mut parts = rest.splitn(2, '.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some((major, minor.parse().ok()?))
}

fn bias(maps: &[Mapping], m: &Mapping, elf: &Elf) -> u64 {
    procmaps::file_base(maps, m).unwrap_or(m.start) - elf.first_vaddr
}

fn ranges_of(maps: &[Mapping], m: &Mapping) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|o| o.exec && o.path == m.path && o.inode == m.inode)
        .map(|o| (o.start, o.end))
        .collect()
}

fn abs(bias: u64, s: Sym) -> (u64, u64) {
    (bias + s.value, bias + s.value + s.size.max(1))
}

impl Process {
    /// Reads everything needed from /proc and the target's files. Changes nothing. `mem` is
    /// the process's memory, opened before anything was read.
    pub fn inspect(proc: Arc<Proc>, mem: Arc<Mem>) -> Result<Process, AttachError> {
        let pid = proc.pid;
        match settled_state(&proc)? {
            'Z' | 'X' if proc.exited() => return Err(AttachError::Exited(pid)),
            'Z' | 'X' => {
                return Err(other(
                    "inspecting the process",
                    format!(
                        "the main thread of PID {pid} has ended while other threads run on; \
                         mprof cannot attach to such a process"
                    ),
                ))
            }
            // A tracing stop ('t') of another tracer (another mprof attach, say) is not a
            // stopped program.
            'T' | 't' => {
                return Err(match proc.status().map(|s| s.tracer) {
                    Ok(tracer) if tracer != 0 => AttachError::AlreadyTraced {
                        pid,
                        tracer,
                        name: remote::thread_name(tracer, tracer),
                    },
                    _ => AttachError::Stopped(pid),
                })
            }
            _ => {}
        }
        // A running program whose file was deleted (every python3 after a package upgrade)
        // reads as "/usr/bin/python3.11 (deleted)".
        let exe = proc
            .exe()
            .map_err(|e| io_error(pid, "reading the executable path", e))?;
        let maps = procmaps::read(&proc).map_err(|e| io_error(pid, "reading the memory map", e))?;
        let python = find_python(&proc, &exe, &maps)?;
        if let Some(v) = python.version {
            let (lo, hi) = mprof_common::layout::supported_range();
            if v < lo || v > hi {
                return Err(AttachError::Unsupported { pid, version: v });
            }
        }
        let (libc, dl_iterate_phdr) = find_libc(&proc, &maps)?;
        let locking = locking_code(&maps, dl_iterate_phdr);
        let comm = proc.comm().unwrap_or_default();
        Ok(Process {
            pid,
            proc,
            exe,
            mem,
            comm,
            maps,
            python,
            libc,
            locking,
            loaded_agent: None,
            region: None,
            extensions: RefCell::new(HashMap::new()),
            allocators: RefCell::new(HashMap::new()),
            unwind_tables: RefCell::new(HashMap::new()),
        })
    }

    /// Whether a profiling session runs in the target: the agent maps its ring while a session
    /// runs, and a live reader keeps the ring's heartbeat moving (it beats every few
    /// milliseconds). A session whose reader died (mprof was killed) is not running: the next
    /// attach takes it over. A heartbeat that stands still is watched until it is old enough
    /// to call the reader dead (about two seconds).
    pub fn session_running(&self, mem: &Mem) -> bool {
        let rings: Vec<u64> = self
            .maps
            .iter()
            .filter(|m| m.path.contains("mprof-ring") && m.offset == 0)
            .map(|m| m.start + mprof_common::ring::HEARTBEAT_OFFSET as u64)
            .collect();
        rings.iter().any(|&at| {
            let Ok(first) = mem.read_u64(at) else {
                return false; // unmapped meanwhile: that session ended
            };
            loop {
                std::thread::sleep(std::time::Duration::from_millis(50));
                let Ok(beat) = mem.read_u64(at) else {
                    return false;
                };
                if beat != first {
                    return true;
                }
                if monotonic_ns().saturating_sub(beat) >= ORPHAN_AFTER_NS {
                    return false;
                }
            }
        })
    }

    /// Looks for what an earlier attach left: the agent and the trampoline region. Needs
    /// access to the target's memory.
    pub fn find_leftovers(&mut self, mem: &Mem) -> Result<(), AttachError> {
        self.loaded_agent = find_agent(self.pid, &self.maps, mem)?;
        self.region = self
            .maps
            .iter()
            .filter(|m| m.path.is_empty() && m.inode == 0 && m.exec && m.write)
            .filter(|m| m.len() == trampoline::REGION_SIZE as u64)
            .find(|m| trampoline::is_region(mem, m.start))
            .map(|m| m.start);
        Ok(())
    }

    /// What tells whether the process is still the one inspected.
    pub fn liveness(&self) -> Liveness {
        Liveness {
            proc: self.proc.clone(),
            mem: self.mem.clone(),
            exe: self.exe.clone(),
            comm: self.comm.clone(),
            probe: self.python.text.first().map_or(0, |r| r.0),
        }
    }

    /// Why the process is no longer the one inspected, if it is not (see [`Liveness::left`]).
    pub fn left(&self) -> Option<AttachError> {
        self.liveness().left()
    }

    /// The error of a target that replaced its program.
    pub fn execed(&self) -> AttachError {
        self.liveness().execed()
    }

    pub fn mapping_at(&self, addr: u64) -> Option<&Mapping> {
        self.maps.iter().find(|m| m.contains(addr))
    }

    /// The mapping at `addr` now: from the snapshot taken at inspection, or, for memory mapped
    /// since (the stack of a thread started later), from `/proc/PID/maps` again.
    pub fn mapping_now(&self, addr: u64) -> Option<Mapping> {
        self.mapping_at(addr).cloned().or_else(|| {
            procmaps::read(&self.proc)
                .ok()?
                .into_iter()
                .find(|m| m.contains(addr))
        })
    }

    /// The return addresses on the stack of a thread stopped with `regs` (see `unwind`), up to
    /// the first in `stop_in`.
    pub fn frames(
        &self,
        mem: &Mem,
        regs: &crate::ptrace::Regs,
        stop_in: &[(u64, u64)],
    ) -> crate::unwind::Frames {
        crate::unwind::walk(
            self,
            mem,
            regs,
            stop_in,
            &mut self.unwind_tables.borrow_mut(),
        )
    }

    /// The executable ranges of an agent an earlier attach or `record` loaded.
    pub fn agent_text(&self) -> Vec<(u64, u64)> {
        self.maps
            .iter()
            .filter(|m| m.exec && m.path.contains("mprof-agent"))
            .map(|m| (m.start, m.end))
            .collect()
    }

    /// Where `addr` is, for messages: `libcrypto.so.3+0x1a2b3c`, `[anonymous memory]`.
    pub fn describe(&self, addr: u64) -> String {
        match self.mapping_at(addr) {
            Some(m) if m.is_file() => {
                let base = procmaps::file_base(&self.maps, m).unwrap_or(m.start);
                format!("in {}+{:#x}", m.file_name(), addr - base)
            }
            Some(m) if !m.path.is_empty() => format!("in {}", m.path),
            Some(_) => "in anonymous memory".into(),
            None => format!("at unmapped {addr:#x}"),
        }
    }

    /// Whether `addr` is in the code of a library that defines `malloc` (jemalloc, tcmalloc, a
    /// static executable): its own locks are then held while it runs.
    pub fn in_allocator(&self, addr: u64) -> bool {
        let Some(m) = self.mapping_at(addr) else {
            return false;
        };
        if !m.exec || !m.is_file() {
            return false;
        }
        let key = (m.path.clone(), m.inode);
        if let Some(&known) = self.allocators.borrow().get(&key) {
            return known;
        }
        let defines = load_elf(&self.proc, m)
            .map(|(elf, _)| elf.symbol("malloc").is_some() || elf.symbol("free").is_some())
            .unwrap_or(true);
        self.allocators.borrow_mut().insert(key, defines);
        defines
    }

    /// Whether `addr` is in the code of a CPython extension module (a library exporting a
    /// `PyInit_` function: loaded by `import`, so it cannot be the process's allocator).
    pub fn in_extension_module(&self, addr: u64) -> bool {
        let Some(m) = self.mapping_at(addr) else {
            return false;
        };
        if !m.exec || !m.is_file() || !m.file_name().contains(".so") {
            return false;
        }
        let key = (m.path.clone(), m.inode);
        if let Some(&known) = self.extensions.borrow().get(&key) {
            return known;
        }
        let is_ext = load_elf(&self.proc, m)
            .map(|(elf, _)| elf.with_prefix("PyInit_").next().is_some())
            .unwrap_or(false);
        self.extensions.borrow_mut().insert(key, is_ext);
        is_ext
    }
}

/// Tells whether the target is still the process, and the program, that was attached: not
/// exited, not another process that reused its PID, not replaced by an `exec`.
#[derive(Clone)]
pub struct Liveness {
    proc: Arc<Proc>,
    mem: Arc<Mem>,
    exe: String,
    /// The command name when the process was inspected.
    comm: String,
    /// An address of the program attached (its interpreter's code): readable while the
    /// process runs that program.
    probe: u64,
}

impl Liveness {
    pub fn pid(&self) -> u32 {
        self.proc.pid
    }

    /// Whether the process attached still runs the program attached.
    pub fn alive(&self) -> bool {
        self.left().is_none()
    }

    /// Why the process is no longer the program attached: it exited, or it exec'd.
    pub fn left(&self) -> Option<AttachError> {
        if self.proc.exited() {
            return Some(self.exited());
        }
        let mut byte = [0u8];
        if self.probe == 0 || self.mem.read(self.probe, &mut byte).is_ok() {
            return None;
        }
        // The memory attached is gone: an exec, or an exit under way (a dying process loses
        // its memory before it is a zombie, and its program file with it; a process that
        // exec'd has the new one).
        for _ in 0..50 {
            if self.proc.exited() {
                return Some(self.exited());
            }
            if self.proc.exe().is_ok() {
                return Some(self.execed());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Some(self.execed())
    }

    /// The error of a target that has exited: a program that replaced the one attached, and
    /// exited since, left its name.
    fn exited(&self) -> AttachError {
        match self.proc.comm() {
            Ok(now) if !now.is_empty() && now != self.comm => AttachError::Execed {
                pid: self.proc.pid,
                from: self.exe.clone(),
                to: format!("{now}, which has exited since"),
            },
            _ => AttachError::Exited(self.proc.pid),
        }
    }

    /// The error of a target that replaced its program.
    pub fn execed(&self) -> AttachError {
        AttachError::Execed {
            pid: self.proc.pid,
            from: self.exe.clone(),
            to: self.proc.exe().unwrap_or_else(|_| "another program".into()),
        }
    }

    /// Why reading the process, or tracing its thread, failed with `e` while doing `what`. A
    /// thread that vanished (ESRCH) is looked at for a moment: a thread killed by another's
    /// `exec` vanishes before the process's memory is replaced.
    pub fn why_gone(&self, e: std::io::Error, what: &str) -> AttachError {
        let tries = if e.raw_os_error() == Some(libc::ESRCH) {
            20
        } else {
            1
        };
        self.left_within(tries).unwrap_or_else(|| other(what, e))
    }

    /// [`Liveness::left`], looked at up to `tries` times 10 ms apart: a traced thread gone
    /// (another thread's `exec` ends every other thread first) comes a moment before the
    /// process's memory is the new program's.
    pub fn left_within(&self, tries: u32) -> Option<AttachError> {
        for i in 0..tries {
            if let Some(left) = self.left() {
                return Some(left);
            }
            if i + 1 < tries {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        None
    }
}

/// The process's state letter; a main thread seen as a zombie while the process lives (for
/// the moment an `exec` from another thread takes, or for good) is looked at again for a
/// moment.
fn settled_state(proc: &Proc) -> Result<char, AttachError> {
    let pid = proc.pid;
    let mut state = '?';
    for _ in 0..20 {
        state = proc.stat().map_err(|e| io_error(pid, "reading stat", e))?.0;
        if !matches!(state, 'Z' | 'X') || proc.exited() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(state)
}

fn find_python(proc: &Proc, exe: &str, maps: &[Mapping]) -> Result<Python, AttachError> {
    let pid = proc.pid;
    let lib = maps
        .iter()
        .find(|m| m.is_file() && m.file_name().starts_with("libpython"));
    let exe_map = maps
        .iter()
        .find(|m| m.is_file() && m.path.strip_suffix(" (deleted)").unwrap_or(&m.path) == exe);
    let not_python = || AttachError::NotPython {
        pid,
        exe: exe.to_string(),
    };
    let (image, version) = match lib {
        Some(m) => (m, version_in_name(m.file_name(), "libpython")),
        None => {
            let m = exe_map.ok_or_else(not_python)?;
            (m, version_in_name(m.file_name(), "python"))
        }
    };
    let (elf, _) = load_elf(proc, image).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound if image.path.ends_with(" (deleted)") => other(
            "reading the interpreter",
            format!(
                "{} was deleted or replaced since PID {pid} started (a package upgrade?); \
                 reading the original needs root (CAP_SYS_ADMIN)",
                image.path.trim_end_matches(" (deleted)")
            ),
        ),
        _ => io_error(pid, "reading the interpreter", e),
    })?;
    if elf.symbol("Py_GetVersion").is_none() {
        return Err(not_python());
    }
    let b = bias(maps, image, &elf);
    let with_prefixes = |prefixes: &[&str]| -> Vec<(u64, u64)> {
        prefixes
            .iter()
            .flat_map(|prefix| elf.with_prefix(prefix).map(|(_, s)| abs(b, s)))
            .collect()
    };
    let allocator_setup = with_prefixes(ALLOCATOR_SETUP_PREFIXES);
    let locks = with_prefixes(LOCK_PREFIXES);
    Ok(Python {
        version,
        text: ranges_of(maps, image),
        excluded: [allocator_setup.as_slice(), locks.as_slice()].concat(),
        allocator_setup,
        locks,
        runtime: elf.symbol("_PyRuntime").map(|s| abs(b, s)),
        eval_loop: elf.symbol("_PyEval_EvalFrameDefault").map(|s| abs(b, s)),
        defines_malloc: elf.symbol("malloc").is_some(),
    })
}

fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so") || name.starts_with("libc-2.") || name.starts_with("ld-musl")
}

/// Names of objects whose code takes the allocator's or the loader's locks, or runs callbacks
/// under them.
fn is_locking_object(name: &str) -> bool {
    is_libc(name)
        || [
            "ld-linux",
            "ld-2.",
            "libpthread",
            "libdl.so",
            "libgcc_s",
            "libunwind",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        || name.contains("mprof-agent")
}

/// Objects that must not be active anywhere on a chosen thread's stack (unlike the C
/// library, whose thread-start frames are on every stack).
fn is_loader_or_unwinder(name: &str) -> bool {
    ["ld-linux", "ld-2.", "ld-musl", "libgcc_s", "libunwind"]
        .iter()
        .any(|p| name.starts_with(p))
        || name.contains("mprof-agent")
}

fn locking_code(maps: &[Mapping], dl_iterate_phdr: Option<(u64, u64)>) -> LockingCode {
    let mut code = LockingCode::default();
    for m in maps.iter().filter(|m| m.exec && !m.path.is_empty()) {
        let name = m.file_name();
        if is_locking_object(name) {
            code.pc.push((m.start, m.end));
        }
        if is_loader_or_unwinder(name) {
            code.on_stack.push((m.start, m.end));
        }
    }
    code.on_stack.extend(dl_iterate_phdr);
    code
}

fn find_libc(proc: &Proc, maps: &[Mapping]) -> Result<(Libc, Option<(u64, u64)>), AttachError> {
    let pid = proc.pid;
    let m = maps
        .iter()
        .find(|m| m.is_file() && is_libc(m.file_name()))
        .ok_or_else(|| {
            other(
                "finding the C library",
                format!("no libc mapped in PID {pid}"),
            )
        })?;
    let (elf, file) = load_elf(proc, m).map_err(|e| io_error(pid, "reading the C library", e))?;
    let b = bias(maps, m, &elf);
    let at = |name: &str| elf.symbol(name).map(|s| b + s.value);
    let (dlopen, dlopen_flags, dlerror) = match (at("dlopen"), at("__libc_dlopen_mode")) {
        (Some(d), _) => (d, RTLD_NOW, at("dlerror").unwrap_or(0)),
        (None, Some(d)) => (d, RTLD_NOW | RTLD_DLOPEN_PRIVATE, 0),
        _ => find_libdl(proc, maps)?,
    };
    let restore_rt = find_bytes(maps, m, &file, &RESTORE_RT).ok_or_else(|| {
        other(
            "reading the C library",
            format!("no signal return stub (__restore_rt) in {}", m.path),
        )
    })?;
    let text = maps
        .iter()
        .filter(|o| o.exec && o.is_file())
        .filter(|o| is_libc(o.file_name()) || o.file_name().starts_with("libpthread"))
        .map(|o| (o.start, o.end))
        .collect();
    let libc = Libc {
        dlopen,
        dlopen_flags,
        dlerror,
        errno_location: at("__errno_location").unwrap_or(0),
        restore_rt,
        text,
    };
    Ok((libc, elf.symbol("dl_iterate_phdr").map(|s| abs(b, s))))
}

/// glibc before 2.34 keeps `dlopen` in libdl.
fn find_libdl(proc: &Proc, maps: &[Mapping]) -> Result<(u64, u64, u64), AttachError> {
    let pid = proc.pid;
    let missing = || other("finding dlopen", format!("PID {pid} has no dlopen"));
    let m = maps
        .iter()
        .find(|m| m.is_file() && m.file_name().starts_with("libdl.so"))
        .ok_or_else(missing)?;
    let (elf, _) = load_elf(proc, m).map_err(|e| io_error(pid, "reading libdl", e))?;
    let b = bias(maps, m, &elf);
    let dlopen = elf.symbol("dlopen").ok_or_else(missing)?;
    let dlerror = elf.symbol("dlerror").map_or(0, |s| b + s.value);
    Ok((b + dlopen.value, RTLD_NOW, dlerror))
}

/// The address of the first occurrence of `needle` in the executable mappings of `m`'s file.
fn find_bytes(maps: &[Mapping], m: &Mapping, file: &MappedFile, needle: &[u8]) -> Option<u64> {
    maps.iter()
        .filter(|o| o.exec && o.path == m.path && o.inode == m.inode)
        .find_map(|o| {
            let len = o.len().min(file.len().checked_sub(o.offset)?);
            let hay = file.read_at(o.offset, len).ok()?;
            let at = hay.windows(needle.len()).position(|w| w == needle)?;
            Some(o.start + at as u64)
        })
}

/// The start function of an agent already loaded in the target, after checking that it is
/// this build's agent (so the symbol offset is right).
fn find_agent(pid: u32, maps: &[Mapping], mem: &Mem) -> Result<Option<LoadedAgent>, AttachError> {
    let Some(m) = maps
        .iter()
        .find(|m| m.offset == 0 && m.path.contains("mprof-agent"))
    else {
        return Ok(None);
    };
    if !maps
        .iter()
        .any(|o| o.exec && o.path == m.path && o.inode == m.inode)
    {
        return Ok(None);
    }
    let ours = Elf::parse(crate::agent::AGENT_SO).map_err(|e| other("reading the agent", e))?;
    let (off, len) = ours.first_segment;
    let image = &crate::agent::AGENT_SO[off as usize..(off + len) as usize];
    let base = m.start - ours.first_vaddr;
    let theirs = mem
        .read_vec(base + off, len as usize)
        .map_err(|e| other("reading the loaded agent", e))?;
    if theirs != image {
        return Err(AttachError::ForeignAgent(pid));
    }
    let entry = |name: &str| {
        ours.symbol(name)
            .map(|s| base + s.value)
            .ok_or_else(|| other("reading the agent", format!("no {name}")))
    };
    Ok(Some(LoadedAgent {
        start: entry("mprof_agent_start")?,
        stop: entry("mprof_agent_stop")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_library_and_executable_names() {
        assert_eq!(
            version_in_name("libpython3.11.so.1.0", "libpython"),
            Some((3, 11))
        );
        assert_eq!(
            version_in_name("libpython3.7m.so.1.0", "libpython"),
            Some((3, 7))
        );
        assert_eq!(version_in_name("python3.13", "python"), Some((3, 13)));
        assert_eq!(version_in_name("python3", "python"), None);
        assert_eq!(version_in_name("python", "python"), None);
    }
}
