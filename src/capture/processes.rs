//! The processes of a capture. Under `--follow-children` a session writes the program's own
//! capture at `CAPTURE` (its metadata names the directory, `children_dir=CAPTURE.d`) and one
//! capture per followed program in `CAPTURE.d`: `PID.mprof`, and `PID-2.mprof`, `PID-3.mprof`…
//! for the programs a followed process ran after it by exec (the same pid, a new image whose
//! addresses and code objects are its own; see [`capture_name`]). A [`CaptureSet`] opens them
//! together: every view shows them merged by default, or one process (all its programs) with
//! `--pid PID`.
//!
//! Merging interleaves the records of all the captures by time (each record takes the time of
//! the last timed record before it in its own file), so the whole live heap, its peak and the
//! timeline are those of all the processes at once. The records keep their process (an index:
//! 0 is the program's, then the children by pid), because addresses and code objects mean
//! something only within their process (see `crate::analysis::aggregate`).
//!
//! The directory and its files are untrusted input like any capture: the directory and every
//! file are opened relative to a descriptor without following symlinks (a symlink is skipped
//! with a warning, never followed out); only regular files named `PID.mprof` or `PID-N.mprof`
//! are read, at most [`MAX_MEMBERS`] of them; anything else there is reported in one warning
//! line. A child's capture that is not a capture is skipped with a warning; a damaged tail is
//! a warning, as for any capture.

use crate::capture::directory::Directory;
use crate::capture::file::{CaptureFile, Pass};
use crate::capture::records::{Event, Records, Totals};
use anyhow::{bail, Result};
use mprof_common::record::Record;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Most followed processes read with a capture (mprof follows at most 4096 per session).
pub const MAX_MEMBERS: usize = 4096;
/// Records at the start of a capture searched for `children_dir`.
const META_SEARCH: usize = 32;
/// Read buffer per capture when several are interleaved.
const MEMBER_BUFFER: usize = 64 << 10;

/// Which processes a view shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pick {
    /// All of them, merged (a capture without followed children is one process anyway).
    #[default]
    All,
    /// The process with this pid alone.
    Pid(u32),
}

impl Pick {
    /// `--pid PID` given or not.
    pub fn of(pid: Option<u32>) -> Pick {
        pid.map_or(Pick::All, Pick::Pid)
    }
}

/// `--pid PID`, for every view of a capture.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct PidArgs {
    /// Only this process of a capture recorded with --follow-children (default: all its
    /// processes merged; `mprof report --per-process` lists them).
    #[arg(long)]
    pub pid: Option<u32>,
}

impl PidArgs {
    pub fn pick(&self) -> Pick {
        Pick::of(self.pid)
    }
}

/// One capture of the set.
pub struct Member {
    /// The process's pid: the file name's for a child, the metadata's for the program. Two
    /// members share it when a followed process ran a new program by exec.
    pub pid: Option<u32>,
    pub file: CaptureFile,
}

/// The captures a view reads: the one it was given and, unless one process was picked, the
/// captures of its followed children.
pub struct CaptureSet {
    /// The program's capture first (when it is read), then the children by pid.
    pub members: Vec<Member>,
    /// What the reader should be told about the directory and the children's captures.
    pub warnings: Vec<String>,
    /// Whether the capture followed children (even if none of their captures is read).
    pub followed: bool,
    /// The processes asked for.
    pub pick: Pick,
}

impl CaptureSet {
    /// Opens `path` and, as `pick` says, its children's captures.
    pub fn open(path: &Path, pick: Pick) -> Result<CaptureSet> {
        let root = CaptureFile::open(path)?;
        let (root_pid, dir_name) = scan_meta(&root)?;
        let mut set = CaptureSet::open_picked(path, pick, root, root_pid, dir_name)?;
        set.pick = pick;
        Ok(set)
    }

    fn open_picked(
        path: &Path,
        pick: Pick,
        root: CaptureFile,
        root_pid: Option<u32>,
        dir_name: Option<String>,
    ) -> Result<CaptureSet> {
        let Some(dir_name) = dir_name else {
            return match pick {
                Pick::Pid(pid) if root_pid.is_some_and(|p| p != pid) => bail!(
                    "{} is the capture of PID {} alone (recorded without --follow-children): \
                     PID {pid} is not in it",
                    path.display(),
                    root_pid.unwrap_or(0)
                ),
                _ => Ok(CaptureSet::single(root_pid, root)),
            };
        };
        let dir_path = children_path(path, &dir_name);
        if let Some(pid) = root_pid.filter(|&p| pick == Pick::Pid(p)) {
            // The program, and the programs it ran after it by exec, if any.
            let mut set = CaptureSet::single(root_pid, root);
            set.followed = true;
            if let Ok(l) = Listing::read(&dir_path) {
                for &(_, image) in l.captures.iter().filter(|(p, _)| *p == pid) {
                    set.add_member(&l, &dir_path, pid, image);
                }
            }
            return Ok(set);
        }
        let listing = match Listing::read(&dir_path) {
            Ok(listing) => listing,
            Err(e) if pick == Pick::All => {
                let mut set = CaptureSet::single(root_pid, root);
                set.followed = true;
                set.warnings.push(format!(
                    "the captures of the followed processes cannot be read ({e:#}); the figures \
                     are the program's alone"
                ));
                return Ok(set);
            }
            Err(e) => return Err(e),
        };
        match pick {
            Pick::All => Ok(CaptureSet::merged(root_pid, root, &dir_path, listing)),
            Pick::Pid(pid) => CaptureSet::one_child(path, root_pid, &dir_path, listing, pid),
        }
    }

    /// One capture file alone, whatever it followed.
    pub fn of_file(file: CaptureFile) -> CaptureSet {
        CaptureSet::single(None, file)
    }

    fn single(pid: Option<u32>, file: CaptureFile) -> CaptureSet {
        CaptureSet {
            members: vec![Member { pid, file }],
            warnings: Vec::new(),
            followed: false,
            pick: Pick::All,
        }
    }

    /// The program's capture and every readable child's.
    fn merged(root_pid: Option<u32>, root: CaptureFile, dir: &Path, l: Listing) -> CaptureSet {
        let mut set = CaptureSet::single(root_pid, root);
        set.followed = true;
        set.warnings.extend(l.warnings.iter().cloned());
        raise_file_limit(l.captures.len() + 16);
        for &(pid, image) in &l.captures {
            set.add_member(&l, dir, pid, image);
        }
        set
    }

    /// Opens image `image` of child `pid` as a member; one that cannot be read is a warning.
    fn add_member(&mut self, l: &Listing, dir: &Path, pid: u32, image: u32) {
        match l.open(dir, pid, image) {
            Ok(file) => self.members.push(Member {
                pid: Some(pid),
                file,
            }),
            Err(e) => self
                .warnings
                .push(format!("skipping {}: {e:#}", capture_name(pid, image))),
        }
    }

    /// The captures of child `pid` alone (every program it ran, merged).
    fn one_child(
        path: &Path,
        root_pid: Option<u32>,
        dir: &Path,
        l: Listing,
        pid: u32,
    ) -> Result<CaptureSet> {
        let images: Vec<u32> = l
            .captures
            .iter()
            .filter(|(p, _)| *p == pid)
            .map(|&(_, image)| image)
            .collect();
        if images.is_empty() {
            let mut known: Vec<String> = root_pid
                .iter()
                .map(|p| format!("{p} (the program)"))
                .collect();
            let mut pids: Vec<u32> = l.captures.iter().map(|&(p, _)| p).collect();
            pids.dedup();
            known.extend(pids.iter().take(12).map(u32::to_string));
            if pids.len() > 12 {
                known.push(format!("… {} more", pids.len() - 12));
            }
            bail!(
                "PID {pid} is not among the processes of {}: {} (mprof report --per-process \
                 lists them)",
                path.display(),
                known.join(", ")
            );
        }
        // The latest program first, as the set's root (its title and metadata): the earlier
        // ones ended with their exec, and their blocks leave the live heap then, as a child's
        // do when its capture ends (the root's stay live to the end).
        let (last, earlier) = images.split_last().expect("not empty");
        let file = l.open(dir, pid, *last)?;
        let mut set = CaptureSet::single(Some(pid), file);
        set.followed = true;
        for &image in earlier {
            set.add_member(&l, dir, pid, image);
        }
        set.warnings.extend(l.warnings);
        Ok(set)
    }

    /// The bytes of all the captures read.
    pub fn size(&self) -> u64 {
        self.members.iter().map(|m| m.file.size).sum()
    }

    /// The program's capture (or the one process picked).
    pub fn root(&self) -> &CaptureFile {
        &self.members[0].file
    }

    /// One pass over the events of every capture, interleaved by time (see the module doc):
    /// `f` gets each event with where it was read ([`Reading`]: its process, the index in
    /// [`CaptureSet::members`], and its capture's reader), until it returns false. Returns
    /// each capture's [`Pass`].
    pub fn for_each(&self, mut f: impl FnMut(&Event, &Reading) -> bool) -> Result<Vec<Pass>> {
        if let [only] = &self.members[..] {
            return Ok(vec![for_each_alone(&only.file, f)?]);
        }
        let mut heads = Vec::with_capacity(self.members.len());
        let mut queue = BinaryHeap::new();
        let buffer = match self.members.len() {
            1 => 1 << 20,
            _ => MEMBER_BUFFER,
        };
        for (i, m) in self.members.iter().enumerate() {
            let mut head = Head {
                records: m.file.records(buffer)?,
                next: None,
                clock: 0,
                sampled: 0,
                counted: Totals::default(),
            };
            if let Some(key) = head.fetch()? {
                queue.push(Reverse((key, i)));
            }
            heads.push(head);
        }
        let mut declared = Totals::default();
        let mut events = 0u64;
        let mut read = 0u64;
        while let Some(Reverse((_, i))) = queue.pop() {
            events += 1;
            if events.is_multiple_of(PROGRESS_EVERY) {
                read = heads.iter().map(|h| h.records.position()).sum();
            }
            let head = &mut heads[i];
            let event = head.next.take().expect("a queued head has an event");
            if head.counted != *head.records.declared() {
                declared.unmerge(&head.counted);
                head.counted = *head.records.declared();
                declared.merge(&head.counted);
            }
            let at = Reading {
                process: i as u32,
                records: &head.records,
                declared: &declared,
                read,
            };
            if !f(&event, &at) {
                break;
            }
            if let Some(key) = head.fetch()? {
                queue.push(Reverse((key, i)));
            }
        }
        let mut passes: Vec<Pass> = heads.into_iter().map(|h| h.records.finish()).collect();
        for (pass, m) in passes.iter_mut().zip(&self.members) {
            pass.changed |= m.file.changed();
        }
        Ok(passes)
    }
}

/// [`CaptureSet::for_each`] of a set of one capture: no interleaving.
fn for_each_alone(file: &CaptureFile, mut f: impl FnMut(&Event, &Reading) -> bool) -> Result<Pass> {
    let mut records = file.records(1 << 20)?;
    let mut events = 0u64;
    let mut read = 0;
    while records.advance()? {
        events += 1;
        if events.is_multiple_of(PROGRESS_EVERY) {
            read = records.position();
        }
        let at = Reading {
            process: 0,
            records: &records,
            declared: records.declared(),
            read,
        };
        if !f(records.current(), &at) {
            break;
        }
    }
    let mut pass = records.finish();
    pass.changed |= file.changed();
    Ok(pass)
}

/// Events between two updates of [`Reading::read`].
pub const PROGRESS_EVERY: u64 = 1 << 16;

/// Where an event of a [`CaptureSet::for_each`] was read.
pub struct Reading<'r, 'a> {
    /// Its process: the index of its capture in [`CaptureSet::members`].
    pub process: u32,
    /// Its capture's reader (its stack nodes, its frame's declarations).
    pub records: &'r Records<'a>,
    /// What the frames of all the captures read so far declare.
    pub declared: &'r Totals,
    /// Bytes of all the captures read so far, updated every [`PROGRESS_EVERY`] events.
    pub read: u64,
}

/// A capture being interleaved: its next event and the time it is sorted by.
struct Head<'a> {
    records: Records<'a>,
    next: Option<Event>,
    /// The time of the last timed record read from this capture.
    clock: u64,
    /// The time of the last sample read from this capture.
    sampled: u64,
    /// Its declarations counted in the set's sum so far.
    counted: Totals,
}

impl Head<'_> {
    /// Reads the next event; returns its sort key, or `None` at the end.
    fn fetch(&mut self) -> Result<Option<u64>> {
        self.next = self.records.next_event()?;
        let Some(event) = &self.next else {
            return Ok(None);
        };
        let sample = match event {
            Event::Sample(_) => true,
            Event::Record(r) => match &**r {
                Record::Alloc { .. } => true,
                // A program that ran a new one by exec ended right after its last sample: the
                // RSS readings since were the new program's, read before mprof learnt of the
                // exec. Its blocks leave the live heap there, before the new program's first
                // samples.
                Record::Meta { text } if crate::capture::meta::ended_by_exec(text) => {
                    return Ok(Some(self.sampled));
                }
                _ => false,
            },
            Event::Free(_) => false,
        };
        if let Some(t) = event.time_ns() {
            self.clock = t;
            if sample {
                self.sampled = t;
            }
        }
        Ok(Some(self.clock))
    }
}

/// The pid and the children's directory a capture's first records name.
fn scan_meta(file: &CaptureFile) -> Result<(Option<u32>, Option<String>)> {
    let (mut pid, mut dir, mut seen) = (None, None, 0);
    file.for_each(|r| {
        seen += 1;
        if let Record::Meta { text } = &r {
            for (key, value) in crate::capture::meta::meta_pairs(text) {
                match key {
                    "pid" => pid = value.parse().ok().or(pid),
                    "children_dir" => dir = Some(value.to_owned()),
                    _ => {}
                }
            }
        }
        seen < META_SEARCH
    })?;
    Ok((pid, dir))
}

/// The metadata that names a capture's children's directory (`children_dir=CAPTURE.d`, by its
/// name beside the capture: that may be the user's own symlink to the directory).
pub fn children_dir_meta(capture: &Path) -> String {
    let dir = children_dir(capture);
    format!(
        "children_dir={}\n",
        dir.file_name().unwrap_or_default().to_string_lossy()
    )
}

/// Where the captures of a capture's followed children go: `CAPTURE.d`.
pub fn children_dir(capture: &Path) -> PathBuf {
    let mut name = capture.as_os_str().to_owned();
    name.push(".d");
    PathBuf::from(name)
}

/// Where the children's captures of `capture` are: the directory its metadata names, when
/// that is a plain name ending in `.d` in the capture's own directory (a capture is
/// untrusted: it cannot send mprof elsewhere), else `CAPTURE.d`.
fn children_path(capture: &Path, named: &str) -> PathBuf {
    let plain = !named.is_empty()
        && !named.starts_with('.')
        && !named.contains('/')
        && named.ends_with(".d");
    match (plain, capture.parent()) {
        (true, Some(parent)) => parent.join(named),
        (true, None) => PathBuf::from(named),
        (false, _) => children_dir(capture),
    }
}

/// The captures found in a children's directory, opened without following symlinks.
struct Listing {
    dir: Directory,
    /// The (pid, image) of the regular files named as [`capture_name`] names them, sorted, at
    /// most [`MAX_MEMBERS`].
    captures: Vec<(u32, u32)>,
    warnings: Vec<String>,
}

impl Listing {
    /// Opens `path` (not a symlink) and lists its captures.
    fn read(path: &Path) -> Result<Listing> {
        let mut listing = Listing {
            dir: Directory::open(path, false)?,
            captures: Vec::new(),
            warnings: Vec::new(),
        };
        listing.scan(path)?;
        Ok(listing)
    }

    /// Sorts the directory's entries into captures and the rest.
    fn scan(&mut self, path: &Path) -> Result<()> {
        let (mut links, mut others) = (0usize, 0usize);
        for entry in self.dir.entries()? {
            let (name, kind) = entry?;
            let member = member_of_name(name.as_bytes());
            match (kind, member) {
                (Some(k), _) if k.is_symlink() => links += 1,
                (Some(k), Some(member)) if k.is_file() => self.captures.push(member),
                _ => others += 1,
            }
        }
        self.captures.sort_unstable();
        self.captures.dedup();
        if self.captures.len() > MAX_MEMBERS {
            self.warnings.push(format!(
                "{}: {} captures, only the first {MAX_MEMBERS} (by pid) are read",
                path.display(),
                self.captures.len()
            ));
            self.captures.truncate(MAX_MEMBERS);
        }
        if links > 0 {
            self.warnings.push(format!(
                "{}: {links} symlink(s) skipped, not followed",
                path.display()
            ));
        }
        if others > 0 {
            self.warnings.push(format!(
                "{}: {others} entr(y/ies) that are not PID.mprof (or PID-N.mprof) captures ignored",
                path.display()
            ));
        }
        Ok(())
    }

    /// Opens the capture of image `image` of `pid` ([`capture_name`]): a regular file, not a
    /// symlink, without blocking on a FIFO; and checks that it starts like a capture.
    fn open(&self, dir: &Path, pid: u32, image: u32) -> Result<CaptureFile> {
        let name = capture_name(pid, image);
        let file = self.dir.open_file(&name)?;
        let capture = CaptureFile::from_file(file, &dir.join(&name))?;
        capture.records(0)?;
        Ok(capture)
    }
}

/// The name of the capture of the `image`-th program (from 1) that followed process `pid` ran:
/// `PID.mprof` for the first, `PID-N.mprof` for the N-th, started by an exec in the same pid.
pub fn capture_name(pid: u32, image: u32) -> String {
    match image {
        0 | 1 => format!("{pid}.mprof"),
        n => format!("{pid}-{n}.mprof"),
    }
}

/// The (pid, image) a capture's file name says ([`capture_name`]): `1234.mprof` → (1234, 1),
/// `1234-2.mprof` → (1234, 2). Plain decimal numbers (no sign, no leading zero), an image
/// number from 2; no other name.
fn member_of_name(name: &[u8]) -> Option<(u32, u32)> {
    fn number(digits: &[u8]) -> Option<u32> {
        if digits.is_empty() || digits.len() > 10 || digits[0] == b'0' {
            return None;
        }
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
    let stem = name.strip_suffix(b".mprof")?;
    match stem.iter().position(|&b| b == b'-') {
        None => Some((number(stem)?, 1)),
        Some(dash) => {
            let image = number(&stem[dash + 1..])?;
            (image >= 2).then_some((number(&stem[..dash])?, image))
        }
    }
}

/// Raises the soft limit of open files towards `wanted` (within the hard limit): a merged
/// view holds every capture open at once.
fn raise_file_limit(wanted: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, a live local, and setrlimit reads it;
    // neither keeps the pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= wanted as u64 {
            return;
        }
        lim.rlim_cur = (wanted as u64).min(lim.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

#[cfg(test)]
mod tests;
