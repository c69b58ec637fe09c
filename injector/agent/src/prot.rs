//! The protections of the process's pages as the kernel has them (`/proc/self/maps`), for the
//! GOT scans: which pages are read-only now (to make writable for a write, and read-only again
//! after it), and whether an object's RELRO region has been made read-only yet, which the
//! loader does once it has relocated the object (a scan leaves an object alone until then).

use crate::sys;
use std::ffi::c_int;

/// One mapping: its range and whether it is readable and writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub end: usize,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
}

impl Range {
    /// The `mprotect` protection of the mapping.
    pub fn prot(&self) -> c_int {
        let mut p = 0;
        if self.read {
            p |= sys::PROT_READ;
        }
        if self.write {
            p |= sys::PROT_WRITE;
        }
        if self.exec {
            p |= sys::PROT_EXEC;
        }
        p
    }
}

/// The process's mappings, sorted by address.
pub struct Protections {
    ranges: Vec<Range>,
}

/// Most bytes of `/proc/self/maps` read (a million mappings' worth).
const MAX_MAPS: usize = 128 << 20;

impl Protections {
    /// Reads `/proc/self/maps` now. `None` if it cannot be read.
    pub fn read() -> Option<Protections> {
        let text = read_file(c"/proc/self/maps")?;
        Some(Protections {
            ranges: parse(&text),
        })
    }

    /// The mapping that holds `addr`.
    pub fn at(&self, addr: usize) -> Option<Range> {
        let i = self.ranges.partition_point(|r| r.end <= addr);
        self.ranges.get(i).filter(|r| r.start <= addr).copied()
    }

    /// Whether every page of `[start, end)` is mapped read-only (not writable).
    pub fn read_only(&self, start: usize, end: usize) -> bool {
        let mut at = start;
        while at < end {
            match self.at(at) {
                Some(r) if !r.write => at = r.end,
                _ => return false,
            }
        }
        true
    }
}

/// Parses the lines of `/proc/PID/maps`: "start-end perms ...".
fn parse(text: &[u8]) -> Vec<Range> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line.split(|&b| b == b' ');
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some(dash) = range.iter().position(|&b| b == b'-') else {
            continue;
        };
        let (Some(start), Some(end)) = (hex(&range[..dash]), hex(&range[dash + 1..])) else {
            continue;
        };
        if perms.len() < 3 {
            continue;
        }
        out.push(Range {
            start,
            end,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
        });
    }
    out.sort_by_key(|r| r.start);
    out
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0usize, |acc, &b| {
        let d = (b as char).to_digit(16)?;
        Some(acc << 4 | d as usize)
    })
}

/// The whole of a (proc) file, read with the C library's `open` and `read` (no stdio).
fn read_file(path: &std::ffi::CStr) -> Option<Vec<u8>> {
    // SAFETY: open with a NUL-terminated path; the result is checked.
    let fd = unsafe { sys::open(path.as_ptr(), sys::O_RDONLY | sys::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = Vec::<u8>::with_capacity(64 << 10);
    let ok = loop {
        if buf.len() == buf.capacity() {
            if buf.len() >= MAX_MAPS {
                break false;
            }
            buf.reserve(buf.len());
        }
        let spare = buf.capacity() - buf.len();
        // SAFETY: read writes at most `spare` bytes into the vector's spare capacity.
        let n = unsafe { sys::read(fd, buf.as_mut_ptr().add(buf.len()).cast(), spare) };
        if n < 0 {
            break false;
        }
        if n == 0 {
            break true;
        }
        // SAFETY: the kernel initialised `n` more bytes.
        unsafe { buf.set_len(buf.len() + n as usize) };
    };
    // SAFETY: the descriptor opened above.
    unsafe { sys::close(fd) };
    ok.then_some(buf)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_become_sorted_ranges() {
        let text = b"7f00-7f10 r--p 00000000 08:01 1 /lib/a.so\n\
                     1000-2000 r-xp 00000000 08:01 1 /bin/x\n\
                     2000-3000 rw-p 00000000 00:00 0 \n\
                     bad line\n";
        let p = Protections {
            ranges: parse(text),
        };
        assert_eq!(p.ranges.len(), 3);
        assert_eq!(p.ranges[0].start, 0x1000);
        assert!(p.at(0x1fff).is_some_and(|r| r.exec && !r.write));
        assert!(p.at(0x2000).is_some_and(|r| r.write));
        assert!(p.at(0x3000).is_none());
        assert!(p.read_only(0x1000, 0x2000));
        assert!(!p.read_only(0x1000, 0x2001));
        assert!(p.read_only(0x7f00, 0x7f10));
        assert!(!p.read_only(0x7f00, 0x7f20), "unmapped is not read-only");
    }

    #[test]
    fn this_process_s_own_pages_are_found() {
        let p = Protections::read().unwrap();
        let code = maps_lines_become_sorted_ranges as *const () as usize;
        assert!(p.at(code).is_some_and(|r| r.exec && r.read && !r.write));
        let local = 5u64;
        let stack = &local as *const u64 as usize;
        assert!(p.at(stack).is_some_and(|r| r.write));
    }
}
