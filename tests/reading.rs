//! Reading captures at scale (issue 51): a capture of any length opens by default within the
//! memory bound, since the reader holds nothing per sample and its allowance comes from what
//! the capture's frames declare; a crafted one is still refused, early.

mod common;

use common::{mprof, run_with_timeout};
use mprof::capture::frame::{encode, frame_of, Declared};
use mprof::capture::pack::Packer;
use mprof_common::record::{encode as encode_record, Record, ALLOC_NATIVE_STACK};
use mprof_common::stacks::{
    brief_aux, encode_brief, encode_context, encode_sample, encode_stack, Node, Sample,
};
use std::path::Path;
use std::time::Duration;

/// The generated capture: 30 million samples over 50,000 distinct stacks.
const SAMPLES: u64 = 30_000_000;
const STACKS: u32 = 50_000;
/// Samples per frame (each frame frees what it allocates, so its frames are alike but for
/// their time).
const PER_FRAME: u64 = 250_000;
/// Blocks live at once: each sample's block is freed this many samples later.
const WINDOW: u64 = 1_000;
/// The memory bound of the issue.
const BOUND: u64 = 128 << 20;

fn header() -> Vec<u8> {
    let mut bytes = b"MPROFCAP".to_vec();
    bytes.extend_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes
}

/// Writes the capture: code objects and stack nodes first (50 functions of depth 2 calling
/// 1,000 lines each), then frames of packed samples and frees, each frame the same but for
/// its time. Made as `mprof record` makes its frames (`frame_of`), without going sample by
/// sample through a writer, so that it takes a few seconds.
fn write_big(path: &Path) -> u64 {
    let mut first = Vec::new();
    first.extend(encode_record(&Record::Meta {
        text: "rate=1\npid=4242\ncommand=generated\n".into(),
    }));
    for f in 0..50u64 {
        first.extend(encode_record(&Record::Code {
            code: 0x1000 + f,
            firstline: 1,
            filename: format!("/srv/app/module_{f}.py"),
            name: format!("function_{f}"),
        }));
    }
    // Node 1..=50: the functions; then 1,000 lines under each.
    for f in 0..50u32 {
        let node = Node {
            parent: 0,
            code: 0x1000 + f as u64,
            line: 1,
            entry: false,
        };
        first.extend(encode_stack(f + 1, &node));
    }
    for s in 0..STACKS {
        let node = Node {
            parent: 1 + s / 1000,
            code: 0x1000 + (s % 50) as u64,
            line: 10 + s % 1000,
            entry: false,
        };
        first.extend(encode_stack(51 + s, &node));
    }
    let mut file = header();
    file.extend(frame_of(&first));
    // The samples of one frame, packed.
    let aux = brief_aux(2, 0).unwrap();
    let addr = |i: u64| 0x7f00_0000_0000 + (i * 48) % (1 << 30);
    let mut packer = Packer::default();
    let mut runs = Vec::new();
    for i in 0..PER_FRAME {
        let node = 51 + ((i * 7919) % STACKS as u64) as u32;
        packer.add(&encode_brief(addr(i), 16 + (i % 200) as u32, node, aux));
        if i >= WINDOW {
            packer.add(&encode_record(&Record::Free {
                addr: addr(i - WINDOW),
            }));
        }
        if packer.len() >= 64 << 10 {
            runs.extend(packer.take().unwrap());
        }
    }
    for i in PER_FRAME - WINDOW..PER_FRAME {
        packer.add(&encode_record(&Record::Free { addr: addr(i) }));
    }
    runs.extend(packer.take().unwrap());
    for n in 0..SAMPLES / PER_FRAME {
        let mut records = encode_context(1, 1_000_000_000 + n * 20_000_000);
        records.extend_from_slice(&runs);
        file.extend(frame_of(&records));
    }
    let mut last = encode_record(&Record::End {
        reason: 1,
        time_ns: 1_000_000_000 + SAMPLES / PER_FRAME * 20_000_000,
    });
    last.extend(encode_record(&Record::Stats {
        samples: SAMPLES,
        dropped: 0,
    }));
    file.extend(frame_of(&last));
    std::fs::write(path, &file).unwrap();
    file.len() as u64
}

/// The peak RSS of the children waited for so far, in bytes, and their CPU time (user and
/// system) in seconds.
fn children_usage() -> (u64, f64) {
    // SAFETY: getrusage fills `usage`, a zeroed local it is given a pointer to.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        usage.ru_maxrss as u64 * 1024,
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
    )
}

/// The case: a generated capture of 30 million samples over 50,000 distinct stacks
/// opens by default (no `MPROF_READ_MEMORY_MIB`), its report is exact, and the reader's peak
/// RSS stays within 128 MiB. With progress forced on, a read that takes over a second says
/// how far it got.
#[test]
fn thirty_million_samples_open_by_default_within_the_memory_bound() {
    let dir = common::tempdir();
    let path = dir.path().join("big.mprof");
    let started = std::time::Instant::now();
    let size = write_big(&path);
    eprintln!(
        "generated {SAMPLES} samples over {STACKS} stacks: {} MiB in {:.1} s",
        size >> 20,
        started.elapsed().as_secs_f64()
    );
    let started = std::time::Instant::now();
    let cpu_before = children_usage().1;
    let out = run_with_timeout(
        mprof()
            .arg("report")
            .arg(&path)
            .args(["--by", "stack", "--top", "3"])
            .env_remove("MPROF_READ_MEMORY_MIB")
            .env("MPROF_PROGRESS", "always"),
        Duration::from_secs(300),
    );
    let took = started.elapsed();
    let (rss, cpu_after) = children_usage();
    // Other tests' children end meanwhile too: the CPU time is at most this.
    let cpu = cpu_after - cpu_before;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("30000000 samples"), "{stdout}");
    eprintln!(
        "report: {:.1} s, {cpu:.1} s of CPU at most, peak RSS {} MiB (at least {:.1} M samples \
         per CPU second)",
        took.as_secs_f64(),
        rss >> 20,
        SAMPLES as f64 / cpu / 1e6
    );
    assert!(rss <= BOUND, "peak RSS {} MiB", rss >> 20);
    if took > Duration::from_millis(1500) {
        assert!(stderr.contains("mprof: reading "), "{stderr}");
        assert!(stderr.contains("s left"), "{stderr}");
    }
}

/// A frame whose records hold more live blocks than it declares, a capture whose frames
/// declare more than a real capture needs, and a frame whose samples carry more bytes of
/// native stacks than it declares: all refused with one line, the second before anything is
/// read, and read when `MPROF_READ_MEMORY_MIB` allows it.
#[test]
fn crafted_frames_are_refused() {
    let dir = common::tempdir();
    let mut records = encode_record(&Record::Meta {
        text: "rate=1\n".into(),
    });
    records.extend(encode_stack(1, &Node::default()));
    records.extend(encode_context(1, 5));
    for i in 0..100u64 {
        records.extend(encode_brief(
            0x1000 + 16 * i,
            16,
            1,
            brief_aux(1, 0).unwrap(),
        ));
    }
    let honest = frame_of(&records);
    let mut declared = Declared::read(&honest[8..]).unwrap();
    assert_eq!(declared.live, 100);
    let report = |name: &str, frame: &[u8], allow: Option<&str>| {
        let path = dir.path().join(name);
        let mut bytes = header();
        bytes.extend_from_slice(frame);
        std::fs::write(&path, &bytes).unwrap();
        let mut cmd = mprof();
        cmd.arg("report")
            .arg(&path)
            .env_remove("MPROF_READ_MEMORY_MIB");
        if let Some(mib) = allow {
            cmd.env("MPROF_READ_MEMORY_MIB", mib);
        }
        run_with_timeout(&mut cmd, common::hostile::LIMIT)
    };
    let read = report("honest.mprof", &honest, None);
    assert!(read.status.success(), "{read:?}");
    declared.live = 10;
    let lying = report("lying.mprof", &encode(&declared, &honest[8 + 24..]), None);
    let err = String::from_utf8_lossy(&lying.stderr);
    assert_eq!(lying.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("more live blocks than it declares (10)"),
        "{err}"
    );
    declared.live = u32::MAX;
    let greedy = encode(&declared, &honest[8 + 24..]);
    let refused = report("greedy.mprof", &greedy, None);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("declare") && err.contains("MPROF_READ_MEMORY_MIB=<MiB>"),
        "{err}"
    );
    let allowed = report("greedy.mprof", &greedy, Some("1000000"));
    assert!(allowed.status.success(), "{allowed:?}");
    // Samples that carry their native stacks whole, declared as fewer bytes than they hold.
    let mut records = encode_record(&Record::Meta {
        text: "rate=1\n".into(),
    });
    records.extend(encode_stack(1, &Node::default()));
    for i in 0..10u64 {
        let s = Sample {
            tid: 1,
            flags: ALLOC_NATIVE_STACK,
            addr: 0x1000 + 16 * i,
            size: 16,
            time_ns: 5,
            stack: 1,
        };
        records.extend(encode_sample(&s, 1, Some(&[0x40_0000 + i, 0x40_1000])));
    }
    let honest = frame_of(&records);
    let mut declared = Declared::read(&honest[8..]).unwrap();
    assert_eq!(declared.stacks, 10 * (8 + 16));
    assert!(report("native.mprof", &honest, None).status.success());
    declared.stacks -= 1;
    let lying = report(
        "native-lying.mprof",
        &encode(&declared, &honest[8 + 24..]),
        None,
    );
    let err = String::from_utf8_lossy(&lying.stderr);
    assert_eq!(lying.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("more bytes of whole stacks than it declares (239)"),
        "{err}"
    );
}

/// The captures of older formats kept in `tests/captures` (see its README).
fn kept_capture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/captures")
        .join(name)
}

/// A capture of format 4 (before frames), written by an earlier mprof, reads as that mprof
/// read it: every figure its `report --json` printed then is printed now, and every other
/// view reads it without a warning.
#[test]
fn a_capture_of_the_format_before_frames_reads_as_it_did() {
    let old = kept_capture("format4-grow.mprof");
    let bytes = std::fs::read(&old).unwrap();
    assert_eq!(&bytes[8..12], &4u32.to_le_bytes(), "not a format 4 capture");
    let then: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(kept_capture("format4-grow.report.json")).unwrap(),
    )
    .unwrap();
    let now = common::report_json(&old, &[]);
    for (key, value) in then.as_object().unwrap() {
        assert_eq!(&now[key], value, "{key}");
    }
    assert_eq!(now["samples"], 196);
    assert_eq!(now["locations"][0]["function"], "grow");
    assert_eq!(now["locations"][0]["peak_bytes"], 20 * (4 << 20) + 20);
    let dir = common::tempdir();
    let out = |name: &str| dir.path().join(name);
    for (view, args) in [
        ("flamegraph", vec!["-o".into(), out("f.svg")]),
        ("timeline", vec!["-o".into(), out("t.svg")]),
        ("html", vec!["-o".into(), out("r.html")]),
        (
            "export",
            vec![
                "--format".into(),
                "pprof".into(),
                "-o".into(),
                out("p.pb.gz"),
            ],
        ),
        ("diff", vec![old.clone()]),
    ] {
        let got = run_with_timeout(
            mprof().arg(view).arg(&old).args(&args),
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&got.stderr);
        assert!(got.status.success(), "{view}: {stderr}");
        assert!(!stderr.contains("warning"), "{view}: {stderr}");
    }
}

/// The format version in the header: 0 (never written) and a file that is not a capture are
/// refused with one line; a newer version is read with a one-line warning, the records this
/// mprof knows read as they are, and a frame compressed in a way it does not know is skipped
/// with a warning that says so; one of which nothing is readable is refused.
#[test]
fn a_capture_of_another_format_version_is_refused_or_read_with_a_warning() {
    let dir = common::tempdir();
    let old = std::fs::read(kept_capture("format4-grow.mprof")).unwrap();
    let report = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        run_with_timeout(
            mprof().arg("report").arg(&path).args(["--json"]),
            Duration::from_secs(60),
        )
    };
    let with_version = |version: u32| {
        let mut bytes = old.clone();
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        bytes
    };
    for (name, bytes, why) in [
        ("v0.mprof", with_version(0), "format version 0 is invalid"),
        (
            "other.mprof",
            b"MPROFRNG\x05\0\0\0\0\0\0\0".to_vec(),
            "MPROFCAP header",
        ),
    ] {
        let got = report(name, &bytes);
        let err = String::from_utf8_lossy(&got.stderr);
        assert_eq!(got.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
    }
    let newer = report("v99.mprof", &with_version(99));
    let err = String::from_utf8_lossy(&newer.stderr);
    assert!(newer.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("written by a newer mprof (format 99, this one reads 5)"),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&newer.stdout).unwrap();
    assert_eq!(json["samples"], 196);
    // Two frames of one sample each; the second in a codec of a later mprof.
    let mut records = encode_record(&Record::Meta {
        text: "rate=1\n".into(),
    });
    records.extend(encode_stack(1, &Node::default()));
    records.extend(encode_context(1, 5));
    records.extend(encode_brief(0x1000, 16, 1, brief_aux(1, 0).unwrap()));
    let mut bytes = header();
    bytes.extend(frame_of(&records));
    let mut later = frame_of(&encode_brief(0x2000, 32, 1, brief_aux(1, 0).unwrap()));
    later[6..8].copy_from_slice(&9u16.to_le_bytes());
    bytes.extend(&later);
    let got = report("codec.mprof", &bytes);
    let err = String::from_utf8_lossy(&got.stderr);
    assert!(got.status.success(), "{err}");
    assert!(
        err.contains("1 frame(s) compressed in a way this mprof does not know were skipped"),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(json["samples"], 1);
    // A newer mprof's capture of which nothing is readable here (every frame in its codec)
    // is refused, not shown as an empty profile.
    let mut bytes = header();
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    bytes.extend(&later);
    bytes.extend(&later);
    let got = report("unreadable.mprof", &bytes);
    let err = String::from_utf8_lossy(&got.stderr);
    assert_eq!(got.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("a newer mprof wrote it (capture format 99; this one reads up to 5)"),
        "{err}"
    );
    assert!(!err.contains("  "), "a run of spaces: {err}");
}

/// A thread-per-request server's capture: 100,000 threads, each with 30 samples at 30 of 3,000
/// stacks, frees following. Its sites (stack and thread) would be 3 million: the threads past
/// the first 4,096 are read together, so it opens by default within the memory bound, exact.
#[test]
fn a_capture_of_a_hundred_thousand_threads_opens_within_the_memory_bound() {
    const THREADS: u32 = 100_000;
    const PER_THREAD: u32 = 30;
    let dir = common::tempdir();
    let path = dir.path().join("threads.mprof");
    let mut first = encode_record(&Record::Meta {
        text: "rate=1\npid=4242\ncommand=generated\n".into(),
    });
    first.extend(encode_record(&Record::Code {
        code: 0x1000,
        firstline: 1,
        filename: "/srv/app/handler.py".into(),
        name: "handle".into(),
    }));
    for s in 0..3_000u32 {
        let node = Node {
            parent: 0,
            code: 0x1000,
            line: 10 + s,
            entry: false,
        };
        first.extend(encode_stack(1 + s, &node));
    }
    let mut file = header();
    file.extend(frame_of(&first));
    let aux = brief_aux(1, 0).unwrap();
    let mut records = Vec::new();
    let mut packer = Packer::default();
    let mut samples = 0u64;
    for t in 0..THREADS {
        if let Some(run) = packer.take() {
            records.extend(run);
        }
        records.extend(encode_context(10 + t, 1_000_000_000 + t as u64 * 10_000));
        for i in 0..PER_THREAD {
            let node = 1 + (t * 7 + i * 101) % 3_000;
            let addr = 0x7f00_0000_0000 + (i as u64) * 64;
            packer.add(&encode_brief(addr, 100, node, aux));
            packer.add(&encode_record(&Record::Free { addr }));
            samples += 1;
        }
        if records.len() >= 512 << 10 {
            if let Some(run) = packer.take() {
                records.extend(run);
            }
            file.extend(frame_of(&records));
            records.clear();
        }
    }
    if let Some(run) = packer.take() {
        records.extend(run);
    }
    records.extend(encode_record(&Record::End {
        reason: 1,
        time_ns: 2_000_000_000,
    }));
    records.extend(encode_record(&Record::Stats {
        samples,
        dropped: 0,
    }));
    file.extend(frame_of(&records));
    std::fs::write(&path, &file).unwrap();
    let out = run_with_timeout(
        mprof()
            .arg("report")
            .arg(&path)
            .args(["--by", "thread", "--top", "3"])
            .env_remove("MPROF_READ_MEMORY_MIB"),
        Duration::from_secs(300),
    );
    let (rss, _) = children_usage();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    eprintln!(
        "{} KiB, peak RSS {} MiB\n{stdout}",
        file.len() >> 10,
        rss >> 20
    );
    assert!(
        stdout.contains(&format!("{samples} samples")),
        "{stdout}\n{stderr}"
    );
    // Every allocation is counted, the threads past the first 4,096 together.
    let together = (THREADS - 4_096) as u64 * PER_THREAD as u64 * 100;
    assert!(stdout.contains("thread 0 (other threads)"), "{stdout}");
    // 95,904 came after; they are counted up to 65,536.
    assert!(
        stderr.contains("65536 or more threads came after the first 4096"),
        "{stderr}"
    );
    let json = run_with_timeout(
        mprof()
            .args(["report", "--json", "--by", "thread"])
            .arg(&path)
            .env_remove("MPROF_READ_MEMORY_MIB"),
        Duration::from_secs(300),
    );
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let total = json["totals"]["allocated"]["bytes"].as_f64().unwrap();
    assert_eq!(total, samples as f64 * 100.0);
    let top = &json["locations"][0];
    assert_eq!(top["thread"], 0, "{top}");
    assert_eq!(
        top["alloc_bytes"].as_f64().unwrap(),
        together as f64,
        "{top}"
    );
    assert!(rss <= BOUND, "peak RSS {} MiB", rss >> 20);
}
