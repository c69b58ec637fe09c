//! Native stacks (`--native`) beyond the plain chain: an `-O2` build with an inlined level, a
//! stripped library (`.dynsym`, `exported+0x…`), separate debug files (`.gnu_debuglink`,
//! build id), libraries deleted or replaced after the run, every view of a mixed capture, and
//! hostile MODULE records and files: one interpreter (the newest present) is enough there.
//! Clone names and a stripped extension: every interpreter.

mod common;

use common::mixed::*;
use common::native::{build_chain, chain_line};
use common::procs::LIMIT;
use common::{mprof, report_json, run_with_timeout};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `-O2 -g` with a `static inline` level: the inlined function is a frame of its own, at the
/// line of its call in its caller; a stripped library: `.dynsym`'s exported name, and
/// `exported+0x…` (the nearest exported function before them) for the static functions.
#[test]
fn inlined_frames_and_stripped_libraries() {
    if common::tier::full_tier_only(
        "inlined_frames_and_stripped_libraries",
        "builds and symbolizes three libraries",
    ) {
        return;
    }
    let py = one_python();
    let dir = common::tempdir();
    let Some(so) = build_chain(&py, dir.path(), &["-g", "-O2", "-DWITH_INLINE"]) else {
        return;
    };
    let capture = dir.path().join("inline.mprof");
    record(&py, dir.path(), &capture);
    let (all, _) = report_stacks(&capture, &[]);
    let mut want = CHAIN.to_vec();
    want.insert(1, "chain_inline");
    let s = expect("-O2 inline", &all, &want);
    assert_c_frame("-O2 inline", &s[0], "level2", &so);
    assert_c_frame("-O2 inline", &s[1], "inline", &so);
    assert_c_frame("-O2 inline", &s[2], "level1", &so);
    assert_c_frame("-O2 inline", &s[3], "entry", &so);

    let stripped_dir = common::tempdir();
    let so = build_chain(&py, stripped_dir.path(), &["-g", "-O1"]).unwrap();
    let status = Command::new("strip").arg(&so).status().unwrap();
    assert!(status.success());
    let capture = stripped_dir.path().join("stripped.mprof");
    record(&py, stripped_dir.path(), &capture);
    let (all, warnings) = report_stacks(&capture, &[]);
    let base = so.file_name().unwrap().to_str().unwrap();
    let s = all
        .iter()
        .find(|s| s.len() == 5 && s[0].function == "chain_level2" && s[3].function == CHAIN[3])
        .unwrap_or_else(|| panic!("stripped: no chain stack"));
    assert_eq!(s[0].file, so.to_str().unwrap(), "{:?}", s[0]);
    assert_eq!(s[0].line, 0);
    // The static functions: after the exported chain_level2, named from it.
    for f in &s[1..3] {
        assert!(f.function.starts_with("chain_level2+0x"), "stripped: {f:?}");
        assert_eq!(f.kind, "native");
    }
    assert!(!warnings.iter().any(|w| w.contains(base)), "{warnings:?}");
}

/// Moves `so`'s DWARF into a separate file `debug`, leaves `so` stripped.
fn split_debug(so: &Path, debug: &Path) {
    for args in [
        vec!["--only-keep-debug".into(), so.into(), debug.into()],
        vec!["--strip-debug".into(), so.into()],
    ] {
        let args: Vec<PathBuf> = args;
        let status = Command::new("objcopy").args(&args).status().unwrap();
        assert!(status.success(), "objcopy {args:?}");
    }
}

fn build_id(so: &Path) -> String {
    let out = Command::new("readelf").arg("-n").arg(so).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id")
        .trim()
        .to_owned()
}

/// Debug information in a separate file: found through `.gnu_debuglink` beside the library,
/// or by build id under a debug directory (`MPROF_DEBUG_DIRS`, for `/usr/lib/debug`).
#[test]
fn separate_debug_files_are_found() {
    if common::tier::full_tier_only(
        "separate_debug_files_are_found",
        "builds and symbolizes split debug files",
    ) {
        return;
    }
    let py = one_python();
    let dir = common::tempdir();
    let Some(so) = build_chain(&py, dir.path(), &["-g", "-O1"]) else {
        return;
    };
    let capture = dir.path().join("r.mprof");
    record(&py, dir.path(), &capture);
    // Strip the library after the run: the capture's build id still names it.
    let debug_dir = dir.path().join("debug");
    let id = build_id(&so);
    let by_id = debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(by_id.parent().unwrap()).unwrap();
    split_debug(&so, &by_id);
    assert_eq!(build_id(&so), id);
    let lines_shown = |env: Option<&Path>| {
        let mut cmd = mprof();
        cmd.arg("report")
            .arg(&capture)
            .args(["--json", "--by", "stack", "--top", "0"]);
        match env {
            Some(d) => cmd.env("MPROF_DEBUG_DIRS", d),
            None => cmd.env("MPROF_DEBUG_DIRS", dir.path().join("nowhere")),
        };
        let out = run_with_timeout(&mut cmd, LIMIT);
        assert!(out.status.success(), "{}", stderr(&out));
        let all = stacks(&serde_json::from_slice(&out.stdout).unwrap());
        all.iter()
            .find(|s| s.first().is_some_and(|f| f.function == "chain_level2"))
            .is_some_and(|s| s[0].line == chain_line("level2"))
    };
    assert!(!lines_shown(None), "no debug file: no lines");
    assert!(lines_shown(Some(&debug_dir)), "by build id");
    let beside = dir.path().join("native_chain.debug");
    std::fs::copy(&by_id, &beside).unwrap();
    let link = format!("--add-gnu-debuglink={}", beside.display());
    let status = Command::new("objcopy")
        .current_dir(dir.path())
        .arg(&link)
        .arg(&so)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(lines_shown(None), "through .gnu_debuglink");
}

/// The library deleted after the run, then replaced by another build: a warning that names
/// it and says why, `module+0x…` frames in the right places, the Python frames intact.
#[test]
fn libraries_deleted_or_replaced_after_the_run() {
    if common::tier::full_tier_only(
        "libraries_deleted_or_replaced_after_the_run",
        "builds, deletes and rebuilds libraries",
    ) {
        return;
    }
    let py = one_python();
    let dir = common::tempdir();
    let Some(so) = build_chain(&py, dir.path(), &["-g", "-O1"]) else {
        return;
    };
    let capture = dir.path().join("r.mprof");
    record(&py, dir.path(), &capture);
    let base = so.file_name().unwrap().to_str().unwrap().to_owned();
    std::fs::remove_file(&so).unwrap();
    let check = |why: &str| {
        let (all, warnings) = report_stacks(&capture, &[]);
        let warning = warnings
            .iter()
            .find(|w| w.contains(&base))
            .unwrap_or_else(|| {
                let chain: Vec<_> = all
                    .iter()
                    .filter(|s| s.iter().any(|f| f.function == "alloc_in_chain"))
                    .map(|s| names(s))
                    .collect();
                panic!("no warning about {base}: {warnings:?}; {chain:?}")
            });
        assert!(warning.contains(why), "{warning}");
        assert!(!warning.contains('\n'), "{warning}");
        let s = all
            .iter()
            .find(|s| s.len() == 5 && s[3].function == "alloc_in_chain")
            .unwrap_or_else(|| panic!("{why}: no chain stack"));
        for f in &s[..3] {
            assert!(f.function.starts_with(&format!("{base}+0x")), "{f:?}");
        }
        assert_eq!(s[4].function, "<module>");
        let text = text_report(&capture, &[]);
        assert!(text.contains(&format!("{base}+0x")), "{text}");
    };
    check("deleted or moved");
    let other = common::tempdir();
    let rebuilt = build_chain(&py, other.path(), &["-g", "-O2"]).unwrap();
    std::fs::copy(&rebuilt, &so).unwrap();
    check("changed since the capture");
}

/// Every view of a `--native` capture shows the C frames: `--by function`, the flamegraph,
/// the timeline, the HTML page, pprof, speedscope and folded stacks.
#[test]
fn every_view_shows_native_frames() {
    if common::tier::full_tier_only(
        "every_view_shows_native_frames",
        "every view of a --native capture",
    ) {
        return;
    }
    let py = one_python();
    let dir = common::tempdir();
    if build_chain(&py, dir.path(), &["-g", "-O1"]).is_none() {
        return;
    }
    let capture = dir.path().join("r.mprof");
    record(&py, dir.path(), &capture);
    let report = report_json(&capture, &["--by", "function", "--top", "0"]);
    let by_function = common::by_function(&report);
    let level2 = by_function.get("chain_level2").unwrap_or_else(|| {
        let (all, warnings) = report_stacks(&capture, &["--top", "8"]);
        let all: Vec<Vec<&str>> = all.iter().map(|s| names(s)).collect();
        panic!("no chain_level2 by function: {warnings:?} {all:?}")
    });
    assert_eq!(level2["allocator"], "native");
    assert_eq!(level2["alloc_bytes"].as_u64(), Some(20 * 100_003));
    assert!(level2["file"].as_str().unwrap().ends_with("native_chain.c"));
    let svg = dir.path().join("flame.svg");
    let out = run_with_timeout(
        mprof().arg("flamegraph").arg(&capture).arg("-o").arg(&svg),
        LIMIT,
    );
    assert!(out.status.success(), "flamegraph: {}", stderr(&out));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("chain_level2 (c/native_chain.c:"),
        "flamegraph"
    );
    // The timeline and the HTML page load the libraries' debug information too, which is not
    // counted against the capture's memory allowance (it was: both refused every small
    // `--native` capture of pyenv's interpreters as "may be corrupt or crafted").
    // By function: by default they group by your code, where the C function is the row's
    // innermost frame only.
    for (view, name) in [("timeline", "timeline.svg"), ("html", "report.html")] {
        let path = dir.path().join(name);
        let out = run_with_timeout(
            mprof()
                .arg(view)
                .arg(&capture)
                .args(["--by", "function", "-o"])
                .arg(&path),
            LIMIT,
        );
        assert!(out.status.success(), "{view}: {}", stderr(&out));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("chain_level2"), "{view}: no native frame");
    }
    for (format, name) in [
        ("folded", "out.folded"),
        ("speedscope", "out.speedscope.json"),
        ("pprof", "out.pb.gz"),
    ] {
        let out_path = dir.path().join(name);
        let out = run_with_timeout(
            mprof()
                .arg("export")
                .arg(&capture)
                .args(["-f", format, "-o"])
                .arg(&out_path),
            LIMIT,
        );
        assert!(out.status.success(), "{format}: {}", stderr(&out));
        let bytes = std::fs::read(&out_path).unwrap();
        let text = match format {
            "pprof" => {
                use std::io::Read;
                let mut raw = Vec::new();
                flate2::read::GzDecoder::new(&bytes[..])
                    .read_to_end(&mut raw)
                    .unwrap();
                String::from_utf8_lossy(&raw).into_owned()
            }
            _ => String::from_utf8_lossy(&bytes).into_owned(),
        };
        assert!(text.contains("chain_level2"), "{format}: no native frame");
        if format == "folded" {
            let line = text.lines().find(|l| l.contains("chain_level2")).unwrap();
            let order = ["<module>", "alloc_in_chain", "chain_entry", "chain_level1"];
            let at: Vec<usize> = order.iter().map(|n| line.find(n).unwrap()).collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
        }
    }
}

/// A hand-made capture whose modules are hostile: files that are not ELF, a truncated ELF, a
/// FIFO, a directory, a device; then a MODULE record that lies about its lengths. The report
/// succeeds, every warning is one line, and the frames are `name+0x…`.
#[test]
fn hostile_module_records_and_files_are_warnings_not_crashes() {
    use mprof_common::record::{encode, Frame, Module, ModuleRange, NativeStack, Record};
    let dir = common::tempdir();
    let d = dir.path();
    std::fs::write(
        d.join("junk.so"),
        b"\x7fELF\x02\x01\x01 not really an ELF file",
    )
    .unwrap();
    let real = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    std::fs::write(d.join("cut.so"), &real[..real.len().min(4096)]).unwrap();
    mprof::base::make_fifo(&d.join("fifo.so"));
    std::fs::create_dir(d.join("dir.so")).unwrap();
    let paths = [
        d.join("junk.so"),
        d.join("cut.so"),
        d.join("fifo.so"),
        d.join("dir.so"),
        PathBuf::from("/dev/zero"),
    ];
    let mut bytes = b"MPROFCAP".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let mut push = |r: Record| bytes.extend_from_slice(&encode(&r));
    push(Record::Meta {
        text: "rate=1\nnative_stacks=on\n".into(),
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
            file_size: 0,
            flags: 0,
            build_id: vec![],
            path: path.to_str().unwrap().into(),
            ranges: vec![ModuleRange {
                start,
                end: start + 0x1000,
                offset: 0,
            }],
        }));
        push(Record::Alloc {
            tid: 1,
            flags: 0,
            addr: i as u64,
            size: 100,
            time_ns: i as u64,
            frames: vec![Frame { code: 1, line: 2 }],
            native: Some(NativeStack {
                addrs: vec![start + 0x10, start + 0x20],
                entries: vec![],
            }),
        });
    }
    // A MODULE record that claims 1,000 ranges: the capture's corrupt tail.
    let mut lying = encode(&Record::Module(Module {
        path: "/x".into(),
        ..Module::default()
    }));
    lying[8 + 20..8 + 22].copy_from_slice(&1000u16.to_le_bytes());
    bytes.extend_from_slice(&lying);
    let capture = d.join("hostile.mprof");
    std::fs::write(&capture, &bytes).unwrap();
    let out = run_with_timeout(
        mprof()
            .arg("report")
            .arg(&capture)
            .args(["--by", "stack", "--top", "0"]),
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (err, text) = (stderr(&out), String::from_utf8_lossy(&out.stdout));
    assert!(!err.contains("panicked"), "{err}");
    for name in ["junk.so", "cut.so", "fifo.so", "dir.so", "zero"] {
        assert!(text.contains(&format!("{name}+0x")), "{name}: {text}");
        assert!(
            err.lines()
                .any(|l| l.starts_with("mprof: warning: ") && l.contains(name)),
            "{name}: {err}"
        );
    }
    assert!(err.contains("corrupt record"), "{err}");
    assert!(text.contains("main (app.py:2)"), "{text}");
}

/// The address and size of `name` in the symbols `nm` lists for `so` (`-D`: the dynamic ones).
fn nm(so: &Path, dynamic: bool) -> Vec<(u64, u64, String)> {
    let mut cmd = Command::new("nm");
    cmd.args(["-S", "--defined-only"]);
    if dynamic {
        cmd.arg("-D");
    }
    let out = cmd.arg(so).output().expect("nm");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, size, kind, name) = match f[..] {
                [a, s, k, n] => (a, s, k, n),
                _ => return None,
            };
            (kind == "T" || kind == "t").then(|| {
                (
                    u64::from_str_radix(addr, 16).unwrap(),
                    u64::from_str_radix(size, 16).unwrap(),
                    name.to_owned(),
                )
            })
        })
        .collect()
}

/// The innermost frame of the first stack of `all` whose innermost frame `pick` accepts.
fn leaf(all: &[Vec<Frame>], pick: impl Fn(&str) -> bool) -> Option<&Frame> {
    all.iter().map(|s| &s[0]).find(|f| pick(&f.function))
}

/// Clones of C++ functions are demangled with their suffix kept readable (`[clone .isra.0]`),
/// also when the demangler refuses the name whole (its outline); in a stripped extension (no
/// `.symtab`), a static function is named after the nearest exported function before it with
/// the offset (`names_exported+0x1a`), never `module+0x…`. On every interpreter present, with
/// an extension compiled for it.
#[test]
fn clone_names_and_stripped_extensions_have_readable_names() {
    const CLONE: &str = "clone_alloc(unsigned long) [clone .isra.0]";
    const REFUSED: &str =
        "arrow::py::(anonymous namespace)::ObjectWriterVisitor::Visit<…>(…) [clone .isra.0]";
    for py in common::pythons() {
        let dir = common::tempdir();
        let Some(so) =
            common::native::build_names(&py, dir.path(), &["-O1", "-fno-toplevel-reorder"])
        else {
            continue;
        };
        let base = so.file_name().unwrap().to_str().unwrap().to_owned();
        let record = |name: &str| {
            let capture = dir.path().join(name);
            common::record_script(
                &py,
                &["-q", "--native"],
                &[],
                &capture,
                "native_names_workload.py",
                dir.path(),
            );
            // The workload's own stacks: through `allocate`.
            let mut all = report_stacks(&capture, &[]).0;
            all.retain(|s| s.iter().any(|f| f.function == "allocate"));
            all
        };
        let all = record("symtab.mprof");
        for name in [CLONE, REFUSED, "hidden_alloc"] {
            let f = leaf(&all, |n| n == name)
                .unwrap_or_else(|| panic!("{}: no frame {name}: {all:?}", py.label));
            assert_eq!(f.kind, "native", "{}: {f:?}", py.label);
        }

        // Where hidden_alloc lies, and the exported function just before it.
        let hidden = nm(&so, false)
            .into_iter()
            .find(|s| s.2 == "hidden_alloc")
            .expect("hidden_alloc in .symtab");
        let exported = nm(&so, true)
            .into_iter()
            .filter(|s| s.0 <= hidden.0)
            .max_by_key(|s| s.0)
            .expect("an exported function before hidden_alloc");
        assert_eq!(
            exported.2, "names_exported",
            "{}: the source's order",
            py.label
        );
        let status = Command::new("strip").arg(&so).status().unwrap();
        assert!(status.success());
        assert!(nm(&so, false).is_empty(), "{base} keeps a .symtab");
        let all = record("stripped.mprof");
        for name in [CLONE, REFUSED] {
            assert!(
                leaf(&all, |n| n == name).is_some(),
                "{}: stripped: no frame {name}: {all:?}",
                py.label
            );
        }
        let prefix = format!("{}+0x", exported.2);
        let f = leaf(&all, |n| n.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{}: stripped: no frame {prefix}…: {all:?}", py.label));
        let offset = u64::from_str_radix(&f.function[prefix.len()..], 16).unwrap();
        let (from, to) = (hidden.0 - exported.0, hidden.0 + hidden.1 - exported.0);
        assert!(
            (from..=to).contains(&offset),
            "{}: {} is not in hidden_alloc ({from:#x}..{to:#x})",
            py.label,
            f.function
        );
        assert!(
            !all.iter().flatten().any(|f| f.function.starts_with(&base)),
            "{}: stripped: a frame named {base}+0x…: {all:?}",
            py.label
        );
    }
}
