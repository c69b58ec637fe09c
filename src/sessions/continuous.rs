//! Continuous profiling (`--every`): a session that stays on and, every interval, emits a
//! profile of that interval (allocated during it, live at its end, per stack and thread) into
//! a directory of rolling pprof files ([`rolling`]) and/or to an OpenTelemetry Collector over
//! OTLP/HTTP ([`sender`]).
//!
//! The records are the ones the capture gets, fed as the session drains the rings to the live
//! view's model (`crate::views::live::model`), which keeps, per stack and thread, the
//! figures since the start, the live blocks and the interval's allocations; each interval
//! [`Model::roll`]s them over. What it holds grows with distinct stacks and live sampled
//! blocks, not with time: an interval's profile is dropped once written and queued, and the
//! queue for the collector is bounded.

pub mod rolling;
pub mod sender;

use crate::sessions::children::Event;
use crate::views::export::interval::{Frame, Interval, Names, Site};
use crate::views::export::otlp;
use crate::views::live::model::Model;
use anyhow::{bail, Result};
use rolling::{Bounds, Rolling};
use sender::Sender;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The shortest interval.
pub const SHORTEST: Duration = Duration::from_secs(1);
/// The path of the profiles signal on a collector's OTLP/HTTP receiver, added to a URL that
/// has no path.
pub const OTLP_PROFILES_PATH: &str = "/v1development/profiles";
/// How long the last interval may wait for the collector when the session ends.
pub const CLOSING_GRACE: Duration = Duration::from_secs(5);

/// `--every` and where its profiles go (shared by `record` and `attach`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ContinuousArgs {
    /// Stay on and emit a profile of every interval of this length (`60s`, `5m`, `2s`):
    /// bytes and objects allocated during it, and live at its end. Needs `--profiles-dir` or
    /// `--otlp`.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub every: Option<Duration>,
    /// With `--every`: write each interval as a pprof file into DIR, the oldest removed past
    /// `--keep` files or `--keep-bytes`.
    #[arg(long, value_name = "DIR", requires = "every")]
    pub profiles_dir: Option<PathBuf>,
    /// Profiles kept in `--profiles-dir`.
    #[arg(long, value_name = "N", default_value_t = 1440)]
    pub keep: usize,
    /// Bytes of profiles kept in `--profiles-dir`.
    #[arg(long, value_name = "SIZE", default_value = "256MiB",
          value_parser = crate::base::units::parse_size)]
    pub keep_bytes: u64,
    /// With `--every`: each capture file (`-o`, a followed child's) stops growing at SIZE,
    /// whole frames kept, and the session goes on with its intervals (0: no limit).
    #[arg(long, value_name = "SIZE", default_value = "256MiB",
          value_parser = crate::base::units::parse_size)]
    pub capture_bytes: u64,
    /// With `--every`: send each interval to an OpenTelemetry Collector (OTLP over HTTP,
    /// protobuf), e.g. `http://127.0.0.1:4318`; the profiles path is added to a URL without
    /// one.
    #[arg(long, value_name = "URL", requires = "every")]
    pub otlp: Option<String>,
    /// A header for every request to the collector, `NAME=VALUE` (e.g. a tenant's
    /// `X-Scope-OrgID=team-a`); repeat for more. Default: $OTEL_EXPORTER_OTLP_HEADERS
    /// (`name=value,name=value`).
    #[arg(long, value_name = "NAME=VALUE", requires = "otlp")]
    pub otlp_header: Vec<String>,
    /// Most bytes of profiles waiting for a collector that is down or slow; past it the
    /// oldest are dropped and counted.
    #[arg(long, value_name = "SIZE", default_value = "16MiB",
          value_parser = crate::base::units::parse_size)]
    pub otlp_buffer: u64,
    /// The service the profiles are of (their `service.name`; default: $OTEL_SERVICE_NAME,
    /// else `unknown_service:` and the program's name).
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,
}

impl ContinuousArgs {
    /// The most bytes a capture file of the session may hold: `--capture-bytes` with
    /// `--every`, none without.
    pub fn capture_limit(&self) -> Option<u64> {
        (self.every.is_some() && self.capture_bytes > 0).then_some(self.capture_bytes)
    }
}

/// The headers of `--otlp-header` (else of `OTEL_EXPORTER_OTLP_HEADERS`, whose values may be
/// percent-encoded), each a valid HTTP header: a token for its name, no control character in
/// its value.
pub fn otlp_headers(flags: &[String]) -> Result<Vec<(String, String)>> {
    let from_env;
    let (items, decode): (Vec<&str>, bool) = if flags.is_empty() {
        from_env = std::env::var("OTEL_EXPORTER_OTLP_HEADERS").unwrap_or_default();
        let items = from_env
            .split(',')
            .filter(|i| !i.trim().is_empty())
            .collect();
        (items, true)
    } else {
        (flags.iter().map(String::as_str).collect(), false)
    };
    let mut headers = Vec::new();
    for item in items {
        let Some((name, value)) = item.split_once('=') else {
            bail!("an OTLP header is NAME=VALUE, not {:?}", item);
        };
        let name = name.trim();
        let value = if decode {
            percent_decoded(value.trim())
        } else {
            value.trim().to_owned()
        };
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            bail!("{name:?} is not an HTTP header name");
        }
        if value.chars().any(|c| c.is_control()) {
            bail!("the value of the OTLP header {name} has a control character");
        }
        headers.push((name.to_owned(), value));
    }
    Ok(headers)
}

/// `%XX` sequences decoded (others left as they are).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `--every`: a number with `ms`, `s`, `m` or `h` (plain numbers are seconds).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => t.split_at(at),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("'{text}': a duration like 500ms, 60s, 5m or 1h")),
    };
    let seconds = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .map(|n| n * scale)
        .ok_or_else(|| format!("'{text}': a duration like 500ms, 60s, 5m or 1h"))?;
    if !(SHORTEST.as_secs_f64()..=7.0 * 86400.0).contains(&seconds) {
        return Err(format!("'{text}': from 1s to 7 days"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The full OTLP/HTTP URL of `--otlp`, or why it is not one mprof can send to.
pub fn otlp_url(url: &str) -> Result<String> {
    let Some(rest) = url.strip_prefix("http://") else {
        if url.starts_with("https://") {
            bail!(
                "--otlp {url}: mprof sends plain HTTP only; send to a collector on this host or \
                 its network (http://), which can forward over TLS"
            );
        }
        bail!("--otlp {url}: not an http:// URL");
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("--otlp {url}: no host");
    }
    let path = match path {
        "" | "/" => OTLP_PROFILES_PATH,
        p => p,
    };
    Ok(format!("http://{host}{path}"))
}

/// A continuous session's intervals.
pub struct Continuous {
    model: Model,
    model_rate: u64,
    every: Duration,
    pid: u32,
    seq: u64,
    started: Instant,
    interval_start: Instant,
    interval_start_unix_ns: u64,
    rolling: Option<Rolling>,
    written: u64,
    write_failed: Option<String>,
    sender: Option<Sender>,
    otlp_url: Option<String>,
    resource: Vec<(String, String)>,
    python_known: bool,
}

impl Continuous {
    /// The continuous side of a session sampled at `rate`, if `--every` asks for one: its
    /// directory prepared and its URL checked, before anything changes in the target. Its
    /// process is said by [`Continuous::of_process`].
    pub fn prepare(args: &ContinuousArgs, rate: u64) -> Result<Option<Self>> {
        let Some(every) = args.every else {
            return Ok(None);
        };
        if args.profiles_dir.is_none() && args.otlp.is_none() {
            bail!("--every needs somewhere to send its profiles: --profiles-dir DIR, --otlp URL, or both");
        }
        let otlp_url = args.otlp.as_deref().map(otlp_url).transpose()?;
        let rolling = match &args.profiles_dir {
            Some(dir) => Some(Rolling::open(
                dir,
                Bounds {
                    files: args.keep.max(1),
                    bytes: args.keep_bytes,
                },
            )?),
            None => None,
        };
        let headers = otlp_headers(&args.otlp_header)?;
        let sender = otlp_url
            .as_deref()
            .map(|url| Sender::start(url, headers, args.otlp_buffer as usize));
        let service = args.service_name.clone().or_else(|| {
            std::env::var("OTEL_SERVICE_NAME")
                .ok()
                .filter(|s| !s.is_empty())
        });
        let resource = vec![
            ("service.name".to_owned(), service.unwrap_or_default()),
            ("process.pid".to_owned(), String::new()),
            ("host.name".to_owned(), host_name()),
            ("process.runtime.name".to_owned(), "cpython".to_owned()),
        ];
        let now = Instant::now();
        Ok(Some(Continuous {
            model: Model::new(rate, crate::base::clock::monotonic_ns()),
            model_rate: rate,
            every,
            pid: 0,
            seq: 0,
            started: now,
            interval_start: now,
            interval_start_unix_ns: unix_ns(),
            rolling,
            written: 0,
            write_failed: None,
            sender,
            otlp_url,
            resource,
            python_known: false,
        }))
    }

    /// The session's process is `pid`, running `arguments` (its command line: the default
    /// service name is `unknown_service:` and the program's name). The intervals start now.
    pub fn of_process(&mut self, pid: u32, arguments: &[String]) {
        self.pid = pid;
        for (key, value) in &mut self.resource {
            match key.as_str() {
                "process.pid" => *value = pid.to_string(),
                "service.name" if value.is_empty() => {
                    *value = format!("unknown_service:{}", program_name(arguments))
                }
                _ => {}
            }
        }
        self.started = Instant::now();
        self.interval_start = self.started;
        self.interval_start_unix_ns = unix_ns();
        self.model = Model::new(self.model_rate, crate::base::clock::monotonic_ns());
    }

    /// The records that follow are the program's.
    pub fn enter_program(&mut self) {
        self.model.enter(self.pid);
    }

    /// One record of the process entered last, as the capture gets it.
    pub fn observe(&mut self, bytes: &[u8]) {
        self.model.observe(bytes);
    }

    /// What happened to a followed child.
    pub fn child(&mut self, event: &Event) {
        match *event {
            Event::Started(pid, command) => self.model.started(pid, command),
            Event::Record(pid, bytes) => {
                self.model.enter(pid);
                self.model.observe(bytes);
            }
            Event::Ended(pid) => self.model.ended(pid),
            Event::ProgramReplaced(_) => {}
        }
    }

    /// Emits the interval if it is over; `dropped` is what the program's agent dropped so far,
    /// `python` its version (asked until known).
    pub fn tick(&mut self, dropped: u64, python: impl FnOnce() -> String) {
        self.status(dropped, python);
        if self.interval_start.elapsed() >= self.every {
            self.emit();
        }
    }

    fn status(&mut self, dropped: u64, python: impl FnOnce() -> String) {
        let python = if self.python_known {
            String::new()
        } else {
            python()
        };
        if !self.python_known && !python.is_empty() {
            self.python_known = true;
            let version = python.split_whitespace().next().unwrap_or("").to_owned();
            self.resource
                .push(("process.runtime.version".to_owned(), version));
        }
        self.model.set_ring_status(dropped, &python);
    }

    /// Rolls the interval over and sends its profile where it goes.
    fn emit(&mut self) {
        let interval = self.roll();
        if let Some(r) = &mut self.rolling {
            let written = interval.pprof().and_then(|bytes| {
                let ms = interval.start_unix_ns / 1_000_000;
                r.write(ms, self.pid, interval.seq, &bytes)
            });
            match written {
                Ok(_) => {
                    self.written += 1;
                    self.write_failed = None;
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    if self.write_failed.as_ref() != Some(&why) {
                        crate::say!(
                            "mprof: warning: interval {} not written: {why}",
                            interval.seq
                        );
                    }
                    self.write_failed = Some(why);
                }
            }
        }
        if let Some(s) = &mut self.sender {
            s.push(otlp::request_bytes(&interval));
        }
    }

    /// The interval that ends now; the next one starts.
    fn roll(&mut self) -> Interval {
        let now = Instant::now();
        let end_unix_ns = unix_ns();
        let snap = self.model.roll(crate::base::clock::monotonic_ns());
        let threads: HashMap<u32, (u32, Option<&str>)> = snap
            .threads
            .iter()
            .map(|t| (t.tid, (t.pid, t.name.as_deref())))
            .collect();
        let mut stacks: HashMap<_, Arc<[Frame]>> = HashMap::new();
        let mut names = Names::default();
        let sites = snap
            .sites
            .iter()
            .filter(|(_, _, f)| f.in_interval())
            .map(|&(stack, tid, f)| {
                let (pid, name) = threads.get(&tid).copied().unwrap_or((self.pid, None));
                Site {
                    frames: stacks
                        .entry(stack)
                        .or_insert_with(|| {
                            let frames = self.model.frames(stack);
                            frames.map(|l| Frame::of(&l, &mut names)).collect()
                        })
                        .clone(),
                    pid: if pid == 0 { self.pid } else { pid },
                    tid,
                    thread_name: name.map(str::to_owned),
                    allocator: self.model.allocator(stack).name(),
                    allocated: f.recent,
                    live: f.live,
                }
            })
            .collect();
        // What the next intervals need is the live blocks' sites: the rest goes.
        self.model.forget_idle();
        self.seq += 1;
        let interval = Interval {
            seq: self.seq,
            start_unix_ns: self.interval_start_unix_ns,
            duration_ns: now.duration_since(self.interval_start).as_nanos() as u64,
            rate: snap.rate,
            resource: self.resource.clone(),
            dropped_samples: snap.dropped,
            sites,
        };
        self.interval_start = now;
        self.interval_start_unix_ns = end_unix_ns;
        interval
    }

    /// Ends the session: emits the interval under way, gives the collector
    /// [`CLOSING_GRACE`] to take what waits, and says what went where.
    pub fn finish(mut self, dropped: u64, python: impl FnOnce() -> String) -> String {
        self.status(dropped, python);
        if self.seq == 0 || self.interval_start.elapsed() >= Duration::from_millis(100) {
            self.emit();
        }
        let mut parts = Vec::new();
        if let Some(r) = &self.rolling {
            let removed = match r.removed {
                0 => String::new(),
                n => format!(" ({n} older removed)"),
            };
            parts.push(format!(
                "{} profile(s) written to {}{removed}",
                self.written,
                r.path().display()
            ));
        }
        if let Some(s) = self.sender.take() {
            let c = s.close(CLOSING_GRACE);
            let url = self.otlp_url.as_deref().unwrap_or("");
            let dropped = match c.dropped {
                0 => String::new(),
                n => format!(", {n} dropped (the collector was down or slow)"),
            };
            parts.push(format!("{} sent to {url}{dropped}", c.sent));
        }
        format!(
            "mprof: {} interval(s) of {:?} over {:.0} s: {}",
            self.seq,
            self.every,
            self.started.elapsed().as_secs_f64(),
            parts.join("; ")
        )
    }
}

/// What a command line runs, by name: the script or module after the interpreter's options
/// (`python -m uvicorn app:app` is `uvicorn`, `python app.py` is `app.py`), or the executable
/// when it is not a `python` (a console script: `gunicorn`).
pub fn program_name(arguments: &[String]) -> String {
    let base = |a: &str| a.rsplit('/').next().unwrap_or(a).to_owned();
    let executable = arguments
        .first()
        .map_or_else(|| "python".to_owned(), |a| base(a));
    if !executable.starts_with("python") {
        return executable;
    }
    let mut rest = arguments.iter().skip(1);
    while let Some(a) = rest.next() {
        match a.as_str() {
            "-m" => {
                return rest
                    .next()
                    .map_or_else(|| "python".to_owned(), |m| m.clone())
            }
            "-c" => return "python -c".to_owned(),
            _ if a.starts_with('-') => {}
            _ => return base(a),
        }
    }
    executable
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This machine's name (`host.name`).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_headers_are_checked() {
        let flags = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            otlp_headers(&flags(&[
                "X-Scope-OrgID=team-a",
                "Authorization=Bearer a=b"
            ]))
            .unwrap(),
            vec![
                ("X-Scope-OrgID".to_owned(), "team-a".to_owned()),
                ("Authorization".to_owned(), "Bearer a=b".to_owned())
            ]
        );
        for bad in ["novalue", "=v", "a b=c", "x:y=z", "ok=line\r\nInjected: 1"] {
            assert!(otlp_headers(&flags(&[bad])).is_err(), "{bad}");
        }
        assert_eq!(
            percent_decoded("Basic%20dXNlcg%3D%3D%zz%"),
            "Basic dXNlcg==%zz%"
        );
    }

    #[test]
    fn intervals_and_urls_parse() {
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_interval("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("60"), Ok(Duration::from_secs(60)));
        for bad in ["0s", "10ms", "1x", "", "nans", "8d", "-5s"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
        assert_eq!(
            otlp_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1development/profiles"
        );
        assert_eq!(otlp_url("http://c:1/x/y").unwrap(), "http://c:1/x/y");
        assert!(otlp_url("https://c:1").is_err());
        assert!(otlp_url("ftp://c").is_err());
        assert!(otlp_url("http:///p").is_err());
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            program_name(&args(&["/usr/bin/python3", "-u", "srv/app.py"])),
            "app.py"
        );
        assert_eq!(
            program_name(&args(&["python", "-m", "uvicorn", "a:b"])),
            "uvicorn"
        );
        assert_eq!(program_name(&args(&["/opt/bin/gunicorn"])), "gunicorn");
    }
}
