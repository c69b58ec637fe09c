//! What enters the target process: the agent library, embedded in the mprof binary, and the
//! means of loading it (a preload for `record`, ptrace for `attach`).

// Every unsafe operation, in an `unsafe fn` too, sits in an `unsafe` block whose SAFETY comment
// says why it is sound (attributes of the crate root: the agent's bare-rustc build obeys them).
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod agent;
#[cfg(target_arch = "x86_64")]
mod choose;
mod elf;
mod error;
#[cfg(target_arch = "x86_64")]
mod hijack;
#[cfg(target_arch = "x86_64")]
pub mod inject;
#[cfg(not(target_arch = "x86_64"))]
#[path = "inject_unsupported.rs"]
pub mod inject;
pub mod mapped_file;
pub mod procmaps;
#[cfg(target_arch = "x86_64")]
mod ptrace;
pub mod remote;
#[cfg(target_arch = "x86_64")]
mod safepoint;
#[cfg(target_arch = "x86_64")]
mod target;
#[cfg(target_arch = "x86_64")]
mod trampoline;
#[cfg(target_arch = "x86_64")]
mod unwind;

pub use error::AttachError;
