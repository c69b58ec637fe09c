//! Every output format from the fixed capture, against golden files (`MPROF_BLESS=1`
//! rewrites them), and what every view must say about its input: an incomplete capture, an
//! unknown rate, hostile names, the thread a site ran in. Output names that say another
//! format are refused.

mod common;

use common::views::{fixture, golden, json, mprof, ok, stderr, stdout, BUILD, MODULE};
use mprof::capture::testing::CaptureBuilder as Capture;
use mprof::views::export::pprof::PprofProfile;
use mprof_common::record::Record;
use prost::Message;
use std::io::Read;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The pprof file decoded, as text.
fn pprof_text(path: &Path) -> String {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .expect("gzip");
    format!(
        "{:#?}\n",
        PprofProfile::decode(raw.as_slice()).expect("profile.proto")
    )
}

/// The fixture with a few more samples (for diffs): build_index grew, load_rows shrank.
fn grown() -> Capture {
    let mut c = fixture();
    c.alloc(0x900, 50_000, 2_100_000_000, &[(BUILD, 12), (MODULE, 50)]);
    c
}

fn write(c: &Capture, dir: &Path, name: &str) -> PathBuf {
    c.write(dir, name)
}

#[test]
fn every_export_format_matches_its_golden_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = write(&fixture(), d, "app.mprof");
    for (format, name) in [
        ("pprof", "app.pb.gz"),
        ("speedscope", "app.speedscope.json"),
        ("folded", "app.folded"),
        ("json", "app.json"),
    ] {
        let out = d.join(name);
        let o = ok(&["export", s(&f), "--format", format, "-o", s(&out)]);
        assert!(stderr(&o).contains("wrote"), "{}", stderr(&o));
        let text = if format == "pprof" {
            pprof_text(&out)
        } else {
            std::fs::read_to_string(&out).unwrap()
        };
        golden(&format!("export-{name}.txt"), &text);
    }
    // Without -o the file goes beside the capture, named by the format.
    ok(&["export", s(&f), "--format", "speedscope"]);
    assert!(d.join("app.speedscope.json").is_file());
    // Without --format the name says it.
    let named = d.join("named.pb.gz");
    ok(&["export", s(&f), "-o", s(&named)]);
    assert_eq!(pprof_text(&named), pprof_text(&d.join("app.pb.gz")));
}

#[test]
fn pictures_and_documents_match_their_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = write(&fixture(), d, "app.mprof");
    let base = write(&fixture(), d, "base.mprof");
    let new = write(&grown(), d, "new.mprof");
    let cases: [(&str, Vec<&str>); 6] = [
        ("flamegraph-allocated.svg", vec!["flamegraph", s(&f)]),
        (
            "flamegraph-live-inverted.svg",
            vec!["flamegraph", s(&f), "--view", "live", "--inverted"],
        ),
        (
            "flamegraph-diff.svg",
            vec!["flamegraph", s(&new), "--diff", s(&base)],
        ),
        ("timeline.svg", vec!["timeline", s(&f)]),
        ("report.html", vec!["html", s(&f)]),
        (
            "flamegraph-thread-1.svg",
            vec!["flamegraph", s(&f), "--thread", "1"],
        ),
    ];
    for (name, mut args) in cases {
        let out = d.join(name);
        args.extend(["-o", s(&out)]);
        ok(&args);
        golden(name, &std::fs::read_to_string(&out).unwrap());
    }
    let text = stdout(&ok(&[
        "diff",
        s(&base),
        s(&new),
        "--view",
        "allocated",
        "--by",
        "line",
    ]));
    golden("diff-allocated-line.txt", &text);
    let j = stdout(&ok(&["diff", s(&base), s(&new), "--by", "stack", "--json"]));
    golden("diff-live-stack.json", &j);
}

#[test]
fn a_diff_marks_noise_and_sorts_by_growth() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = write(&fixture(), d, "base.mprof");
    let new = write(&grown(), d, "new.mprof");
    let v = json(&[
        "diff",
        s(&base),
        s(&new),
        "--view",
        "allocated",
        "--top",
        "0",
    ]);
    let sites = v["sites"].as_array().unwrap();
    assert_eq!(sites[0]["label"], "build_index (app.py:12)");
    assert!(sites[0]["change_bytes"].as_i64().unwrap() >= 50_000);
    assert_eq!(sites[0]["noise"], false);
    // Everything else is the same samples: no change, and so within 2σ.
    assert!(sites[1..]
        .iter()
        .all(|x| x["change_bytes"] == 0 && x["noise"] == true));
    let same = json(&["diff", s(&base), s(&base)]);
    assert_eq!(same["total"]["change_bytes"], 0);
}

/// A capture cut before its END record and before mprof's closing Stats record.
fn incomplete() -> Capture {
    let mut c = Capture::new();
    c.meta("mode=record\ncommand=python app.py\npid=9\nrate=1\n")
        .code(1, "app.py", "work", 1)
        .alloc(1, 1000, 1_000, &[(1, 2)])
        .push(Record::Rss {
            time_ns: 2_000,
            rss_bytes: 1 << 20,
        });
    c
}

#[test]
fn an_incomplete_capture_is_flagged_in_every_view() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = write(&incomplete(), d, "cut.mprof");
    let o = ok(&["report", s(&f)]);
    assert!(
        stdout(&o).contains("warning: incomplete capture"),
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("mprof: warning: incomplete capture"));
    assert_eq!(json(&["report", s(&f)])["completeness"], "incomplete");
    let svg = d.join("cut.svg");
    ok(&["flamegraph", s(&f), "-o", s(&svg)]);
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("INCOMPLETE capture"));
    let timeline = d.join("cut-timeline.svg");
    ok(&["timeline", s(&f), "-o", s(&timeline)]);
    assert!(std::fs::read_to_string(&timeline)
        .unwrap()
        .contains("INCOMPLETE capture"));
    let html = d.join("cut.html");
    ok(&["html", s(&f), "-o", s(&html)]);
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("warning: incomplete capture"));
    let pb = d.join("cut.pb.gz");
    ok(&["export", s(&f), "-o", s(&pb)]);
    assert!(pprof_text(&pb).contains("incomplete capture"));
    let ss = d.join("cut.speedscope.json");
    ok(&["export", s(&f), "-o", s(&ss)]);
    let diff = stdout(&ok(&["diff", s(&f), s(&f)]));
    assert!(diff.contains("new: warning: incomplete capture"), "{diff}");
    // With an END record the same capture is complete; with only mprof's Stats it is
    // finished (the agent wrote no END), which is not flagged.
    for (last, word) in [
        (
            Record::End {
                reason: 1,
                time_ns: 3_000,
            },
            "ended",
        ),
        (
            Record::Stats {
                samples: 1,
                dropped: 0,
            },
            "finished",
        ),
    ] {
        let mut c = incomplete();
        c.push(last);
        let f = write(&c, d, "whole.mprof");
        assert_eq!(json(&["report", s(&f)])["completeness"], word);
        assert!(!stdout(&ok(&["report", s(&f)])).contains("incomplete"));
    }
}

#[test]
fn a_header_only_capture_does_not_claim_rate_one() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(&Capture::new(), dir.path(), "empty.mprof");
    let text = stdout(&ok(&["report", s(&f)]));
    assert!(!text.contains("every allocation recorded"), "{text}");
    assert!(text.contains("rate unknown"), "{text}");
    assert!(text.contains("incomplete capture"), "{text}");
}

#[test]
fn report_shows_peak_rss_beside_the_peak_heap_and_groups_by_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Capture::new();
    c.meta("rate=1\n")
        .push(Record::Thread {
            tid: 11,
            name: "main (python3)".into(),
        })
        .push(Record::Thread {
            tid: 12,
            name: "worker".into(),
        })
        .code(1, "app.py", "f", 1)
        .alloc_in(11, 1, 1000, 1, &[(1, 2)])
        .alloc_in(12, 2, 3000, 2, &[(1, 2)])
        .alloc_in(12, 3, 500, 3, &[(1, 3)])
        .push(Record::Rss {
            time_ns: 4,
            rss_bytes: 8 << 20,
        })
        .push(Record::End {
            reason: 1,
            time_ns: 5,
        });
    let f = write(&c, dir.path(), "threads.mprof");
    let text = stdout(&ok(&["report", s(&f), "--by", "thread"]));
    assert!(
        text.contains("peak live heap 4.39 KiB ± 0 B at 0.000 s; peak RSS 8.00 MiB"),
        "{text}"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("thread ")).collect();
    assert!(
        rows[0].contains("3.42 KiB") && rows[0].ends_with("thread 12 worker · runs f (app.py:1)"),
        "{text}"
    );
    assert!(
        rows[1].ends_with("thread 11 main (python3) · runs f (app.py:1)"),
        "{text}"
    );
    let v = json(&["report", s(&f), "--by", "thread"]);
    assert_eq!(v["locations"][0]["thread"], 12);
    assert_eq!(v["locations"][0]["alloc_bytes"], 3500);
    let svg = dir.path().join("t.svg");
    ok(&["flamegraph", s(&f), "--thread", "11", "-o", s(&svg)]);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("thread 11 main (python3)"));
    assert!(
        svg.contains("<title>all (all: 1000 B ± 0 B"),
        "thread 12 was drawn"
    );
}

#[test]
fn hostile_names_reach_no_view_as_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let evil = "f\x1b]52;c;aGVsbG8=\x07\x1b[2J\u{9b}31m";
    let mut c = Capture::new();
    c.meta("rate=1\ncommand=python \x1b[2Jevil.py\n")
        .push(Record::Thread {
            tid: 1,
            name: "t\x1b[31m".into(),
        })
        .code(1, "evil\x1b[1m.py", evil, 1)
        .alloc(1, 100, 1, &[(1, 2)])
        .push(Record::End {
            reason: 1,
            time_ns: 2,
        });
    let f = write(&c, d, "evil.mprof");
    let clean = |what: &str, bytes: &[u8]| {
        for bad in [0x1bu8, 0x07] {
            assert!(!bytes.contains(&bad), "{what} carries byte {bad:#x}");
        }
        assert!(
            !String::from_utf8_lossy(bytes).contains('\u{9b}'),
            "{what} carries CSI"
        );
    };
    for args in [
        vec!["report", s(&f)],
        vec!["report", s(&f), "--by", "stack"],
        vec!["report", s(&f), "--by", "thread"],
        vec!["report", s(&f), "--json"],
        vec!["diff", s(&f), s(&f)],
    ] {
        let o = ok(&args);
        clean(&format!("{args:?}"), &o.stdout);
        clean(&format!("{args:?} stderr"), &o.stderr);
    }
    assert!(stdout(&ok(&["report", s(&f)])).contains("f\\u{1b}]52;c;aGVsbG8=\\u{7}"));
    for (args, out) in [
        (vec!["flamegraph", s(&f)], "e.svg"),
        (vec!["flamegraph", s(&f)], "e.folded"),
        (vec!["timeline", s(&f)], "t.svg"),
        (vec!["html", s(&f)], "e.html"),
        (vec!["export", s(&f)], "e.speedscope.json"),
        (vec!["export", s(&f)], "e.json"),
    ] {
        let path = d.join(out);
        let mut args = args.clone();
        args.extend(["-o", s(&path)]);
        ok(&args);
        clean(out, &std::fs::read(&path).unwrap());
    }
    let pb = d.join("e.pb.gz");
    ok(&["export", s(&f), "-o", s(&pb)]);
    clean("pprof", pprof_text(&pb).as_bytes());
}

#[test]
fn an_output_name_of_another_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = write(&fixture(), d, "app.mprof");
    for (args, needle) in [
        (vec!["flamegraph", s(&f), "-o"], "out.json"),
        (vec!["flamegraph", s(&f), "-o"], "out.pb.gz"),
        (vec!["timeline", s(&f), "-o"], "t.png"),
        (vec!["timeline", s(&f), "-o"], "t.html"),
        (vec!["html", s(&f), "-o"], "r.svg"),
        (vec!["export", s(&f), "--format", "pprof", "-o"], "x.json"),
        (
            vec!["export", s(&f), "--format", "json", "-o"],
            "x.speedscope.json",
        ),
        (vec!["export", s(&f), "-o"], "x.svg"),
        (vec!["flamegraph", s(&f), "--diff", s(&f), "-o"], "d.folded"),
    ] {
        let out = d.join(needle);
        let mut args = args.clone();
        args.push(s(&out));
        let o = mprof(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("mprof: error: ") && err.contains(needle),
            "{err}"
        );
        assert!(!out.exists(), "{needle} was written");
    }
    let t99 = d.join("t99.svg");
    let o = mprof(&["flamegraph", s(&f), "--thread", "99", "-o", s(&t99)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("its threads: 1 MainThread"),
        "{}",
        stderr(&o)
    );
    assert!(!t99.exists());
    let o = mprof(&["export", s(&f), "-o", s(&d.join("x.out"))]);
    assert!(stderr(&o).contains("say which format"), "{}", stderr(&o));
}

#[test]
fn bad_inputs_fail_cleanly_in_every_new_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let missing = d.join("nope.mprof");
    let garbage = d.join("garbage.mprof");
    std::fs::write(&garbage, b"this is not a capture file at all\n").unwrap();
    let good = write(&fixture(), d, "good.mprof");
    for bad in [&missing, &garbage] {
        let b = s(bad);
        for args in [
            vec!["timeline", b, "-o", s(&d.join("t.svg"))],
            vec!["html", b, "-o", s(&d.join("r.html"))],
            vec!["export", b, "-o", s(&d.join("x.pb.gz"))],
            vec!["export", b, "-o", s(&d.join("x.speedscope.json"))],
            vec!["diff", b, s(&good)],
            vec!["diff", s(&good), b],
            vec![
                "flamegraph",
                s(&good),
                "--diff",
                b,
                "-o",
                s(&d.join("d.svg")),
            ],
        ] {
            let o = mprof(&args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("mprof: error: "), "{err}");
        }
    }
    for out in ["t.svg", "r.html", "x.pb.gz", "x.speedscope.json", "d.svg"] {
        assert!(!d.join(out).exists(), "{out} written for a bad input");
    }
    // A header-only capture draws and exports without a sample and without failing.
    let empty = write(&Capture::new(), d, "empty.mprof");
    for (cmd, out) in [
        ("timeline", "e.svg"),
        ("html", "e.html"),
        ("flamegraph", "f.svg"),
        ("export", "e.pb.gz"),
        ("export", "e.speedscope.json"),
    ] {
        ok(&[cmd, s(&empty), "-o", s(&d.join(out))]);
    }
}

/// `-o -` writes to standard output the bytes the file would hold, and no file named `-`; a
/// reader that stops early is no error; a gzipped profile is not poured onto a terminal.
#[test]
fn a_dash_writes_to_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = write(&fixture(), d, "app.mprof");
    for (args, name) in [
        (vec!["export", s(&f), "--format", "folded"], "app.folded"),
        (vec!["export", s(&f), "--format", "pprof"], "app.pb.gz"),
        (vec!["export", s(&f), "--format", "json"], "app.json"),
        (vec!["flamegraph", s(&f)], "f.svg"),
        (vec!["timeline", s(&f)], "t.svg"),
        (vec!["html", s(&f)], "r.html"),
    ] {
        let file = d.join(name);
        let mut to_file = args.clone();
        to_file.extend(["-o", s(&file)]);
        ok(&to_file);
        let mut to_stdout = args.clone();
        to_stdout.extend(["-o", "-"]);
        let o = ok(&to_stdout);
        assert_eq!(o.stdout, std::fs::read(&file).unwrap(), "{args:?}");
        assert!(!stderr(&o).contains("wrote"), "{}", stderr(&o));
    }
    assert!(!Path::new("-").exists() && !d.join("-").exists());

    // A reader that closes the pipe at once: still a success.
    let shell = format!(
        "{} export {} --format folded -o - | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}",
        env!("CARGO_BIN_EXE_mprof"),
        s(&f)
    );
    let status = std::process::Command::new("bash")
        .args(["-c", &shell])
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");

    // On a terminal (`script` gives mprof one), pprof's gzip is refused, folded text is not.
    let on_tty = |format: &str| {
        let cmd = format!(
            "{} export {} --format {format} -o -",
            env!("CARGO_BIN_EXE_mprof"),
            s(&f)
        );
        std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
    };
    match on_tty("pprof") {
        Ok(o) => {
            let all = String::from_utf8_lossy(&o.stdout).into_owned();
            assert!(!o.status.success(), "{all}");
            assert!(all.contains("not writing the pprof profile"), "{all}");
            let o = on_tty("folded").unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        }
        Err(e) => common::tier::skip(
            "the terminal check",
            &format!("no `script` ({e}; apt-get install -y bsdutils; .ci/run does)"),
        ),
    }
}
