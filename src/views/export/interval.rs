//! One interval of a continuous session (`--every`): what was allocated during it and what was
//! live at its end, per stack and thread, as Go's heap profiles hold them
//! (`alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`), and the two encodings it is
//! sent in: a gzipped pprof file ([`Interval::pprof`]) and an OTLP profiles request
//! ([`super::otlp`]).

use super::pprof::{self, number_label, text_label, whole, Code, PprofProfile, Sample, Strings};
use crate::analysis::estimate::Estimate;
use crate::analysis::profile::Location;
use anyhow::Result;
use flate2::write::GzEncoder;
use prost::Message;
use std::io::Write;

/// A frame of a stack, owned (an interval outlives the session's tables only as long as it
/// waits to be sent).
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub firstline: u32,
}

impl Frame {
    /// The frame of `loc`.
    pub fn of(loc: &Location) -> Frame {
        Frame {
            function: loc.function.to_owned(),
            file: loc.file.to_owned(),
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
    /// Innermost first.
    pub frames: Vec<Frame>,
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
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&self.pprof_message().encode_to_vec())?;
        Ok(gz.finish()?)
    }
}

/// Reads back what [`Interval::pprof`] wrote (the tests, and `mprof` reading a directory of
/// them): the message, or why it is not one.
pub fn read_pprof(bytes: &[u8]) -> Result<PprofProfile> {
    pprof::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::profile::{Profile, Source};
    use crate::capture::processes::Pick;
    use crate::capture::rolling::file_name;

    fn estimate(bytes: f64, count: f64, variance: f64) -> Estimate {
        Estimate {
            bytes,
            count,
            variance,
            samples: 1,
        }
    }

    /// Interval `seq` of 2 s: `grow` keeps `seq` MiB in thread 5 (MainThread), `churn` in
    /// thread 6 allocates 4 MiB and keeps none.
    fn interval(seq: u64) -> Interval {
        let frame = |function: &str, line| Frame {
            function: function.to_owned(),
            file: "/srv/app.py".to_owned(),
            line,
            firstline: 1,
        };
        let site = |name: &str, line, tid, allocated, live| Site {
            frames: vec![frame(name, line), frame("<module>", 20)],
            pid: 900,
            tid,
            thread_name: Some(format!("T{tid}")),
            allocator: "python",
            allocated,
            live,
        };
        let mib = 1048576.0;
        Interval {
            seq,
            start_unix_ns: 1_800_000_000_000_000_000 + (seq - 1) * 2_000_000_000,
            duration_ns: 2_000_000_000,
            rate: 65536,
            resource: vec![
                ("service.name".into(), "shop".into()),
                ("process.pid".into(), "900".into()),
            ],
            dropped_samples: 0,
            sites: vec![
                site(
                    "grow",
                    7,
                    5,
                    estimate(mib, 1.0, 4e9),
                    estimate(seq as f64 * mib, seq as f64, seq as f64 * 4e9),
                ),
                site(
                    "churn",
                    9,
                    6,
                    estimate(4.0 * mib, 400.0, 1e10),
                    Estimate::default(),
                ),
            ],
        }
    }

    #[test]
    fn the_files_written_read_back_as_a_profile() {
        let dir = tempfile::tempdir().unwrap();
        for seq in 1..=4 {
            let i = interval(seq);
            let name = file_name(i.start_unix_ns / 1_000_000, 900, seq);
            std::fs::write(dir.path().join(name), i.pprof().unwrap()).unwrap();
        }
        let (p, warnings) = Profile::read(dir.path()).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let t = p.totals();
        let mib = 1048576.0;
        assert_eq!(t.allocated.bytes, 4.0 * 5.0 * mib);
        assert_eq!(t.live.bytes, 4.0 * mib);
        // The standard errors went through whole bytes: √(4·4e9) = 126491.1 → 126491.
        assert_eq!(t.live.stderr(), 126491.0);
        assert_eq!(p.threads.get(&5).map(String::as_str), Some("T5"));
        assert_eq!(p.meta["command"], "shop");
        assert_eq!(p.duration_seconds, 8.0);
        // The timeline comes from the series: the live heap at each interval's end.
        let source = Source::open(dir.path(), Pick::All).unwrap();
        let p = source.load().unwrap();
        let grouping = crate::analysis::grouping::Grouping::Line;
        let t = crate::views::timeline::load_source(&source, &p, 5, grouping).unwrap();
        let points: Vec<(f64, f64)> = t.points.iter().map(|pt| (pt.seconds, pt.heap)).collect();
        assert_eq!(
            points,
            [
                (2.0, mib),
                (4.0, 2.0 * mib),
                (6.0, 3.0 * mib),
                (8.0, 4.0 * mib)
            ]
        );
        assert_eq!(t.points[3].sites[0], 4.0 * mib);
        // The last half: allocated over two intervals, live at the end.
        let path = format!("{}@-4s..", dir.path().display());
        let (half, _) = Profile::read(std::path::Path::new(&path)).unwrap();
        assert_eq!(half.totals().allocated.bytes, 2.0 * 5.0 * mib);
        assert_eq!(half.totals().live.bytes, 4.0 * mib);
    }

    /// Mutated interval files (bytes flipped, cut, repeated, in the protobuf before gzip)
    /// give a profile that every view renders, or a warning, never a panic.
    #[test]
    fn mutated_interval_files_are_read_or_skipped() {
        use crate::analysis::grouping::Grouping;
        use crate::analysis::profile::View;
        use crate::views::{diff, flamegraph, report};
        let raw = interval(3).pprof_message().encode_to_vec();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n.max(1) as u64) as usize
        };
        let (mut read, mut skipped) = (0, 0);
        for round in 0..400 {
            let mut bytes = raw.clone();
            for _ in 0..1 + next(4) {
                let at = next(bytes.len());
                match next(4) {
                    0 => bytes[at] ^= 1 << next(8),
                    1 => bytes[at] = [0, 0x7f, 0x80, 0xff][next(4)],
                    2 => bytes.truncate(at),
                    _ => {
                        let end = (at + 1 + next(16)).min(bytes.len());
                        let piece = bytes[at..end].to_vec();
                        bytes.splice(at..at, piece);
                    }
                }
                if bytes.is_empty() {
                    bytes.push(0);
                }
            }
            let dir = tempfile::tempdir().unwrap();
            let good = interval(1);
            let name = file_name(good.start_unix_ns / 1_000_000, 900, 1);
            std::fs::write(dir.path().join(name), good.pprof().unwrap()).unwrap();
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&bytes).unwrap();
            let name = file_name(1_900_000_000_000, 900, 2 + round);
            std::fs::write(dir.path().join(name), gz.finish().unwrap()).unwrap();
            let (p, warnings) = Profile::read(dir.path()).unwrap();
            match warnings.iter().any(|w| w.starts_with("skipping")) {
                true => skipped += 1,
                false => read += 1,
            }
            for w in &warnings {
                assert!(!w.contains('\n'), "{w}");
            }
            for view in View::ALL {
                report::render(&p, view, Grouping::YourCode, 20, false).unwrap();
                report::render(&p, view, Grouping::Stack, 0, true).unwrap();
            }
            let settings = flamegraph::Settings::of(View::Live);
            flamegraph::svg(&p, &settings, Some(&p)).unwrap();
            diff::text(&p, &p, View::Live, Grouping::Line, 20);
        }
        assert!(read > 0 && skipped > 0, "{read} read, {skipped} skipped");
    }
}
