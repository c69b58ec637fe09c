//! Shared by the tests of the views: a fixed capture that exercises every rule, running the
//! real binary, and golden files (`MPROF_BLESS=1` rewrites them).

use mprof::capture::testing::CaptureBuilder as Capture;
use mprof_common::record::Record;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

pub const MODULE: u64 = 0x1000;
pub const BUILD: u64 = 0x2000;
pub const LOAD: u64 = 0x3000;
pub const CHUNK: u64 = 0x4000;

/// A fixed, sampled capture that exercises every rule: start-up allocation with no frames,
/// realloc, a free of an unsampled block, an unannounced code object, a reused code address,
/// a peak that differs from the end, dropped records.
pub fn fixture() -> Capture {
    let mut c = Capture::new();
    c.meta(
        "mode=record\ncommand=python app.py\npid=4242\nrate=1024\nmax_depth=128\nseed=7\n\
         python=3.12.1\nstart_unix_ms=1700000000000\n",
    )
    .push(Record::Thread {
        tid: 1,
        name: "MainThread".into(),
    })
    .alloc(0x10, 4096, 1_000_000_000, &[])
    .code(MODULE, "app.py", "<module>", 1)
    .code(BUILD, "app.py", "build_index", 10)
    .code(LOAD, "app.py", "load_rows", 30)
    .code(CHUNK, "lib/util.py", "chunk", 5)
    .alloc(0x100, 8192, 1_100_000_000, &[(BUILD, 12), (MODULE, 50)])
    .alloc(0x200, 8192, 1_200_000_000, &[(BUILD, 12), (MODULE, 50)])
    .alloc(
        0x400,
        100_000,
        1_300_000_000,
        &[(LOAD, 33), (BUILD, 14), (MODULE, 50)],
    )
    .alloc(
        0x500,
        512,
        1_400_000_000,
        &[(CHUNK, 7), (LOAD, 35), (MODULE, 52)],
    )
    .free(0x400)
    .free(0x500)
    .alloc(
        0x600,
        1500,
        1_500_000_000,
        &[(CHUNK, 8), (LOAD, 35), (MODULE, 52)],
    )
    .alloc(0x300, 8192, 1_600_000_000, &[(BUILD, 12), (MODULE, 51)])
    .alloc(0x700, 2048, 1_700_000_000, &[(0x9999, 3), (MODULE, 60)])
    .free(0xdead)
    .code(LOAD, "app.py", "parse", 70)
    .alloc(0x800, 3000, 1_800_000_000, &[(LOAD, 72), (MODULE, 55)])
    .push(Record::Rss {
        time_ns: 1_900_000_000,
        rss_bytes: 50 << 20,
    })
    .push(Record::End {
        reason: 1,
        time_ns: 2_000_000_000,
    })
    .push(Record::Stats {
        samples: 9,
        dropped: 3,
    });
    c
}

pub fn mprof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mprof"))
        .args(args)
        .output()
        .expect("run mprof")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// Runs mprof and expects success.
pub fn ok(args: &[&str]) -> Output {
    let o = mprof(args);
    assert!(o.status.success(), "mprof {args:?} failed: {}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
    o
}

pub fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&stdout(&ok(&all))).expect("valid JSON")
}

/// Compares `actual` with `tests/golden/<name>`, or rewrites it when `MPROF_BLESS=1`.
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if mprof::capture::testing::bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}; run with MPROF_BLESS=1", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the golden file (MPROF_BLESS=1 rewrites it)\n\
         --- expected\n{expected}\n--- actual\n{actual}"
    );
}
