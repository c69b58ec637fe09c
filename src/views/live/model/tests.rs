//! Tests of the live view's model: rows by every grouping, rates, skipping, and agreement
//! with the batch profile.

use super::*;
use crate::capture::testing::code;

fn alloc(tid: u32, addr: u64, size: u64, frames: &[(u64, u32)]) -> Record {
    crate::capture::testing::alloc(tid, addr, size, addr, frames)
}

/// rate 1 (exact figures): main → build (twice, recursive) → leaf, and a second thread.
fn model() -> Model {
    let mut m = Model::new(1, 0);
    for r in [
        code(1, "app.py", "main", 1),
        code(2, "app.py", "build", 10),
        code(3, "lib.py", "leaf", 20),
        alloc(7, 100, 1000, &[(3, 21), (2, 11), (2, 12), (1, 2)]),
        alloc(7, 200, 500, &[(2, 13), (1, 3)]),
        alloc(8, 300, 300, &[(3, 22), (1, 4)]),
        Record::Free { addr: 100 },
        Record::Thread {
            tid: 8,
            name: "worker".into(),
        },
    ] {
        m.apply(&r);
    }
    m
}

fn table(m: &Model, s: &Snapshot, settings: Settings) -> Vec<(String, u32, f64, f64)> {
    rows(m, s, &settings)
        .iter()
        .map(|r| {
            (
                format!("{}:{}", r.file, r.function),
                r.line,
                r.figures.allocated.bytes,
                r.figures.live.bytes,
            )
        })
        .collect()
}

#[test]
fn own_rows_by_line_and_by_file() {
    let mut m = model();
    let s = m.roll(1_000_000_000);
    let settings = Settings {
        sort: Column::Allocated,
        ..Settings::default()
    };
    assert_eq!(
        table(&m, &s, settings),
        [
            ("lib.py:leaf".into(), 21, 1000.0, 0.0),
            ("app.py:build".into(), 13, 500.0, 500.0),
            ("lib.py:leaf".into(), 22, 300.0, 300.0),
        ]
    );
    let by_file = Settings {
        group: Grouping::File,
        ..settings
    };
    assert_eq!(
        table(&m, &s, by_file),
        [
            ("lib.py:".into(), 0, 1300.0, 300.0),
            ("app.py:".into(), 0, 500.0, 500.0),
        ]
    );
}

#[test]
fn totals_count_a_recursive_function_once_per_stack() {
    let mut m = model();
    let s = m.roll(1_000_000_000);
    let settings = Settings {
        sort: Column::Allocated,
        group: Grouping::Function,
        inclusive: true,
        thread: None,
        process: None,
    };
    assert_eq!(
        table(&m, &s, settings),
        [
            ("app.py:main".into(), 1, 1800.0, 800.0),
            ("app.py:build".into(), 10, 1500.0, 500.0),
            ("lib.py:leaf".into(), 20, 1300.0, 300.0),
        ]
    );
}

#[test]
fn by_your_code_own_rows_show_the_innermost_and_totals_keep_your_frames() {
    let mut m = Model::new(1, 0);
    let json = "/usr/lib/python3.11/json/encoder.py";
    for r in [
        code(1, "app.py", "main", 1),
        code(2, json, "encode", 180),
        code(3, "/usr/lib/python3.11/functools.py", "wrapper", 900),
        alloc(7, 100, 1000, &[(2, 200), (1, 5)]),
        alloc(7, 200, 300, &[(2, 201), (3, 905), (1, 5)]),
        alloc(7, 300, 50, &[(1, 6)]),
        alloc(7, 400, 20, &[(2, 202)]),
    ] {
        m.apply(&r);
    }
    let s = m.roll(1_000_000_000);
    let settings = Settings {
        sort: Column::Allocated,
        ..Settings::default()
    };
    let rows = rows(&m, &s, &settings);
    let got: Vec<_> = rows
        .iter()
        .map(|r| {
            let b = r.beside.unwrap();
            let inner = b.innermost.map(|l| l.line);
            (
                r.file,
                r.line,
                r.figures.allocated.bytes,
                inner,
                b.more,
                b.yours,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("app.py", 5, 1300.0, Some(200), 1, true),
            ("app.py", 6, 50.0, None, 0, true),
            (json, 202, 20.0, None, 0, false),
        ]
    );
    let total = Settings {
        inclusive: true,
        ..settings
    };
    assert_eq!(
        table(&m, &s, total),
        [
            ("app.py:main".into(), 5, 1300.0, 1300.0),
            ("app.py:main".into(), 6, 50.0, 50.0),
            (format!("{json}:encode"), 202, 20.0, 20.0),
        ]
    );
}

#[test]
fn thread_filter_and_names() {
    let mut m = model();
    let s = m.roll(1_000_000_000);
    assert_eq!(
        s.threads.iter().map(Thread::label).collect::<Vec<_>>(),
        ["7", "8 worker"]
    );
    let settings = Settings {
        thread: Some(8),
        ..Settings::default()
    };
    assert_eq!(
        table(&m, &s, settings),
        [("lib.py:leaf".into(), 22, 300.0, 300.0)]
    );
}

#[test]
fn rates_cover_the_last_interval_only() {
    let mut m = model();
    let s = m.roll(2_000_000_000);
    assert_eq!(s.alloc_rate, 900.0);
    assert_eq!(s.sample_rate, 1.5);
    assert_eq!(s.live_heap, 800.0);
    assert_eq!(s.peak_heap, 1800.0);
    m.apply(&alloc(7, 400, 64, &[(2, 13), (1, 3)]));
    let s = m.roll(2_500_000_000);
    assert_eq!(s.alloc_rate, 128.0);
    let settings = Settings::default();
    let top = &rows(&m, &s, &settings)[0];
    assert_eq!((top.function, top.line), ("build", 13));
    assert_eq!(top.figures.recent.bytes, 64.0);
    assert_eq!(top.figures.allocated.bytes, 564.0);
    assert_eq!(s.heap_history, [800.0, 864.0]);
}

#[test]
fn a_reader_behind_skips_samples_but_keeps_names_and_frees() {
    let mut m = Model::new(1, 0);
    m.observe(&record::encode(&alloc(7, 100, 1000, &[])));
    for r in [
        code(1, "a.py", "f", 1),
        alloc(7, 200, 500, &[(1, 2)]),
        Record::Free { addr: 100 },
    ] {
        m.observe_but_skip_samples(&record::encode(&r));
    }
    m.observe(&record::encode(&alloc(7, 300, 10, &[(1, 3)])));
    let s = m.roll(1);
    assert_eq!((s.skipped, s.live_heap), (1, 10.0));
    let by_live = Settings {
        sort: Column::Live,
        ..Settings::default()
    };
    let rows = rows(&m, &s, &by_live);
    assert_eq!(rows[0].function, "f");
    assert_eq!(rows[1].figures.live.bytes, 0.0);
}

#[test]
fn live_figures_agree_with_the_batch_profile() {
    // The same records through the shared aggregator, incrementally and in batch.
    let mut records = vec![Record::Meta {
        text: "rate=4096".into(),
    }];
    records.push(code(1, "a.py", "f", 1));
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in 0..5000u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let addr = state % 300;
        records.push(match i % 3 {
            0 => Record::Free { addr },
            _ => alloc(
                1 + (i % 2) as u32,
                addr,
                state % 20_000,
                &[(1, (i % 4) as u32)],
            ),
        });
    }
    let mut m = Model::new(4096, 0);
    records.iter().for_each(|r| m.apply(r));
    let s = m.roll(1);
    let p = crate::analysis::profile::Profile::from_records(&records);
    let sum =
        |f: fn(&SiteFigures) -> &Estimate| s.sites.iter().map(|(_, _, x)| f(x).bytes).sum::<f64>();
    let t = p.totals();
    assert!((sum(|x| &x.allocated) - t.allocated.bytes).abs() < 1e-6 * t.allocated.bytes);
    assert!((sum(|x| &x.live) - t.live.bytes).abs() < 1e-6 * t.allocated.bytes);
    assert!((s.live_heap - t.live.bytes).abs() < 1e-6 * t.allocated.bytes);
    assert!((s.peak_heap - t.peak.bytes).abs() < 1e-6 * t.allocated.bytes);
    let samples: u64 = s.sites.iter().map(|(_, _, x)| x.live.samples).sum();
    assert_eq!(samples, t.live.samples);
}

#[inline(never)]
fn native_leaf() -> u64 {
    native_leaf as *const () as u64 + 1
}

#[test]
fn native_frames_are_rows_by_function_and_inclusive() {
    // This test binary's modules, as `record --native` writes them, and a sample whose
    // native stack holds one of its functions under a Python frame.
    let here = native_leaf();
    let mut m = Model::new(1, 0);
    for r in crate::analysis::symbols::tracker::ModuleTracker::new(std::process::id())
        .before_sample(&[here])
    {
        m.apply(&r);
    }
    m.apply(&code(1, "app.py", "main", 1));
    let mut sample = alloc(7, 100, 4096, &[(1, 2)]);
    if let Record::Alloc { native, .. } = &mut sample {
        *native = Some(mprof_common::record::NativeStack {
            addrs: vec![here],
            entries: vec![1],
        });
    }
    m.apply(&sample);
    let s = m.roll(1_000_000_000);
    for inclusive in [false, true] {
        let settings = Settings {
            group: Grouping::Function,
            inclusive,
            ..Settings::default()
        };
        let rows = rows(&m, &s, &settings);
        let native = rows
            .iter()
            .find(|r| r.function.ends_with("native_leaf"))
            .unwrap_or_else(|| panic!("no native row: {rows:?}"));
        assert_eq!(native.figures.allocated.bytes, 4096.0);
        assert_eq!(
            rows.iter().any(|r| r.function == "main"),
            inclusive,
            "{rows:?}"
        );
    }
}
