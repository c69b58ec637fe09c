//! The real OpenTelemetry Collector the OTLP tests send profiles to (tests/common/otelcol.rs,
//! tools/otelcol), proved with no mprof code: a profiles request built from the OTLP protobuf
//! definitions (`opentelemetry-proto`) and POSTed over HTTP comes back out of the collector's
//! exporter decodable, with its sample values, strings and resource attributes; again after the
//! collector is stopped and started on the same port; and a POST while it is down fails at once
//! with a connection error. Full tier: a real consumer, built by tools/test-deps.sh.

mod common;

use common::otelcol::{self, Collector};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use std::time::{Duration, Instant};

/// Why these tests belong to the full tier (docs/testing.md).
const CONSUMER: &str = "a real consumer of mprof's output (an OpenTelemetry Collector)";

/// One heap profile of `run` (1, 2, …): in-use bytes at two Python lines, `run` × 4096 and
/// `run` × 1024, from a service named `mprof-otel-test-RUN`.
fn request(run: i64) -> ExportProfilesServiceRequest {
    // Index 0 of every table is the empty entry, by the format's convention.
    let strings = [
        "",
        "inuse_space",
        "bytes",
        "space",
        "leak",
        "server.py",
        "handle",
    ];
    let dictionary = ProfilesDictionary {
        mapping_table: vec![Mapping::default()],
        location_table: vec![Location::default(), location(1, 42), location(2, 7)],
        function_table: vec![Function::default(), function(4, 5, 40), function(6, 5, 5)],
        link_table: vec![Link::default()],
        string_table: strings.iter().map(|s| s.to_string()).collect(),
        attribute_table: vec![KeyValueAndUnit::default()],
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: vec![1, 2],
            },
            Stack {
                location_indices: vec![2],
            },
        ],
    };
    let sample = |stack_index, bytes| Sample {
        stack_index,
        values: vec![bytes],
        ..Default::default()
    };
    let start = 1_780_000_000_000_000_000 + run as u64 * 2_000_000_000;
    let profile = Profile {
        sample_type: Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        samples: vec![sample(1, run * 4096), sample(2, run * 1024)],
        time_unix_nano: start,
        duration_nano: 2_000_000_000,
        period_type: Some(ValueType {
            type_strindex: 3,
            unit_strindex: 2,
        }),
        period: 131_072,
        profile_id: vec![run as u8; 16],
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    string_attr("service.name", &format!("mprof-otel-test-{run}")),
                    KeyValue {
                        key: "process.pid".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::IntValue(4242)),
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "mprof".into(),
                    version: "0.1.0".into(),
                    ..Default::default()
                }),
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary),
    }
}

fn location(function_index: i32, line: i64) -> Location {
    Location {
        lines: vec![Line {
            function_index,
            line,
            column: 0,
        }],
        ..Default::default()
    }
}

fn function(name: i32, file: i32, start_line: i64) -> Function {
    Function {
        name_strindex: name,
        system_name_strindex: name,
        filename_strindex: file,
        start_line,
    }
}

fn string_attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

/// A plain-HTTP client that gives up after `limit` (no retries, statuses as errors).
fn agent(limit: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(limit))
        .build()
        .into()
}

/// POSTs `request` to `url` as OTLP/HTTP protobuf, giving up after `limit`.
fn send(
    url: &str,
    request: &ExportProfilesServiceRequest,
    limit: Duration,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    agent(limit)
        .post(url)
        .header("Content-Type", "application/x-protobuf")
        .send(&request.encode_to_vec()[..])
}

/// POSTs `request` to `url`; the collector's response, decoded.
fn post(url: &str, request: &ExportProfilesServiceRequest) -> ExportProfilesServiceResponse {
    let mut response =
        send(url, request, Duration::from_secs(20)).unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert_eq!(response.status(), 200);
    let body = response.body_mut().read_to_vec().expect("response body");
    ExportProfilesServiceResponse::decode(&body[..]).expect("an ExportProfilesServiceResponse")
}

/// The collector for `test`, started; `None` in the fast tier, or after saying why it is
/// skipped.
fn collector(test: &str) -> Option<Collector> {
    if common::tier::full_tier_only(test, CONSUMER) {
        return None;
    }
    Collector::start(test)
}

/// The string at `index` of the string table.
fn string(table: &[String], index: i32) -> &str {
    table
        .get(usize::try_from(index).unwrap())
        .unwrap_or_else(|| panic!("string index {index} outside the table ({})", table.len()))
}

/// A key-value pair with its key and string value resolved: inline, or (as the collector
/// writes them) references into the string table.
fn resolved(kv: &KeyValue, table: &[String]) -> (String, String) {
    let key = if kv.key.is_empty() {
        string(table, kv.key_strindex).to_string()
    } else {
        kv.key.clone()
    };
    let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::StringValueStrindex(i)) => string(table, *i).to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    };
    (key, value)
}

/// What a test checks in one batch the collector wrote: the resource's attributes, and each
/// sample as (sample type, unit, innermost function, its file and line, value).
struct Decoded {
    attributes: Vec<(String, String)>,
    samples: Vec<(String, String, String, String, i64, i64)>,
}

fn decode(bytes: &[u8]) -> Decoded {
    let request = otelcol::decode(bytes);
    let dict = request.dictionary.expect("a dictionary");
    let table = &dict.string_table;
    assert_eq!(request.resource_profiles.len(), 1);
    let rp = &request.resource_profiles[0];
    let attributes = rp.resource.as_ref().expect("a resource").attributes.iter();
    let attributes = attributes.map(|kv| resolved(kv, table)).collect();
    let mut samples = Vec::new();
    for profile in rp.scope_profiles.iter().flat_map(|s| &s.profiles) {
        let st = profile.sample_type.expect("a sample type");
        for sample in &profile.samples {
            let stack = &dict.stack_table[sample.stack_index as usize];
            let location = &dict.location_table[stack.location_indices[0] as usize];
            let line = &location.lines[0];
            let function = &dict.function_table[line.function_index as usize];
            for &value in &sample.values {
                samples.push((
                    string(table, st.type_strindex).to_string(),
                    string(table, st.unit_strindex).to_string(),
                    string(table, function.name_strindex).to_string(),
                    string(table, function.filename_strindex).to_string(),
                    line.line,
                    value,
                ));
            }
        }
    }
    Decoded {
        attributes,
        samples,
    }
}

/// Checks that `bytes` (one batch the collector wrote) is the profile of `run`.
fn assert_is_run(bytes: &[u8], run: i64, log: &str) {
    let got = decode(bytes);
    let service = format!("mprof-otel-test-{run}");
    let attr = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert!(
        got.attributes.contains(&attr("service.name", &service))
            && got.attributes.contains(&attr("process.pid", "4242")),
        "run {run}: resource attributes {:?}\n{log}",
        got.attributes
    );
    let sample = |function: &str, line, value| {
        let s = |x: &str| x.to_string();
        (
            s("inuse_space"),
            s("bytes"),
            s(function),
            s("server.py"),
            line,
            value,
        )
    };
    assert_eq!(
        got.samples,
        vec![
            sample("leak", 42, run * 4096),
            sample("handle", 7, run * 1024)
        ],
        "run {run}\n{log}"
    );
}

#[test]
fn collector_receives_profiles_over_http_across_a_restart() {
    let Some(mut collector) = collector("collector_receives_profiles_over_http_across_a_restart")
    else {
        return;
    };
    let url = collector.profiles_url();
    assert!(url.ends_with("/v1development/profiles"), "{url}");

    let response = post(&url, &request(1));
    let rejected = response
        .partial_success
        .as_ref()
        .map_or(0, |p| p.rejected_profiles);
    assert_eq!(rejected, 0, "{response:?}");
    let got = collector.received();
    assert_eq!(
        got.len(),
        1,
        "written before the POST returned\n{}",
        collector.log()
    );
    assert_is_run(&got[0], 1, &collector.log());

    // Stopped as an operator would, then started again on the same port: the same URL works,
    // and what it writes follows what the first run wrote.
    collector.stop();
    collector.restart();
    assert_eq!(collector.profiles_url(), url);
    post(&url, &request(2));
    post(&url, &request(3));
    let got = collector.received();
    assert_eq!(got.len(), 3, "{}", collector.log());
    for (run, bytes) in (1..).zip(&got) {
        assert_is_run(bytes, run, &collector.log());
    }
    collector.stop();
    eprintln!("collector at {url}: 3 profiles sent across a restart, decoded back as sent");
}

#[test]
fn a_post_while_the_collector_is_down_fails_at_once() {
    let Some(mut collector) = collector("a_post_while_the_collector_is_down_fails_at_once") else {
        return;
    };
    let url = collector.profiles_url();
    collector.kill();
    let start = Instant::now();
    let err = send(&url, &request(1), Duration::from_secs(30)).expect_err("nothing listens");
    let elapsed = start.elapsed();
    let refused = match &err {
        ureq::Error::Io(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        ureq::Error::ConnectionFailed => true,
        _ => false,
    };
    assert!(refused, "a connection error, got {err:?}");
    // Refused by the kernel on loopback: far below the client's 30 s limit, however loaded
    // the machine (a hang would reach the limit).
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(collector.received().is_empty());

    // Up again, the same request goes through.
    collector.restart();
    post(&url, &request(1));
    let got = collector.wait_received(1, Duration::from_secs(5));
    assert_eq!(got.len(), 1, "{}", collector.log());
    assert_is_run(&got[0], 1, &collector.log());
}

#[test]
fn the_index_check_finds_dangling_indices() {
    let good = request(1);
    assert_eq!(otelcol::check_indices(&good), Ok(()));
    let mut dangling = good.clone();
    dangling.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 3;
    assert_eq!(
        otelcol::check_indices(&dangling),
        Err("sample stack_index 3 outside its table of 3".to_string())
    );
    let mut no_zero = good.clone();
    let dict = no_zero.dictionary.as_mut().unwrap();
    dict.string_table[0] = "x".into();
    assert_eq!(
        otelcol::check_indices(&no_zero),
        Err("string_table[0] is not its zero value".to_string())
    );
    let mut no_value = good;
    no_value.resource_profiles[0].scope_profiles[0].profiles[0].samples[1].values = vec![];
    assert_eq!(
        otelcol::check_indices(&no_value),
        Err("a sample with 0 values and 0 timestamps".to_string())
    );
}
