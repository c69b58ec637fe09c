//! Continuous profiling (`--every`): a leaking web server (tests/py/leaky_server.py) under
//! load, profiled interval by interval into a directory of rolling pprof files and to an
//! OpenTelemetry Collector (a real one, tools/otelcol, when tools/test-deps.sh built it): the
//! in-use bytes at the leaking line grow interval by interval within their error bars, the
//! files are bounded, `go tool pprof` reads them, and a collector that is down costs bounded
//! memory and never holds the server back.

mod common;

use common::procs::{signal, Target, LIMIT};
use common::{main_python, mprof, pythons, run_with_timeout, script};
use mprof::views::export::pprof::{decode, PprofProfile};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The line of leaky_server.py that keeps 20,000 bytes per request.
const LEAK_LINE: i64 = 17;

/// Requests sent to the server from a thread of the test, at about 100 a second, until
/// stopped: how many failed and the slowest answer.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    slowest_us: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let slowest_us = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent, failed, slowest_us) = (
                stop.clone(),
                sent.clone(),
                failed.clone(),
                slowest_us.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if get(port).is_none() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    slowest_us.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                    sent.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Load {
            stop,
            sent,
            failed,
            slowest_us,
            thread: Some(thread),
        }
    }

    /// Stops; (sent, failed, slowest answer).
    fn finish(mut self) -> (u64, u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            Duration::from_micros(self.slowest_us.load(Ordering::Relaxed)),
        )
    }
}

/// One GET to the server on `port`; its body.
fn get(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.0 200").then_some(out)
}

/// `mprof record --rate 64KiB --every 1s --profiles-dir PROFILES -o DIR/c.mprof EXTRA --`,
/// the program to follow.
fn record_every_second(profiles: &Path, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = mprof();
    cmd.args(["record", "--rate", "64KiB", "--every", "1s"])
        .arg("--profiles-dir")
        .arg(profiles)
        .arg("-o")
        .arg(dir.join("c.mprof"))
        .args(extra)
        .arg("--");
    cmd
}

/// An mprof session the test runs, its program's output read line by line.
struct Recording {
    guard: common::ChildGuard,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Recording {
    fn start(cmd: &mut Command) -> Recording {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Recording {
            lines: common::procs::lines(child.stdout.take().unwrap()),
            stderr: common::procs::lines(child.stderr.take().unwrap()),
            guard: common::ChildGuard(child),
        }
    }

    /// The program's next line that starts with `prefix` (waited for at most [`LIMIT`]).
    fn line(&self, prefix: &str) -> String {
        common::procs::wait_line(&self.lines, prefix, LIMIT, &mut Vec::new())
            .unwrap_or_else(|| panic!("the program never said {prefix:?}"))
    }

    fn pid(&self) -> u32 {
        self.guard.0.id()
    }

    /// Waits (at most [`LIMIT`]) for mprof to exit: its status and what it said.
    fn end(mut self) -> (std::process::ExitStatus, String) {
        let end = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.guard.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < end, "mprof did not end");
            std::thread::sleep(Duration::from_millis(20));
        };
        let err: Vec<String> =
            std::iter::from_fn(|| self.stderr.recv_timeout(Duration::from_secs(2)).ok()).collect();
        (status, err.join("\n"))
    }
}

/// The server under `py`, run directly (for attach).
fn server(py: &Path) -> (Target, u16) {
    let t = Target::python(py, "leaky_server.py", &[]);
    let port = t.ready[2].parse().unwrap();
    (t, port)
}

/// Bytes in use at the leaking line in one interval's profile, and their standard error.
fn leaked(p: &PprofProfile) -> (f64, f64) {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let inuse = p
        .sample_type
        .iter()
        .position(|t| s(t.r#type) == "inuse_space")
        .expect("an inuse_space type");
    let leak_locations: Vec<u64> = p
        .location
        .iter()
        .filter(|l| {
            l.line.iter().any(|line| {
                line.line == LEAK_LINE
                    && p.function
                        .iter()
                        .any(|f| f.id == line.function_id && s(f.name) == "handle")
            })
        })
        .map(|l| l.id)
        .collect();
    let (mut bytes, mut variance) = (0.0, 0.0);
    for sample in &p.sample {
        if sample
            .location_id
            .first()
            .is_some_and(|l| leak_locations.contains(l))
        {
            bytes += sample.value[inuse] as f64;
            let se = sample
                .label
                .iter()
                .find(|l| s(l.key) == "inuse_space_stderr")
                .map_or(0.0, |l| l.num as f64);
            variance += se * se;
        }
    }
    (bytes, variance.sqrt())
}

/// Checks that the leak's in-use bytes never fall between two intervals by more than two
/// standard errors, grow from the first interval to the last by more than two, and end
/// within three (and 5%) of `kept`, the bytes the server really kept.
fn grows(series: &[(f64, f64)], kept: f64) {
    let apart = |(a, ea): (f64, f64), (b, eb): (f64, f64)| (b - a) / (ea * ea + eb * eb).sqrt();
    for w in series.windows(2) {
        assert!(
            apart(w[0], w[1]) >= -2.0,
            "the leak's in-use bytes fell between intervals: {series:?}"
        );
    }
    let (first, last) = (series[0], series[series.len() - 1]);
    assert!(
        apart(first, last) > 2.0,
        "the leak did not grow: {series:?}"
    );
    assert!(
        (last.0 - kept).abs() <= 3.0 * last.1 + 0.05 * kept,
        "the last interval holds {} bytes at the leak, the server kept {kept}: {series:?}",
        last.0
    );
}

#[test]
fn a_leaking_server_leaves_rolling_pprof_files_whose_leak_grows() {
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let profiles = dir.path().join("profiles");
    let recording = Recording::start(
        record_every_second(&profiles, dir.path(), &["--keep", "5"])
            .arg(&py.path)
            .arg(script("leaky_server.py")),
    );
    let ready = recording.line("ready");
    let port: u16 = ready.split_whitespace().nth(2).unwrap().parse().unwrap();
    let load = Load::start(port);
    std::thread::sleep(Duration::from_secs(8));
    let (sent, failed, _) = load.finish();
    // SIGTERM to mprof: passed on to the server, which exits; the interval under way is
    // written.
    signal(recording.pid(), libc::SIGTERM);
    let (status, err) = recording.end();
    assert!(status.success(), "{}: {err}", py.label);
    assert_eq!(failed, 0, "{sent} requests");
    let files = common::interval_files(&profiles);
    assert_eq!(files.len(), 5, "--keep 5: {files:?}\n{err}");
    assert!(err.contains("older removed"), "{err}");
    let series: Vec<(f64, f64)> = files
        .iter()
        .map(|f| leaked(&decode(&std::fs::read(f).unwrap()).unwrap()))
        .collect();
    eprintln!(
        "{}: in use at the leak, interval by interval: {series:?}",
        py.label
    );
    // Every request kept 20,000 bytes; the last interval ends after the last request.
    grows(&series, sent as f64 * 20_000.0);
    if let Some(go) = common::tools::go("go tool pprof on a rolling file") {
        let out = run_with_timeout(
            Command::new(go)
                .args(["tool", "pprof", "-top", "-sample_index=inuse_space"])
                .arg(&files[files.len() - 2]),
            LIMIT,
        );
        let top = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(top.contains("handle"), "{top}");
        assert!(
            top.contains("service.name=unknown_service:leaky_server.py"),
            "{top}"
        );
    }
}

#[test]
fn a_collector_that_is_down_costs_bounded_memory_and_never_holds_the_server_back() {
    let py = main_python(&pythons());
    let (mut target, port) = server(&py.path);
    let dir = common::tempdir();
    let profiles = dir.path().join("p");
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut attach = common::procs::Attach::start(
        target.pid,
        &[
            "--rate",
            "64KiB",
            "--every",
            "1s",
            "--otlp",
            &url,
            "--otlp-buffer",
            "16KiB",
            "--profiles-dir",
            profiles.to_str().unwrap(),
            "-o",
            dir.path().join("c.mprof").to_str().unwrap(),
        ],
    );
    attach.attached();
    let load = Load::start(port);
    std::thread::sleep(Duration::from_secs(6));
    let (_, hwm_kib) = rss_kib(attach.guard.0.id());
    let (sent, failed, slowest) = load.finish();
    let started = Instant::now();
    let err = attach.detach();
    let took = started.elapsed();
    assert_eq!(failed, 0, "{sent} requests");
    assert!(
        slowest < Duration::from_secs(2),
        "an answer took {slowest:?}"
    );
    assert!(target.alive(), "the server died: {err}");
    assert!(
        get(port).is_some(),
        "the server stopped answering after the detach"
    );
    assert!(err.contains("did not take a profile"), "{err}");
    assert!(
        err.contains("dropped (the collector was down or slow)"),
        "{err}"
    );
    // The profiles still went to the directory, one per interval.
    assert!(common::interval_files(&profiles).len() >= 5, "{err}");
    // Detaching waits for the collector a few seconds at most.
    assert!(took < Duration::from_secs(15), "the detach took {took:?}");
    eprintln!("mprof's peak RSS with the collector down: {hwm_kib} KiB; detach took {took:?}");
    assert!(hwm_kib < 200 * 1024, "mprof's peak RSS {hwm_kib} KiB");
}

#[test]
fn continuous_flags_without_a_destination_or_over_https_are_refused() {
    for (args, says) in [
        (&["--every", "1s"][..], "--every needs somewhere"),
        (
            &["--every", "1s", "--otlp", "https://c:4318"][..],
            "plain HTTP only",
        ),
        (
            &["--every", "0.5s", "--profiles-dir", "p"][..],
            "from 1s to 7 days",
        ),
        (&["--profiles-dir", "p"][..], "--every"),
        (
            &["--every", "1s", "--otlp", "http://c", "--live"][..],
            "cannot be used with",
        ),
    ] {
        let out = run_with_timeout(
            mprof()
                .arg("record")
                .args(args)
                .args(["--", "python3", "-c", "pass"]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            err.lines().filter(|l| l.contains("error")).count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// Bytes in use at the leaking line in one interval's OTLP request, their standard error,
/// the interval's start and length, and the request's resource attributes.
struct OtlpInterval {
    leaked: (f64, f64),
    start_ns: u64,
    duration_ns: u64,
    resource: Vec<(String, String)>,
}

fn otlp_interval(batch: &[u8]) -> OtlpInterval {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let request = common::otelcol::decode(batch);
    let d = request.dictionary.as_ref().unwrap();
    let s = |i: i32| d.string_table[i as usize].as_str();
    let rp = &request.resource_profiles[0];
    let resource = rp
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            let key = if kv.key.is_empty() {
                s(kv.key_strindex).to_owned()
            } else {
                kv.key.clone()
            };
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(v)) => v.clone(),
                Some(Value::StringValueStrindex(i)) => s(*i).to_owned(),
                Some(Value::IntValue(n)) => n.to_string(),
                other => format!("{other:?}"),
            };
            (key, value)
        })
        .collect();
    let profiles = &rp.scope_profiles[0].profiles;
    let types: Vec<&str> = profiles
        .iter()
        .map(|p| s(p.sample_type.as_ref().unwrap().type_strindex))
        .collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    let inuse = &profiles[3];
    let at_leak = |stack: i32| {
        let stack = &d.stack_table[stack as usize];
        stack.location_indices.first().is_some_and(|&l| {
            d.location_table[l as usize].lines.iter().any(|line| {
                line.line == LEAK_LINE
                    && s(d.function_table[line.function_index as usize].name_strindex) == "handle"
            })
        })
    };
    let (mut bytes, mut variance) = (0.0, 0.0);
    for sample in inuse.samples.iter().filter(|x| at_leak(x.stack_index)) {
        bytes += sample.values[0] as f64;
        for &a in &sample.attribute_indices {
            let a = &d.attribute_table[a as usize];
            if s(a.key_strindex) == "mprof.stderr" {
                if let Some(Value::IntValue(se)) = a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    variance += (*se as f64).powi(2);
                }
            }
        }
    }
    OtlpInterval {
        leaked: (bytes, variance.sqrt()),
        start_ns: inuse.time_unix_nano,
        duration_ns: inuse.duration_nano,
        resource,
    }
}

#[test]
fn a_collector_gets_every_interval_of_a_leaking_server_even_across_its_restart() {
    let test = "a_collector_gets_every_interval_of_a_leaking_server_even_across_its_restart";
    if common::tier::full_tier_only(test, "a real OpenTelemetry Collector, 25 s") {
        return;
    }
    let Some(mut collector) = common::otelcol::Collector::start(test) else {
        return;
    };
    let py = main_python(&pythons());
    let (mut target, port) = server(&py.path);
    let dir = common::tempdir();
    let mut attach = common::procs::Attach::start(
        target.pid,
        &[
            "--rate",
            "64KiB",
            "--every",
            "2s",
            "--otlp",
            &collector.http_endpoint(),
            "--service-name",
            "leaky",
            "-o",
            dir.path().join("c.mprof").to_str().unwrap(),
        ],
    );
    attach.attached();
    let load = Load::start(port);
    // 20 s of intervals; the collector is down for 5 of them (two or three intervals wait).
    std::thread::sleep(Duration::from_secs(8));
    collector.kill();
    std::thread::sleep(Duration::from_secs(5));
    collector.restart();
    std::thread::sleep(Duration::from_secs(7));
    let (sent, failed, slowest) = load.finish();
    let err = attach.detach();
    assert_eq!(failed, 0, "{sent} requests");
    assert!(
        slowest < Duration::from_secs(2),
        "an answer took {slowest:?}"
    );
    assert!(target.alive(), "the server died: {err}");
    assert!(err.contains("takes profiles again"), "{err}");
    let batches = collector.wait_received(10, Duration::from_secs(10));
    let mut intervals: Vec<OtlpInterval> = batches.iter().map(|b| otlp_interval(b)).collect();
    intervals.sort_by_key(|i| i.start_ns);
    // A request the collector wrote just before it was killed may come again.
    intervals.dedup_by_key(|i| i.start_ns);
    assert!(intervals.len() >= 8, "{} intervals: {err}", intervals.len());
    // None lost in the outage: each starts where the one before ended.
    for w in intervals.windows(2) {
        let gap = w[1].start_ns as i64 - (w[0].start_ns + w[0].duration_ns) as i64;
        assert!(
            gap.abs() < 50_000_000,
            "a gap of {gap} ns between intervals"
        );
    }
    for i in &intervals {
        let has = |k: &str, v: &str| i.resource.iter().any(|(a, b)| a == k && b == v);
        assert!(has("service.name", "leaky"), "{:?}", i.resource);
        assert!(
            has("process.pid", &target.pid.to_string()),
            "{:?}",
            i.resource
        );
        assert!(has("process.runtime.name", "cpython"), "{:?}", i.resource);
    }
    let series: Vec<(f64, f64)> = intervals.iter().map(|i| i.leaked).collect();
    eprintln!("OTLP: in use at the leak, interval by interval: {series:?}");
    // The server kept 20,000 bytes a request, and the last interval ends after the last one
    // (its requests before the attach are not seen: the first interval starts at the attach).
    let before: f64 = get(port)
        .and_then(|body| body.lines().last()?.split_whitespace().next()?.parse().ok())
        .map(|kept: f64| (kept - 1.0 - sent as f64) * 20_000.0)
        .unwrap();
    assert_eq!(before, 0.0, "requests before the attach");
    grows(&series, sent as f64 * 20_000.0);
}

#[test]
fn a_pre_fork_servers_workers_are_in_every_interval_with_their_pids() {
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let stop = dir.path().join("STOP");
    let profiles = dir.path().join("p");
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(4));
            std::fs::write(stop, b"").unwrap();
        })
    };
    let out = run_with_timeout(
        record_every_second(&profiles, dir.path(), &["-q", "--follow-children"])
            .arg(&py.path)
            .arg(script("prefork_server.py"))
            .arg(&stop),
        LIMIT,
    );
    stopper.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The master says "ready PID"; the workers' own lines may interleave.
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let master: i64 = said
        .lines()
        .find_map(|l| l.strip_prefix("ready ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let files = common::interval_files(&profiles);
    assert!(files.len() >= 3, "{files:?}\n{err}");
    // Every whole interval (the last may be a moment after the workers ended) has samples of
    // both workers, labelled with their pids.
    for f in &files[..files.len() - 1] {
        let p = decode(&std::fs::read(f).unwrap()).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let pids: std::collections::BTreeSet<i64> = p
            .sample
            .iter()
            .flat_map(|x| x.label.iter())
            .filter(|l| s(l.key) == "pid")
            .map(|l| l.num)
            .collect();
        let workers = pids.iter().filter(|&&p| p != master).count();
        assert_eq!(
            workers,
            2,
            "{}: pids {pids:?}, master {master}",
            f.display()
        );
    }
}

/// mprof's RSS (VmRSS, KiB) and its peak (VmHWM).
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} for mprof ({pid})"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `record --rate 256 --every 1s` of tests/py/thread_churn.py in `mode` for 16 s: mprof's
/// RSS at 8 s and its peak at the end (KiB), and the requests handled.
fn churn_memory(py: &Path, mode: &str) -> (u64, u64, u64) {
    let dir = common::tempdir();
    let recording = Recording::start(
        mprof()
            .args(["record", "--rate", "256", "--every", "1s", "--profiles-dir"])
            .arg(dir.path().join("p"))
            .arg("-o")
            .arg(dir.path().join("c.mprof"))
            .arg("--")
            .arg(py)
            .arg(script("thread_churn.py"))
            .args([mode, "16"]),
    );
    recording.line("ready");
    std::thread::sleep(Duration::from_secs(8));
    let (middle, _) = rss_kib(recording.pid());
    let done = recording.line("requests");
    let (_, peak) = rss_kib(recording.pid());
    let (status, err) = recording.end();
    assert!(status.success(), "{mode}: {err}");
    let requests = done.split_whitespace().nth(1).unwrap().parse().unwrap();
    (middle, peak, requests)
}

#[test]
fn a_thread_per_request_server_costs_mprof_no_more_memory_than_a_pool() {
    // What a continuous session holds grows with distinct stacks and live blocks, not with the
    // threads a server started and ended: once a thread is gone, its sites go with the
    // interval that last showed them.
    let py = main_python(&pythons());
    let (_, pool_peak, pool_requests) = churn_memory(&py.path, "pool");
    let (middle, peak, requests) = churn_memory(&py.path, "thread");
    eprintln!(
        "{}: mprof's peak RSS: {pool_peak} KiB for {pool_requests} requests on a pool, \
         {peak} KiB for {requests} on a thread each ({middle} KiB half way)",
        py.label
    );
    assert!(requests > 4_000, "only {requests} threads ran");
    // Measured: 42 MiB on a pool, 47 MiB a thread each; 65 MiB when every thread's sites were
    // kept.
    assert!(
        peak < pool_peak + 16 * 1024,
        "a thread per request: {peak} KiB, a pool: {pool_peak} KiB"
    );
}

#[test]
fn a_continuous_sessions_capture_stops_at_its_limit_and_the_intervals_go_on() {
    // Left on for days, the capture would grow with the samples: with `--every` it stops at
    // `--capture-bytes`, whole frames kept, and only the intervals go on.
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let profiles = dir.path().join("p");
    let capture = dir.path().join("c.mprof");
    let out = run_with_timeout(
        mprof()
            .args([
                "record",
                "--rate",
                "256",
                "--every",
                "1s",
                "--capture-bytes",
            ])
            .arg("512KiB")
            .arg("--profiles-dir")
            .arg(&profiles)
            .arg("-o")
            .arg(&capture)
            .arg("--")
            .arg(&py.path)
            .arg(script("thread_churn.py"))
            .args(["pool", "4"]),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("reached its limit (512.00 KiB"), "{err}");
    let size = std::fs::metadata(&capture).unwrap().len();
    assert!(size <= 512 * 1024, "the capture holds {size} bytes");
    // What it holds reads: the samples before the limit.
    let report = run_with_timeout(mprof().args(["report", "--json"]).arg(&capture), LIMIT);
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let samples = json["samples"].as_u64().unwrap();
    assert!(samples > 1000, "{samples} samples in the capture");
    // The last interval, long after the capture stopped, still has the requests' samples.
    let files = common::interval_files(&profiles);
    assert!(files.len() >= 3, "{files:?}\n{err}");
    let last = decode(&std::fs::read(&files[files.len() - 2]).unwrap()).unwrap();
    let allocated: i64 = last.sample.iter().map(|s| s.value[0]).sum();
    assert!(
        allocated > 1000,
        "the interval after the limit: {allocated} allocations"
    );
}

#[test]
fn otlp_headers_go_with_every_request() {
    // A receiver of one request on loopback: what mprof sent, head and all.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        String::from_utf8_lossy(&head).to_lowercase()
    });
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "--every", "1s", "--otlp", &url])
            .args(["--otlp-header", "X-Scope-OrgID=team-a"])
            .arg("-o")
            .arg(dir.path().join("c.mprof"))
            .arg("--")
            .arg(&py.path)
            .args([
                "-c",
                "import time; x = [bytes(1000) for _ in range(2000)]; time.sleep(1.5)",
            ]),
        LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = receiver.join().unwrap();
    assert!(head.starts_with("post /v1development/profiles "), "{head}");
    assert!(head.contains("\r\nx-scope-orgid: team-a\r\n"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: application/x-protobuf\r\n"),
        "{head}"
    );
    // A header that would split the request is refused before anything starts.
    let out = run_with_timeout(
        mprof()
            .args(["record", "--every", "1s", "--otlp", "http://127.0.0.1:9"])
            .args(["--otlp-header", "X-A=1\r\nX-B: 2"])
            .arg("--")
            .arg(&py.path)
            .args(["-c", "pass"]),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("control character"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
