//! `record --follow-children`: a program started by exec with an environment of its own
//! (`subprocess.Popen(..., env={...})`, `os.execve`, `os.posix_spawn`) loses `LD_PRELOAD` and
//! `MPROF_FOLLOW`, so it would not load the agent; mprof's look for such strays (four times a
//! second) misses one that ends sooner. The exec and spawn calls of the interpreter and its
//! extension modules (see `native`) go through [`with_follow_env`], which adds back what the
//! environment passed lacks of the two: the agent's library in front of whatever `LD_PRELOAD`
//! it has, and the rendezvous.
//!
//! It runs between `vfork()` and exec (CPython's `_posixsubprocess`), in memory the parent
//! shares: no allocation, no lock, only the stack. What it adds is kept at the agent's start
//! in fixed buffers; an environment too large for them is passed on as it was.

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

/// Room for each kept `NAME=value` string (NUL included).
const ENTRY: usize = 1024;
/// Entries of an environment that can be extended; a larger one is passed on as it was.
const MAX_ENTRIES: usize = 1024;

const PRELOAD: &[u8] = b"LD_PRELOAD=";
const FOLLOW: &[u8] = b"MPROF_FOLLOW=";

struct Kept {
    /// `MPROF_FOLLOW=...`, NUL-terminated.
    follow: [u8; ENTRY],
    /// The agent's library, as `LD_PRELOAD` names it first (no NUL).
    agent: [u8; ENTRY],
    agent_len: usize,
}

static ARMED: AtomicBool = AtomicBool::new(false);
static mut KEPT: Kept = Kept {
    follow: [0; ENTRY],
    agent: [0; ENTRY],
    agent_len: 0,
};

/// The libraries a value of `LD_PRELOAD` names (the loader takes colons and blanks between
/// them).
fn preloaded(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b':' || b == b' ')
        .filter(|p| !p.is_empty())
}

/// Keeps what an exec must pass on: `follow`, the value of `MPROF_FOLLOW`, and the agent's
/// library, the first entry of `preload` (the value of `LD_PRELOAD`, entries separated by
/// colons or blanks). Called once, from the loader's constructor, before any other thread.
pub fn arm(follow: &[u8], preload: &[u8]) {
    let agent = preloaded(preload).next().unwrap_or(&[]);
    if agent.is_empty()
        || agent.len() > ENTRY
        || FOLLOW.len() + follow.len() + 1 > ENTRY
        || follow.contains(&0)
        || agent.contains(&0)
    {
        return;
    }
    // SAFETY: written once, before any other thread exists and before `ARMED` lets any
    // reader in; read only after `ARMED` is seen set.
    unsafe {
        let kept = &mut *std::ptr::addr_of_mut!(KEPT);
        kept.follow[..FOLLOW.len()].copy_from_slice(FOLLOW);
        kept.follow[FOLLOW.len()..FOLLOW.len() + follow.len()].copy_from_slice(follow);
        kept.follow[FOLLOW.len() + follow.len()] = 0;
        kept.agent[..agent.len()].copy_from_slice(agent);
        kept.agent_len = agent.len();
    }
    ARMED.store(true, Ordering::Release);
}

/// Calls `exec` with `envp`, or, when following is armed and `envp` lacks `MPROF_FOLLOW` or the
/// agent in `LD_PRELOAD`, with a copy of it on the stack that has them (the agent first in
/// `LD_PRELOAD`, before what the program had there).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings, as exec takes.
pub unsafe fn with_follow_env<R>(
    envp: *const *const c_char,
    exec: impl FnOnce(*const *const c_char) -> R,
) -> R {
    if envp.is_null() || !ARMED.load(Ordering::Acquire) {
        return exec(envp);
    }
    // SAFETY: written before `ARMED` was set, never after.
    let kept = unsafe { &*std::ptr::addr_of!(KEPT) };
    let agent = &kept.agent[..kept.agent_len];
    let mut entries = [std::ptr::null::<c_char>(); MAX_ENTRIES + 3];
    let mut n = 0;
    let (mut theirs, mut follows) = (None::<&[u8]>, false);
    let mut at = envp;
    // SAFETY: `at` is an element of `envp`, up to its NULL end (contract).
    while !unsafe { *at }.is_null() {
        // SAFETY: a non-null element of `envp`: a NUL-terminated string (contract).
        let entry = unsafe { CStr::from_ptr(*at) }.to_bytes();
        if entry.starts_with(PRELOAD) {
            theirs = Some(&entry[PRELOAD.len()..]);
        } else {
            follows |= entry.starts_with(FOLLOW);
            if n == MAX_ENTRIES {
                return exec(envp);
            }
            // SAFETY: an element of `envp`, read above.
            entries[n] = unsafe { *at };
            n += 1;
        }
        // SAFETY: `at` was not the NULL end: the next element is in the array too.
        at = unsafe { at.add(1) };
    }
    let loads_agent = theirs.is_some_and(|t| preloaded(t).any(|p| p == agent));
    if follows && loads_agent {
        return exec(envp);
    }
    // `LD_PRELOAD=` the agent, then theirs after a colon (theirs alone if it has the agent).
    let mut preload = [0u8; 2 * ENTRY + PRELOAD.len() + 2];
    let theirs = theirs.filter(|t| !t.is_empty());
    let ours = if loads_agent { &[][..] } else { agent };
    let sep = usize::from(!ours.is_empty() && theirs.is_some());
    let len = PRELOAD.len() + ours.len() + sep + theirs.map_or(0, |t| t.len());
    if len + 1 > preload.len() {
        return exec(envp);
    }
    let mut put = |at: usize, bytes: &[u8]| {
        preload[at..at + bytes.len()].copy_from_slice(bytes);
        at + bytes.len()
    };
    let end = put(0, PRELOAD);
    let end = put(end, ours);
    let end = put(end, &b":"[..sep]);
    put(end, theirs.unwrap_or(&[]));
    entries[n] = preload.as_ptr().cast();
    if !follows {
        entries[n + 1] = kept.follow.as_ptr().cast();
    }
    exec(entries.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn run(env: &[&str]) -> Vec<String> {
        let owned: Vec<CString> = env.iter().map(|e| CString::new(*e).unwrap()).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|e| e.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // SAFETY: a NULL-terminated array of C strings that outlive the call.
        unsafe {
            with_follow_env(ptrs.as_ptr(), |e| {
                let mut out = Vec::new();
                let mut at = e;
                while !(*at).is_null() {
                    out.push(CStr::from_ptr(*at).to_str().unwrap().to_string());
                    at = at.add(1);
                }
                out
            })
        }
    }

    /// One test, as arming is once per process.
    #[test]
    fn an_environment_without_the_rendezvous_gets_it_and_the_agent() {
        // Not armed: passed on as it was.
        assert_eq!(run(&["PATH=/bin"]), ["PATH=/bin"]);
        arm(b"rendezvous 1 2", b"/proc/9/fd/3:/usr/lib/user.so");
        assert_eq!(
            run(&["PATH=/bin"]),
            [
                "PATH=/bin",
                "LD_PRELOAD=/proc/9/fd/3",
                "MPROF_FOLLOW=rendezvous 1 2"
            ]
        );
        // Their own preload stays, after the agent's.
        assert_eq!(
            run(&["LD_PRELOAD=/x.so", "A=b"]),
            [
                "A=b",
                "LD_PRELOAD=/proc/9/fd/3:/x.so",
                "MPROF_FOLLOW=rendezvous 1 2"
            ]
        );
        // Already followed (the environment mprof gave): untouched.
        let inherited = ["LD_PRELOAD=/x.so:/proc/9/fd/3", "MPROF_FOLLOW=other"];
        assert_eq!(run(&inherited), inherited);
        // The rendezvous kept but the preload dropped (a copy of the environment without
        // LD_PRELOAD): the agent comes back, the rendezvous stays theirs.
        assert_eq!(
            run(&["MPROF_FOLLOW=other", "A=b"]),
            ["MPROF_FOLLOW=other", "A=b", "LD_PRELOAD=/proc/9/fd/3"]
        );
        // The preload kept, the rendezvous dropped: it comes back.
        assert_eq!(
            run(&["LD_PRELOAD=/proc/9/fd/3"]),
            ["LD_PRELOAD=/proc/9/fd/3", "MPROF_FOLLOW=rendezvous 1 2"]
        );
        // Too many entries to copy: passed on as it was.
        let many: Vec<String> = (0..MAX_ENTRIES + 1).map(|i| format!("V{i}=1")).collect();
        let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        assert_eq!(run(&many).len(), MAX_ENTRIES + 1);
    }
}
