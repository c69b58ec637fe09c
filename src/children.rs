//! Following the child processes of a recorded program (`record --follow-children`).
//!
//! mprof listens on an abstract Unix socket (the rendezvous, see `mprof_common::children`).
//! A forked child of a profiled process, or a Python started by exec under the followed tree,
//! makes a ring of its own and sends its descriptor there; mprof takes the sender's pid from
//! the kernel (`SO_PEERCRED`), accepts only descendants of the program it started, checks the
//! memory file (sealed, the size mprof asked for) and drains it into a capture of its own,
//! `CAPTURE.d/PID.mprof`. The views read the program's capture and those of its children
//! together, or one process alone.

use crate::capture::CaptureWriter;
use crate::output::OutputDir;
use crate::session::{Reader, RingMem};
use anyhow::Result;
use mprof_common::children::{Hello, BORN_FORKED};
use mprof_common::record::Record;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where children hand their rings.
pub struct Rendezvous {
    fd: OwnedFd,
    name: String,
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
        Ok(Rendezvous { fd, name })
    }

    pub fn name(&self) -> &str {
        &self.name
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
                return out;
            }
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
    let fd = received_fd(&msg);
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
fn received_fd(msg: &libc::msghdr) -> Option<OwnedFd> {
    let mut found = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled in, within its length.
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

/// The parent of `pid` (from /proc).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` descends from `root`.
fn descends_from(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..128 {
        match parent_of(p) {
            Some(parent) if parent == root => return true,
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// Whether `pid` is still running (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')?
                .1
                .split_whitespace()
                .next()
                .map(String::from)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// The command line of `pid`, for the capture's metadata.
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// One followed child being drained.
struct Child {
    pid: u32,
    reader: Reader<Box<RingMem>>,
    announced_version: bool,
}

/// The followed children of a recording.
pub struct Children {
    dir: OutputDir,
    root: u32,
    /// The sampling settings, for the children's metadata.
    sampling: crate::SamplingArgs,
    live: Vec<Child>,
    done: usize,
    refused: usize,
    /// Every child admitted, and the program's user.
    known: std::collections::HashSet<u32>,
    root_uid: Option<u32>,
}

/// Most children one recording follows.
const MAX_CHILDREN: usize = 4096;

fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

impl Children {
    /// Prepares `CAPTURE.d` (see [`OutputDir::prepare`]), before the program starts or the
    /// target is touched, so that a refusal changes nothing.
    pub fn prepare_dir(capture: &Path) -> Result<OutputDir> {
        Ok(OutputDir::prepare(
            &children_dir(capture),
            "children's capture directory",
        )?)
    }

    /// The children of `root`, once its session has started; their captures go to `dir`
    /// (from [`Children::prepare_dir`]), which is kept from now on.
    pub fn new(mut dir: OutputDir, root: u32, sampling: &crate::SamplingArgs) -> Children {
        dir.keep();
        Children {
            dir,
            root,
            sampling: sampling.clone(),
            live: Vec::new(),
            done: 0,
            refused: 0,
            known: std::collections::HashSet::new(),
            root_uid: uid_of(root),
        }
    }

    /// Takes the rings children handed over, drains every child's ring, and finishes the
    /// captures of children that ended. Returns the bytes moved.
    pub fn pump(&mut self, rendezvous: &Rendezvous) -> Result<usize> {
        for arrival in rendezvous.arrivals() {
            if let Err(e) = self.admit(arrival) {
                self.refused += 1;
                eprintln!("mprof: warning: a child's ring was refused: {e:#}");
            }
        }
        let mut moved = 0;
        let mut i = 0;
        while i < self.live.len() {
            let child = &mut self.live[i];
            moved += child.reader.pump()?;
            if !child.announced_version {
                let version = child.reader.ring().python_version();
                if !version.is_empty() {
                    child.announced_version = true;
                    child.reader.capture.write(&Record::Meta {
                        text: format!("python={version}\n"),
                    })?;
                }
            }
            if !running(child.pid) {
                let mut child = self.live.swap_remove(i);
                while child.reader.pump()? > 0 {}
                child.reader.finish()?;
                self.done += 1;
                continue;
            }
            i += 1;
        }
        Ok(moved)
    }

    fn admit(&mut self, arrival: Arrival) -> Result<()> {
        let Arrival {
            pid,
            uid,
            hello,
            fd,
        } = arrival;
        if !self.belongs(pid, uid, hello.ppid) {
            anyhow::bail!("PID {pid} is not a descendant of PID {}", self.root);
        }
        if self.profiled() >= MAX_CHILDREN {
            anyhow::bail!("more than {MAX_CHILDREN} children: PID {pid} is not profiled");
        }
        let ring = Box::new(RingMem::from_child(fd)?);
        let mut capture = CaptureWriter::create_in(&self.dir, &format!("{pid}.mprof"))?;
        capture.place()?;
        let born = if hello.born == BORN_FORKED {
            "fork"
        } else {
            "exec"
        };
        capture.write(&Record::Meta {
            text: format!(
                "mode=child\npid={pid}\nppid={}\nborn={born}\nroot_pid={}\ncommand={}\n{}",
                hello.ppid,
                self.root,
                command_line(pid).replace('\n', "\\n"),
                self.sampling.meta()
            ),
        })?;
        self.known.insert(pid);
        self.live.push(Child {
            pid,
            reader: Reader::new(ring, capture, pid),
            announced_version: false,
        });
        Ok(())
    }

    /// Takes on a process mprof attached itself (a descendant of the root, under `attach
    /// --follow-children`): its capture goes beside the forked children's.
    pub fn adopt(&mut self, pid: u32, ring: RingMem, meta: &str) -> Result<()> {
        let mut capture = CaptureWriter::create_in(&self.dir, &format!("{pid}.mprof"))?;
        capture.place()?;
        capture.write(&Record::Meta {
            text: format!(
                "{meta}root_pid={}\ncommand={}\nrate={}\nmax_depth={}\nseed={}\n",
                self.root,
                command_line(pid).replace('\n', "\\n"),
                self.sampling.rate,
                self.sampling.max_depth,
                self.sampling.seed
            ),
        })?;
        self.known.insert(pid);
        self.live.push(Child {
            pid,
            reader: Reader::new(Box::new(ring), capture, pid),
            announced_version: false,
        });
        Ok(())
    }

    /// The processes being drained, with their rings (to ask them to stop).
    pub fn rings(&self) -> impl Iterator<Item = (u32, &RingMem)> {
        self.live.iter().map(|c| (c.pid, c.reader.ring()))
    }

    /// After the program ended: drains the children still running for up to `grace`, then
    /// finishes every capture.
    pub fn finish(&mut self, rendezvous: &Rendezvous, grace: Duration) -> Result<()> {
        let until = Instant::now() + grace;
        while !self.live.is_empty() && Instant::now() < until {
            if self.pump(rendezvous)? == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.pump(rendezvous)?;
        for mut child in self.live.drain(..) {
            while child.reader.pump()? > 0 {}
            child.reader.finish()?;
            self.done += 1;
        }
        Ok(())
    }

    /// Whether the sender `pid` (user `uid`, saying its parent is `ppid`) is one of the
    /// program's descendants. A child that already exited can no longer be traced back
    /// through /proc: it is accepted if it ran as the program's user and names as its parent
    /// the program or a child already admitted.
    fn belongs(&self, pid: u32, uid: u32, ppid: u32) -> bool {
        if descends_from(pid, self.root) {
            return true;
        }
        let gone = !running(pid) && parent_of(pid).is_none();
        let known_parent = ppid == self.root || self.known.contains(&ppid);
        gone && known_parent && Some(uid) == self.root_uid
    }

    /// How many children were profiled.
    pub fn profiled(&self) -> usize {
        self.done + self.live.len()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Where the captures of a capture's followed children go: `CAPTURE.d`.
pub fn children_dir(capture: &Path) -> PathBuf {
    let mut name = capture.as_os_str().to_owned();
    name.push(".d");
    PathBuf::from(name)
}

/// The Python processes among the descendants of `root` right now (pid and command line), at
/// most `limit` of them: for the hint when children are not followed.
pub fn python_descendants(root: u32, limit: usize) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    let mut seen = 0;
    while let Some(pid) = queue.pop() {
        seen += 1;
        if seen > 10_000 || found.len() >= limit {
            break;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            for child in text
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                queue.push(child);
                if is_python(child) && found.len() < limit {
                    found.push((child, command_line(child)));
                }
            }
        }
    }
    found
}

/// Whether `pid` runs a CPython (libpython mapped, or an executable named python*).
fn is_python(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let name = exe
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    name.starts_with("python")
        || std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|maps| maps.contains("libpython"))
}

/// Python children seen while a program ran without `--follow-children`.
#[derive(Default)]
pub struct Unfollowed {
    seen: std::collections::BTreeMap<u32, String>,
    last: Option<Instant>,
}

impl Unfollowed {
    /// Looks at the program's descendants (at most twenty times a second).
    pub fn watch(&mut self, root: u32) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(50))
        {
            return;
        }
        self.last = Some(Instant::now());
        for (pid, command) in python_descendants(root, 64) {
            self.seen.entry(pid).or_insert(command);
        }
    }

    /// The hint for the summary, if Python children were seen or counted (`forked`: forks the
    /// agent counted, which may have been too short-lived to be seen).
    pub fn hint(&self, forked: u32) -> Option<String> {
        if self.seen.is_empty() {
            return (forked > 0).then(|| {
                format!(
                    "the program forked {forked} process(es), which were not profiled; record with \
                     --follow-children to profile them too"
                )
            });
        }
        let shown: Vec<String> = self
            .seen
            .iter()
            .take(4)
            .map(|(pid, cmd)| {
                format!(
                    "{pid} ({})",
                    crate::text::printable(&cmd.chars().take(60).collect::<String>())
                )
            })
            .collect();
        let more = if self.seen.len() > 4 {
            format!(" and {} more", self.seen.len() - 4)
        } else {
            String::new()
        };
        Some(format!(
            "the program started {} Python child process(es), which were not profiled: {}{more}; \
             record with --follow-children to profile them too",
            self.seen.len(),
            shown.join(", ")
        ))
    }
}
