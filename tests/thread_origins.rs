//! Work done on threads that run none of the user's code is shown under the line that started
//! the thread (issue 52): `mprof record --rate 1` of tests/py/thread_origins.py, on every
//! interpreter present, groups by your code (the default of `report`)
//! - a `threading.Thread` whose target is a library's (in a site-packages folder) under
//!   "thread started at" the script's `worker.start()` line;
//! - a native thread started with `pthread_create` by a C library (tests/c/thread_origin.c,
//!   loaded with ctypes) under "thread started at" the line that called into the library;
//! - Arrow's own native threads under the `pyarrow.csv.read_csv` line (and pandas'
//!   `read_csv(engine="pyarrow")` when pandas is there).

mod common;

use common::native::build_library;
use common::{pythons, record_script, report_json, script};
use serde_json::Value;
use std::path::Path;

/// Bytes the Python worker keeps: 200 bytearrays of 10,000 bytes (each 10,001 with its NUL).
const PYTHON_BYTES: u64 = 200 * 10_001;
/// Bytes the native thread keeps: 8 blocks of 1 MiB.
const NATIVE_BYTES: u64 = 8 << 20;

/// The line of tests/py/thread_origins.py marked `# mark: WHAT`.
fn marked_line(what: &str) -> u64 {
    let text = std::fs::read_to_string(script("thread_origins.py")).unwrap();
    let mark = format!("# mark: {what}");
    let at = text.lines().position(|l| l.ends_with(&mark)).unwrap();
    at as u64 + 1
}

/// The library module the Python worker runs, in a site-packages folder of `dir`.
fn write_worklib(dir: &Path) {
    let site = dir.join("lib/site-packages");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(
        site.join("worklib.py"),
        "def work(kept, n, size):\n    for _ in range(n):\n        kept.append(bytearray(size))\n",
    )
    .unwrap();
}

/// The row of `report` grouped at "thread started at" `line` of tests/py/thread_origins.py.
fn started_at(report: &Value, line: u64) -> Option<&Value> {
    started_at_file(report, "thread_origins.py", line)
}

/// The row of `report` grouped at "thread started at" `line` of the script `name`, if any.
fn started_at_file<'a>(report: &'a Value, name: &str, line: u64) -> Option<&'a Value> {
    report["locations"].as_array().unwrap().iter().find(|l| {
        l["function"] == "thread started at"
            && l["line"] == line
            && l["file"].as_str().is_some_and(|f| f.ends_with(name))
    })
}

#[test]
fn threads_that_run_no_code_of_yours_show_under_the_line_that_started_them() {
    let dir = common::tempdir();
    write_worklib(dir.path());
    let library = build_library(dir.path(), "thread_origin");
    let (python_line, native_line) = (marked_line("python thread"), marked_line("native thread"));
    for py in pythons() {
        let capture = dir
            .path()
            .join(format!("{}.mprof", py.label.replace(' ', "-")));
        let env = [("THREAD_ORIGIN_LIBRARY", library.to_str().unwrap())];
        let options = ["-q", "--rate", "1"];
        record_script(
            &py,
            &options,
            &env,
            &capture,
            "thread_origins.py",
            dir.path(),
        );
        let report = report_json(&capture, &["--top", "0"]);
        let row = started_at(&report, python_line)
            .unwrap_or_else(|| panic!("{}: no row for the Python thread: {report}", py.label));
        let bytes = row["alloc_bytes"].as_u64().unwrap();
        // The bytearrays, and what the list that keeps them and the thread's start-up took.
        assert!(
            (PYTHON_BYTES..PYTHON_BYTES + 200_000).contains(&bytes),
            "{}: {bytes} B under the Python thread's start: {row}",
            py.label
        );
        assert_eq!(row["in_your_code"], true, "{}: {row}", py.label);
        let row = started_at(&report, native_line)
            .unwrap_or_else(|| panic!("{}: no row for the native thread: {report}", py.label));
        let bytes = row["alloc_bytes"].as_u64().unwrap();
        assert!(
            (NATIVE_BYTES..NATIVE_BYTES + 4096).contains(&bytes),
            "{}: {bytes} B under the native thread's start: {row}",
            py.label
        );
        let text = common::views::stdout(&common::views::ok(&[
            "report",
            capture.to_str().unwrap(),
            "--top",
            "0",
        ]));
        let label = format!("thread_origins.py:{native_line}");
        assert!(
            text.lines()
                .any(|l| l.contains("thread started at ") && l.contains(&label)),
            "{}: {text}",
            py.label
        );
        eprintln!(
            "{}: thread started at line {python_line}: {} B, line {native_line}: {bytes} B",
            py.label,
            started_at(&report, python_line).unwrap()["alloc_bytes"]
        );
    }
}

/// Arrow parses a CSV on native threads of its own, which it starts at the first read: their
/// bytes are under "thread started at" the `read_csv` line, pyarrow's and pandas'
/// (`engine="pyarrow"`), each in a process of its own (pyenv's 3.11, where tools/test-deps.sh
/// installs both).
#[test]
fn arrow_threads_show_under_the_read_csv_line() {
    let text = std::fs::read_to_string(script("arrow_csv_threads.py")).unwrap();
    let line_of = |what: &str| {
        let mark = format!("# mark: {what}");
        text.lines().position(|l| l.ends_with(&mark)).unwrap() as u64 + 1
    };
    for py in pythons() {
        if !common::pyarrow_or_skip(&py, &format!("Arrow's threads on {}", py.label)) {
            continue;
        }
        let mut readers = vec![("pyarrow", line_of("pyarrow read_csv"))];
        if common::imports(&py, "pandas") {
            readers.push(("pandas", line_of("pandas read_csv")));
        } else {
            common::tier::skip(
                &format!("pandas on {}", py.label),
                "pandas not importable (tools/test-deps.sh installs it into pyenv's 3.11)",
            );
        }
        for (reader, line) in readers {
            let dir = common::tempdir();
            let capture = dir.path().join("arrow.mprof");
            let env = [
                ("ARROW_DEFAULT_MEMORY_POOL", "system"),
                ("CSV_READER", reader),
            ];
            record_script(
                &py,
                &["-q"],
                &env,
                &capture,
                "arrow_csv_threads.py",
                dir.path(),
            );
            let report = report_json(&capture, &["--top", "0"]);
            let row = started_at_file(&report, "arrow_csv_threads.py", line).unwrap_or_else(|| {
                panic!(
                    "{} {reader}: nothing started at line {line}: {report}",
                    py.label
                )
            });
            let bytes = row["alloc_bytes"].as_u64().unwrap();
            assert!(bytes > 1 << 20, "{} {reader}: {bytes} B: {row}", py.label);
            eprintln!(
                "{} {reader}: thread started at line {line}: {bytes} B",
                py.label
            );
        }
    }
}

/// The reader's pairing, on a hand-built capture: a thread that samples before its creator
/// returned waits (its early samples have no origin), a reused `pthread_t` goes to its latest
/// creation and never to the stale one, and a SPAWN naming a stack never defined is skipped.
#[test]
fn the_reader_pairs_each_thread_with_its_own_creation() {
    use mprof::capture::testing::CaptureBuilder;
    use mprof_common::record::Record;
    use mprof_common::stacks::{encode_stack, Node};
    const APP: u64 = 0x10;
    const LIB: u64 = 0x20;
    let node = |code, line| Node {
        parent: 0,
        code,
        line,
        entry: false,
    };
    let spawn = |serial, node| Record::Spawn {
        serial,
        tid: 1,
        node,
        depth: 1,
        truncated: false,
        frames: Vec::new(),
    };
    let pool = "/venv/lib/python3.11/site-packages/lib/pool.py";
    let mut c = CaptureBuilder::new();
    c.meta("mode=record\npid=7\nrate=1\npython=3.11.2\ncwd=/srv/app\nprogram_dir=/srv/app\n")
        .code(APP, "/srv/app/app.py", "<module>", 1)
        .code(LIB, pool, "work", 1);
    c.bytes.extend(encode_stack(1, &node(APP, 5)));
    c.bytes.extend(encode_stack(2, &node(APP, 9)));
    let spawned = |serial, handle| Record::Spawned { serial, handle };
    let handle = |tid, handle| Record::Handle {
        tid,
        handle,
        serial: 0,
    };
    // Thread 2, started at line 5, samples once its creator returned.
    c.push(spawn(1, 1))
        .push(spawned(1, 0x100))
        .push(handle(2, 0x100))
        .alloc_in(2, 0x1000, 1000, 1, &[(LIB, 3)]);
    // Thread 3 gets thread 2's handle, started at line 9, and samples before its creator
    // returned: that sample has no origin; the next is line 9's, never line 5's.
    c.push(spawn(2, 2))
        .push(handle(3, 0x100))
        .alloc_in(3, 0x2000, 2000, 2, &[(LIB, 3)])
        .push(spawned(2, 0x100))
        .alloc_in(3, 0x3000, 4000, 3, &[(LIB, 3)]);
    // A SPAWN naming a stack never defined is skipped; thread 4 has no origin.
    c.push(spawn(3, 99))
        .push(spawned(3, 0x400))
        .push(handle(4, 0x400))
        .alloc_in(4, 0x4000, 8000, 4, &[(LIB, 3)]);
    let dir = tempfile::tempdir().unwrap();
    let capture = c.write(dir.path(), "pairing.mprof");
    let report = report_json(&capture, &["--top", "0"]);
    let rows: Vec<(String, u64, u64)> = report["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let function = l["function"].as_str().unwrap().to_owned();
            (
                function,
                l["line"].as_u64().unwrap(),
                l["alloc_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("work".to_owned(), 3, 10_000),
            ("thread started at".to_owned(), 9, 4000),
            ("thread started at".to_owned(), 5, 1000),
        ],
        "{report}"
    );
}
