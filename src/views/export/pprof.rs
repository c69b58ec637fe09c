//! pprof: a gzipped protobuf `Profile` per pprof's `profile.proto`, read by `go tool pprof`,
//! Grafana Pyroscope, Parca and Polar Signals.
//!
//! Sample types, in order: `alloc_objects`/`alloc_space` (allocated), `inuse_objects`/
//! `inuse_space` (live at the end, the default, as in Go's heap profiles) and `peak_objects`/
//! `peak_space` (live at the peak). One sample per stack and thread, with a `thread` label
//! (and `thread_name` when known), an `allocator` label (`python`, `native` or `mmap`) and the
//! capture's `mode`, `pid`, `command` and `python`; values are the estimates rounded to whole
//! bytes and allocations. The period is the sampling rate (`space`/`bytes`). The capture's
//! meta goes in the profile's comments as `key=value` (`go tool pprof -comments`). The
//! messages are declared in `crate::capture::pprof`.

use crate::analysis::profile::{FastMap, Location, Profile, View};
use anyhow::Result;
use flate2::write::GzEncoder;
use prost::Message;
use std::io::Write;

/// The messages, and the bounded reader of a file, are the capture stage's: mprof reads them
/// back as captures.
pub use crate::capture::pprof::{
    decode, Function, Label, Line, PprofLocation, PprofProfile, Sample, ValueType, MAX_DECODED,
};

/// Meta keys that also label every sample (what tools that group by labels, like Pyroscope,
/// can filter on); all of the meta is in the comments.
const META_LABELS: [&str; 4] = ["mode", "pid", "command", "python"];

/// The pprof export.
pub struct Pprof;

impl super::Exporter for Pprof {
    fn format(&self) -> super::Format {
        super::Format::Pprof
    }

    fn export(&self, p: &Profile, _: &super::Options) -> Result<Vec<u8>> {
        gzipped(&profile(p))
    }
}

/// A profile message as a pprof file holds it: encoded, then gzipped.
pub fn gzipped(message: &PprofProfile) -> Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&message.encode_to_vec())?;
    Ok(gz.finish()?)
}

/// The string table under construction (index 0 is the empty string, as the format wants).
pub(super) struct Strings {
    table: Vec<String>,
    index: FastMap<String, i64>,
}

impl Strings {
    pub(super) fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            index: FastMap::from_iter([(String::new(), 0)]),
        }
    }

    /// The index of `s`, made printable (`go tool pprof` shows the strings on a terminal).
    pub(super) fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table
            .push(crate::base::text::printable(s).into_owned());
        self.index.insert(s.to_owned(), i);
        i
    }

    /// The table, index 0 the empty string.
    pub(super) fn into_table(self) -> Vec<String> {
        self.table
    }

    /// A `ValueType` of a type and its unit.
    pub(super) fn value_type(&mut self, t: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.id(t),
            unit: self.id(unit),
        }
    }
}

/// The functions and locations of a profile under construction: one location per distinct
/// (function, line), one function per distinct (file, name, first line); ids from 1.
#[derive(Default)]
pub(super) struct Code {
    /// By (file, name) as indices in the string table, and first line.
    functions: FastMap<(i64, i64, u32), u64>,
    pub(super) function: Vec<Function>,
    locations: FastMap<(u64, u32), u64>,
    pub(super) location: Vec<PprofLocation>,
    /// The location of each frame seen, by where its names are (the profile interns them):
    /// a frame met again, in another stack, costs one look-up of a few words.
    seen: FastMap<Place, u64>,
}

/// A frame by where its file and function names are, its first line and line.
type Place = (usize, usize, usize, usize, u32, u32);

impl Code {
    /// The id of the location of `loc`, its strings in `strings`.
    pub(super) fn location(&mut self, strings: &mut Strings, loc: &Location) -> u64 {
        let place = (
            loc.file.as_ptr() as usize,
            loc.file.len(),
            loc.function.as_ptr() as usize,
            loc.function.len(),
            loc.firstline,
            loc.line,
        );
        if let Some(&id) = self.seen.get(&place) {
            return id;
        }
        let id = self.location_of(strings, loc);
        self.seen.insert(place, id);
        id
    }

    /// [`Code::location`] of a frame not seen yet.
    fn location_of(&mut self, strings: &mut Strings, loc: &Location) -> u64 {
        // The name first, then the file: the order a new function's strings join the table.
        let name = strings.id(loc.function);
        let filename = strings.id(loc.file);
        let next = self.functions.len() as u64 + 1;
        let function = &mut self.function;
        let key = (filename, name, loc.firstline);
        let function_id = *self.functions.entry(key).or_insert_with(|| {
            function.push(Function {
                id: next,
                name,
                // pprof demangles a system name as C++, turning `<module>` into
                // nothing: Python names have no system form.
                system_name: 0,
                filename,
                start_line: loc.firstline as i64,
            });
            next
        });
        let next = self.locations.len() as u64 + 1;
        let location = &mut self.location;
        *self
            .locations
            .entry((function_id, loc.line))
            .or_insert_with(|| {
                location.push(PprofLocation {
                    id: next,
                    line: vec![Line {
                        function_id,
                        line: loc.line as i64,
                    }],
                });
                next
            })
    }
}

/// A label of a string value.
pub(super) fn text_label(strings: &mut Strings, key: &str, value: &str) -> Label {
    Label {
        key: strings.id(key),
        str: strings.id(value),
        ..Label::default()
    }
}

/// A label of a number, with its unit (empty for none).
pub(super) fn number_label(strings: &mut Strings, key: &str, num: i64, unit: &str) -> Label {
    Label {
        key: strings.id(key),
        num,
        num_unit: if unit.is_empty() { 0 } else { strings.id(unit) },
        ..Label::default()
    }
}

/// A figure as the whole number pprof holds.
pub(super) fn whole(x: f64) -> i64 {
    x.round().max(0.0) as i64
}

/// The profile message of a capture.
pub fn profile(p: &Profile) -> PprofProfile {
    let mut strings = Strings::new();
    let sample_type = vec![
        strings.value_type("alloc_objects", "count"),
        strings.value_type("alloc_space", "bytes"),
        strings.value_type("inuse_objects", "count"),
        strings.value_type("inuse_space", "bytes"),
        strings.value_type("peak_objects", "count"),
        strings.value_type("peak_space", "bytes"),
    ];
    let period_type = Some(strings.value_type("space", "bytes"));
    let mut code = Code::default();
    let mut sample = Vec::new();
    // Per frame id of the profile, its location (0: not met yet); per thread, allocator and
    // for the meta, their labels. Each is made where it is first met, so the string table
    // keeps the order of a walk that makes them all anew.
    let names = p.trie();
    let mut by_frame = vec![0u64; names.frame_count()];
    let mut thread_labels: FastMap<u32, Vec<Label>> = FastMap::default();
    let mut allocator_labels: FastMap<&str, Label> = FastMap::default();
    let mut meta_labels: Option<Vec<Label>> = None;
    for ((stack, tid), figures) in p.sites() {
        let ids = names
            .frame_ids(stack.0)
            .map(|frame| {
                let id = &mut by_frame[frame as usize];
                if *id == 0 {
                    *id = code.location(&mut strings, &names.location(frame));
                }
                *id
            })
            .collect();
        let mut value = Vec::with_capacity(6);
        for view in [View::Allocated, View::Live, View::Peak] {
            let e = figures.get(view);
            value.push(whole(e.count));
            value.push(whole(e.bytes));
        }
        let mut label = thread_labels
            .entry(*tid)
            .or_insert_with(|| {
                let mut label = vec![number_label(&mut strings, "thread", *tid as i64, "")];
                if let Some(name) = p.threads.get(tid) {
                    label.push(text_label(&mut strings, "thread_name", name));
                }
                label
            })
            .clone();
        let allocator = p.allocator(*stack).name();
        label.push(
            allocator_labels
                .entry(allocator)
                .or_insert_with(|| text_label(&mut strings, "allocator", allocator))
                .clone(),
        );
        label.extend_from_slice(meta_labels.get_or_insert_with(|| {
            META_LABELS
                .iter()
                .filter_map(|&key| {
                    let value = p.meta.get(key)?;
                    Some(text_label(&mut strings, key, value))
                })
                .collect()
        }));
        sample.push(Sample {
            location_id: ids,
            value,
            label,
        });
    }
    let mut comment: Vec<i64> = p
        .meta
        .iter()
        .map(|(k, v)| strings.id(&format!("{k}={v}")))
        .collect();
    if let Some(w) = p.incomplete() {
        comment.push(strings.id(&w));
    }
    let start_ms: i64 = p
        .meta
        .get("start_unix_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let default_sample_type = strings.id("inuse_space");
    PprofProfile {
        sample_type,
        sample,
        location: code.location,
        function: code.function,
        time_nanos: start_ms.saturating_mul(1_000_000),
        duration_nanos: (p.duration_seconds * 1e9) as i64,
        period_type,
        period: p.rate as i64,
        comment,
        default_sample_type,
        string_table: strings.into_table(),
    }
}
