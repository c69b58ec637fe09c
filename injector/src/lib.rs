//! What enters the target process: the agent library, embedded in the mprof binary, and the
//! means of loading it (a preload for `record`, ptrace for `attach`).

pub mod agent;
pub mod attach;
mod elf;
mod error;
mod hijack;
mod procmaps;
mod ptrace;
mod remote;
mod safepoint;
mod target;
mod trampoline;

pub use error::AttachError;
