//! pprof's on-disk format: the messages of pprof's `profile.proto` that mprof writes
//! (`mprof export --format pprof`, and one file per interval under `--every --profiles-dir`)
//! and reads back (`crate::capture::rolling`), declared with prost's derive, field numbers as
//! in profile.proto; and [`decode`], the bounded reader of a file.
//!
//! The messages live in the capture stage because mprof reads them back as it reads its own
//! captures; what to write in them is `crate::views::export::pprof`'s.
//!
//! A file to read is untrusted: it is unpacked to at most [`MAX_DECODED`] bytes (and no more
//! than the caller allows), and before the message is built, its wire form is walked to count
//! what building it would take in memory ([`parsed_size`]); a message that would take more
//! than the caller allows is refused, not built (a sample can take 36 times its few bytes on
//! the wire once built).

use anyhow::{bail, Result};
use prost::Message;
use std::io::Read;

/// profile.proto's `Profile` (the fields mprof writes).
#[derive(Clone, PartialEq, Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<PprofLocation>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// profile.proto's `ValueType`: string-table indices of a type and its unit.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// profile.proto's `Sample`: locations innermost first, one value per sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// profile.proto's `Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// profile.proto's `Location`: here one Python frame (function and line), no mapping.
#[derive(Clone, PartialEq, Message)]
pub struct PprofLocation {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// profile.proto's `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// profile.proto's `Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The largest pprof message [`decode`] unpacks: a file claiming more is refused, not read.
pub const MAX_DECODED: u64 = 256 << 20;
/// What [`decode`] lets a message take in memory: unpacked, then built ([`parsed_size`]).
pub const MAX_MEMORY: u64 = 1 << 30;

/// A pprof file's message (gzipped or not), as far as mprof writes its fields; a file that is
/// not one, that unpacks to more than [`MAX_DECODED`], or that would take more than
/// [`MAX_MEMORY`] bytes unpacked and built, is an error.
pub fn decode(bytes: &[u8]) -> Result<PprofProfile> {
    decode_within(bytes, MAX_MEMORY)
}

/// [`decode`] within `max_memory` bytes: the unpacked bytes and the built message together.
pub fn decode_within(bytes: &[u8], max_memory: u64) -> Result<PprofProfile> {
    let raw = unpack(bytes, max_memory.min(MAX_DECODED))?;
    let Some(parsed) = parsed_size(&raw) else {
        bail!("not a pprof profile: its protobuf encoding is malformed");
    };
    let memory = parsed.saturating_add(raw.len() as u64);
    if memory > max_memory {
        bail!(
            "its {} bytes of profile would take {} MiB of memory once read, more than the {} \
             MiB allowed: it may be corrupt or crafted",
            raw.len(),
            memory >> 20,
            max_memory >> 20
        );
    }
    PprofProfile::decode(raw.as_slice()).map_err(|e| anyhow::anyhow!("not a pprof profile: {e}"))
}

/// The protobuf bytes of a file: unzipped when it is gzipped; more than `max` bytes is an
/// error.
fn unpack(bytes: &[u8], max: u64) -> Result<Vec<u8>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        if bytes.len() as u64 > max {
            bail!("a pprof file larger than {} MiB", max >> 20);
        }
        return Ok(bytes.to_vec());
    }
    let mut out = Vec::new();
    let mut gz = flate2::read::GzDecoder::new(bytes).take(max + 1);
    gz.read_to_end(&mut out)
        .map_err(|e| anyhow::anyhow!("not a gzipped pprof file: {e}"))?;
    if out.len() as u64 > max {
        bail!("a pprof file larger than {} MiB unpacked", max >> 20);
    }
    Ok(out)
}

/// Protobuf's wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// The bytes of memory a [`PprofProfile`] decoded from `raw` would hold in its vectors and
/// strings, at most (each vector counted twice: its capacity may be double its length), or
/// `None` when the wire form is malformed. Fields mprof does not declare cost nothing (prost
/// skips them).
pub fn parsed_size(raw: &[u8]) -> Option<u64> {
    use std::mem::size_of;
    let mut total = size_of::<PprofProfile>() as u64;
    for field in Fields(raw) {
        let (number, value) = field?;
        total = total.saturating_add(match (number, value) {
            (1 | 11, _) => size_of::<ValueType>() as u64,
            (2, Value::Bytes(sample)) => sample_size(sample)?,
            (4, Value::Bytes(location)) => location_size(location)?,
            (5, _) => size_of::<Function>() as u64,
            (6, Value::Bytes(s)) => (size_of::<String>() + s.len()) as u64,
            (13, value) => numbers(value)?,
            _ => 0,
        });
    }
    Some(total.saturating_mul(2))
}

fn sample_size(raw: &[u8]) -> Option<u64> {
    let mut total = std::mem::size_of::<Sample>() as u64;
    for field in Fields(raw) {
        total = total.saturating_add(match field? {
            (1 | 2, value) => numbers(value)?,
            (3, _) => std::mem::size_of::<Label>() as u64,
            _ => 0,
        });
    }
    Some(total)
}

fn location_size(raw: &[u8]) -> Option<u64> {
    let mut total = std::mem::size_of::<PprofLocation>() as u64;
    for field in Fields(raw) {
        if let (4, _) = field? {
            total = total.saturating_add(std::mem::size_of::<Line>() as u64);
        }
    }
    Some(total)
}

/// Bytes of a repeated 64-bit number field's entries: one, or a packed run of varints.
fn numbers(value: Value) -> Option<u64> {
    match value {
        Value::Bytes(packed) => {
            let mut n = 0u64;
            let mut at = 0;
            while at < packed.len() {
                varint(packed, &mut at)?;
                n += 1;
            }
            Some(n * 8)
        }
        _ => Some(8),
    }
}

/// One field's value on the wire.
enum Value<'a> {
    Number,
    Bytes(&'a [u8]),
}

/// The fields of a message on the wire: (field number, value), `None` where it is malformed
/// (then nothing more).
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Option<(u64, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_none() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Option<(u64, Value<'a>)> {
        let mut at = 0;
        let key = varint(self.0, &mut at)?;
        let value = match key & 7 {
            VARINT => {
                varint(self.0, &mut at)?;
                Value::Number
            }
            FIXED64 => {
                at = at.checked_add(8).filter(|&end| end <= self.0.len())?;
                Value::Number
            }
            FIXED32 => {
                at = at.checked_add(4).filter(|&end| end <= self.0.len())?;
                Value::Number
            }
            LEN => {
                let len = usize::try_from(varint(self.0, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|&end| end <= self.0.len())?;
                let bytes = &self.0[at..end];
                at = end;
                Value::Bytes(bytes)
            }
            _ => return None,
        };
        self.0 = &self.0[at..];
        Some((key >> 3, value))
    }
}

/// A varint at `*at`, moving `*at` past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> PprofProfile {
        PprofProfile {
            sample: vec![
                Sample {
                    location_id: vec![1, 2, 300],
                    value: vec![5, 1 << 40],
                    label: vec![Label::default()],
                };
                3
            ],
            location: vec![PprofLocation {
                id: 1,
                line: vec![Line::default(); 2],
            }],
            string_table: vec![String::new(), "abc".into()],
            comment: vec![1, 1],
            period_type: Some(ValueType::default()),
            ..PprofProfile::default()
        }
    }

    #[test]
    fn the_walk_counts_what_building_takes_and_refuses_a_bad_wire() {
        let m = message();
        let raw = m.encode_to_vec();
        let counted = parsed_size(&raw).unwrap();
        use std::mem::size_of;
        let sample = size_of::<Sample>() + 5 * 8 + size_of::<Label>();
        let at_least = size_of::<PprofProfile>()
            + 3 * sample
            + size_of::<PprofLocation>()
            + 2 * size_of::<Line>()
            + 2 * size_of::<String>()
            + 3
            + 2 * 8
            + size_of::<ValueType>();
        assert_eq!(counted, 2 * at_least as u64);
        assert_eq!(decode(&raw).unwrap(), m);
        // Cut anywhere inside, the wire is malformed or a shorter message: never a panic.
        for end in 0..raw.len() {
            let _ = parsed_size(&raw[..end]);
            let _ = decode(&raw[..end]);
        }
        assert!(parsed_size(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_none());
        assert!(parsed_size(&[0x0b]).is_none(), "wire type 3 (groups)");
        let e = decode_within(&raw, 2 * at_least as u64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than the 0 MiB allowed"), "{e}");
        let e = decode_within(&raw, 16).unwrap_err().to_string();
        assert!(e.contains("larger than 0 MiB"), "{e}");
        // Many empty samples: two bytes each on the wire, counted at their built size.
        let crowd: Vec<u8> = [0x12, 0x00].repeat(1000);
        assert!(parsed_size(&crowd).unwrap() >= 1000 * size_of::<Sample>() as u64);
    }
}
