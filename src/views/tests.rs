//! A capture with followed children, built by hand, through every stage: merged figures, one
//! process alone, and a children's directory that is damaged or hostile.

use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Keep, Profile, View};
use crate::capture::processes::{CaptureSet, Pick};
use crate::capture::testing::CaptureBuilder;
use crate::views::{about, process_table, report, timeline};
use mprof_common::record::Record;
use std::path::{Path, PathBuf};

const S: u64 = 1_000_000_000;

/// The program (pid 100): `main` keeps 1000 bytes from 1 s, frees them at 5 s.
fn program(children: bool) -> CaptureBuilder {
    let mut c = CaptureBuilder::new();
    c.meta("mode=record\npid=100\nrate=1\ncommand=python app.py");
    if children {
        c.meta("children_dir=c.mprof.d");
    }
    c.code(1, "/app/app.py", "main", 1);
    c.alloc_in(100, 0x10, 1000, S, &[(1, 2)]);
    c.push(Record::Rss {
        time_ns: S,
        rss_bytes: 10_000,
    });
    c.free_at(0x10, 5 * S);
    c.push(Record::Stats {
        samples: 1,
        dropped: 0,
    });
    c
}

/// A child whose code address 1 is `work` (a Python of its own: addresses mean something
/// else there) and that allocates at the program's address 0x10 too: `size` bytes at `at`
/// seconds, kept until it ends at `until` seconds.
fn child(pid: u32, size: u64, at: u64, until: u64, dropped: u64) -> CaptureBuilder {
    let mut c = CaptureBuilder::new();
    c.meta(&format!(
        "mode=child\npid={pid}\nppid=100\nborn=exec\ncommand=python worker.py\nrate=1"
    ));
    c.code(1, "/app/worker.py", "work", 1);
    c.alloc_in(pid, 0x10, size, at * S, &[(1, 3)]);
    for t in [at, until] {
        c.push(Record::Rss {
            time_ns: t * S,
            rss_bytes: 5_000,
        });
    }
    c.push(Record::Stats {
        samples: 1,
        dropped,
    });
    c
}

trait FreeAt {
    fn free_at(&mut self, addr: u64, time_ns: u64) -> &mut Self;
}

impl FreeAt for CaptureBuilder {
    /// An RSS reading, then a free, which takes its time (frees carry none).
    fn free_at(&mut self, addr: u64, time_ns: u64) -> &mut Self {
        self.push(Record::Rss {
            time_ns,
            rss_bytes: 10_000,
        })
        .free(addr)
    }
}

/// The program and two children (2000 bytes from 2 s to 7 s, 4000 bytes from 6 s to 8 s) in
/// `dir`.
fn family(dir: &Path) -> PathBuf {
    let root = program(true).write(dir, "c.mprof");
    let d = dir.join("c.mprof.d");
    std::fs::create_dir(&d).unwrap();
    child(201, 2000, 2, 7, 3).write(&d, "201.mprof");
    child(202, 4000, 6, 8, 0).write(&d, "202.mprof");
    root
}

fn function_bytes(p: &Profile, view: View, function: &str) -> f64 {
    p.stacks()
        .filter(|(id, _)| p.innermost(*id).function == function)
        .map(|(_, f)| f.get(view).bytes)
        .sum()
}

#[test]
fn children_are_merged_by_time_each_in_its_own_address_space() {
    let dir = tempfile::tempdir().unwrap();
    let (p, warnings) = Profile::read(&family(dir.path())).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(p.processes.len(), 3);
    assert!(p.followed);
    assert_eq!(p.samples, 3);
    assert_eq!(p.dropped, 3);
    // Code address 1 is `main` in the program and `work` in the children.
    assert_eq!(function_bytes(&p, View::Allocated, "main"), 1000.0);
    assert_eq!(function_bytes(&p, View::Allocated, "work"), 6000.0);
    // The program's free of 0x10 does not free the children's blocks at 0x10.
    assert_eq!(function_bytes(&p, View::Live, "main"), 0.0);
    assert_eq!(function_bytes(&p, View::Live, "work"), 6000.0);
    // The peak is at 6 s (2000 + 4000 live at once, the program's 1000 freed at 5 s), not the
    // sum of each process's own peak (7000).
    assert_eq!(p.totals().peak.bytes, 6000.0);
    assert_eq!(p.peak_seconds, Some(5.0));
    // RSS adds up over the processes running at the same time: 10,000 + 5,000 + 5,000 at 6 s.
    assert_eq!(p.max_rss, Some(20_000));
    let rows = process_table::rows(&p);
    let pids: Vec<_> = rows
        .iter()
        .map(|r| (r.pid, r.ppid, r.born.as_str()))
        .collect();
    assert_eq!(
        pids,
        [
            (Some(100), None, "record"),
            (Some(201), Some(100), "exec"),
            (Some(202), Some(100), "exec")
        ]
    );
    assert_eq!(rows[1].alloc_bytes, 2000);
    assert_eq!(rows[1].dropped, 3);
    assert_eq!(rows[2].peak_bytes, 4000);
    let text = report::text_report(&p, View::Allocated, Grouping::Line, 0);
    assert!(text.contains("3 processes merged"), "{text}");
}

#[test]
fn one_process_is_picked_by_pid() {
    let dir = tempfile::tempdir().unwrap();
    let root = family(dir.path());
    let set = CaptureSet::open(&root, Pick::Pid(202)).unwrap();
    let p = Profile::load_set(&set).unwrap();
    assert_eq!(p.processes.len(), 1);
    assert_eq!(function_bytes(&p, View::Allocated, "work"), 4000.0);
    assert_eq!(p.meta.get("pid").map(String::as_str), Some("202"));
    let header = about::header_line(&p).unwrap();
    assert!(header.contains("process 202 alone"), "{header}");
    let p = Profile::load_set(&CaptureSet::open(&root, Pick::Pid(100)).unwrap()).unwrap();
    assert_eq!(function_bytes(&p, View::Allocated, "main"), 1000.0);
    assert_eq!(function_bytes(&p, View::Allocated, "work"), 0.0);
    let e = CaptureSet::open(&root, Pick::Pid(7))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("PID 7 is not among") && e.contains("201, 202"),
        "{e}"
    );
    let alone = program(false).write(dir.path(), "alone.mprof");
    let e = CaptureSet::open(&alone, Pick::Pid(7))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("without --follow-children"), "{e}");
}

#[test]
fn hostile_entries_are_skipped_with_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let root = family(dir.path());
    let d = dir.path().join("c.mprof.d");
    // Outside the directory: a capture a symlink points at, which must not be read.
    let outside = child(300, 1 << 20, 3, 4, 0).write(dir.path(), "outside.mprof");
    std::os::unix::fs::symlink(&outside, d.join("300.mprof")).unwrap();
    std::fs::write(d.join("301.mprof"), b"not a capture at all").unwrap();
    let mut cut = child(302, 500, 3, 4, 0).bytes;
    cut.truncate(cut.len() - 5);
    std::fs::write(d.join("302.mprof"), cut).unwrap();
    std::fs::write(d.join("notes.txt"), b"x").unwrap();
    std::fs::create_dir(d.join("303.mprof")).unwrap();
    crate::base::make_fifo(&d.join("304.mprof"));
    let (p, warnings) = Profile::read(&root).unwrap();
    let all = warnings.join("\n");
    assert!(all.contains("1 symlink(s) skipped, not followed"), "{all}");
    assert!(
        all.contains("skipping 301.mprof") && all.contains("MPROFCAP"),
        "{all}"
    );
    assert!(
        all.contains("302.mprof: capture ends with a truncated record"),
        "{all}"
    );
    // notes.txt, the directory 303.mprof and the FIFO 304.mprof (never opened).
    assert!(
        all.contains("3 entr(y/ies) that are not PID.mprof (or PID-N.mprof) captures"),
        "{all}"
    );
    assert!(warnings.iter().all(|w| !w.contains('\n')), "{warnings:?}");
    // The symlinked capture's megabyte is nowhere; the truncated child's sample is kept.
    assert_eq!(p.totals().allocated.bytes, 1000.0 + 6000.0 + 500.0);
    assert_eq!(p.processes.len(), 4);
}

#[test]
fn a_symlinked_or_missing_directory_is_a_warning_and_the_program_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = program(true).write(dir.path(), "c.mprof");
    let (p, warnings) = Profile::read(&root).unwrap();
    assert_eq!(p.processes.len(), 1);
    assert!(warnings[0].contains("cannot be read"), "{warnings:?}");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    child(201, 2000, 2, 3, 0).write(&elsewhere, "201.mprof");
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("c.mprof.d")).unwrap();
    let (p, warnings) = Profile::read(&root).unwrap();
    assert_eq!(p.totals().allocated.bytes, 1000.0);
    assert!(
        warnings[0].contains("symlink there is not followed"),
        "{warnings:?}"
    );
    assert!(CaptureSet::open(&root, Pick::Pid(201)).is_err());
}

#[test]
fn the_timeline_adds_up_the_processes() {
    let dir = tempfile::tempdir().unwrap();
    let set = CaptureSet::open(&family(dir.path()), Pick::All).unwrap();
    let p = Profile::load_set_keeping(&set, Keep::Series).unwrap();
    let t = timeline::load(&set, &p, 5, crate::analysis::grouping::Grouping::Line).unwrap();
    let heap_at = |s: f64| {
        t.points
            .iter()
            .rfind(|pt| pt.seconds <= s + 1e-9)
            .map(|pt| (pt.heap, pt.rss))
            .unwrap()
    };
    assert_eq!(heap_at(1.0).0, 3000.0);
    assert_eq!(heap_at(5.5).0, 6000.0);
    // At the end both children have ended: their blocks and their RSS left the sums.
    let last = t.points.last().unwrap();
    assert_eq!((last.heap, last.rss), (0.0, Some(10_000.0)));
}

mod intervals;
