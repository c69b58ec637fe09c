//! `mprof _inprocess`: the reader of a session that a Python program starts on itself
//! (`pymprof.start()`, `pymprof.tracemalloc.start()`, the pytest plugin).
//!
//! The program (pymprof, `python/pymprof/_session.py`) makes two memory files and starts this
//! command as its child with both: this side writes the agent's image into one and sets the
//! ring up in the other, and says where the agent's entry points are. The program loads the
//! agent from the image with `dlopen` (or finds the one `mprof record` or `attach` loaded),
//! calls `mprof_agent_start` on the ring itself, with its GIL held, and says so. From then on
//! this side drains the ring as `record` and `attach` do, keeping the heartbeat the agent
//! watches, and aggregates the samples here ([`traces`]): the program's questions
//! (`get_traced_memory`, `take_snapshot`, an epoch's figures) are lines on this command's
//! standard input, answered on its standard output ([`wire`]) once everything the program
//! published before asking has been read. With `-o`, the records also go into a capture that
//! every view reads. The program stops the agent itself (`mprof_agent_stop`), then says
//! `stop`; the end of its standard input (the program is gone) ends the session too.
//!
//! A program another session profiles already (`record`, `attach`) is refused by the agent,
//! and the reason goes back to the program as an error.

pub mod traces;
pub mod wire;

use crate::capture::file::CaptureWriter;
use crate::sessions::reader::{Reader, RingMem};
use crate::sessions::sampling::SamplingArgs;
use anyhow::{bail, Context, Result};
use mprof_common::record::Record;
use mprof_common::ring::{STATE_ACTIVE, STATE_FAILED};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;
use traces::Traces;

/// What `mprof _inprocess` is given.
#[derive(Clone, Copy)]
pub struct Options<'a> {
    /// The program (this command's parent).
    pub pid: u32,
    /// The program's memory file for the ring, and the one for the agent's image (inherited).
    pub ring_fd: i32,
    pub agent_fd: i32,
    /// Where to write a capture, if anywhere.
    pub output: Option<&'a Path>,
    pub sampling: &'a SamplingArgs,
}

/// A round that moved this many bytes goes on at once; one below `QUIET` lets the sleep grow.
const BUSY: usize = 256 << 10;
const QUIET: usize = 64 << 10;

/// Runs the session until the program says `stop` or goes away.
pub fn run(o: Options) -> Result<()> {
    let ring_fd = inherited(o.ring_fd, "--ring-fd")?;
    let agent_fd = inherited(o.agent_fd, "--agent-fd")?;
    if o.sampling.native && o.output.is_none() {
        bail!("native stacks are read from a capture file: give one (-o)");
    }
    std::fs::File::from(agent_fd)
        .write_all(mprof_injector::agent::AGENT_SO)
        .context("writing the agent's image")?;
    let data_size = crate::sessions::reader::ring_data_size(
        o.sampling.rate,
        crate::sessions::reader::address_space_headroom(o.pid),
    )
    .map_err(|why| anyhow::anyhow!("cannot profile under this address-space limit: {why}"))?;
    let ring = RingMem::from_fd(ring_fd, o.sampling, data_size)?;
    let mut io = Io::new();
    io.reply(&wire::json_reply(
        &json!({"ok": true, "agent": agent_entries()?}),
    ))?;
    let started = loop {
        ring.heartbeat();
        match io.lines(Duration::from_millis(20))? {
            None => return Ok(()),
            Some(lines) if !lines.is_empty() => break lines[0].clone(),
            Some(_) => {}
        }
    };
    if let Some(why) = start_failure(&ring, &started)? {
        io.reply(&wire::json_reply(&json!({"error": why})))?;
        return Ok(());
    }
    let mut sink = match o.output {
        Some(path) => Sink::Capture(Box::new(open_capture(path, &ring, o)?)),
        None => Sink::Bare(&ring),
    };
    io.reply(&wire::json_reply(
        &json!({"ok": true, "python": ring.python_version()}),
    ))?;
    let mut traces = Traces::new(o.sampling.rate);
    let mut poll = crate::sessions::driver::POLL;
    loop {
        let moved = sink.pump(&mut traces)?;
        let wait = if moved >= BUSY { Duration::ZERO } else { poll };
        poll = if moved < QUIET {
            (poll * 2).min(crate::sessions::driver::IDLE_POLL)
        } else {
            crate::sessions::driver::POLL
        };
        let Some(lines) = io.lines(wait)? else {
            return sink.finish(&mut traces);
        };
        for line in lines {
            while sink.pump(&mut traces)? > 0 {}
            poll = crate::sessions::driver::POLL;
            if line.trim() == "stop" {
                let done = stop_reply(&ring, &traces, o.output);
                sink.finish(&mut traces)?;
                return io.reply(&wire::json_reply(&done));
            }
            io.reply(&answer(&line, &mut traces, o.sampling.rate))?;
        }
    }
}

/// An inherited descriptor, checked to be open.
fn inherited(fd: i32, flag: &str) -> Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open; no memory is touched.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("{flag} {fd} is not an open descriptor this command inherited");
    }
    // SAFETY: the descriptor was handed to this command for it alone (pymprof passes it and
    // keeps its own), and it is open (checked above).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Where the agent's entry points and first segment are in its image, for a program that
/// finds an agent loaded already (by `record` or `attach`, or by itself before): it checks
/// that the loaded agent is this very image and calls it at these offsets.
fn agent_entries() -> Result<Value> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let elf = object::File::parse(mprof_injector::agent::AGENT_SO).context("the agent image")?;
    let seg = elf.segments().next().context("the agent has no segment")?;
    let (off, len) = seg.file_range();
    let entry = |name: &str| {
        elf.dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.address())
            .with_context(|| format!("the agent has no {name}"))
    };
    Ok(json!({
        "start": entry("mprof_agent_start")?,
        "stop": entry("mprof_agent_stop")?,
        "first_vaddr": seg.address(),
        "segment": [off, len],
    }))
}

/// Why the agent did not start, after the program said it called it (`started RET`).
fn start_failure(ring: &RingMem, said: &str) -> Result<Option<String>> {
    let ret = said.strip_prefix("started ").map(str::trim);
    let state = ring.state()?;
    if state == STATE_ACTIVE && ret == Some("0") {
        return Ok(None);
    }
    let message = ring.message();
    Ok(Some(if message.contains("already running") {
        "this process is already being profiled (by mprof record, mprof attach, or another \
         pymprof session)"
            .to_string()
    } else if state == STATE_FAILED && !message.is_empty() {
        format!("the mprof agent could not start: {message}")
    } else {
        format!(
            "the mprof agent did not start (it returned {})",
            ret.unwrap_or("nothing")
        )
    }))
}

/// The capture of a session, placed and with its metadata.
fn open_capture<'r>(path: &Path, ring: &'r RingMem, o: Options) -> Result<Reader<&'r RingMem>> {
    let mut capture = CaptureWriter::create(path)?;
    capture.place()?;
    let argv = crate::sessions::procfs::arguments(o.pid);
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", o.pid)).ok();
    let yours = crate::analysis::focus::meta_lines(&argv, cwd.as_deref(), &o.sampling.focus);
    capture.write(&Record::Meta {
        text: format!(
            "mode=pymprof\npid={}\nppid={}\n{}start_unix_ms={}\npython={}\ncommand={}\n{yours}",
            o.pid,
            crate::sessions::procfs::parent_of(o.pid).unwrap_or(0),
            o.sampling.meta(),
            crate::base::clock::unix_ms(),
            ring.python_version(),
            argv.join(" ").replace('\n', "\\n"),
        ),
    })?;
    Ok(Reader::new(ring, capture, o.pid).keep_statm_open())
}

/// Where the records go besides [`Traces`]: a capture, or nowhere.
enum Sink<'r> {
    Capture(Box<Reader<&'r RingMem>>),
    Bare(&'r RingMem),
}

impl Sink<'_> {
    /// Drains the ring (and beats the heartbeat); returns the bytes moved.
    fn pump(&mut self, traces: &mut Traces) -> Result<usize> {
        match self {
            Sink::Capture(reader) => reader.pump_observed(|bytes| traces.observe(bytes)),
            Sink::Bare(ring) => {
                ring.heartbeat();
                ring.reader()
                    .drain_then(|bytes| traces.observe(bytes), |f, t| ring.release(f, t))
                    .map_err(|e| anyhow::anyhow!("the program damaged the ring ({e})"))
            }
        }
    }

    /// Drains what is left and closes the capture.
    fn finish(&mut self, traces: &mut Traces) -> Result<()> {
        while self.pump(traces)? > 0 {}
        if let Sink::Capture(reader) = self {
            reader.capture.write(&Record::Meta {
                text: format!(
                    "exit_unix_ms={}\nreader_cpu_ms={}\n",
                    crate::base::clock::unix_ms(),
                    crate::sessions::driver::own_cpu_ms()
                ),
            })?;
            reader.finish()?;
        }
        Ok(())
    }
}

/// The answer to `stop`.
fn stop_reply(ring: &RingMem, traces: &Traces, output: Option<&Path>) -> Value {
    json!({
        "ok": true,
        "samples": ring.reader().samples(),
        "dropped": ring.dropped(),
        "reader_gone": traces.reader_gone(),
        "capture": output.map(|p| p.display().to_string()),
    })
}

/// The answer to one request (see `python/pymprof/_session.py` for who asks what).
fn answer(line: &str, traces: &mut Traces, rate: u64) -> Vec<u8> {
    let mut words = line.split_whitespace();
    let number = |w: Option<&str>| w.and_then(|w| w.parse::<u64>().ok());
    let ok = || wire::json_reply(&json!({"ok": true}));
    match words.next().unwrap_or("") {
        "memory" => {
            let (now, peak) = traces.memory();
            wire::json_reply(&json!({
                "ok": true,
                "current": wire::estimate(&now),
                "peak": wire::estimate(&peak),
                "ended": traces.ended,
            }))
        }
        "snapshot" => {
            let nframe = number(words.next()).unwrap_or(1) as usize;
            wire::frame(b'B', &wire::snapshot(traces, rate, nframe.max(1)))
        }
        "traceback" => {
            let (Some(addr), nframe) = (number(words.next()), number(words.next())) else {
                return wire::json_reply(&json!({"error": "traceback ADDR NFRAME"}));
            };
            let found = traces.block_at(addr).map(|b| b.stack);
            let tb = found.map(|s| wire::traceback(traces.frames(s), nframe.unwrap_or(1) as usize));
            wire::json_reply(&match tb {
                Some((frames, total)) => json!({"ok": true, "frames": frames, "total": total}),
                None => json!({"ok": true, "frames": null}),
            })
        }
        "reset_peak" => {
            traces.reset_peak();
            ok()
        }
        "clear" => {
            traces.clear();
            ok()
        }
        "mark" => {
            traces.mark();
            ok()
        }
        "epoch" => {
            let top = number(words.next()).unwrap_or(5) as usize;
            let root = line.splitn(3, ' ').nth(2).unwrap_or("").trim();
            let (allocated, live, peak) = traces.epoch();
            wire::json_reply(&json!({
                "ok": true,
                "allocated": wire::estimate(&allocated),
                "live": wire::estimate(&live),
                "peak": wire::estimate(&peak),
                "peak_sites": wire::top_sites(traces, traces.epoch_stacks(true), root, top),
                "live_sites": wire::top_sites(traces, traces.epoch_stacks(false), root, top),
            }))
        }
        "overhead" => wire::json_reply(&json!({"ok": true, "bytes": own_rss()})),
        other => wire::json_reply(&json!({"error": format!("unknown request {other:?}")})),
    }
}

/// This process's resident memory: where the traces are kept (`get_tracemalloc_memory`).
fn own_rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64
}

/// The program's requests (lines on standard input) and this side's replies (standard output).
struct Io {
    stdin: std::mem::ManuallyDrop<std::fs::File>,
    pending: Vec<u8>,
}

impl Io {
    fn new() -> Io {
        // SAFETY: descriptor 0 is this process's standard input, open for its whole life;
        // ManuallyDrop never closes it.
        let stdin = unsafe { std::fs::File::from_raw_fd(0) };
        Io {
            stdin: std::mem::ManuallyDrop::new(stdin),
            pending: Vec::new(),
        }
    }

    /// The whole lines that arrive within `wait` (none if none did); `None` once the program
    /// has closed its end.
    fn lines(&mut self, wait: Duration) -> Result<Option<Vec<String>>> {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on a local array of one pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        if n <= 0 || fds[0].revents == 0 {
            return Ok(Some(Vec::new()));
        }
        let mut buf = [0u8; 4096];
        let got = match self.stdin.read(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(Some(Vec::new())),
            Err(e) => return Err(e).context("reading the program's requests"),
        };
        if got == 0 {
            return Ok(None);
        }
        self.pending.extend_from_slice(&buf[..got]);
        let mut lines = Vec::new();
        while let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=at).collect();
            lines.push(String::from_utf8_lossy(&line[..at]).into_owned());
        }
        Ok(Some(lines))
    }

    fn reply(&mut self, bytes: &[u8]) -> Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)
            .and_then(|()| out.flush())
            .context("answering the program")
    }
}
