//! A real OpenTelemetry Collector for the OTLP tests: `tools/otelcol`, the collector's own OTLP
//! receiver (HTTP and gRPC) on loopback and the profiles signal on, with one exporter,
//! `framedfile`, that appends every profiles batch it is handed to a file this guard reads
//! back ([`Collector::received`]).
//!
//! `tools/test-deps.sh` builds it (minutes on a fresh machine) into the cache folder that
//! `tools/otelcol/path.sh` names by the hash of its sources; a test never builds it. Missing, it
//! makes the test print `SKIPPED` (a failure under `MPROF_CI=1`, [`super::tier::skip`]).
//!
//! ```ignore
//! let Some(mut collector) = Collector::start(TEST) else { return };
//! post(collector.profiles_url(), body);        // OTLP/HTTP, application/x-protobuf
//! let batches = collector.received();          // serialized ExportProfilesServiceRequests
//! let request = otelcol::decode(&batches[0]);  // decoded, every index checked
//! collector.stop();                            // SIGTERM, waits; or kill() for SIGKILL
//! collector.restart();                         // same ports, same file: batches accumulate
//! ```

use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;

use super::procs;
use super::tier::skip;
use super::tools;

/// The OTLP/HTTP path of the profiles signal (still in development upstream): the receiver's
/// default, `defaultProfilesURLPath` in the collector's otlpreceiver.
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// How long the collector may take to listen, or to exit after SIGTERM, on a loaded machine.
const STARTUP: Duration = Duration::from_secs(30);
const SHUTDOWN: Duration = Duration::from_secs(15);

/// The built collector binary, or `None` after printing why the test is skipped: no Go, or
/// `tools/test-deps.sh` has not built the current sources.
pub fn binary(test: &str) -> Option<PathBuf> {
    tools::go(test)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/otelcol/path.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("run tools/otelcol/path.sh");
    assert!(
        out.status.success(),
        "tools/otelcol/path.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    if path.is_file() {
        return Some(path);
    }
    skip(
        test,
        &format!(
            "the test collector is not built at {} (tools/test-deps.sh builds it; .ci/run runs it)",
            path.display()
        ),
    );
    None
}

/// A collector process on loopback, killed (and waited for) when dropped. Its config, its
/// output file and its log live in a temporary folder of its own.
pub struct Collector {
    binary: PathBuf,
    dir: tempfile::TempDir,
    http_port: u16,
    grpc_port: u16,
    child: Option<Child>,
}

impl Collector {
    /// Starts the built collector on two free loopback ports and waits until both listen, or
    /// returns `None` after printing why the test is skipped.
    pub fn start(test: &str) -> Option<Collector> {
        let binary = binary(test)?;
        let mut collector = Collector {
            binary,
            dir: tempfile::tempdir().expect("collector dir"),
            http_port: free_port(),
            grpc_port: free_port(),
            child: None,
        };
        collector.write_config();
        collector.restart();
        Some(collector)
    }

    /// `http://127.0.0.1:PORT/v1development/profiles`: where OTLP/HTTP profiles are POSTed.
    pub fn profiles_url(&self) -> String {
        format!("{}{PROFILES_PATH}", self.http_endpoint())
    }

    /// `http://127.0.0.1:PORT`: the OTLP/HTTP endpoint (signal paths appended by the sender).
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// `http://127.0.0.1:PORT`: the OTLP/gRPC endpoint.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The collector's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every profiles batch the collector has written so far, across restarts, in order: each
    /// a serialized `ExportProfilesServiceRequest` (which also decodes as `ProfilesData`).
    /// The collector re-encodes what it received: resource and scope attribute strings come
    /// back as string-table references (`key_strindex`, `StringValueStrindex`).
    pub fn received(&self) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(self.output()).unwrap_or_default();
        frames(&bytes)
    }

    /// Waits until at least `count` batches were written (or `limit` passed), and returns them
    /// all.
    pub fn wait_received(&self, count: usize, limit: Duration) -> Vec<Vec<u8>> {
        let start = Instant::now();
        loop {
            let got = self.received();
            if got.len() >= count || start.elapsed() > limit {
                return got;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the collector printed (all its runs): for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("otelcol.log")).unwrap_or_default()
    }

    /// Stops the collector as an operator would (SIGTERM) and waits for it to exit; panics if
    /// it does not within 15 s (after killing it).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        procs::signal(child.id(), libc::SIGTERM);
        let start = Instant::now();
        while child.try_wait().expect("wait for the collector").is_none() {
            if start.elapsed() > SHUTDOWN {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the collector did not exit within {SHUTDOWN:?} of SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the collector at once (SIGKILL), as a crash would, and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the collector again, on the same ports and appending to the same file, and waits
    /// until it listens. Panics if it is running, or if it exits or does not listen in time.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the collector is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("otelcol.log"))
            .expect("collector log");
        let child = Command::new(&self.binary)
            .arg("--config")
            .arg(self.dir.path().join("config.yaml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn the collector");
        self.child = Some(child);
        self.wait_listening();
    }

    fn output(&self) -> PathBuf {
        self.dir.path().join("received.bin")
    }

    fn write_config(&self) {
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: \"127.0.0.1:{}\"\n      \
             grpc:\n        endpoint: \"127.0.0.1:{}\"\n\
             exporters:\n  framedfile:\n    path: \"{}\"\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  \
             pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [framedfile]\n",
            self.http_port,
            self.grpc_port,
            self.output().display()
        );
        std::fs::write(self.dir.path().join("config.yaml"), config).expect("collector config");
    }

    fn wait_listening(&mut self) {
        let start = Instant::now();
        let listening = |port: u16| {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        };
        loop {
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().expect("wait for the collector") {
                self.child = None;
                panic!("the collector exited at start ({status}):\n{}", self.log());
            }
            if listening(self.http_port) && listening(self.grpc_port) {
                return;
            }
            if start.elapsed() > STARTUP {
                self.kill();
                panic!(
                    "the collector did not listen within {STARTUP:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port free now (the kernel's pick; closed again for the collector to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The whole frames of the exporter's file: a 4-byte little-endian length, then that many
/// bytes. A frame still being written (a short tail) is left for the next read.
fn frames(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some((len, rest)) = bytes.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            break;
        }
        out.push(rest[..len].to_vec());
        bytes = &rest[len..];
    }
    out
}

/// Decodes one batch the collector wrote and checks what the collector itself does not: the
/// dictionary's tables each start with their zero entry, and every index in the message points
/// inside its table (the receiver checks only the string references of resource and scope
/// attributes, and accepts a sample pointing at a stack that does not exist). Panics saying
/// what is wrong.
pub fn decode(bytes: &[u8]) -> ExportProfilesServiceRequest {
    let request = ExportProfilesServiceRequest::decode(bytes)
        .unwrap_or_else(|e| panic!("not an OTLP ExportProfilesServiceRequest: {e}"));
    if let Err(why) = check_indices(&request) {
        panic!("an inconsistent OTLP profiles message: {why}\n{request:?}");
    }
    request
}

/// Whether `request`'s dictionary starts each table with its zero entry and every index of
/// the message is inside its table; the first fault otherwise.
pub fn check_indices(request: &ExportProfilesServiceRequest) -> Result<(), String> {
    let d = request.dictionary.as_ref().ok_or("no dictionary")?;
    // The collector writes attribute_table[0]'s value as an empty AnyValue, not as none.
    let no_value = |v: &Option<AnyValue>| v.as_ref().is_none_or(|v| v.value.is_none());
    let zero = [
        ("string_table", d.string_table.first().map(|s| s.is_empty())),
        (
            "mapping_table",
            d.mapping_table.first().map(|m| *m == Default::default()),
        ),
        (
            "location_table",
            d.location_table.first().map(|l| *l == Default::default()),
        ),
        (
            "function_table",
            d.function_table.first().map(|f| *f == Default::default()),
        ),
        (
            "link_table",
            d.link_table.first().map(|l| *l == Default::default()),
        ),
        (
            "stack_table",
            d.stack_table.first().map(|s| *s == Default::default()),
        ),
        (
            "attribute_table",
            d.attribute_table
                .first()
                .map(|a| a.key_strindex == 0 && a.unit_strindex == 0 && no_value(&a.value)),
        ),
    ];
    for (table, ok) in zero {
        match ok {
            None => return Err(format!("{table} is empty (entry 0 must be its zero value)")),
            Some(false) => return Err(format!("{table}[0] is not its zero value")),
            Some(true) => {}
        }
    }
    let within = |what: &str, index: i32, len: usize| {
        if usize::try_from(index).is_ok_and(|i| i < len) {
            Ok(())
        } else {
            Err(format!("{what} {index} outside its table of {len}"))
        }
    };
    let strings = |what: &str, i| within(what, i, d.string_table.len());
    let attrs = |what: &str, indices: &[i32]| {
        indices
            .iter()
            .try_for_each(|&i| within(what, i, d.attribute_table.len()))
    };
    let key_values = |what: &str, kvs: &[KeyValue]| {
        kvs.iter().try_for_each(|kv| {
            strings(&format!("{what} key_strindex"), kv.key_strindex)?;
            match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValueStrindex(i)) => {
                    strings(&format!("{what} string_value_strindex"), *i)
                }
                _ => Ok(()),
            }
        })
    };
    for m in &d.mapping_table {
        strings("mapping filename_strindex", m.filename_strindex)?;
        attrs("mapping attribute index", &m.attribute_indices)?;
    }
    for l in &d.location_table {
        within(
            "location mapping_index",
            l.mapping_index,
            d.mapping_table.len(),
        )?;
        attrs("location attribute index", &l.attribute_indices)?;
        for line in &l.lines {
            within(
                "line function_index",
                line.function_index,
                d.function_table.len(),
            )?;
        }
    }
    for f in &d.function_table {
        strings("function name_strindex", f.name_strindex)?;
        strings("function system_name_strindex", f.system_name_strindex)?;
        strings("function filename_strindex", f.filename_strindex)?;
    }
    for a in &d.attribute_table {
        strings("attribute key_strindex", a.key_strindex)?;
        strings("attribute unit_strindex", a.unit_strindex)?;
    }
    for s in &d.stack_table {
        for &i in &s.location_indices {
            within("stack location index", i, d.location_table.len())?;
        }
    }
    for rp in &request.resource_profiles {
        if let Some(resource) = &rp.resource {
            key_values("resource attribute", &resource.attributes)?;
        }
        for sp in &rp.scope_profiles {
            if let Some(scope) = &sp.scope {
                key_values("scope attribute", &scope.attributes)?;
            }
            for p in &sp.profiles {
                for vt in p.sample_type.iter().chain(&p.period_type) {
                    strings("value type type_strindex", vt.type_strindex)?;
                    strings("value type unit_strindex", vt.unit_strindex)?;
                }
                attrs("profile attribute index", &p.attribute_indices)?;
                for s in &p.samples {
                    within("sample stack_index", s.stack_index, d.stack_table.len())?;
                    within("sample link_index", s.link_index, d.link_table.len())?;
                    attrs("sample attribute index", &s.attribute_indices)?;
                    let (values, times) = (s.values.len(), s.timestamps_unix_nano.len());
                    if values + times == 0 || (values > 0 && times > 0 && values != times) {
                        return Err(format!(
                            "a sample with {values} values and {times} timestamps"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
