//! Where followed children hand their rings to mprof: an abstract Unix socket (see
//! `mprof_common::children`). A child connects and sends one message, a `Hello` and its ring's
//! descriptor (`SCM_RIGHTS`); the sender's pid and user come from the kernel (`SO_PEERCRED`),
//! never from the message. Who may be admitted is decided in `crate::sessions::children`.

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
    /// Connections accepted whose message has not come yet, oldest first. Nothing waits for
    /// one: anyone may connect to an abstract socket, and a connection that never says
    /// anything must not hold up the session's loop (the agents' rings would fill and their
    /// heartbeat go stale, which ends their sessions).
    pending: std::cell::RefCell<std::collections::VecDeque<Pending>>,
}

/// An accepted connection still waiting for its message.
struct Pending {
    conn: OwnedFd,
    cred: libc::ucred,
    since: std::time::Instant,
}

/// How long a connection may stay silent before it is closed: a child sends its message as
/// soon as it has connected.
const SILENT_FOR: std::time::Duration = std::time::Duration::from_secs(1);
/// At most this many silent connections are kept; a new one closes the oldest.
const MAX_PENDING: usize = 64;
/// At most this many connections are accepted a round.
const MAX_ACCEPTS: usize = 256;

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
        let nanos = crate::base::clock::monotonic_ns();
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
            pending: Default::default(),
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
        // The listening socket and the connections whose message is still to come.
        let mut fds: Vec<libc::pollfd> = std::iter::once(self.fd.as_raw_fd())
            .chain(self.pending.borrow().iter().map(|p| p.conn.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on our own array of pollfds; the result only ends the wait.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }

    /// The children that sent a ring since the last call (never blocks).
    pub fn arrivals(&self) -> Vec<Arrival> {
        let mut out = Vec::new();
        // Bounded, so that connections made faster than they are taken on cannot keep the
        // loop here; the rest are taken on next time.
        for _ in 0..MAX_ACCEPTS {
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
                            crate::say!(
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
                break;
            }
            self.stuck.set(false);
            // SAFETY: a fresh descriptor that nothing else owns.
            let conn = unsafe { OwnedFd::from_raw_fd(conn) };
            let Some(cred) = peer(&conn) else { continue };
            let p = Pending {
                conn,
                cred,
                since: std::time::Instant::now(),
            };
            // A child has nearly always sent its message by now.
            match receive(&p) {
                Received::Message(arrival) => out.push(arrival),
                Received::NotYet => {
                    let mut pending = self.pending.borrow_mut();
                    if pending.len() >= MAX_PENDING {
                        pending.pop_front();
                    }
                    pending.push_back(p);
                }
                Received::Closed => {}
            }
        }
        self.pending.borrow_mut().retain(|p| match receive(p) {
            Received::Message(arrival) => {
                out.push(arrival);
                false
            }
            Received::NotYet => p.since.elapsed() < SILENT_FOR,
            Received::Closed => false,
        });
        out
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

/// Who is at the other end of a connection, from the kernel.
fn peer(conn: &OwnedFd) -> Option<libc::ucred> {
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
    (ok == 0).then_some(cred)
}

/// What a pending connection had to say.
enum Received {
    /// A well-formed message with its descriptor.
    Message(Arrival),
    /// Nothing yet.
    NotYet,
    /// The peer closed it, or sent something else than a child's message: it is closed.
    Closed,
}

/// Reads one child's message on a pending connection, without waiting: what it says, and
/// the descriptor it carries.
fn receive(p: &Pending) -> Received {
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
    let n = unsafe {
        libc::recvmsg(
            p.conn.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        return match e {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Received::NotYet,
            _ => Received::Closed,
        };
    }
    // SAFETY: `msg` is what recvmsg just returned into, its control buffer `control` still
    // alive and unmoved.
    let fd = unsafe { received_fd(&msg) };
    let hello = (n > 0)
        .then(|| Hello::parse(&payload[..n as usize]))
        .flatten();
    match (hello, fd) {
        (Some(hello), Some(fd)) => Received::Message(Arrival {
            pid: p.cred.pid as u32,
            uid: p.cred.uid,
            hello,
            fd,
        }),
        _ => Received::Closed,
    }
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
