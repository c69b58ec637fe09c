//! Reading and writing the target's memory (`/proc/PID/mem`) and what `/proc` says about its
//! threads, always through a [`Proc`]: a handle on the very process mprof was asked for, which
//! never reaches another process that reuses its PID once it has died.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

/// The target's address space, as it was when opened: after an `exec`, reads and writes through
/// it fail (the kernel ties the file to the memory it was opened on), so nothing mprof writes
/// can reach the program the target became.
pub struct Mem {
    file: File,
}

impl Mem {
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, addr)
    }

    pub fn read_vec(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    pub fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn write(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, addr)
    }
}

/// One process, held from the first look at it: a pidfd (which tells when this process, and no
/// other, has exited) and a descriptor of its `/proc` directory (through which every file is
/// read: once the process is gone, they fail, even if another process has taken its PID).
pub struct Proc {
    pub pid: u32,
    dir: OwnedFd,
    pidfd: OwnedFd,
}

impl Proc {
    /// Takes hold of process `pid`: the pidfd first, then its `/proc` directory, then checks
    /// that the process the pidfd holds has not exited meanwhile (so the directory is its own).
    pub fn open(pid: u32) -> io::Result<Proc> {
        if pid == 0 || pid > i32::MAX as u32 {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let dir = File::open(format!("/proc/{pid}"))?;
        let p = Proc {
            pid,
            dir: dir.into(),
            pidfd,
        };
        if p.exited() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(p)
    }

    /// The path of `rel` inside the process's `/proc` directory, as this process can open it
    /// (through the directory's descriptor: never another process's).
    pub fn path(&self, rel: &str) -> String {
        format!("/proc/self/fd/{}/{rel}", self.dir.as_raw_fd())
    }

    pub fn read_to_string(&self, rel: &str) -> io::Result<String> {
        std::fs::read_to_string(self.path(rel))
    }

    /// Whether the process has exited (a zombie counts as exited).
    pub fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd, a local; no waiting.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r != 0 && (r < 0 || p.revents != 0)
    }

    /// The pidfd, for `pidfd_getfd`.
    pub fn pidfd(&self) -> &OwnedFd {
        &self.pidfd
    }

    /// Opens the process's memory for reading and writing (allowed to a process that may trace
    /// it).
    pub fn mem(&self) -> io::Result<Mem> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path("mem"))?;
        Ok(Mem { file })
    }

    pub fn thread_status(&self, tid: u32) -> io::Result<ThreadStatus> {
        Ok(parse_status(
            &self.read_to_string(&format!("task/{tid}/status"))?,
        ))
    }

    pub fn status(&self) -> io::Result<ThreadStatus> {
        Ok(parse_status(&self.read_to_string("status")?))
    }

    /// Whether thread `tid` is one of this process's.
    pub fn has_thread(&self, tid: u32) -> bool {
        std::fs::metadata(self.path(&format!("task/{tid}"))).is_ok()
    }

    /// The thread ids of the process, main thread first.
    pub fn threads(&self) -> io::Result<Vec<u32>> {
        let pid = self.pid;
        let mut tids: Vec<u32> = std::fs::read_dir(self.path("task"))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        tids.sort_by_key(|&t| (t != pid, t));
        Ok(tids)
    }

    /// The state letter and start time from the process's `stat`.
    pub fn stat(&self) -> io::Result<(char, u64)> {
        parse_stat(&self.read_to_string("stat")?)
    }

    /// The process's command name (`comm`: the program's file name, up to 15 bytes, unless
    /// the program renamed itself); still there while it is a zombie.
    pub fn comm(&self) -> io::Result<String> {
        Ok(self
            .read_to_string("comm")?
            .trim_end_matches('\n')
            .to_string())
    }

    /// The program the process runs now (`exe`), " (deleted)" removed.
    pub fn exe(&self) -> io::Result<String> {
        let exe = std::fs::read_link(self.path("exe"))?.display().to_string();
        Ok(exe.strip_suffix(" (deleted)").unwrap_or(&exe).to_string())
    }
}

/// Signal masks and state of one thread, from `/proc/PID/task/TID/status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadStatus {
    /// 'R', 'S', 'D', 'T', 't', 'Z'...
    pub state: char,
    /// Signals pending for the thread or the whole process.
    pub pending: u64,
    pub blocked: u64,
    /// Process id of the tracer, 0 if none.
    pub tracer: u32,
}

impl ThreadStatus {
    /// Signals that will be delivered as soon as the thread runs.
    pub fn deliverable(&self) -> u64 {
        self.pending & !self.blocked
    }
}

fn hex_field(line: &str) -> u64 {
    u64::from_str_radix(line.trim(), 16).unwrap_or(0)
}

pub fn parse_status(text: &str) -> ThreadStatus {
    let mut s = ThreadStatus::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key {
            "State" => s.state = value.trim().chars().next().unwrap_or('?'),
            "SigPnd" | "ShdPnd" => s.pending |= hex_field(value),
            "SigBlk" => s.blocked = hex_field(value),
            "TracerPid" => s.tracer = value.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    s
}

/// A thread's name (`comm`), empty if it is gone.
pub fn thread_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Parses `/proc/PID/stat`: the state letter and start time (clock ticks since boot).
fn parse_stat(text: &str) -> io::Result<(char, u64)> {
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
    let start = fields.get(19).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_masks_combine_thread_and_shared_pending() {
        let s = parse_status(
            "Name:\tpython3\nState:\tS (sleeping)\nTracerPid:\t0\nSigPnd:\t0000000000000002\n\
             ShdPnd:\t0000000000000100\nSigBlk:\t0000000000000100\nSigCgt:\t0000000180004002\n",
        );
        assert_eq!(s.state, 'S');
        assert_eq!(s.pending, 0x102);
        assert_eq!(s.deliverable(), 0x2);
    }

    #[test]
    fn a_handle_reads_its_own_process_and_tells_when_it_exited() {
        let me = Proc::open(std::process::id()).unwrap();
        let (state, start) = me.stat().unwrap();
        assert!(state == 'R' || state == 'S');
        assert!(start > 0);
        assert!(!me.exited());
        assert!(me.has_thread(std::process::id()));
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let held = Proc::open(child.id()).unwrap();
        assert!(!held.exited());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(held.exited());
        // Reaped: the directory held no longer reads, whoever has the number now.
        assert!(held.stat().is_err());
    }
}
