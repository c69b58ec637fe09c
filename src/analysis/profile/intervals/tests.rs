//! The interval reader on pprof messages built by hand (the encoder's own files are read back
//! in `crate::views::tests`): how the intervals add up, ranges, and hostile files.

use super::*;
use crate::capture::pprof::{Function, Label, Line, PprofLocation, Sample, ValueType};
use crate::capture::rolling::{file_name, Spec};
use prost::Message;
use std::io::Write;
use std::path::Path;

/// One stack in one thread of an interval: its frames (function, line) innermost first in
/// `app.py`, and (objects, bytes, stderr) allocated and live.
struct Site<'a> {
    frames: &'a [(&'a str, i64)],
    tid: i64,
    alloc: (i64, i64, i64),
    live: (i64, i64, i64),
}

/// A message as `--every` writes it for process 42: the four heap types, the labels, the
/// resource.
fn message(start_ms: i64, rate: i64, sites: &[Site]) -> PprofProfile {
    message_of(42, start_ms, rate, sites)
}

/// [`message`] of process `pid`.
fn message_of(pid: i64, start_ms: i64, rate: i64, sites: &[Site]) -> PprofProfile {
    let mut strings = vec![String::new()];
    let mut id = |s: &str| -> i64 {
        match strings.iter().position(|x| x == s) {
            Some(i) => i as i64,
            None => {
                strings.push(s.to_owned());
                strings.len() as i64 - 1
            }
        }
    };
    let sample_type = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .iter()
    .map(|t| ValueType {
        r#type: id(t),
        unit: 0,
    })
    .collect();
    let (mut function, mut location, mut sample) = (Vec::new(), Vec::new(), Vec::new());
    for site in sites {
        let mut ids = Vec::new();
        for &(name, line) in site.frames {
            let fid = function.len() as u64 + 1;
            function.push(Function {
                id: fid,
                name: id(name),
                filename: id("app.py"),
                start_line: 1,
                ..Function::default()
            });
            let lid = location.len() as u64 + 1;
            location.push(PprofLocation {
                id: lid,
                line: vec![Line {
                    function_id: fid,
                    line,
                }],
            });
            ids.push(lid);
        }
        let num = |key: i64, num: i64| Label {
            key,
            num,
            ..Label::default()
        };
        sample.push(Sample {
            location_id: ids,
            value: vec![site.alloc.0, site.alloc.1, site.live.0, site.live.1],
            label: vec![
                num(id("thread"), site.tid),
                num(id("pid"), pid),
                Label {
                    key: id("allocator"),
                    str: id("python"),
                    ..Label::default()
                },
                num(id("alloc_space_stderr"), site.alloc.2),
                num(id("inuse_space_stderr"), site.live.2),
            ],
        });
    }
    let process = format!("process.pid={pid}");
    let comment = vec![
        id("service.name=shop"),
        id(&process),
        id("process.runtime.version=3.11.7"),
        id("mprof.dropped=3"),
    ];
    PprofProfile {
        sample_type,
        sample,
        location,
        function,
        string_table: strings,
        time_nanos: start_ms * 1_000_000,
        duration_nanos: 10_000_000_000,
        period: rate,
        comment,
        ..PprofProfile::default()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// Writes interval `seq` (from 1, 10 s each from t=1000 s) into `dir`.
fn write(dir: &Path, seq: u64, m: &PprofProfile) {
    let ms = 1_000_000 + (seq - 1) * 10_000;
    std::fs::write(dir.join(file_name(ms, 42, seq)), gzip(&m.encode_to_vec())).unwrap();
}

fn interval(seq: u64, sites: &[Site]) -> PprofProfile {
    message(1_000_000 + (seq as i64 - 1) * 10_000, 65536, sites)
}

/// Reads `path` (`DIR@RANGE` included) as the views do.
fn read_path(path: &str, pick: Pick) -> Result<(Profile, Vec<String>)> {
    let spec = Spec::of(Path::new(path))?.expect("interval profiles");
    read(&Listing::open(&spec)?, spec.range.as_ref(), pick)
}

/// The error of reading `path`, as one line.
fn error_of(path: &str, pick: Pick) -> String {
    match read_path(path, pick) {
        Ok(_) => panic!("{path} read"),
        Err(e) => format!("{e:#}"),
    }
}

/// (innermost function, thread) → figures.
fn by_site(p: &Profile) -> BTreeMap<(String, u32), Figures> {
    p.sites()
        .iter()
        .map(|((stack, tid), f)| ((p.innermost(*stack).function.to_owned(), *tid), *f))
        .collect()
}

const LEAK: &[(&str, i64)] = &[("leak", 4), ("<module>", 9)];
const TEMP: &[(&str, i64)] = &[("temp", 6), ("<module>", 10)];

/// Three intervals: `leak` keeps 100 more bytes each; `temp` holds 500 in the second only.
fn three(dir: &Path) {
    let leak = |live: i64| Site {
        frames: LEAK,
        tid: 7,
        alloc: (1, 100, 30),
        live: (live / 100, live, 40),
    };
    write(dir, 1, &interval(1, &[leak(100)]));
    let temp = Site {
        frames: TEMP,
        tid: 8,
        alloc: (5, 500, 50),
        live: (5, 500, 50),
    };
    write(dir, 2, &interval(2, &[leak(200), temp]));
    write(dir, 3, &interval(3, &[leak(300)]));
}

#[test]
fn allocated_adds_up_live_is_the_last_and_peak_the_highest_interval() {
    let dir = tempfile::tempdir().unwrap();
    three(dir.path());
    let (p, warnings) = read_path(&dir.path().display().to_string(), Pick::All).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let sites = by_site(&p);
    let leak = sites[&("leak".to_owned(), 7)];
    let temp = sites[&("temp".to_owned(), 8)];
    assert_eq!((leak.allocated.bytes, leak.allocated.count), (300.0, 3.0));
    assert_eq!(leak.allocated.variance, 3.0 * 900.0);
    assert_eq!((leak.live.bytes, leak.live.variance), (300.0, 1600.0));
    assert_eq!(
        leak.peak.bytes, 200.0,
        "the peak is interval 2's end (700 B)"
    );
    assert_eq!((temp.allocated.bytes, temp.live.bytes), (500.0, 0.0));
    assert_eq!(temp.peak.bytes, 500.0);
    assert_eq!(p.totals().peak.bytes, 700.0);
    assert_eq!(p.peak_seconds, Some(20.0));
    assert_eq!(p.duration_seconds, 30.0);
    // Samples: min(objects, bytes²/variance): 100²/30² = 11.1 capped at 1 object.
    assert_eq!(leak.allocated.samples, 3);
    assert_eq!(temp.allocated.samples, 5);
    assert_eq!(
        leak.live.samples, 3,
        "300²/40² = 56, capped at the 3 objects"
    );
    assert_eq!(p.threads.len(), 0);
    assert_eq!((p.rate, p.rate_known, p.dropped), (65536, true, 3));
    assert_eq!(p.meta["pid"], "42");
    assert_eq!(p.meta["python"], "3.11.7");
    assert_eq!(p.meta["command"], "shop");
    assert_eq!(p.meta["intervals"], "3");
    let from = p.intervals.as_ref().unwrap();
    assert_eq!((from.read, from.listed), (3, 3));
    assert!(
        from.text().contains("all 3 interval profiles"),
        "{}",
        from.text()
    );
    // The series: one point per interval end, the live heap at each.
    let series = p.series().unwrap();
    let heaps: Vec<f64> = series.points.iter().map(|pt| pt.heap).collect();
    assert_eq!(heaps, [100.0, 700.0, 300.0]);
    // `temp` went back to 0 at the third point; `leak` changed at every point.
    let line_of = |f: &str| {
        let at = series
            .lines
            .iter()
            .position(|&st| p.innermost(st).function == f);
        at.unwrap() as u32
    };
    let log = |line: u32| -> Vec<(u32, f64)> {
        let entries = series.log.iter().filter(|e| e.1 == line);
        entries.map(|&(pt, _, b)| (pt, b)).collect()
    };
    assert_eq!(log(line_of("temp")), [(1, 500.0), (2, 0.0)]);
    assert_eq!(log(line_of("leak")), [(0, 100.0), (1, 200.0), (2, 300.0)]);
    // The stacks are whole: leak under <module>.
    let stack = p.sites().iter().find(|(k, _)| k.1 == 7).unwrap().0 .0;
    let frames: Vec<_> = p.frames(stack).map(|l| (l.function, l.line)).collect();
    assert_eq!(frames, [("leak", 4), ("<module>", 9)]);
}

#[test]
fn a_range_reads_its_intervals_and_a_range_of_none_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    three(dir.path());
    let d = dir.path().display().to_string();
    let (first, _) = read_path(&format!("{d}@..10s"), Pick::All).unwrap();
    assert_eq!(first.totals().live.bytes, 100.0);
    assert_eq!(first.totals().allocated.bytes, 100.0);
    let (last, _) = read_path(&format!("{d}@-15s.."), Pick::All).unwrap();
    assert_eq!(last.totals().allocated.bytes, 100.0);
    assert_eq!(last.totals().live.bytes, 300.0);
    // A site live at the end of the range but allocated before it still shows.
    assert_eq!(last.stacks().count(), 1);
    let (middle, _) = read_path(&format!("{d}@5s..-5s"), Pick::All).unwrap();
    assert_eq!(middle.intervals.as_ref().unwrap().read, 2);
    assert_eq!(middle.totals().live.bytes, 300.0);
    let e = error_of(&format!("{d}@1h.."), Pick::All);
    assert!(e.contains("selects none of its 3 interval(s)"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn one_process_is_picked_by_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    three(dir.path());
    let d = dir.path().display().to_string();
    assert!(read_path(&d, Pick::Pid(42)).is_ok());
    // Another service writing into the same directory at the same time, its intervals
    // between 42's: its own live heap when picked, and 42's untouched by it.
    for seq in 1..=3u64 {
        let site = Site {
            frames: TEMP,
            tid: 9,
            alloc: (1, 1000, 0),
            live: (seq as i64, seq as i64 * 1000, 0),
        };
        let start = 1_000_000 + (seq - 1) * 10_000 + 5_000;
        let m = message_of(43, start as i64, 65536, &[site]);
        let name = file_name(start, 43, seq);
        std::fs::write(dir.path().join(name), gzip(&m.encode_to_vec())).unwrap();
    }
    let (p42, _) = read_path(&d, Pick::Pid(42)).unwrap();
    assert_eq!(p42.totals().live.bytes, 300.0);
    assert_eq!(p42.intervals.as_ref().unwrap().read, 3);
    let (p43, _) = read_path(&d, Pick::Pid(43)).unwrap();
    assert_eq!(p43.totals().live.bytes, 3000.0);
    assert_eq!(p43.totals().allocated.bytes, 3000.0);
    let (all, _) = read_path(&d, Pick::All).unwrap();
    assert_eq!(all.totals().allocated.bytes, 3000.0 + 800.0);
    assert_eq!(all.processes.len(), 2);
    let e = error_of(&d, Pick::Pid(7));
    assert!(
        e.contains("PID 7 is not among the processes") && e.contains("42"),
        "{e}"
    );
}

#[test]
fn corrupt_and_crafted_files_are_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    three(d);
    let broken = |seq: u64, bytes: &[u8]| {
        let ms = 1_000_000 + (seq - 1) * 10_000 + 1;
        std::fs::write(d.join(file_name(ms, 42, seq)), bytes).unwrap();
    };
    broken(10, b"\x1f\x8bnot really gzip");
    broken(11, &gzip(b"\xff\xff\xff"));
    let mut bad_string = interval(1, &[]);
    bad_string.comment = vec![99];
    broken(12, &gzip(&bad_string.encode_to_vec()));
    let mut bad_location = interval(1, &[]);
    bad_location.sample.push(Sample {
        location_id: vec![77],
        value: vec![0; 4],
        label: vec![],
    });
    broken(13, &gzip(&bad_location.encode_to_vec()));
    // A sound sample, then a bad one: the file counts for nothing, its site included.
    let sound = Site {
        frames: TEMP,
        tid: 99,
        alloc: (1, 10, 0),
        live: (1, 10, 0),
    };
    let mut half_bad = interval(1, &[sound]);
    half_bad.sample.push(Sample {
        location_id: vec![77],
        value: vec![0; 4],
        label: vec![],
    });
    broken(17, &gzip(&half_bad.encode_to_vec()));
    let mut negative = interval(1, &[]);
    negative.sample.push(Sample {
        value: vec![-1, 0, 0, 0],
        ..Sample::default()
    });
    broken(14, &gzip(&negative.encode_to_vec()));
    let mut short = interval(1, &[]);
    short.sample.push(Sample {
        value: vec![1],
        ..Sample::default()
    });
    broken(15, &gzip(&short.encode_to_vec()));
    let mut not_heap = interval(1, &[]);
    not_heap.sample_type.clear();
    broken(16, &gzip(&not_heap.encode_to_vec()));
    std::fs::write(d.join("notes.txt"), b"ignored").unwrap();
    std::fs::write(d.join("mprof-1-2.pb.gz"), b"ignored: not the pattern").unwrap();
    let (p, warnings) = read_path(&d.display().to_string(), Pick::All).unwrap();
    assert_eq!(warnings.len(), 8, "{warnings:#?}");
    for (w, why) in warnings.iter().zip([
        "not a gzipped pprof file",
        "malformed",
        "string index out of range",
        "location it does not have",
        "negative value",
        "1 values for 4 sample types",
        "not a heap profile",
        "location it does not have",
    ]) {
        assert!(
            w.starts_with("skipping mprof-") && w.contains(why),
            "{w} / {why}"
        );
        assert!(!w.contains('\n'), "{w}");
    }
    // The sound intervals still add up; the last sound one is live.
    assert_eq!(p.totals().allocated.bytes, 800.0);
    assert!(p.sites().iter().all(|((_, tid), _)| *tid != 99));
    assert!(!p.thread_ids().contains(&99));
    assert_eq!(p.intervals.as_ref().unwrap().read, 3);
    // Only corrupt files: an error, with the reason.
    let only = tempfile::tempdir().unwrap();
    std::fs::write(only.path().join(file_name(1, 1, 1)), b"\x1f\x8bjunk").unwrap();
    let e = error_of(&only.path().display().to_string(), Pick::All);
    assert!(e.contains("no interval profile could be read"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = error_of(&empty.path().display().to_string(), Pick::All);
    assert!(e.contains("holds no interval profiles"), "{e}");
}

#[test]
fn deep_stacks_long_names_and_huge_figures_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let long = "f".repeat(10_000);
    let frames: Vec<(&str, i64)> = (0..1000)
        .map(|i| (if i == 0 { long.as_str() } else { "g" }, i))
        .collect();
    let m = interval(
        1,
        &[Site {
            frames: &frames,
            tid: i64::MAX,
            alloc: (i64::MAX, i64::MAX, i64::MAX),
            live: (0, 0, -5),
        }],
    );
    write(dir.path(), 1, &m);
    let (p, _) = read_path(&dir.path().display().to_string(), Pick::All).unwrap();
    let (stack, f) = p.stacks().next().unwrap();
    let frames: Vec<_> = p.frames(stack).collect();
    assert_eq!(frames.len(), MAX_DEPTH + 1);
    assert_eq!(
        frames[MAX_DEPTH].function,
        crate::analysis::names::TRUNCATED
    );
    assert!(frames[0].function.len() <= MAX_NAME + 4);
    assert!(f.allocated.bytes.is_finite() && f.allocated.stderr().is_finite());
    assert_eq!(f.live, Estimate::default());
}

#[test]
fn a_file_without_standard_errors_gets_the_rate_bound() {
    assert_eq!(derived_samples(0.0, 0.0, 0.0), 0);
    assert_eq!(derived_samples(4096.0, 4.0, 0.0), 4, "rate 1: exact");
    assert_eq!(
        derived_samples(10.0 * 65536.0, 10.0, 10.0 * 65536f64.powi(2)),
        10
    );
    let e = estimate(&[3, 300, 0, 0], Some((0, 1)), None, 1000);
    assert_eq!((e.bytes, e.variance), (300.0, 300_000.0));
    assert_eq!(estimate(&[3, 300], Some((0, 1)), None, 1).variance, 0.0);
}

#[test]
fn a_long_series_is_thinned_with_the_range_of_what_it_merges() {
    let mut s = Recorded::default();
    for i in 0..10u32 {
        let heap = if i == 3 { 100.0 } else { i as f64 };
        s.points.push(SeriesPoint {
            time_ns: i as u64,
            rss: None,
            heap,
            lo: heap,
            hi: heap,
            hi_first: false,
        });
        s.log.push((i, 0, heap));
    }
    let t = thin(s, 2);
    assert_eq!(t.points.len(), 2);
    assert_eq!(
        (t.points[0].lo, t.points[0].hi, t.points[0].heap),
        (0.0, 100.0, 4.0)
    );
    assert_eq!(t.points[1].time_ns, 9);
    assert!(t.log.iter().all(|e| e.0 < 2));
}
