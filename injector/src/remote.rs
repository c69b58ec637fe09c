//! Reading and writing the target's memory (`/proc/PID/mem`) and what `/proc` says about its
//! threads.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;

/// The target's address space.
pub struct Mem {
    file: File,
}

impl Mem {
    /// Opens `/proc/PID/mem` for reading and writing (allowed to a process that may trace it).
    pub fn open(pid: u32) -> io::Result<Mem> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))?;
        Ok(Mem { file })
    }

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

pub fn thread_status(pid: u32, tid: u32) -> io::Result<ThreadStatus> {
    Ok(parse_status(&std::fs::read_to_string(format!(
        "/proc/{pid}/task/{tid}/status"
    ))?))
}

pub fn process_status(pid: u32) -> io::Result<ThreadStatus> {
    Ok(parse_status(&std::fs::read_to_string(format!(
        "/proc/{pid}/status"
    ))?))
}

/// The thread ids of the target, main thread first.
pub fn threads(pid: u32) -> io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_by_key(|&t| (t != pid, t));
    Ok(tids)
}

/// A thread's name (`comm`), empty if it is gone.
pub fn thread_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The state letter and start time (clock ticks since boot) from `/proc/PID/stat`; the start
/// time tells a process from a later one that reused its pid.
pub fn stat(pid: u32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
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

/// Whether the process that had `start_time` is still there (and not a zombie).
pub fn alive(pid: u32, start_time: u64) -> bool {
    matches!(stat(pid), Ok((state, start)) if start == start_time && state != 'Z' && state != 'X')
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
    fn stat_of_this_process() {
        let (state, start) = stat(std::process::id()).unwrap();
        assert!(state == 'R' || state == 'S');
        assert!(start > 0);
        assert!(alive(std::process::id(), start));
    }
}
