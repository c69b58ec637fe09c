//! The agent library, built by `build.rs` and carried inside the mprof binary.

use anyhow::{Context, Result};
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The agent's ELF image.
pub static AGENT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmprof_agent.so"));

/// How the agent's code was laid out (see `injector/build.rs`): "profile" (by
/// `injector/agent.profdata`), "off" (`MPROF_AGENT_PGO=off`), "no profile" (none, or not for
/// this target), "instrumented" (`MPROF_AGENT_PGO=generate=DIR`), or "unreadable" (this
/// compiler could not read the profile).
pub const AGENT_LAYOUT: &str = env!("MPROF_AGENT_LAYOUT");

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

#[cfg(test)]
mod tests {
    use super::{AGENT_LAYOUT, AGENT_SO};
    use object::{Object, ObjectSymbol};

    /// The shipped agent as an ELF object, where build.rs compiles it for x86-64 Linux with
    /// what `what` checks; elsewhere `None`, said as a skip.
    fn x86_64_agent(what: &str) -> Option<object::File<'static>> {
        if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            eprintln!("SKIPPED: {what} on x86-64 Linux only");
            return None;
        }
        Some(object::File::parse(AGENT_SO).expect("the agent is an ELF object"))
    }

    /// The agent reaches its thread-locals through TLS descriptors on x86-64 (`build.rs`):
    /// no call of `__tls_get_addr`, which reads the thread's module vector at every RAW and
    /// native hook, where a descriptor the loader put in the static TLS block is answered in
    /// two instructions.
    #[test]
    fn the_agent_reads_its_thread_locals_through_descriptors() {
        let Some(elf) = x86_64_agent("TLS descriptors are asked for") else {
            return;
        };
        let imports: Vec<String> = elf
            .dynamic_symbols()
            .filter(|s| s.is_undefined())
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect();
        assert!(
            !imports.iter().any(|n| n == "__tls_get_addr"),
            "the agent calls __tls_get_addr: {imports:?}"
        );
        let descriptors = elf
            .dynamic_relocations()
            .expect("the agent has dynamic relocations")
            .filter(|(_, r)| {
                r.flags()
                    == object::RelocationFlags::Elf {
                        r_type: object::elf::R_X86_64_TLSDESC,
                    }
            })
            .count();
        assert!(descriptors > 0, "the agent has no TLS descriptor");
    }

    /// Every function of the agent starts on a cache line of its own on x86-64 (`build.rs`),
    /// so that a hook's fast path of a few dozen bytes is one line to fetch, not two.
    #[test]
    fn the_agents_functions_start_on_cache_lines() {
        use object::SymbolKind;
        let Some(elf) = x86_64_agent("the functions are aligned") else {
            return;
        };
        // The agent's own functions: the C library's start files are not compiled with it.
        let own: Vec<(String, u64)> = elf
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.name().ok()?.to_owned(), s.address())))
            .filter(|(name, _)| name.contains("mprof_agent"))
            .collect();
        let hooks = own
            .iter()
            .filter(|(n, _)| n.contains("hook_malloc"))
            .count();
        assert!(hooks > 0, "no malloc hook among the agent's symbols");
        let off: Vec<_> = own.iter().filter(|(_, a)| a % 64 != 0).collect();
        assert!(off.is_empty(), "functions off a cache line: {off:?}");
    }

    /// The agent shipped from this checkout is laid out by its profile: a profile this
    /// compiler cannot read, or one missing from the checkout, would leave the agent's code to
    /// the compiler's guesses without anything else saying so.
    #[test]
    fn the_agent_is_laid_out_by_its_profile() {
        let asked_otherwise = matches!(AGENT_LAYOUT, "off" | "instrumented");
        if asked_otherwise || !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            eprintln!(
                "SKIPPED: the agent's layout is {AGENT_LAYOUT:?} (MPROF_AGENT_PGO, or a target \
                 the profile is not for)"
            );
            return;
        }
        assert_eq!(
            AGENT_LAYOUT, "profile",
            "the agent was not built with injector/agent.profdata (remake it with \
             tools/agent-pgo.sh if this compiler cannot read it)"
        );
    }
}
