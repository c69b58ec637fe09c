//! The module map of a running target, written into its capture (`--native`): a MODULE record
//! for every loaded object that has executable mappings, written before the first sample that
//! could need it, so that the capture can be symbolized after the process is gone.
//!
//! mprof reads `/proc/PID/maps` when the first sample with a native stack arrives, again
//! whenever a sample shows a return address outside every executable mapping it knows (a
//! library loaded since, by `import` or `dlopen`: read at once, before the sample is written,
//! or the sample could not be symbolized), and every [`RESCAN`] (a library unloaded and
//! another one loaded at the same place). An address still unknown after a fresh read (JIT
//! code, or a hostile target's invention) is remembered, so it costs one read only, and such
//! reads are limited to [`MAX_FORCED_SCANS`] a second. The agent also asks for a read when its
//! process is about to end or to unload a library, and waits for it, bounded
//! ([`ModuleTracker::read_now`], the map handshake of `mprof_common::ring`).
//!
//! Everything comes from the target: the files a mapping names are opened with `O_PATH` and
//! checked to be the mapped file (device and inode) before their ELF headers are read
//! (`mprof_injector::mapped_file`); mprof only reads them.

use super::elf;
use mprof_common::record::{
    Module, ModuleRange, Record, MODULE_BIAS_FROM_ELF, MODULE_DELETED, MODULE_MAIN,
};
use mprof_injector::mapped_file::{self, MappedFile};
use mprof_injector::procmaps::{self, Mapping};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::time::{Duration, Instant};

/// How often the map is read again once native samples arrive.
pub const RESCAN: Duration = Duration::from_millis(500);
/// Most reads of the map caused by unknown addresses in a second (a JIT, or a hostile
/// target, can show a new unknown page in every sample).
const MAX_FORCED_SCANS: u32 = 200;
/// Largest maps file read (a process with a million mappings).
const MAX_MAPS: u64 = 128 << 20;
/// Pages remembered as holding no known code at most.
const MAX_STALE: usize = 1 << 16;

/// A module as mapped: (device, inode, path, executable ranges).
type Key = ((u32, u32), u64, String, Vec<(u64, u64, u64)>);

/// Follows a target's module map and says which MODULE records to write.
pub struct ModuleTracker {
    pid: u32,
    active: bool,
    /// Executable ranges of the last read, sorted (file-backed or not).
    known: Vec<(u64, u64)>,
    last_hit: (u64, u64),
    written: HashSet<Key>,
    stale: HashSet<u64>,
    last_scan: Option<Instant>,
    /// The current second's start and the reads caused by unknown addresses in it.
    forced: (Instant, u32),
    exe: Option<((u32, u32), u64)>,
}

impl ModuleTracker {
    /// A tracker of process `pid`; it reads nothing until a native sample arrives.
    pub fn new(pid: u32) -> ModuleTracker {
        ModuleTracker {
            pid,
            active: false,
            known: Vec::new(),
            last_hit: (0, 0),
            written: HashSet::new(),
            stale: HashSet::new(),
            last_scan: None,
            forced: (Instant::now(), 0),
            exe: None,
        }
    }

    /// The MODULE records to write before a sample whose native stack holds `addrs`.
    pub fn before_sample(&mut self, addrs: &[u64]) -> Vec<Record> {
        self.active = true;
        let unknown = addrs
            .iter()
            .any(|&a| !self.is_known(a) && !self.stale.contains(&(a >> 12)));
        if !unknown {
            return Vec::new();
        }
        if !self.spend_forced_read() {
            return Vec::new();
        }
        let records = self.scan();
        for &a in addrs {
            if !self.is_known(a) {
                if self.stale.len() >= MAX_STALE {
                    self.stale.clear();
                }
                self.stale.insert(a >> 12);
            }
        }
        records
    }

    /// The MODULE records of objects loaded or replaced since the last read, every
    /// [`RESCAN`] once native samples arrive; also when `now` is set (the target is about to
    /// end).
    pub fn tick(&mut self, now: bool) -> Vec<Record> {
        let due = self.last_scan.is_none_or(|t| t.elapsed() >= RESCAN);
        if !self.active || !(due || now) {
            return Vec::new();
        }
        self.scan()
    }

    /// The MODULE records of objects loaded or replaced since the last read, read now because
    /// the agent asked (its process is about to end or to unload a library: the samples still
    /// on their way may name code the map will not show later). Counts against the budget of
    /// forced reads, since the target asks.
    pub fn read_now(&mut self) -> Vec<Record> {
        self.active = true;
        if !self.spend_forced_read() {
            return Vec::new();
        }
        self.scan()
    }

    /// Whether one more read caused by the target fits in this second's budget (counted).
    fn spend_forced_read(&mut self) -> bool {
        if self.forced.0.elapsed() >= Duration::from_secs(1) {
            self.forced = (Instant::now(), 0);
        }
        if self.forced.1 >= MAX_FORCED_SCANS {
            return false;
        }
        self.forced.1 += 1;
        true
    }

    fn is_known(&mut self, addr: u64) -> bool {
        if self.last_hit.0 <= addr && addr < self.last_hit.1 {
            return true;
        }
        let at = self.known.partition_point(|r| r.0 <= addr);
        match at.checked_sub(1).map(|i| self.known[i]) {
            Some(r) if addr < r.1 => {
                self.last_hit = r;
                true
            }
            _ => false,
        }
    }

    /// Reads the map; returns the records of modules not written yet as they are now.
    fn scan(&mut self) -> Vec<Record> {
        self.last_scan = Some(Instant::now());
        let Some(maps) = read_maps(self.pid) else {
            return Vec::new();
        };
        if maps.is_empty() {
            // A process that has ended (a zombie) maps nothing: keep what we knew.
            return Vec::new();
        }
        self.known = maps
            .iter()
            .filter(|m| m.exec)
            .map(|m| (m.start, m.end))
            .collect();
        self.known.sort_unstable();
        self.last_hit = (0, 0);
        if self.exe.is_none() {
            self.exe = exe_identity(self.pid);
        }
        let mut out = Vec::new();
        for (key, mappings) in modules(&maps) {
            if self.written.contains(&key) {
                continue;
            }
            let main = self.exe == Some((key.0, key.1));
            out.push(Record::Module(describe(self.pid, &mappings, main)));
            self.written.insert(key);
        }
        out
    }
}

/// The target's mappings, bounded.
fn read_maps(pid: u32) -> Option<Vec<Mapping>> {
    let file = std::fs::File::open(format!("/proc/{pid}/maps")).ok()?;
    let mut text = String::new();
    file.take(MAX_MAPS).read_to_string(&mut text).ok()?;
    Some(procmaps::parse(&text))
}

/// The device and inode of the target's executable.
fn exe_identity(pid: u32) -> Option<((u32, u32), u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some((
        (libc::major(meta.dev()), libc::minor(meta.dev())),
        meta.ino(),
    ))
}

/// A mapped file: (device, inode, path).
type FileId<'a> = ((u32, u32), u64, &'a str);

/// The file-backed objects with executable mappings, each with all its mappings.
fn modules(maps: &[Mapping]) -> Vec<(Key, Vec<Mapping>)> {
    let mut by_file: HashMap<FileId, Vec<Mapping>> = HashMap::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        by_file
            .entry((m.dev, m.inode, m.path.as_str()))
            .or_default()
            .push(m.clone());
    }
    let mut out: Vec<(Key, Vec<Mapping>)> = by_file
        .into_iter()
        .filter(|(_, ms)| ms.iter().any(|m| m.exec))
        .map(|((dev, inode, path), ms)| {
            let ranges = ms
                .iter()
                .filter(|m| m.exec)
                .map(|m| (m.start, m.end, m.offset))
                .collect();
            ((dev, inode, path.to_owned(), ranges), ms)
        })
        .collect();
    out.sort_by_key(|(key, _)| key.3.first().copied());
    out
}

/// The MODULE record of one object, from its mappings (and its ELF headers, when the mapped
/// file can be read).
fn describe(pid: u32, mappings: &[Mapping], main: bool) -> Module {
    let exec: Vec<&Mapping> = mappings.iter().filter(|m| m.exec).collect();
    let deleted = exec[0].path.ends_with(" (deleted)");
    let path = exec[0].path.trim_end_matches(" (deleted)").to_owned();
    let mut module = Module {
        bias: procmaps::file_base(mappings, exec[0])
            .unwrap_or(exec[0].start.wrapping_sub(exec[0].offset)),
        flags: if main { MODULE_MAIN } else { 0 } | if deleted { MODULE_DELETED } else { 0 },
        path,
        ranges: exec
            .iter()
            .map(|m| ModuleRange {
                start: m.start,
                end: m.end,
                offset: m.offset,
            })
            .collect(),
        ..Module::default()
    };
    if let Some(file) = open_mapped(pid, exec[0]) {
        let reader = file.reader();
        module.file_size = file.len();
        module.build_id = elf::build_id(&reader).unwrap_or_default();
        if let Some(bias) = elf::bias(&reader, exec[0].start, exec[0].offset) {
            module.bias = bias;
            module.flags |= MODULE_BIAS_FROM_ELF;
        }
    }
    module
}

/// The very file a mapping maps, if it can still be opened: read as needed, never mapped (a
/// target that truncates it meanwhile makes a read fail, not mprof die of SIGBUS).
fn open_mapped(pid: u32, m: &Mapping) -> Option<MappedFile> {
    let proc = mprof_injector::remote::Proc::open(pid).ok()?;
    mapped_file::open_mapped(&proc, m).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that read this process's map and expect nothing new in it: one of
    /// them loads a library, which the others, on threads of the same process, would see.
    static MAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn map_unchanged() -> std::sync::MutexGuard<'static, ()> {
        MAP.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn this_process_s_modules_are_described_with_their_build_ids() {
        let _map = map_unchanged();
        let me = std::process::id();
        let mut t = ModuleTracker::new(me);
        assert!(t.tick(false).is_empty(), "inactive until a native sample");
        let here = this_process_s_modules_are_described_with_their_build_ids as *const () as u64;
        let records = t.before_sample(&[here]);
        let modules: Vec<&Module> = records
            .iter()
            .filter_map(|r| match r {
                Record::Module(m) => Some(m),
                _ => None,
            })
            .collect();
        let exe = modules
            .iter()
            .find(|m| m.ranges.iter().any(|r| r.start <= here && here < r.end))
            .expect("the test binary is described");
        assert!(exe.has(MODULE_MAIN) && exe.has(MODULE_BIAS_FROM_ELF));
        assert!(!exe.build_id.is_empty() && exe.file_size > 0);
        assert!(modules.iter().any(|m| m.path.contains("libc.so")));
        assert!(t.before_sample(&[here]).is_empty(), "known: nothing new");
        assert!(t.before_sample(&[8]).is_empty(), "nothing new to describe");
        assert!(t.stale.contains(&0));
        assert!(t.tick(true).is_empty(), "written once");
    }

    #[test]
    fn a_library_loaded_just_after_a_read_is_described_before_its_first_sample() {
        let _map = map_unchanged();
        let mut t = ModuleTracker::new(std::process::id());
        let here = a_library_loaded_just_after_a_read_is_described_before_its_first_sample
            as *const () as u64;
        assert!(!t.before_sample(&[here]).is_empty());
        // SAFETY: loading a plain system library; its address is only looked at.
        let bz2 = unsafe {
            let handle = libc::dlopen(c"libbz2.so.1.0".as_ptr(), libc::RTLD_NOW);
            assert!(!handle.is_null(), "libbz2 is installed");
            libc::dlsym(handle, c"BZ2_bzlibVersion".as_ptr()) as u64
        };
        let records = t.before_sample(&[here, bz2]);
        assert!(
            records
                .iter()
                .any(|r| matches!(r, Record::Module(m) if m.path.contains("libbz2"))),
            "described at once, not a millisecond later"
        );
    }

    #[test]
    fn a_read_the_agent_asks_for_describes_everything_mapped_within_the_budget() {
        let _map = map_unchanged();
        let mut t = ModuleTracker::new(std::process::id());
        let records = t.read_now();
        assert!(t.active, "native samples are on their way");
        assert!(records
            .iter()
            .any(|r| matches!(r, Record::Module(m) if m.path.contains("libc.so"))));
        assert!(t.read_now().is_empty(), "written once");
        t.forced.1 = MAX_FORCED_SCANS;
        let before = t.last_scan;
        assert!(t.read_now().is_empty());
        assert_eq!(t.last_scan, before, "over the budget: the map is not read");
    }
}
