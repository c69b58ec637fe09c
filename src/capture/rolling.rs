//! A directory of rolling interval profiles, as `--every --profiles-dir` writes it and the
//! views read it back: one gzipped pprof file per interval, named
//! `mprof-<unix ms>-<pid>-<interval>.pb.gz` ([`file_name`]) so that their order is their
//! time order; a time range of it (`DIR@FROM..TO`, [`Range`]); and what a path given to a view
//! names ([`Spec::of`]): a capture, a directory of interval profiles (or a time range of
//! one), or one gzipped pprof file.
//!
//! The directory and its files are untrusted: it is read through one descriptor, its files
//! opened without following symlinks (`crate::capture::directory`); only regular files named
//! as [`parse_name`] reads them count (anything else is ignored), at most [`MAX_FILES`] of
//! them (the newest), each at most [`MAX_FILE_BYTES`] bytes.

use crate::capture::directory::Directory;
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The start and the end of a file's name; between them, three numbers and two dashes.
const PREFIX: &str = "mprof-";
const SUFFIX: &str = ".pb.gz";

/// Most interval files read from a directory: the newest, when there are more.
pub const MAX_FILES: usize = 100_000;
/// Largest interval file read (gzipped); a larger one is skipped.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The name of the file of interval `seq` of the session of `pid`, started at `unix_ms`.
pub fn file_name(unix_ms: u64, pid: u32, seq: u64) -> String {
    format!("{PREFIX}{unix_ms:013}-{pid}-{seq:06}{SUFFIX}")
}

/// What an interval file's name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Name {
    /// When the interval started (wall clock, ms since the epoch).
    pub unix_ms: u64,
    /// The session's process.
    pub pid: u32,
    /// The interval's number in its session, from 1.
    pub seq: u64,
}

impl Name {
    /// The interval's start, in ns since the epoch.
    pub fn start_ns(&self) -> u64 {
        self.unix_ms.saturating_mul(1_000_000)
    }

    /// The file's name.
    pub fn file_name(&self) -> String {
        file_name(self.unix_ms, self.pid, self.seq)
    }
}

/// The numbers of an interval file's name ([`file_name`]); `None` for any other name.
pub fn parse_name(name: &str) -> Option<Name> {
    let middle = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let mut parts = middle.split('-');
    let mut number = || -> Option<u64> {
        let digits = parts.next()?;
        let plain = !digits.is_empty() && digits.len() <= 20;
        plain
            .then_some(digits)
            .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?
            .parse()
            .ok()
    };
    let (unix_ms, pid, seq) = (number()?, number()?, number()?);
    if parts.next().is_some() {
        return None;
    }
    Some(Name {
        unix_ms,
        pid: u32::try_from(pid).ok()?,
        seq,
    })
}

/// Whether `name` is an interval file's.
pub fn is_ours(name: &str) -> bool {
    parse_name(name).is_some()
}

/// One end of a [`Range`]: an offset from the start of the first interval, or back from the
/// end of the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offset {
    FromStart(u64),
    FromEnd(u64),
}

/// A time range of a directory of intervals, `FROM..TO` (either end may be left out): the
/// intervals that start at or after FROM and before TO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub from: Option<Offset>,
    pub to: Option<Offset>,
    /// As written.
    pub text: String,
}

impl Range {
    /// Parses `FROM..TO`: each end a duration (`90s`, `10m`, `1.5h`, `2d`, `500ms`; a bare
    /// number is seconds) from the start of the first interval, or with `-` back from the end
    /// of the last; either may be left out.
    pub fn parse(text: &str) -> Result<Range, String> {
        let Some((from, to)) = text.split_once("..") else {
            return Err(format!(
                "'{text}': a time range is FROM..TO (`..1h`, `-1h..`, `10m..20m`)"
            ));
        };
        let end = |t: &str| match t.trim() {
            "" => Ok(None),
            t => offset(t).map(Some),
        };
        Ok(Range {
            from: end(from)?,
            to: end(to)?,
            text: text.to_owned(),
        })
    }

    /// Whether an end is counted back from the end of the last interval.
    pub fn needs_end(&self) -> bool {
        [self.from, self.to]
            .iter()
            .any(|o| matches!(o, Some(Offset::FromEnd(_))))
    }

    /// The intervals selected, of those starting at `starts` (ns, in time order), the first at
    /// `starts[0]`, the last ending at `end_ns`: indices into `starts`.
    pub fn select(&self, starts: &[u64], end_ns: u64) -> std::ops::Range<usize> {
        let Some(&first) = starts.first() else {
            return 0..0;
        };
        let at = |o: Offset| -> i128 {
            match o {
                Offset::FromStart(ns) => first as i128 + ns as i128,
                Offset::FromEnd(ns) => end_ns as i128 - ns as i128,
            }
        };
        let from = self.from.map_or(i128::MIN, at);
        let to = self.to.map_or(i128::MAX, at);
        let a = starts.partition_point(|&s| (s as i128) < from);
        let b = starts.partition_point(|&s| (s as i128) < to);
        a..b.max(a)
    }
}

/// An offset: `[-]NUMBER[ms|s|m|h|d]`, in ns.
fn offset(text: &str) -> Result<Offset, String> {
    let bad =
        || format!("'{text}': an offset like 90s, 10m, 1h or 2d, or -1h to count from the end");
    let (back, t) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let at = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(at);
    let scale = match unit {
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        "d" => 86400e9,
        _ => return Err(bad()),
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    if !n.is_finite() || !number.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad());
    }
    // Saturates at u64::MAX ns (584 years).
    let ns = (n * scale) as u64;
    Ok(if back {
        Offset::FromEnd(ns)
    } else {
        Offset::FromStart(ns)
    })
}

/// What a view's path names, when it is not a capture.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The directory or file.
    pub path: PathBuf,
    /// A directory of interval files, or one file.
    pub directory: bool,
    /// The time range asked for (`DIR@FROM..TO`).
    pub range: Option<Range>,
}

impl Spec {
    /// What `path` names: `None` for a capture (or nothing: the capture reader says what is
    /// wrong); a directory, a gzipped file (pprof), or `DIR@FROM..TO` when `path` itself does
    /// not exist but the directory before its last `@` does.
    pub fn of(path: &Path) -> Result<Option<Spec>> {
        if let Some(kind) = kind_of(path) {
            return Ok(kind.map(|directory| Spec {
                path: path.to_path_buf(),
                directory,
                range: None,
            }));
        }
        let bytes = path.as_os_str().as_bytes();
        let Some(at) = bytes.iter().rposition(|&b| b == b'@') else {
            return Ok(None);
        };
        let base = Path::new(OsStr::from_bytes(&bytes[..at]));
        let range = String::from_utf8_lossy(&bytes[at + 1..]).into_owned();
        match kind_of(base) {
            None => Ok(None),
            Some(Some(true)) => {
                let range = Range::parse(&range)
                    .map_err(|e| anyhow::anyhow!("{}: bad time range {e}", path.display()))?;
                Ok(Some(Spec {
                    path: base.to_path_buf(),
                    directory: true,
                    range: Some(range),
                }))
            }
            Some(_) => bail!(
                "{}: a time range (@FROM..TO) selects intervals of a directory of interval \
                 profiles (written by --every --profiles-dir); {} is a file",
                path.display(),
                base.display()
            ),
        }
    }
}

/// `None` when nothing is at `path`; `Some(Some(true))` for a directory, `Some(Some(false))`
/// for a regular file that starts like gzip (a pprof file), `Some(None)` for anything else
/// (the capture reader judges it).
fn kind_of(path: &Path) -> Option<Option<bool>> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(_) => return Some(None),
    };
    if meta.is_dir() {
        return Some(Some(true));
    }
    if !meta.is_file() {
        return Some(None);
    }
    let mut magic = [0u8; 2];
    let gzipped = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == [0x1f, 0x8b]);
    Some(gzipped.then_some(false))
}

/// The interval files a [`Spec`] names, in time order (not read yet).
pub struct Listing {
    /// The directory (`None` for one file).
    dir: Option<Directory>,
    /// The path as the user gave it (without its range).
    pub path: PathBuf,
    /// Each file's name and what it says (a single file not named so has no [`Name`]).
    pub files: Vec<(String, Option<Name>)>,
    /// What the reader should be told about the directory (symlinks, too many files).
    pub warnings: Vec<String>,
}

impl Listing {
    /// Lists the interval files `spec` names.
    pub fn open(spec: &Spec) -> Result<Listing> {
        if !spec.directory {
            let name = spec.path.file_name().unwrap_or_default().to_string_lossy();
            return Ok(Listing {
                dir: None,
                path: spec.path.clone(),
                files: vec![(name.to_string(), parse_name(&name))],
                warnings: Vec::new(),
            });
        }
        let dir = Directory::open(&spec.path, true)?;
        let mut names: Vec<Name> = Vec::new();
        let mut links = 0usize;
        for entry in dir.entries()? {
            let (name, kind) = entry?;
            let Some(n) = name.to_str().and_then(parse_name) else {
                continue;
            };
            match kind {
                Some(k) if k.is_symlink() => links += 1,
                Some(k) if k.is_file() => names.push(n),
                _ => {}
            }
            if names.len() >= 2 * MAX_FILES {
                keep_newest(&mut names);
            }
        }
        let found = names.len();
        keep_newest(&mut names);
        let mut warnings = Vec::new();
        if found > MAX_FILES {
            warnings.push(format!(
                "{}: {found} interval profiles, only the newest {MAX_FILES} are read",
                spec.path.display()
            ));
        }
        if links > 0 {
            warnings.push(format!(
                "{}: {links} symlink(s) named like interval profiles skipped, not followed",
                spec.path.display()
            ));
        }
        let files = names.iter().map(|n| (n.file_name(), Some(*n))).collect();
        Ok(Listing {
            dir: Some(dir),
            path: spec.path.clone(),
            files,
            warnings,
        })
    }

    /// The bytes of file `i` (at most [`MAX_FILE_BYTES`]).
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let (name, _) = &self.files[i];
        let file = match &self.dir {
            Some(dir) => dir.open_file(name)?,
            None => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&self.path)
                    .with_context(|| format!("cannot read {}", self.path.display()))?;
                if !file.metadata().is_ok_and(|m| m.is_file()) {
                    bail!("{} is not a regular file", self.path.display());
                }
                file
            }
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {name}"))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            bail!("larger than {} MiB", MAX_FILE_BYTES >> 20);
        }
        Ok(bytes)
    }
}

/// Sorts `names` in time order and keeps the newest [`MAX_FILES`].
fn keep_newest(names: &mut Vec<Name>) {
    names.sort_unstable();
    names.dedup();
    let extra = names.len().saturating_sub(MAX_FILES);
    names.drain(..extra);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_as_written_and_nothing_else_passes() {
        let name = file_name(1_796_650_475_355, 12743, 7);
        assert_eq!(name, "mprof-1796650475355-12743-000007.pb.gz");
        assert_eq!(
            parse_name(&name),
            Some(Name {
                unix_ms: 1_796_650_475_355,
                pid: 12743,
                seq: 7
            })
        );
        for bad in [
            "mprof-.pb.gz",
            "mprof-1-2.pb.gz",
            "mprof-1-2-3-4.pb.gz",
            "mprof-1--3.pb.gz",
            "mprof-1-99999999999-3.pb.gz",
            "mprof-1-2-3.pb",
            "mprof-1-2-+3.pb.gz",
            "mprof-../x.pb.gz",
            "xmprof-1-2-3.pb.gz",
        ] {
            assert!(!is_ours(bad), "{bad}");
        }
    }

    #[test]
    fn ranges_select_the_intervals_that_start_in_them() {
        let s = |secs: &[u64]| secs.iter().map(|s| s * 1_000_000_000).collect::<Vec<_>>();
        // Six intervals of 10 s, from t=100 s to t=160 s.
        let starts = s(&[100, 110, 120, 130, 140, 150]);
        let end = 160_000_000_000;
        let sel = |r: &str| Range::parse(r).unwrap().select(&starts, end);
        assert_eq!(sel(".."), 0..6);
        assert_eq!(sel("..20s"), 0..2);
        assert_eq!(sel("-20s.."), 4..6);
        assert_eq!(sel("10s..30s"), 1..3);
        assert_eq!(sel("0.5m.."), 3..6);
        assert_eq!(sel("-1h..-50s"), 0..1);
        assert_eq!(sel("30s..10s"), 3..3);
        assert_eq!(sel("1d.."), 6..6);
        assert!(!Range::parse("..1h").unwrap().needs_end());
        assert!(Range::parse("-1h..").unwrap().needs_end());
        for bad in [
            "1h", "..1x", "a..", "--1h..", "..+1h", "..nan", "..inf", "1h...2h",
        ] {
            assert!(Range::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Range::parse("-90..").unwrap().from,
            Some(Offset::FromEnd(90_000_000_000))
        );
        assert_eq!(
            Range::parse("..500ms").unwrap().to,
            Some(Offset::FromStart(500_000_000))
        );
    }

    #[test]
    fn a_path_names_a_directory_a_range_of_it_or_a_capture() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("prof");
        std::fs::create_dir(&d).unwrap();
        let spec = Spec::of(&d).unwrap().unwrap();
        assert!(spec.directory && spec.range.is_none());
        let ranged = Spec::of(Path::new(&format!("{}@-1h..", d.display())))
            .unwrap()
            .unwrap();
        assert_eq!(
            (ranged.path, ranged.range.unwrap().text),
            (d.clone(), "-1h..".into())
        );
        // A real path with `@` in its name opens as itself.
        let at = dir.path().join("odd@..1h");
        std::fs::create_dir(&at).unwrap();
        assert_eq!(Spec::of(&at).unwrap().unwrap().path, at);
        // A capture, a missing path, a range of a file, a bad range.
        let cap = dir.path().join("c.mprof");
        std::fs::write(&cap, b"MPROFCAP").unwrap();
        assert_eq!(Spec::of(&cap).unwrap(), None);
        assert_eq!(Spec::of(&dir.path().join("none@..1h")).unwrap(), None);
        let e = Spec::of(Path::new(&format!("{}@..1h", cap.display()))).unwrap_err();
        assert!(e.to_string().contains("is a file"), "{e}");
        let e = Spec::of(Path::new(&format!("{}@1h", d.display()))).unwrap_err();
        assert!(e.to_string().contains("FROM..TO"), "{e}");
        let gz = dir.path().join("one.pb.gz");
        std::fs::write(&gz, [0x1f, 0x8b, 0]).unwrap();
        assert!(!Spec::of(&gz).unwrap().unwrap().directory);
    }

    #[test]
    fn a_listing_keeps_regular_files_named_as_intervals_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (ms, seq) in [(3000, 3), (1000, 1), (2000, 2)] {
            std::fs::write(d.join(file_name(ms, 7, seq)), b"x").unwrap();
        }
        std::fs::write(d.join("notes.txt"), b"mine").unwrap();
        std::fs::create_dir(d.join(file_name(4000, 7, 4))).unwrap();
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(secret.path(), d.join(file_name(5000, 7, 5))).unwrap();
        let spec = Spec::of(d).unwrap().unwrap();
        let l = Listing::open(&spec).unwrap();
        let seqs: Vec<u64> = l.files.iter().map(|(_, n)| n.unwrap().seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(l.read(0).unwrap(), b"x");
        assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
        assert!(l.warnings[0].contains("1 symlink(s)"));
        let mut names: Vec<Name> = (0..MAX_FILES as u64 + 5)
            .rev()
            .map(|i| Name {
                unix_ms: i,
                pid: 1,
                seq: i,
            })
            .collect();
        keep_newest(&mut names);
        assert_eq!((names.len(), names[0].seq), (MAX_FILES, 5));
    }
}
