//! Native stacks (`--native`): the target's modules, symbolization with gimli, and the merge
//! of native and Python frames into one stack.
//!
//! - Recording: [`tracker`] reads `/proc/PID/maps` and the ELF files it names (build id, load
//!   bias) and writes a MODULE record for every loaded object a sample's native stack reaches,
//!   and again when the link map changes.
//! - Reading: [`map`] follows the MODULE records of a capture; [`symbolizer`] turns an address
//!   into function, file and line (DWARF through `addr2line`, inlined frames included; else
//!   `.symtab`/`.dynsym`, [`demangle`]d; in a stripped file, the nearest exported symbol
//!   before it, `name+0xoffset`; else `module+0xoffset`), with debug information from the file, from
//!   `/usr/lib/debug/.build-id/`, or through `.gnu_debuglink` ([`loader`], [`elf`], [`mod@file`]);
//!   [`merge`] puts the Python frames in place of the bytecode loop's activations; the stack
//!   trie's side (`crate::analysis::names`) ties them to its frames.
//!
//! The frames of the interpreter itself are hidden unless [`show_interpreter_frames`] is set
//! (`--show-interpreter-frames`): a process-wide display setting, read when a capture is
//! loaded.

pub mod demangle;
pub mod elf;
pub mod file;
pub mod loader;
pub mod map;
pub mod merge;
pub mod symbolizer;
pub mod tracker;

use std::sync::atomic::{AtomicBool, Ordering};

static SHOW_INTERPRETER_FRAMES: AtomicBool = AtomicBool::new(false);

/// Keeps the interpreter's own native frames (and mprof's, and the C library's start-up and
/// allocator frames) in the stacks of captures loaded from now on.
pub fn set_show_interpreter_frames(show: bool) {
    SHOW_INTERPRETER_FRAMES.store(show, Ordering::Relaxed);
}

/// Whether interpreter frames are kept (see [`set_show_interpreter_frames`]).
pub fn show_interpreter_frames() -> bool {
    SHOW_INTERPRETER_FRAMES.load(Ordering::Relaxed)
}
