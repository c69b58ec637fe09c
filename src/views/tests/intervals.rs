//! Interval profiles as `--every` writes them (`crate::views::export::interval`), read back
//! through `Profile` and the views: their figures and timeline, and mutated files.

use crate::analysis::estimate::Estimate;
use crate::analysis::profile::{Profile, Source};
use crate::capture::processes::Pick;
use crate::capture::rolling::file_name;
use crate::views::export::interval::{Frame, Interval, Site};
use prost::Message;
use std::io::Write;

fn estimate(bytes: f64, count: f64, variance: f64) -> Estimate {
    Estimate {
        bytes,
        count,
        variance,
        samples: 1,
    }
}

/// Interval `seq` of 2 s: `grow` keeps `seq` MiB in thread 5 (MainThread), `churn` in
/// thread 6 allocates 4 MiB and keeps none.
fn interval(seq: u64) -> Interval {
    let frame = |function: &str, line| Frame {
        function: function.into(),
        file: "/srv/app.py".into(),
        line,
        firstline: 1,
    };
    let site = |name: &str, line, tid, allocated, live| Site {
        frames: vec![frame(name, line), frame("<module>", 20)].into(),
        pid: 900,
        tid,
        thread_name: Some(format!("T{tid}")),
        allocator: "python",
        allocated,
        live,
    };
    let mib = 1048576.0;
    Interval {
        seq,
        start_unix_ns: 1_800_000_000_000_000_000 + (seq - 1) * 2_000_000_000,
        duration_ns: 2_000_000_000,
        rate: 65536,
        resource: vec![
            ("service.name".into(), "shop".into()),
            ("process.pid".into(), "900".into()),
        ],
        dropped_samples: 0,
        sites: vec![
            site(
                "grow",
                7,
                5,
                estimate(mib, 1.0, 4e9),
                estimate(seq as f64 * mib, seq as f64, seq as f64 * 4e9),
            ),
            site(
                "churn",
                9,
                6,
                estimate(4.0 * mib, 400.0, 1e10),
                Estimate::default(),
            ),
        ],
    }
}

#[test]
fn the_files_written_read_back_as_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    for seq in 1..=4 {
        let i = interval(seq);
        let name = file_name(i.start_unix_ns / 1_000_000, 900, seq);
        std::fs::write(dir.path().join(name), i.pprof().unwrap()).unwrap();
    }
    let (p, warnings) = Profile::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let t = p.totals();
    let mib = 1048576.0;
    assert_eq!(t.allocated.bytes, 4.0 * 5.0 * mib);
    assert_eq!(t.live.bytes, 4.0 * mib);
    // The standard errors went through whole bytes: √(4·4e9) = 126491.1 → 126491.
    assert_eq!(t.live.stderr(), 126491.0);
    assert_eq!(p.threads.get(&5).map(String::as_str), Some("T5"));
    assert_eq!(p.meta["command"], "shop");
    assert_eq!(p.duration_seconds, 8.0);
    // The timeline comes from the series: the live heap at each interval's end.
    let source = Source::open(dir.path(), Pick::All).unwrap();
    let p = source.load().unwrap();
    let grouping = crate::analysis::grouping::Grouping::Line;
    let t = crate::views::timeline::load_source(&source, &p, 5, grouping).unwrap();
    let points: Vec<(f64, f64)> = t.points.iter().map(|pt| (pt.seconds, pt.heap)).collect();
    assert_eq!(
        points,
        [
            (2.0, mib),
            (4.0, 2.0 * mib),
            (6.0, 3.0 * mib),
            (8.0, 4.0 * mib)
        ]
    );
    assert_eq!(t.points[3].sites[0], 4.0 * mib);
    // The last half: allocated over two intervals, live at the end.
    let path = format!("{}@-4s..", dir.path().display());
    let (half, _) = Profile::read(std::path::Path::new(&path)).unwrap();
    assert_eq!(half.totals().allocated.bytes, 2.0 * 5.0 * mib);
    assert_eq!(half.totals().live.bytes, 4.0 * mib);
}

/// Mutated interval files (bytes flipped, cut, repeated, in the protobuf before gzip)
/// give a profile that every view renders, or a warning, never a panic.
#[test]
fn mutated_interval_files_are_read_or_skipped() {
    use crate::analysis::grouping::Grouping;
    use crate::analysis::profile::View;
    use crate::views::{diff, flamegraph, report};
    let raw = interval(3).pprof_message().encode_to_vec();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let (mut read, mut skipped) = (0, 0);
    for round in 0..400 {
        let mut bytes = raw.clone();
        for _ in 0..1 + next(4) {
            let at = next(bytes.len());
            match next(4) {
                0 => bytes[at] ^= 1 << next(8),
                1 => bytes[at] = [0, 0x7f, 0x80, 0xff][next(4)],
                2 => bytes.truncate(at),
                _ => {
                    let end = (at + 1 + next(16)).min(bytes.len());
                    let piece = bytes[at..end].to_vec();
                    bytes.splice(at..at, piece);
                }
            }
            if bytes.is_empty() {
                bytes.push(0);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let good = interval(1);
        let name = file_name(good.start_unix_ns / 1_000_000, 900, 1);
        std::fs::write(dir.path().join(name), good.pprof().unwrap()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        let name = file_name(1_900_000_000_000, 900, 2 + round);
        std::fs::write(dir.path().join(name), gz.finish().unwrap()).unwrap();
        let (p, warnings) = Profile::read(dir.path()).unwrap();
        match warnings.iter().any(|w| w.starts_with("skipping")) {
            true => skipped += 1,
            false => read += 1,
        }
        for w in &warnings {
            assert!(!w.contains('\n'), "{w}");
        }
        for view in View::ALL {
            report::render(&p, view, Grouping::YourCode, 20, false).unwrap();
            report::render(&p, view, Grouping::Stack, 0, true).unwrap();
        }
        let settings = flamegraph::Settings::of(View::Live);
        flamegraph::svg(&p, &settings, Some(&p)).unwrap();
        diff::text(&p, &p, View::Live, Grouping::Line, 20);
    }
    assert!(read > 0 && skipped > 0, "{read} read, {skipped} skipped");
}
