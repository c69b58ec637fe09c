//! `/proc/PID/maps`: what the target has mapped where.

use crate::remote::Proc;
use std::io;
use std::path::PathBuf;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub write: bool,
    pub exec: bool,
    pub offset: u64,
    /// Device (major, minor) and inode of the mapped file.
    pub dev: (u32, u32),
    pub inode: u64,
    /// The path, pseudo-name (`[stack]`) or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the mapping covers nothing (never, as the kernel shows them).
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Whether this maps a file (not anonymous memory, a stack, the vdso...).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && !self.path.is_empty() && !self.path.starts_with('[')
    }

    /// The file name without directories or a ` (deleted)` suffix.
    pub fn file_name(&self) -> &str {
        let path = self.path.strip_suffix(" (deleted)").unwrap_or(&self.path);
        path.rsplit('/').next().unwrap_or(path)
    }
}

/// Parses the text of a maps file; lines it does not understand are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?.as_bytes(),
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let path = fields.next().unwrap_or("").trim_start().to_string();
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    if perms.len() < 4 {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        path,
    })
}

/// Reads the target's mappings.
pub fn read(proc: &Proc) -> io::Result<Vec<Mapping>> {
    Ok(parse(&proc.read_to_string("maps")?))
}

/// Where to read the file behind `m` from this process: the mapping itself (the very file,
/// even deleted; needs CAP_SYS_ADMIN), through the target's root (a target in a container),
/// else the path. The caller checks that what it opens is the mapped file.
pub fn file_paths(proc: &Proc, m: &Mapping) -> Vec<PathBuf> {
    let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
    vec![
        PathBuf::from(proc.path(&format!("map_files/{:x}-{:x}", m.start, m.end))),
        PathBuf::from(proc.path(&format!("root{path}"))),
        PathBuf::from(path),
    ]
}

/// The lowest address at which the file of `m` is mapped (its mapping at file offset 0).
pub fn file_base(maps: &[Mapping], m: &Mapping) -> Option<u64> {
    maps.iter()
        .filter(|o| o.path == m.path && o.inode == m.inode && o.offset == 0)
        .map(|o| o.start)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_files_anonymous_and_pseudo_mappings() {
        let text = "\
55d0c4a00000-55d0c4a28000 r--p 00000000 08:01 1234                       /usr/bin/python3.11
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7f1e2d400000-7f1e2d5a0000 r-xp 00028000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2e000000-7f1e2e800000 r-xp 00000000 00:01 77 /memfd:mprof-agent.so (deleted)
7ffd5a1e0000-7ffd5a201000 rw-p 00000000 00:00 0                          [stack]
";
        let maps = parse(text);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[0].path, "/usr/bin/python3.11");
        assert!(maps[0].is_file() && !maps[0].exec);
        assert!(!maps[1].is_file() && maps[1].path.is_empty());
        assert_eq!(maps[2].offset, 0x28000);
        assert_eq!(maps[2].dev, (8, 1));
        assert!(maps[2].exec);
        assert_eq!(maps[3].file_name(), "memfd:mprof-agent.so");
        assert!(!maps[4].is_file());
        assert!(maps[2].contains(0x7f1e2d400000) && !maps[2].contains(0x7f1e2d5a0000));
    }
}
