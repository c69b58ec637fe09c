//! The timeline draws what the samples say at its resolution: temporaries allocated and freed
//! between two of its points rise and drop (a numpy job's 100 MB temporaries stayed a flat
//! plateau before: a point's value alone misses them), and the peak marker sits where the line
//! peaks. Checked on its CSV table
//! (`mprof timeline -o t.csv`), on every interpreter present.

mod common;

use common::{pythons, report_json, run_with_timeout, tempdir};
use std::time::Duration;

const MIB: f64 = 1048576.0;

/// (seconds, heap, heap_min, heap_max) of each point of the timeline's table.
fn points(csv: &str) -> Vec<[f64; 4]> {
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("seconds,rss,heap,heap_min,heap_max"),
        "{header}"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let n = |i: usize| f[i].parse::<f64>().unwrap();
            [n(0), n(2), n(3), n(4)]
        })
        .collect()
}

#[test]
fn temporaries_rise_and_drop_in_the_timeline() {
    let mut runs = Vec::new();
    for py in pythons() {
        runs.push((py.clone(), "malloc"));
        if common::imports(&py, "numpy") {
            runs.push((py, "numpy"));
        } else if py.label == "pyenv 3.11" {
            common::tier::skip(
                "numpy temporaries",
                "numpy not importable (tools/test-deps.sh installs it into pyenv's 3.11)",
            );
        }
    }
    for (py, kind) in runs {
        let label = format!("{} {kind}", py.label);
        let dir = tempdir();
        let capture = dir.path().join("t.mprof");
        let out = run_with_timeout(
            common::mprof()
                .args(["record", "-q", "--rate", "4KiB", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(common::script("temporaries.py"))
                .env("TEMPORARIES", kind),
            Duration::from_secs(120),
        );
        assert!(out.status.success(), "{label}: {out:?}");
        let table = dir.path().join("t.csv");
        let done = run_with_timeout(
            common::mprof()
                .arg("timeline")
                .arg(&capture)
                .arg("-o")
                .arg(&table),
            Duration::from_secs(60),
        );
        assert!(done.status.success(), "{label}: {done:?}");
        let pts = points(&std::fs::read_to_string(&table).unwrap());
        // A rise: a run of points whose range reaches the temporary (held + 100 MB), which
        // drops back near what is held within its last point or by the next one's.
        let (high, low) = (100.0 * MIB, 70.0 * MIB);
        let runs = |value: &dyn Fn(&[f64; 4]) -> (f64, f64)| {
            let mut rises = 0;
            let mut i = 0;
            while i < pts.len() {
                if value(&pts[i]).1 < high {
                    i += 1;
                    continue;
                }
                while i + 1 < pts.len() && value(&pts[i + 1]).1 >= high && pts[i][1] >= high {
                    i += 1;
                }
                let dropped = pts[i][1] <= low || pts.get(i + 1).is_some_and(|n| value(n).0 <= low);
                rises += dropped as usize;
                i += 1;
            }
            rises
        };
        let rises = runs(&|p| (p[2], p[3]));
        // What the points' values alone (the line before) showed.
        let plain = runs(&|p| (p[1], p[1]));
        eprintln!(
            "{label}: {} points, {rises} rises and drops drawn ({plain} from the points' values alone)",
            pts.len()
        );
        assert!(
            (8..=10).contains(&rises),
            "{label}: {rises} of 10 temporaries rise and drop in the timeline"
        );
        // The peak marker sits where the line reaches the peak: in the point at its time or
        // the next one (records within one tick of the clock share its time, and the point at
        // that time may have been taken before the peak's record).
        let json = report_json(&capture, &[]);
        let at = json["peak_seconds"].as_f64().unwrap();
        let peak = json["totals"]["peak"]["bytes"].as_f64().unwrap();
        let i = pts.partition_point(|p| p[0] < at).min(pts.len() - 1);
        let near = &pts[i..(i + 2).min(pts.len())];
        assert!(
            near.iter().any(|p| p[3] >= 0.9 * peak),
            "{label}: the peak ({peak} at {at} s) is not drawn there: {near:?}"
        );
    }
}
