//! The grouping by your code (`--by your-code`, the default of `report`, `diff`, the summary
//! and the live view): golden text and JSON on a hand-built capture, `--focus`, and the
//! leak-hunt example run under `mprof record` on every interpreter, where the default report
//! names the example's own leaking line.
//!
//! `MPROF_BLESS=1 cargo test --test your_code` rewrites the golden files.

mod common;

use common::views::{golden, json, ok, stdout};
use common::{pythons, report_json, run_with_timeout};
use mprof::capture::testing::CaptureBuilder as Capture;
use mprof_common::record::Record;
use std::path::{Path, PathBuf};
use std::time::Duration;

const APP: u64 = 0x10;
const HANDLER: u64 = 0x20;
const ENCODE: u64 = 0x30;
const ITERENCODE: u64 = 0x40;
const BOOTSTRAP: u64 = 0x50;
const FLASK: u64 = 0x60;
const DECODE: u64 = 0x70;

/// A small web app: a handler whose JSON documents leak (allocated in the standard library's
/// encoder), an import of a package from a virtualenv inside the project, a request decoded
/// by the standard library alone, and start-up allocations. Every allocation recorded
/// (rate 1), so the figures are exact.
fn capture() -> Capture {
    let json = "/usr/lib/python3.11/json/encoder.py";
    let mut c = Capture::new();
    c.meta(
        "mode=record\ncommand=python3 app.py\npid=77\nrate=1\npython=3.11.2\n\
         cwd=/srv/app\nprogram_dir=/srv/app\n",
    )
    .code(APP, "/srv/app/app.py", "<module>", 1)
    .code(HANDLER, "/srv/app/app.py", "handle", 20)
    .code(ENCODE, json, "encode", 183)
    .code(ITERENCODE, json, "iterencode", 205)
    .code(
        BOOTSTRAP,
        "<frozen importlib._bootstrap>",
        "_call_with_frames_removed",
        241,
    )
    .code(
        FLASK,
        "/srv/app/.venv/lib/python3.11/site-packages/flask/__init__.py",
        "<module>",
        1,
    )
    .code(
        DECODE,
        "/usr/lib/python3.11/json/decoder.py",
        "raw_decode",
        343,
    )
    .alloc(1, 3000, 1, &[])
    .alloc(2, 40_000, 2, &[(FLASK, 3), (BOOTSTRAP, 241), (APP, 2)])
    .alloc(3, 100_000, 3, &[(ENCODE, 200), (HANDLER, 24), (APP, 30)])
    .alloc(
        4,
        60_000,
        4,
        &[(ITERENCODE, 258), (ENCODE, 199), (HANDLER, 24), (APP, 30)],
    )
    .alloc(5, 5_000, 5, &[(HANDLER, 22), (APP, 30)])
    .alloc(6, 2_000, 6, &[(DECODE, 353)])
    .free(5)
    .push(Record::End {
        reason: 1,
        time_ns: 9,
    });
    c
}

#[test]
fn text_and_json_reports_by_your_code_match_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = capture().write(dir.path(), "app.mprof");
    let f = file.to_str().unwrap();
    let text = stdout(&ok(&["report", f, "--top", "0"]));
    assert!(text.starts_with(
        "mprof report: allocated bytes, by your code's line (innermost frame beside it)\n"
    ));
    golden("report-your-code.txt", &text);
    assert_eq!(
        text,
        stdout(&ok(&["report", f, "--top", "0", "--by", "your-code"]))
    );
    let focused = stdout(&ok(&["report", f, "--view", "live", "--focus", "flask"]));
    golden("report-your-code-focus-live.txt", &focused);
    golden(
        "report-your-code.json",
        &stdout(&ok(&["report", f, "--json", "--top", "0"])),
    );

    let v = json(&["report", f, "--top", "0"]);
    assert_eq!(v["by"], "your-code");
    let locs = v["locations"].as_array().unwrap();
    let handle = &locs[0];
    assert_eq!(
        (&handle["file"], &handle["line"]),
        (&"/srv/app/app.py".into(), &24.into())
    );
    assert_eq!(handle["alloc_bytes"], 160_000);
    assert_eq!(handle["in_your_code"], true);
    assert_eq!(handle["innermost"]["function"], "encode");
    assert_eq!(handle["innermost"]["line"], 200);
    assert_eq!(handle["innermost_others"], 1);
    let import = locs.iter().find(|l| l["line"] == 2).unwrap();
    assert_eq!(import["function"], "<module>");
    assert_eq!(
        import["innermost"]["file"]
            .as_str()
            .map(|s| s.contains("flask")),
        Some(true)
    );
    let own = locs.iter().find(|l| l["line"] == 22).unwrap();
    assert_eq!(own["innermost"], serde_json::Value::Null);
    let decode = locs.iter().find(|l| l["function"] == "raw_decode").unwrap();
    assert_eq!(decode["in_your_code"], false);
    let by_line = json(&["report", f, "--by", "line"]);
    assert!(by_line["locations"][0].get("innermost").is_none());
    assert_eq!(by_line["locations"][0]["function"], "encode");
}

#[test]
fn diff_groups_by_your_code_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let base = capture().write(dir.path(), "base.mprof");
    let mut grown = capture();
    grown.alloc(
        7,
        1_000_000,
        7,
        &[(ITERENCODE, 258), (ENCODE, 199), (HANDLER, 24), (APP, 31)],
    );
    let new = grown.write(dir.path(), "new.mprof");
    let text = stdout(&ok(&[
        "diff",
        base.to_str().unwrap(),
        new.to_str().unwrap(),
    ]));
    assert!(
        text.starts_with("mprof diff: live bytes at the end, by your code's line"),
        "{text}"
    );
    let mut rows = text
        .lines()
        .skip_while(|l| !l.ends_with("samples  location"));
    let first = rows.nth(1).unwrap_or_default();
    assert!(
        first.contains("+976.56 KiB") && first.ends_with("handle (/srv/app/app.py:24)"),
        "{text}"
    );
}

/// The example's line that keeps every document, found by its marker comment.
fn leaking_line(example: &Path) -> u64 {
    let text = std::fs::read_to_string(example).unwrap();
    1 + text
        .lines()
        .position(|l| l.contains("# <- the leak"))
        .expect("the example marks its leak") as u64
}

/// `examples/leak_hunt.py` under `mprof record`, on every interpreter: by your code (the
/// default) the live view's top site is the example's leaking line, with the standard
/// library's JSON encoder beside it; by line it is the encoder.
#[test]
fn the_leak_hunt_example_names_its_own_leaking_line() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/leak_hunt.py");
    let line = leaking_line(&example);
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("leak.mprof");
        let out = run_with_timeout(
            common::mprof()
                .arg("record")
                .arg("-o")
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(&example),
            Duration::from_secs(120),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", py.label);
        let report = report_json(&capture, &["--view", "live"]);
        let top = &report["locations"][0];
        let file = top["file"].as_str().unwrap();
        assert!(
            file.ends_with("examples/leak_hunt.py") && top["line"] == line,
            "{}: the top live site is {top}",
            py.label
        );
        let inner = top["innermost"]["file"].as_str().unwrap_or_default();
        assert!(inner.ends_with("json/encoder.py"), "{}: {top}", py.label);
        let share = top["live_bytes"].as_f64().unwrap()
            / report["totals"]["live"]["bytes"].as_f64().unwrap();
        assert!(
            share > 0.5,
            "{}: the leak holds {share} of the live heap",
            py.label
        );
        let by_line = report_json(&capture, &["--view", "live", "--by", "line"]);
        let file = by_line["locations"][0]["file"].as_str().unwrap();
        assert!(file.ends_with("json/encoder.py"), "{}: {file}", py.label);
        // The summary names the leaking line too (by allocated bytes, it leads as well).
        let summary_line = format!("leak_hunt.py:{line})");
        assert!(err.contains(&summary_line), "{}: {err}", py.label);
        // The capture says where the program's code is.
        assert_eq!(
            report["meta"]["program_dir"].as_str().map(PathBuf::from),
            Some(example.parent().unwrap().to_path_buf()),
            "{}",
            py.label
        );
    }
}

/// `python -c COMMAND` under `mprof record`, on every interpreter: the program is code compiled
/// from a string (`<string>`), and it is the user's own, so the top site is the command's line
/// with the JSON encoder beside it; the summary says so too. (The list is about 12 MB, three
/// times what `import json` leaves live on 3.11, where that import brings `typing` and
/// `importlib.resources` in: with 4 MB the two lines were within the sampling error of each
/// other, and one seed in three put the import first.)
#[test]
fn a_command_string_program_is_your_code() {
    let command = "\nimport json\nkeep = [json.dumps({'k%d' % i: list(range(50)) for i in range(50)}) for _ in range(1200)]\n";
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("dash_c.mprof");
        let out = run_with_timeout(
            common::mprof().arg("record").arg("-o").arg(&capture).args([
                "--",
                &py.path.to_string_lossy(),
                "-c",
                command,
            ]),
            Duration::from_secs(120),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", py.label);
        let report = report_json(&capture, &["--view", "live"]);
        let top = &report["locations"][0];
        assert!(
            top["file"] == "<string>" && top["line"] == 3,
            "{}: the top live site is {top}",
            py.label
        );
        let inner = top["innermost"]["file"].as_str().unwrap_or_default();
        assert!(inner.ends_with("json/encoder.py"), "{}: {top}", py.label);
        assert_eq!(report["meta"]["focus_names"], "<string>", "{}", py.label);
        assert!(
            !err.contains("(<string>:3)  ← (no frame in your code)"),
            "{}: {err}",
            py.label
        );
    }
}

/// A program read from standard input (`python -`, or `python` with nothing to run and a
/// program piped in) is compiled as `<stdin>`: it is the user's own code, as `-c`'s is.
#[test]
fn a_program_read_from_standard_input_is_your_code() {
    let program = b"import json\nkeep = [json.dumps({'k%d' % i: list(range(50)) for i in range(50)}) for _ in range(1200)]\n";
    for (py, dash) in pythons().into_iter().zip([true, false].into_iter().cycle()) {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("stdin.mprof");
        let source = dir.path().join("program.py");
        std::fs::write(&source, program).unwrap();
        let mut cmd = common::mprof();
        cmd.arg("record")
            .arg("-o")
            .arg(&capture)
            .arg("--")
            .arg(&py.path);
        if dash {
            cmd.arg("-");
        }
        cmd.stdin(std::fs::File::open(&source).unwrap());
        let out = run_with_timeout(&mut cmd, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", py.label);
        let report = report_json(&capture, &["--view", "live"]);
        let top = &report["locations"][0];
        assert!(
            top["file"] == "<stdin>" && top["line"] == 2 && top["in_your_code"] == true,
            "{} (dash: {dash}): the top live site is {top}",
            py.label
        );
        let inner = top["innermost"]["file"].as_str().unwrap_or_default();
        assert!(inner.ends_with("json/encoder.py"), "{}: {top}", py.label);
        assert_eq!(report["meta"]["focus_names"], "<stdin>", "{}", py.label);
    }
}

/// A followed child run as `python -c` counts its `<string>` as your code when it is shown on
/// its own (`report --pid CHILD`), as the program does: each child's capture says what its own
/// code is, from its command line and directory. Before, the child's rows said "no frame in
/// your code".
#[test]
fn a_followed_child_run_with_a_command_string_has_its_own_code() {
    let child = "\nimport json\nkeep = [json.dumps({'k%d' % i: list(range(50)) for i in range(50)}) for _ in range(1200)]\n";
    let parent = format!(
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child:?}], check=True)\n"
    );
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let capture = dir.path().join("parent.mprof");
        let out = run_with_timeout(
            common::mprof()
                .args(["record", "-q", "--follow-children", "-o"])
                .arg(&capture)
                .args(["--", &py.path.to_string_lossy(), "-c", &parent]),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "{}: {}",
            py.label,
            String::from_utf8_lossy(&out.stderr)
        );
        let table = report_json(&capture, &["--per-process"]);
        let child_pid = table["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["born"] != "record")
            .and_then(|p| p["pid"].as_u64())
            .unwrap_or_else(|| panic!("{}: no child in {table}", py.label));
        let report = report_json(
            &capture,
            &["--view", "live", "--pid", &child_pid.to_string()],
        );
        assert_eq!(report["meta"]["focus_names"], "<string>", "{}", py.label);
        let top = &report["locations"][0];
        assert!(
            top["file"] == "<string>" && top["line"] == 3,
            "{}: the child's top live site is {top}",
            py.label
        );
    }
}

/// Runs `program args` under `mprof record` in `cwd`, returns the `report --json` (by your
/// code, allocated bytes, every row).
fn record_in(cwd: &Path, capture: &Path, program: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_with_timeout(
        common::mprof()
            .current_dir(cwd)
            .args(["record", "-q", "-o"])
            .arg(capture)
            .arg("--")
            .arg(program)
            .args(args),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{program:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    report_json(capture, &["--top", "0"])
}

/// Checks a report of the launcher workload: the console script's stub and runpy head no row
/// but those of their own allocations (runpy's module set up, say: the row's frame is its
/// innermost, and not yours); the user's line heads the row of its 20 MB; the tool's own
/// 10 MB have no frame of yours.
fn check_launcher_report(label: &str, report: &serde_json::Value, stub: &Path, line: u64) {
    let rows = report["locations"].as_array().unwrap();
    for row in rows {
        let file = row["file"].as_str().unwrap();
        let launcher = file == stub.to_str().unwrap()
            || file.ends_with("runpy.py")
            || file == "<frozen runpy>";
        assert!(
            !launcher || (row["innermost"].is_null() && row["in_your_code"] == false),
            "{label}: a launcher heads a row: {row}"
        );
    }
    let top = rows
        .iter()
        .max_by_key(|r| r["alloc_bytes"].as_u64().unwrap())
        .unwrap();
    assert!(
        top["file"].as_str().unwrap().ends_with("/app.py") && top["line"] == line,
        "{label}: the top row is not the user's line {line}: {top}"
    );
    assert_eq!(top["in_your_code"], true, "{label}: {top}");
    let tool = rows
        .iter()
        .find(|r| r["function"] == "tool_work" || r["innermost"]["function"] == "tool_work")
        .unwrap_or_else(|| panic!("{label}: no row for the tool's own allocations"));
    assert_eq!(tool["in_your_code"], false, "{label}: {tool}");
}

/// A console script installed in a real virtualenv (`pip install --no-index` of a local
/// wheel: its `bin/` stub imports the tool and calls it, as uvicorn's and pytest's do) and
/// the same tool run as `python -m tinylauncher`: the stub and runpy never head a row of the
/// your-code grouping; the user's module line does. On every interpreter present.
#[test]
fn console_script_launchers_and_runpy_are_not_your_code() {
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/launcher_app.py");
    let line = 1 + std::fs::read_to_string(&app)
        .unwrap()
        .lines()
        .position(|l| l.contains("# USER LINE"))
        .unwrap() as u64;
    for py in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let (wheels, venv, project) = (
            dir.path().join("wheels"),
            dir.path().join("venv"),
            dir.path().join("project"),
        );
        for d in [&wheels, &project] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::copy(&app, project.join("app.py")).unwrap();
        let run = |cmd: &mut std::process::Command, what: &str| {
            let out = run_with_timeout(cmd, Duration::from_secs(180));
            assert!(
                out.status.success(),
                "{}: {what}: {}",
                py.label,
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(
            std::process::Command::new(&py.path)
                .arg(common::script("make_wheel.py"))
                .arg(&wheels),
            "making the wheel",
        );
        let made = run_with_timeout(
            std::process::Command::new(&py.path)
                .args(["-m", "venv"])
                .arg(&venv),
            Duration::from_secs(180),
        );
        if !made.status.success() {
            common::tier::skip_here(
                &format!("{}: the launcher test", py.label),
                &format!("no venv: {}", String::from_utf8_lossy(&made.stderr).trim()),
            );
            continue;
        }
        let python = venv.join("bin/python");
        run(
            std::process::Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--no-index", "--find-links"])
                .arg(&wheels)
                .arg("tinylauncher"),
            "pip install",
        );
        let stub = venv.join("bin/tinylauncher");
        assert!(stub.is_file(), "{}: pip wrote no console script", py.label);
        let label = format!("{} console script", py.label);
        let report = record_in(&project, &dir.path().join("script.mprof"), &stub, &["app"]);
        check_launcher_report(&label, &report, &stub, line);
        let label = format!("{} python -m", py.label);
        let capture = dir.path().join("module.mprof");
        let report = record_in(&project, &capture, &python, &["-m", "tinylauncher", "app"]);
        check_launcher_report(&label, &report, &stub, line);
    }
}
