//! The process's mappings and their resident bytes, from `/proc/PID/smaps`, for the RESIDENT
//! records (see `mprof_common::record::Resident`): anonymous mappings one by one (sampled
//! `mmap` blocks are looked up among them), named ones (files, `[heap]`, `[stack]`) added up
//! per name. Read every 5 seconds at most by the program's own reader (the kernel walks the
//! process's page tables for it, under the lock `mmap` takes in the target: see
//! `RESIDENT_EVERY`) and once at the end.

use mprof_common::record::{AnonMapping, Resident, MAX_ANON, MAX_NAMED};
use std::collections::HashMap;
use std::io::Read;

/// Largest smaps file read (a process with about a million mappings).
const MAX_SMAPS: u64 = 512 << 20;
/// The bytes asked for at each read of it: the mappings of most processes at once.
const READ_CHUNK: usize = 4 << 20;

/// Reads `/proc/PID/smaps` now; `None` if it cannot be read (the process is gone).
pub fn read(pid: u32, time_ns: u64) -> Option<Resident> {
    let mut file = std::fs::File::open(format!("/proc/{pid}/smaps")).ok()?;
    // The kernel lists the mappings as they are during one `read` (it holds the process's
    // mapping lock for it) and takes up after the last one listed at the next: the heap growing
    // or shrinking between two small reads has been counted twice (905 MiB of `[heap]` in a
    // process of 500 MiB). Large reads make it one view of most processes; mappings listed
    // again are skipped by `parse`.
    let mut bytes = Vec::with_capacity(READ_CHUNK);
    loop {
        if bytes.len() as u64 >= MAX_SMAPS {
            break;
        }
        let len = bytes.len();
        bytes.resize(len + READ_CHUNK, 0);
        let n = loop {
            match file.read(&mut bytes[len..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other.ok()?,
            }
        };
        bytes.truncate(len + n);
        if n == 0 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut r = parse(&text);
    r.time_ns = time_ns;
    (r.rss > 0).then_some(r)
}

/// Parses the text of a smaps file.
pub fn parse(text: &str) -> Resident {
    let mut r = Resident::default();
    let mut named: HashMap<&str, u64> = HashMap::new();
    // The mapping whose fields follow: (start, end, name).
    let mut current: Option<(u64, u64, &str)> = None;
    // The end of the last mapping listed: one that starts below it was listed already.
    let mut listed_to = 0;
    for line in text.lines() {
        if let Some(head) = mapping_header(line) {
            current = (head.0 >= listed_to).then_some(head);
            listed_to = listed_to.max(head.1);
            continue;
        }
        let Some(kb) = line.strip_prefix("Rss:") else {
            continue;
        };
        let Some((start, end, name)) = current.take() else {
            continue;
        };
        let bytes = kb
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
            .saturating_mul(1024);
        r.rss = r.rss.saturating_add(bytes);
        if is_anonymous(name) {
            if r.anon.len() < MAX_ANON {
                r.anon.push(AnonMapping {
                    start,
                    end,
                    rss: bytes,
                });
            }
        } else if bytes > 0 {
            *named.entry(name).or_default() += bytes;
        }
    }
    let mut named: Vec<(String, u64)> =
        named.into_iter().map(|(n, b)| (n.to_string(), b)).collect();
    named.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    named.truncate(MAX_NAMED);
    r.named = named;
    r.anon.sort_by_key(|m| m.start);
    r
}

/// Whether a mapping is anonymous memory: unnamed, shared anonymous memory (`mmap` with
/// `MAP_SHARED | MAP_ANONYMOUS`, Python's `mmap.mmap(-1, n)`, which the kernel names after
/// `/dev/zero`), or anonymous memory its program named (`[anon:NAME]`, Linux 5.17+).
fn is_anonymous(name: &str) -> bool {
    name.is_empty()
        || name == "/dev/zero (deleted)"
        || name.starts_with("[anon:")
        || name.starts_with("[anon_shmem:")
}

/// A mapping's first line ("start-end perms offset dev inode name"): its range and name.
fn mapping_header(line: &str) -> Option<(u64, u64, &str)> {
    let (range, rest) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    // Field lines ("Rss:   4 kB") have no hexadecimal range before their first space.
    let mut fields = rest.splitn(5, ' ');
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let name = fields.nth(3).unwrap_or("").trim_start();
    Some((start, end, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_listed_or_added_up_by_name() {
        let text = "\
55d0c4a00000-55d0c4a28000 r--p 00000000 08:01 1234                       /usr/bin/python3.11
Size:                160 kB
Rss:                 120 kB
Pss:                 120 kB
55d0c4a28000-55d0c4a30000 r-xp 00028000 08:01 1234                       /usr/bin/python3.11
Rss:                  32 kB
55d0c5000000-55d0c6000000 rw-p 00000000 00:00 0                          [heap]
Rss:               16000 kB
7f1e2c000000-7f1e6c000000 rw-p 00000000 00:00 0 
Rss:                2048 kB
7ffd5a1e0000-7ffd5a201000 rw-p 00000000 00:00 0                          [stack]
Rss:                 132 kB
";
        let r = parse(text);
        assert_eq!(r.rss, (120 + 32 + 16000 + 2048 + 132) * 1024);
        // The heap listed again (grown meanwhile) by a later read of the file: counted once.
        let again = text.replace(
            "7f1e2c000000-",
            "55d0c5000000-55d0c7000000 rw-p 00000000 00:00 0      [heap]\nRss: 30000 kB\n7f1e2c000000-",
        );
        assert_eq!(parse(&again).rss, r.rss);
        assert_eq!(r.anon.len(), 1);
        assert_eq!(r.anon[0].start, 0x7f1e2c000000);
        assert_eq!(r.anon[0].rss, 2048 * 1024);
        assert_eq!(r.named[0], ("[heap]".to_string(), 16000 * 1024));
        let python = r
            .named
            .iter()
            .find(|(n, _)| n.ends_with("python3.11"))
            .unwrap();
        assert_eq!(python.1, 152 * 1024);
    }

    #[test]
    fn this_process_s_smaps_reads() {
        let r = read(std::process::id(), 1).unwrap();
        assert!(r.rss > 0 && !r.named.is_empty());
        assert!(r.anon.windows(2).all(|w| w[0].start <= w[1].start));
    }
}
