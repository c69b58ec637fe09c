//! A directory of rolling pprof files, one per interval, named so that their order is their
//! time order (`mprof-<unix ms>-<pid>-<interval>.pb.gz`); past the count or the bytes allowed,
//! the oldest are removed. Files of that pattern left by an earlier run count too (a service
//! restarted keeps one history); nothing else in the directory is touched.
//!
//! The directory is prepared like every output of mprof (`crate::base::output`): made 0700 or
//! reused when it is the invoking user's own, a symlink someone else owns refused, every file
//! created through the directory's descriptor.

use crate::base::output::{Access, OutputDir};
use crate::capture::rolling::is_ours;
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;

/// How many files, and how many bytes of them, the directory keeps.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub files: usize,
    pub bytes: u64,
}

/// The directory and the files of the pattern in it, oldest first.
pub struct Rolling {
    dir: OutputDir,
    files: VecDeque<(String, u64)>,
    bounds: Bounds,
    /// Files removed to stay within the bounds.
    pub removed: u64,
}

impl Rolling {
    /// Prepares the directory `path`.
    pub fn open(path: &Path, bounds: Bounds) -> Result<Rolling> {
        let mut dir = OutputDir::prepare(path, "profiles directory")?;
        dir.keep_as_it_is();
        let mut files: Vec<(String, u64)> = std::fs::read_dir(dir.listing())
            .with_context(|| format!("listing {}", path.display()))?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (is_ours(&name) && meta.is_file()).then_some((name, meta.len()))
            })
            .collect();
        files.sort();
        Ok(Rolling {
            dir,
            files: files.into(),
            bounds,
            removed: 0,
        })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes one interval's file, then removes the oldest beyond the bounds (never the new
    /// one). Returns its name.
    pub fn write(&mut self, unix_ms: u64, pid: u32, seq: u64, bytes: &[u8]) -> Result<String> {
        let name = crate::capture::rolling::file_name(unix_ms, pid, seq);
        let (mut file, mut pending) = self.dir.create(&name, "profile", Access::Shared)?;
        file.write_all(bytes)
            .and_then(|()| file.flush())
            .with_context(|| format!("writing {}", self.dir.path().join(&name).display()))?;
        pending.place()?;
        self.files.retain(|(n, _)| *n != name);
        self.files.push_back((name.clone(), bytes.len() as u64));
        self.prune();
        Ok(name)
    }

    fn prune(&mut self) {
        let mut total: u64 = self.files.iter().map(|f| f.1).sum();
        while self.files.len() > 1
            && (self.files.len() > self.bounds.files || total > self.bounds.bytes)
        {
            let Some((old, len)) = self.files.pop_front() else {
                break;
            };
            self.dir.remove(&old);
            total -= len;
            self.removed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_other_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("notes.txt"), b"mine").unwrap();
        std::fs::write(
            path.join("mprof-0000000000001-7-000001.pb.gz"),
            b"earlier run",
        )
        .unwrap();
        let bounds = Bounds {
            files: 3,
            bytes: 1 << 20,
        };
        let mut r = Rolling::open(&path, bounds).unwrap();
        for seq in 1..=4 {
            r.write(1_000 + seq, 42, seq, b"profile").unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "mprof-0000000001002-42-000002.pb.gz",
                "mprof-0000000001003-42-000003.pb.gz",
                "mprof-0000000001004-42-000004.pb.gz",
                "notes.txt"
            ]
        );
        assert_eq!(r.removed, 2);
        // The bytes bound: files of 7 bytes, 10 allowed, the newest always kept.
        let mut r = Rolling::open(
            &path,
            Bounds {
                files: 10,
                bytes: 10,
            },
        )
        .unwrap();
        r.write(2_000, 42, 5, b"profile").unwrap();
        assert_eq!(r.files.len(), 1);
        assert!(is_ours("mprof-0000000002000-42-000005.pb.gz"));
        assert!(!is_ours("mprof-../x.pb.gz") && !is_ours("mprof-.pb.gz"));
    }
}
