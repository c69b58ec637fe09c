//! Following child processes (`record --follow-children`, see `mprof_common::children` for the
//! protocol): a forked child, or a Python started by exec with the agent preloaded, makes a
//! ring of its own and hands it to mprof through the rendezvous socket.
//!
//! Everything here is raw system calls on the stack (no allocation, no lock): it runs in the
//! child half of `fork()` and in the loader's constructor.

use crate::sys;
use mprof_common::children::{ChildRing, Hello, BORN_FORKED, HELLO_MAGIC};
use mprof_common::ring::{region_size, Ring, RingHeader};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

/// The rendezvous and the settings of children's rings, kept from the session's ring header
/// (forked children inherit this memory) or from `MPROF_FOLLOW` (exec'd ones).
struct Follow {
    name: [u8; 64],
    len: usize,
    ring: ChildRing,
}

static FOLLOWING: AtomicBool = AtomicBool::new(false);
static mut FOLLOW: Follow = Follow {
    name: [0; 64],
    len: 0,
    ring: ChildRing {
        data_size: 0,
        rate: 0,
        seed: 0,
        max_depth: 0,
        config_flags: 0,
    },
};

/// Remembers how children are followed, from a session's ring header (empty rendezvous: they
/// are not).
pub fn remember(h: &RingHeader) {
    let len = h.rendezvous.iter().position(|&b| b == 0).unwrap_or(0);
    let ring = ChildRing {
        data_size: h.data_size,
        rate: h.rate,
        seed: h.seed,
        max_depth: h.max_depth,
        config_flags: h.config_flags,
    };
    set(&h.rendezvous[..len], ring);
}

/// Remembers how children are followed, from `MPROF_FOLLOW`.
pub fn remember_env(name: &str, ring: ChildRing) {
    set(name.as_bytes(), ring);
}

fn set(name: &[u8], ring: ChildRing) {
    if name.is_empty() || name.len() >= 64 {
        FOLLOWING.store(false, Ordering::Release);
        return;
    }
    // SAFETY: written only while no other thread reads it: at session start (under the
    // session lock, before FOLLOWING says so) or in the constructor.
    unsafe {
        let f = &mut *std::ptr::addr_of_mut!(FOLLOW);
        f.name = [0; 64];
        f.name[..name.len()].copy_from_slice(name);
        f.len = name.len();
        f.ring = ring;
    }
    FOLLOWING.store(true, Ordering::Release);
}

fn follow() -> Option<&'static Follow> {
    // SAFETY: only read once FOLLOWING says it was written, and not written after that
    // while the session runs.
    FOLLOWING
        .load(Ordering::Acquire)
        .then(|| unsafe { &*std::ptr::addr_of!(FOLLOW) })
}

/// A child's own ring: its descriptor and mapping.
pub struct OwnRing {
    pub fd: c_int,
    pub base: *mut u8,
    pub len: usize,
}

/// Makes a ring for this process (a child being followed) and hands it to mprof. `born` says
/// how the child came to be. None when children are not followed or mprof did not take it.
pub fn make_and_announce(born: u32, ppid: u32) -> Option<OwnRing> {
    let f = follow()?;
    let ring = make_ring(f)?;
    if announce(f, ring.fd, born, ppid) {
        Some(ring)
    } else {
        // SAFETY: the mapping and descriptor just made; nothing else uses them.
        unsafe {
            sys::munmap(ring.base.cast(), ring.len);
            sys::close(ring.fd);
        }
        None
    }
}

fn make_ring(f: &Follow) -> Option<OwnRing> {
    let data = f.ring.data_size as usize;
    let len = region_size(data);
    // SAFETY: raw system calls on this process's own new descriptor and mapping, every result
    // checked.
    unsafe {
        let fd = sys::syscall(
            sys::SYS_MEMFD_CREATE,
            c"mprof-ring".as_ptr(),
            sys::MFD_CLOEXEC | sys::MFD_ALLOW_SEALING,
        ) as c_int;
        if fd < 0 {
            return None;
        }
        let ok = sys::ftruncate(fd, len as i64) == 0
            && sys::fcntl(fd, sys::F_ADD_SEALS, sys::F_SEAL_SHRINK | sys::F_SEAL_GROW) == 0;
        let base = if ok {
            sys::mmap(
                std::ptr::null_mut(),
                len,
                sys::PROT_READ | sys::PROT_WRITE,
                sys::MAP_SHARED,
                fd,
                0,
            )
        } else {
            sys::MAP_FAILED
        };
        if base == sys::MAP_FAILED {
            sys::close(fd);
            return None;
        }
        let base = base as *mut u8;
        // Each child draws its own sample distances.
        let seed = if f.ring.seed == 0 {
            0
        } else {
            f.ring.seed ^ (sys::getpid() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        Ring::init(
            base,
            data,
            f.ring.rate,
            seed,
            f.ring.max_depth,
            f.ring.config_flags,
        );
        // Grandchildren follow too.
        let h = &mut *(base as *mut RingHeader);
        h.rendezvous[..f.len].copy_from_slice(&f.name[..f.len]);
        // The capture says which Python it is (a fork's is its parent's).
        crate::python::write_version(h);
        Some(OwnRing { fd, base, len })
    }
}

/// Sends the ring's descriptor to mprof, saying that `ppid` is the parent; false if nobody
/// listens.
fn announce(f: &Follow, fd: c_int, born: u32, ppid: u32) -> bool {
    let mut addr = sys::SockaddrUn {
        family: sys::AF_UNIX as u16,
        path: [0; 108],
    };
    // Abstract name: a NUL, then the name.
    addr.path[1..1 + f.len].copy_from_slice(&f.name[..f.len]);
    let addr_len = (2 + 1 + f.len) as u32;
    let hello = Hello {
        magic: HELLO_MAGIC,
        born,
        ppid,
        reserved: 0,
    }
    .as_bytes();
    // cmsghdr (len u64, level i32, type i32) + one int, padded to 8.
    let mut control = [0u64; 3];
    control[0] = 20;
    control[1] = (sys::SOL_SOCKET as u32 as u64) | ((sys::SCM_RIGHTS as u32 as u64) << 32);
    control[2] = fd as u32 as u64;
    let mut iov = sys::Iovec {
        base: hello.as_ptr() as *mut c_void,
        len: hello.len(),
    };
    let msg = sys::Msghdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: control.as_mut_ptr().cast(),
        controllen: 24,
        flags: 0,
    };
    // SAFETY: a new socket of this process; every buffer lives on this stack frame.
    unsafe {
        let s = sys::socket(
            sys::AF_UNIX,
            sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK,
            0,
        );
        if s < 0 {
            return false;
        }
        let sent = connect_within(s, &addr, addr_len, ANNOUNCE_WAIT_NS)
            && sys::sendmsg(s, &msg, sys::MSG_NOSIGNAL | sys::MSG_DONTWAIT) == hello.len() as isize;
        sys::close(s);
        sent
    }
}

/// How long a child waits for mprof to take its ring: a stopped mprof, or one whose backlog is
/// full, must not hang the program's `fork()` (the child then runs on unprofiled).
const ANNOUNCE_WAIT_NS: u64 = 500_000_000;

/// Connects the non-blocking socket `s` to `addr`, trying again while the listener's backlog
/// is full, for at most `wait_ns`.
///
/// # Safety
/// `s` is a socket of this process; `addr` holds `len` bytes of address.
unsafe fn connect_within(s: c_int, addr: &sys::SockaddrUn, len: u32, wait_ns: u64) -> bool {
    let start = sys::now_ns();
    loop {
        // SAFETY: a socket of this process and `len` bytes of address (contract).
        if unsafe { sys::connect(s, addr, len) } == 0 {
            return true;
        }
        // A full backlog says EAGAIN at once (Unix sockets never say EINPROGRESS).
        // SAFETY: `errno` points to the calling thread's own errno.
        if unsafe { *sys::errno() } != sys::EAGAIN || sys::now_ns().saturating_sub(start) >= wait_ns
        {
            return false;
        }
        sys::sleep_ns(5_000_000);
    }
}

/// Connects to a listener named `name` (abstract) whose backlog is full, and returns how long
/// the connect took to give up (for the locks' tests); `None` when no such listener can be
/// made here.
#[cfg(test)]
pub fn connect_to_full_backlog_for_test(name: &str) -> Option<std::time::Duration> {
    let mut addr = sys::SockaddrUn {
        family: sys::AF_UNIX as u16,
        path: [0; 108],
    };
    addr.path[1..1 + name.len()].copy_from_slice(name.as_bytes());
    let len = (2 + 1 + name.len()) as u32;
    let kind = sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK;
    // SAFETY: sockets of this test, closed at the end; every buffer lives on this frame.
    unsafe {
        let listener = sys::socket(sys::AF_UNIX, kind, 0);
        if listener < 0 || sys::bind(listener, &addr, len) != 0 || sys::listen(listener, 0) != 0 {
            return None;
        }
        // Fill the backlog: connects succeed until it is full.
        let mut filled = Vec::new();
        for _ in 0..64 {
            let s = sys::socket(sys::AF_UNIX, kind, 0);
            if sys::connect(s, &addr, len) != 0 {
                sys::close(s);
                break;
            }
            filled.push(s);
        }
        let s = sys::socket(sys::AF_UNIX, kind, 0);
        let start = std::time::Instant::now();
        let connected = connect_within(s, &addr, len, ANNOUNCE_WAIT_NS);
        let took = start.elapsed();
        for fd in filled.into_iter().chain([s, listener]) {
            sys::close(fd);
        }
        (!connected).then_some(took)
    }
}

/// Whether this is a forked child's birth: used by the fork handler.
pub const FORKED: u32 = BORN_FORKED;
