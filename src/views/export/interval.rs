//! One interval of a continuous session (`--every`): what was allocated during it and what was
//! live at its end, per stack and thread, as Go's heap profiles hold them
//! (`alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`), and the two encodings it is
//! sent in: a gzipped pprof file ([`Interval::pprof`]) and an OTLP profiles request
//! ([`super::otlp`]).

use super::pprof::{self, number_label, text_label, whole, Code, PprofProfile, Sample, Strings};
use crate::analysis::estimate::Estimate;
use crate::analysis::profile::Location;
use anyhow::Result;
use std::collections::HashSet;
use std::sync::Arc;

/// A frame of a stack, owned (an interval outlives the session's tables only as long as it
/// waits to be sent). Its names are shared by every frame of the interval that has them
/// ([`Names`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub function: Arc<str>,
    pub file: Arc<str>,
    pub line: u32,
    pub firstline: u32,
}

/// The names of one interval's frames, each held once.
#[derive(Default)]
pub struct Names(HashSet<Arc<str>>);

impl Names {
    fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(held) = self.0.get(name) {
            return held.clone();
        }
        let held: Arc<str> = Arc::from(name);
        self.0.insert(held.clone());
        held
    }
}

impl Frame {
    /// The frame of `loc`, its names held in `names`.
    pub fn of(loc: &Location, names: &mut Names) -> Frame {
        Frame {
            function: names.get(loc.function),
            file: names.get(loc.file),
            line: loc.line,
            firstline: loc.firstline,
        }
    }

    fn location(&self) -> Location<'_> {
        Location {
            file: &self.file,
            function: &self.function,
            line: self.line,
            firstline: self.firstline,
            module: None,
        }
    }
}

/// A stack in a thread of a process, and its figures over the interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// Innermost first; shared by the sites of the interval that have the same stack.
    pub frames: Arc<[Frame]>,
    pub pid: u32,
    pub tid: u32,
    pub thread_name: Option<String>,
    /// `python`, `native` or `mmap`.
    pub allocator: &'static str,
    /// Allocated during the interval.
    pub allocated: Estimate,
    /// Live at the interval's end (allocated during it or before).
    pub live: Estimate,
}

/// One interval's profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Interval {
    /// The interval's number in its session, from 1.
    pub seq: u64,
    /// Its start (wall clock) and length.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    /// The sampling rate (mean bytes between samples; 1: every allocation).
    pub rate: u64,
    /// Who was profiled: `service.name`, `process.pid`, `host.name`, the runtime... as
    /// OpenTelemetry's resource attributes name them.
    pub resource: Vec<(String, String)>,
    /// Samples the agent dropped so far (a full ring), and earlier intervals that could not be
    /// delivered (see `crate::sessions::continuous`).
    pub dropped_samples: u64,
    pub sites: Vec<Site>,
}

/// Go's four heap sample types, in the order of a pprof sample's values.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

impl Site {
    /// The figures in the order of [`SAMPLE_TYPES`].
    pub fn values(&self) -> [i64; 4] {
        [
            whole(self.allocated.count),
            whole(self.allocated.bytes),
            whole(self.live.count),
            whole(self.live.bytes),
        ]
    }

    /// The frames as locations.
    pub fn locations(&self) -> impl Iterator<Item = Location<'_>> + '_ {
        self.frames.iter().map(Frame::location)
    }
}

impl Interval {
    /// Estimated bytes live at the end, in every site.
    pub fn live_bytes(&self) -> f64 {
        self.sites.iter().map(|s| s.live.bytes).sum()
    }

    /// The pprof message: one sample per site, labelled with its thread, process and
    /// allocator, and the standard errors of its two byte figures (`alloc_space_stderr`,
    /// `inuse_space_stderr`, in bytes; 0 at `--rate 1`); the resource in the comments.
    pub fn pprof_message(&self) -> PprofProfile {
        let mut strings = Strings::new();
        let sample_type = SAMPLE_TYPES
            .iter()
            .map(|(t, u)| strings.value_type(t, u))
            .collect();
        let period_type = Some(strings.value_type("space", "bytes"));
        let mut code = Code::default();
        let mut sample = Vec::with_capacity(self.sites.len());
        for site in &self.sites {
            let location_id = site
                .locations()
                .map(|loc| code.location(&mut strings, &loc))
                .collect();
            let mut label = vec![
                number_label(&mut strings, "thread", site.tid as i64, ""),
                number_label(&mut strings, "pid", site.pid as i64, ""),
                text_label(&mut strings, "allocator", site.allocator),
            ];
            if let Some(name) = &site.thread_name {
                label.push(text_label(&mut strings, "thread_name", name));
            }
            for (key, e) in [
                ("alloc_space_stderr", &site.allocated),
                ("inuse_space_stderr", &site.live),
            ] {
                label.push(number_label(&mut strings, key, whole(e.stderr()), "bytes"));
            }
            sample.push(Sample {
                location_id,
                value: site.values().to_vec(),
                label,
            });
        }
        let mut comment: Vec<i64> = self
            .resource
            .iter()
            .map(|(k, v)| strings.id(&format!("{k}={v}")))
            .collect();
        comment.push(strings.id(&format!("mprof.interval={}", self.seq)));
        comment.push(strings.id(&format!("mprof.dropped={}", self.dropped_samples)));
        let default_sample_type = strings.id("inuse_space");
        PprofProfile {
            sample_type,
            sample,
            location: code.location,
            function: code.function,
            time_nanos: self.start_unix_ns as i64,
            duration_nanos: self.duration_ns as i64,
            period_type,
            period: self.rate as i64,
            comment,
            default_sample_type,
            string_table: strings.into_table(),
        }
    }

    /// The gzipped pprof file.
    pub fn pprof(&self) -> Result<Vec<u8>> {
        pprof::gzipped(&self.pprof_message())
    }
}
