//! Captures whose MODULE records name what an attacker chose (issue 47, points 5 and 6): paths
//! that carry terminal escape sequences, and large files of the attacker's own. Every view
//! reads them; none may write a control character to the terminal, nor hold more memory
//! than its bound.

mod common;

use common::hostile::{clean_exit, LIMIT, NOBODY};
use common::{mprof, run_with_timeout};
use mprof_common::record::{encode, Frame, Module, ModuleRange, NativeStack, Record};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A capture with native stacks whose modules are `paths`, one sample in each.
fn capture_naming(paths: &[String]) -> Vec<u8> {
    let mut bytes = b"MPROFCAP".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let mut push = |r: Record| bytes.extend_from_slice(&encode(&r));
    push(Record::Meta {
        text: "mode=record\ncommand=python app.py\npid=7\nrate=1\nnative_stacks=on\n".into(),
    });
    push(Record::Code {
        code: 1,
        firstline: 1,
        filename: "app.py".into(),
        name: "main".into(),
    });
    for (i, path) in paths.iter().enumerate() {
        let start = 0x10_0000 * (i as u64 + 1);
        push(Record::Module(Module {
            bias: start,
            path: path.clone(),
            ranges: vec![ModuleRange {
                start,
                end: start + 0x1000,
                offset: 0,
            }],
            ..Module::default()
        }));
        push(Record::Alloc {
            tid: 1,
            flags: 0,
            addr: i as u64 + 1,
            size: 100,
            time_ns: i as u64,
            frames: vec![Frame { code: 1, line: 2 }],
            native: Some(NativeStack {
                addrs: vec![start + 0x10],
                entries: vec![],
            }),
        });
    }
    bytes
}

/// Every view of `capture`, each with its output file in `dir` where it writes one.
fn every_view(capture: &Path, dir: &Path) -> Vec<(String, Command)> {
    let c = capture.to_str().unwrap();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let views: Vec<Vec<String>> = vec![
        vec!["report".into(), c.into(), "--by".into(), "stack".into()],
        vec!["report".into(), c.into(), "--json".into()],
        vec!["flamegraph".into(), c.into(), "-o".into(), out("f.svg")],
        vec!["timeline".into(), c.into(), "-o".into(), out("t.svg")],
        vec!["html".into(), c.into(), "-o".into(), out("r.html")],
        vec!["diff".into(), c.into(), c.into()],
        vec!["export".into(), c.into(), "-o".into(), out("p.pb.gz")],
        vec![
            "export".into(),
            c.into(),
            "-o".into(),
            out("s.speedscope.json"),
        ],
        vec!["export".into(), c.into(), "-o".into(), out("x.folded")],
    ];
    views
        .into_iter()
        .map(|args| {
            let mut cmd = mprof();
            cmd.args(&args);
            (args[..1].join(" "), cmd)
        })
        .collect()
}

/// The control characters (other than line breaks and tabs) in `bytes`.
fn controls(bytes: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(bytes);
    text.chars()
        .filter(|&c| c.is_control() && c != '\n' && c != '\t')
        .map(|c| c as u32 as u8)
        .collect()
}

/// Point 5: library paths with escape sequences (an OSC title, a clear-screen, a bell, a NUL)
/// reached root's terminal in the warnings of 7 of 7 views ("deleted or moved since the
/// capture", "cannot be read"): every message mprof prints is made safe for a terminal now.
#[test]
fn escape_sequences_in_module_paths_never_reach_the_terminal() {
    let dir = common::tempdir();
    let evil = [
        "/tmp/no\x1b]0;owned\x07such\x1b[2J/lib.so".to_string(),
        "/tmp/nul\0here/lib\x1b[31mred.so".to_string(),
        "/tmp/\u{9b}31mcsi/\u{202e}lib.so".to_string(),
    ];
    let capture = dir.path().join("evil.mprof");
    std::fs::write(&capture, capture_naming(&evil)).unwrap();
    for (name, mut cmd) in every_view(&capture, dir.path()) {
        let out = run_with_timeout(&mut cmd, LIMIT);
        clean_exit(&out, &name);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("warning"),
            "{name}: the paths were not even warned about: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for (stream, bytes) in [("stderr", &out.stderr), ("stdout", &out.stdout)] {
            let found = controls(bytes);
            assert!(
                found.is_empty(),
                "{name}: control characters {found:?} on {stream}: {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

/// Runs `cmd` under an address-space limit of `mib` MiB (`ulimit -v`), with `env` set.
fn under_address_limit(cmd: &Command, mib: u64, env: &str) -> Output {
    let mut line = format!("ulimit -v {}; {env} exec", mib << 10);
    for part in std::iter::once(cmd.get_program()).chain(cmd.get_args()) {
        line.push_str(" '");
        line.push_str(&part.to_string_lossy().replace('\'', "'\\''"));
        line.push('\'');
    }
    run_with_timeout(Command::new("sh").args(["-c", &line]), LIMIT)
}

/// Point 6: a capture of a few KB whose MODULE records name large files the attacker owns.
/// mprof read each into memory (2.1 GB before refusing; under `ulimit -v` 1 GB every view
/// aborted with "memory allocation of 268435456 bytes failed"). Symbolization now reads at
/// most 512 MiB of such files in all, and a copy that cannot be allocated is a warning: every
/// view ends by its own decision under a 1 GiB address-space limit, with the reader's memory
/// guard (which counts these copies: a clean refusal) and with the guard lifted.
#[test]
fn large_files_named_in_a_capture_stay_within_the_memory_bound() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::tempdir();
    let mut paths = Vec::new();
    for i in 0..12 {
        let path: PathBuf = dir.path().join(format!("big{i}.so"));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(200 << 20).unwrap(); // sparse: no disk used
        drop(f);
        // Another user's file (or one anybody may change): read into memory, not mapped.
        if common::procs::is_root() {
            std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        } else {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        paths.push(path.to_str().unwrap().to_string());
    }
    let capture = dir.path().join("big.mprof");
    std::fs::write(&capture, capture_naming(&paths)).unwrap();
    assert!(std::fs::metadata(&capture).unwrap().len() < 4096);
    for env in ["", "MPROF_READ_MEMORY_MIB=100000"] {
        for (name, cmd) in every_view(&capture, dir.path()) {
            let out = under_address_limit(&cmd, 1024, env);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !err.contains("memory allocation of"),
                "{name} {env}: mprof aborted: {err}"
            );
            let finished = clean_exit(&out, &name);
            if !env.is_empty() {
                assert!(finished, "{name} {env}: {err}");
                assert!(err.contains("in all"), "{name}: no budget warning: {err}");
            }
        }
    }
}
