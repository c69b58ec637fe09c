//! OpenTelemetry's profiles signal (OTLP, `v1development`): an [`Interval`] as the
//! `ExportProfilesServiceRequest` a collector's OTLP receiver takes, built with the
//! `opentelemetry-proto` crate's messages.
//!
//! One resource (the process: `service.name`, `process.pid`, `host.name`, the runtime), one
//! scope (`mprof` and its version), and four profiles sharing one dictionary, one per sample
//! type of Go's heap profiles (`alloc_objects`/`alloc_space` during the interval,
//! `inuse_objects`/`inuse_space` at its end: the format holds one type per profile). A sample
//! is a stack in a thread; its attributes are `thread.id`, `thread.name`, `process.pid` and
//! `mprof.allocator`, and on the two byte types `mprof.stderr`, the estimate's standard error
//! in bytes (0 at `--rate 1`). A site with nothing to say for a type has no sample in it.

use super::interval::{Interval, Site, SAMPLE_TYPES};
use crate::analysis::profile::Location;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otel;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use std::collections::HashMap;

/// The request of an interval, encoded.
pub fn request_bytes(interval: &Interval) -> Vec<u8> {
    request(interval).encode_to_vec()
}

/// The request of an interval.
pub fn request(interval: &Interval) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::new();
    let stacks: Vec<i32> = interval.sites.iter().map(|s| d.stack(s)).collect();
    let attributes: Vec<Vec<i32>> = interval
        .sites
        .iter()
        .map(|s| d.site_attributes(s))
        .collect();
    let space_type = d.string("space");
    let bytes_unit = d.string("bytes");
    let mut profiles = Vec::new();
    for (i, (kind, unit)) in SAMPLE_TYPES.iter().enumerate() {
        let mut samples = Vec::new();
        for (s, site) in interval.sites.iter().enumerate() {
            let value = site.values()[i];
            if value == 0 {
                continue;
            }
            let mut attribute_indices = attributes[s].clone();
            if *unit == "bytes" {
                let estimate = if i < 2 { &site.allocated } else { &site.live };
                let se = estimate.stderr().round() as i64;
                attribute_indices.push(d.int_attribute("mprof.stderr", se, "bytes"));
            }
            samples.push(otel::Sample {
                stack_index: stacks[s],
                attribute_indices,
                values: vec![value],
                ..Default::default()
            });
        }
        profiles.push(otel::Profile {
            sample_type: Some(otel::ValueType {
                type_strindex: d.string(kind),
                unit_strindex: d.string(unit),
            }),
            samples,
            time_unix_nano: interval.start_unix_ns,
            duration_nano: interval.duration_ns,
            period_type: Some(otel::ValueType {
                type_strindex: space_type,
                unit_strindex: bytes_unit,
            }),
            period: interval.rate as i64,
            profile_id: profile_id(interval, i),
            ..Default::default()
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles: vec![otel::ResourceProfiles {
            resource: Some(Resource {
                attributes: interval
                    .resource
                    .iter()
                    .map(|(k, v)| key_value(k, v))
                    .collect(),
                ..Default::default()
            }),
            scope_profiles: vec![otel::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "mprof".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(d.finish()),
    }
}

/// A resource attribute: a whole number stays one (`process.pid`), the rest are strings.
fn key_value(key: &str, value: &str) -> KeyValue {
    let value = match (key, value.parse::<i64>()) {
        ("process.pid", Ok(n)) => any_value::Value::IntValue(n),
        _ => any_value::Value::StringValue(value.to_owned()),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// 16 bytes that tell an interval's profiles apart: its start, its number and the type.
fn profile_id(interval: &Interval, kind: usize) -> Vec<u8> {
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(&interval.start_unix_ns.to_be_bytes());
    id.extend_from_slice(&((interval.seq << 8) | kind as u64).to_be_bytes());
    id
}

/// The dictionary under construction; index 0 of every table is its zero value, as the
/// format wants.
struct Dictionary {
    strings: Vec<String>,
    string_ids: HashMap<String, i32>,
    functions: Vec<otel::Function>,
    function_ids: HashMap<(i32, i32, u32), i32>,
    locations: Vec<otel::Location>,
    location_ids: HashMap<(i32, u32), i32>,
    stacks: Vec<otel::Stack>,
    stack_ids: HashMap<Vec<i32>, i32>,
    attributes: Vec<otel::KeyValueAndUnit>,
    attribute_ids: HashMap<(i32, AttributeValue, i32), i32>,
}

/// An attribute's value, as a key of the table.
#[derive(Clone, PartialEq, Eq, Hash)]
enum AttributeValue {
    Text(String),
    Int(i64),
}

impl Dictionary {
    fn new() -> Dictionary {
        Dictionary {
            strings: vec![String::new()],
            string_ids: HashMap::from([(String::new(), 0)]),
            functions: vec![otel::Function::default()],
            function_ids: HashMap::new(),
            locations: vec![otel::Location::default()],
            location_ids: HashMap::new(),
            stacks: vec![otel::Stack::default()],
            stack_ids: HashMap::new(),
            attributes: vec![otel::KeyValueAndUnit::default()],
            attribute_ids: HashMap::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i32;
        self.strings
            .push(crate::base::text::printable(s).into_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    fn location(&mut self, loc: &Location) -> i32 {
        let key = (
            self.string(loc.function),
            self.string(loc.file),
            loc.firstline,
        );
        let next = self.functions.len() as i32;
        let function = *self.function_ids.entry(key).or_insert(next);
        if function == next {
            self.functions.push(otel::Function {
                name_strindex: key.0,
                system_name_strindex: 0,
                filename_strindex: key.1,
                start_line: loc.firstline as i64,
            });
        }
        let next = self.locations.len() as i32;
        let location = *self
            .location_ids
            .entry((function, loc.line))
            .or_insert(next);
        if location == next {
            self.locations.push(otel::Location {
                lines: vec![otel::Line {
                    function_index: function,
                    line: loc.line as i64,
                    column: 0,
                }],
                ..Default::default()
            });
        }
        location
    }

    fn stack(&mut self, site: &Site) -> i32 {
        let indices: Vec<i32> = site.locations().map(|l| self.location(&l)).collect();
        let next = self.stacks.len() as i32;
        let id = *self.stack_ids.entry(indices.clone()).or_insert(next);
        if id == next {
            self.stacks.push(otel::Stack {
                location_indices: indices,
            });
        }
        id
    }

    fn attribute(&mut self, key: &str, value: AttributeValue, unit: &str) -> i32 {
        let key = self.string(key);
        let unit = if unit.is_empty() {
            0
        } else {
            self.string(unit)
        };
        let next = self.attributes.len() as i32;
        let id = *self
            .attribute_ids
            .entry((key, value.clone(), unit))
            .or_insert(next);
        if id == next {
            let value = match value {
                AttributeValue::Text(s) => any_value::Value::StringValue(s),
                AttributeValue::Int(n) => any_value::Value::IntValue(n),
            };
            self.attributes.push(otel::KeyValueAndUnit {
                key_strindex: key,
                value: Some(AnyValue { value: Some(value) }),
                unit_strindex: unit,
            });
        }
        id
    }

    fn int_attribute(&mut self, key: &str, n: i64, unit: &str) -> i32 {
        self.attribute(key, AttributeValue::Int(n), unit)
    }

    fn site_attributes(&mut self, site: &Site) -> Vec<i32> {
        let mut ids = vec![
            self.int_attribute("thread.id", site.tid as i64, ""),
            self.int_attribute("process.pid", site.pid as i64, ""),
            self.attribute(
                "mprof.allocator",
                AttributeValue::Text(site.allocator.to_owned()),
                "",
            ),
        ];
        if let Some(name) = &site.thread_name {
            let name = crate::base::text::printable(name).into_owned();
            ids.push(self.attribute("thread.name", AttributeValue::Text(name), ""));
        }
        ids
    }

    fn finish(self) -> otel::ProfilesDictionary {
        otel::ProfilesDictionary {
            mapping_table: vec![otel::Mapping::default()],
            location_table: self.locations,
            function_table: self.functions,
            link_table: vec![otel::Link::default()],
            string_table: self.strings,
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}
