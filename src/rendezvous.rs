//! Where followed children hand their rings to mprof: an abstract Unix socket (see
//! `mprof_common::children`). A child connects and sends one message, a `Hello` and its ring's
//! descriptor (`SCM_RIGHTS`); the sender's pid and user come from the kernel (`SO_PEERCRED`),
//! never from the message. Who may be admitted is decided in `crate::children`.

use anyhow::Result;
use mprof_common::children::Hello;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Where children hand their rings.
pub struct Rendezvous {
    fd: OwnedFd,
    name: String,
    /// A connection is waiting that could not be accepted (out of descriptors or memory):
    /// [`Rendezvous::wait`] sleeps rather than wake at once, again and again, for it.
    stuck: std::cell::Cell<bool>,
}

/// A child that handed over its ring.
pub struct Arrival {
    pub pid: u32,
    /// The sender's user, from the kernel.
    pub uid: u32,
    pub hello: Hello,
    pub fd: OwnedFd,
}

fn last_os(what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::last_os_error()).context(what.to_string())
}

impl Rendezvous {
    /// Listens on a fresh abstract socket named after this process.
    pub fn listen() -> Result<Rendezvous> {
        let nanos = crate::session::monotonic_ns();
        let name = format!("mprof-{}-{nanos:x}", std::process::id());
        // SAFETY: a new socket; every argument is a local value.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(last_os("making the rendezvous socket"));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (addr, len) = abstract_address(&name);
        // SAFETY: `addr` is a sockaddr_un of `len` meaningful bytes.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                len,
            )
        };
        // SAFETY: listen on our own socket.
        if bound != 0 || unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(last_os("listening on the rendezvous socket"));
        }
        Ok(Rendezvous {
            fd,
            name,
            stuck: std::cell::Cell::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits up to `timeout` for a child to connect (a signal ends the wait early too): the
    /// session's loop sleeps here, so that a child is taken on, and its command line read,
    /// as soon as it announces itself, not a round later (a fork that exits at once, a
    /// program that runs another by exec at once, are gone or changed by then).
    pub fn wait(&self, timeout: std::time::Duration) {
        if self.stuck.get() {
            std::thread::sleep(timeout);
            return;
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on one pollfd of ours; the result only ends the wait.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }

    /// The children that sent a ring since the last call (never blocks).
    pub fn arrivals(&self) -> Vec<Arrival> {
        let mut out = Vec::new();
        loop {
            // SAFETY: accept on our listening socket; no address is asked for.
            let conn = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if conn < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::ECONNABORTED) => continue,
                    Some(libc::EAGAIN) => self.stuck.set(false),
                    _ => {
                        if !self.stuck.replace(true) {
                            eprintln!(
                                "mprof: warning: children that announce themselves cannot be \
                                 taken on for now ({e}); they run on unprofiled{}",
                                if e.raw_os_error() == Some(libc::EMFILE) {
                                    ": raise the limit of open files (ulimit -n)"
                                } else {
                                    ""
                                }
                            );
                        }
                    }
                }
                return out;
            }
            self.stuck.set(false);
            // SAFETY: a fresh descriptor that nothing else owns.
            let conn = unsafe { OwnedFd::from_raw_fd(conn) };
            if let Some(arrival) = receive(&conn) {
                out.push(arrival);
            }
        }
    }
}

fn abstract_address(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: plain data; all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (addr, len as libc::socklen_t)
}

/// Reads one child's message on an accepted connection: who sent it (from the kernel), what
/// it says, and the descriptor it carries.
fn receive(conn: &OwnedFd) -> Option<Arrival> {
    // SAFETY: plain data; all zeroes is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let ok = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if ok != 0 {
        return None;
    }
    // The child sent its message right after connecting: wait a moment for it.
    let mut pfd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd of ours.
    if unsafe { libc::poll(&mut pfd, 1, 1000) } != 1 {
        return None;
    }
    let mut payload = [0u8; 32];
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    // SAFETY: plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: recvmsg into our buffers, sized above.
    let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    // SAFETY: `msg` is what recvmsg just returned into (when it succeeded), its control
    // buffer `control` still alive and unmoved.
    let fd = (n >= 0).then(|| unsafe { received_fd(&msg) }).flatten();
    let hello = (n > 0)
        .then(|| Hello::parse(&payload[..n as usize]))
        .flatten();
    Some(Arrival {
        pid: cred.pid as u32,
        uid: cred.uid,
        hello: hello?,
        fd: fd?,
    })
}

/// The one descriptor an `SCM_RIGHTS` message carried (any others are closed).
///
/// # Safety
///
/// `msg` was filled by a successful `recvmsg`, and the control buffer it points to is alive.
unsafe fn received_fd(msg: &libc::msghdr) -> Option<OwnedFd> {
    let mut found = None;
    // SAFETY: the kernel wrote the control messages and their lengths (cut to what fit in
    // `msg_controllen`), so the CMSG macros stay within the buffer; an SCM_RIGHTS message's
    // data is that many descriptors, each newly installed in this process and owned by
    // nobody else until wrapped here.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if found.is_none() {
                        found = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    found
}
