//! The agent library, built by `build.rs` and carried inside the mprof binary.

use anyhow::{Context, Result};
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The agent's ELF image.
pub static AGENT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmprof_agent.so"));

/// Writes `bytes` into a new anonymous memory file (nothing on disk, nothing in /dev/shm).
pub fn memfd_with(name: &str, bytes: &[u8], cloexec: bool) -> Result<OwnedFd> {
    let cname = CString::new(name).unwrap();
    let flags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = File::from(owned.try_clone()?);
    file.write_all(bytes).context("writing the agent image")?;
    Ok(owned)
}

/// The agent image in an inheritable memory file; `LD_PRELOAD=/proc/self/fd/N` loads it in a child.
pub fn agent_memfd() -> Result<OwnedFd> {
    memfd_with("mprof-agent.so", AGENT_SO, false)
}

/// The path a child that inherited `fd` uses to open it.
pub fn inherited_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}
