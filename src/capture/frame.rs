//! Frames: the records of a capture compressed in runs (format 5 on), each run a FRAME record
//! (kind 15) holding one zstd frame and saying what the records in it define.
//!
//! ```text
//!  0        4        6        8        12       16       20        24       28       32
//!  +--------+--------+--------+--------+--------+--------+---------+--------+--------+---- ... ---+
//!  | len:u32|kind=15 |codec=1 | raw    | nodes  | text   | samples | live   | stacks | zstd frame |
//!  +--------+--------+--------+--------+--------+--------+---------+--------+--------+---- ... ---+
//!   preamble (every record's)  what the frame declares (u32 each)
//! ```
//! - `raw`: the bytes of the records once decompressed (at most [`MAX_FRAME_RAW`]): whole
//!   records back to back, as a format 4 file holds them after its header (PACKED runs of
//!   samples and frees among them, see [`super::pack`]);
//! - `nodes`: STACK records (stack nodes defined) in it;
//! - `text`: bytes of the records that carry names and text (CODE, THREAD, META, MODULE);
//! - `samples`: samples in it (ALLOC, SAMPLE and BRIEF, packed or not);
//! - `live`: the most sampled blocks live at once up to the end of the frame, as the writer
//!   counts them (a sample's address becomes live, a free of a live address ends it; one
//!   capture, one process);
//! - `stacks`: bytes of the stacks that samples carry whole ([`whole_stack`]: a SAMPLE's
//!   native section, an ALLOC's frames), each distinct one counted in the first frame that
//!   has it: a reader interns every distinct one into its trie of stacks;
//! - the zstd frame carries its content checksum, so a damaged frame is found, not misread.
//!
//! The declarations are the capture's index: the reader's memory allowance is derived from
//! them (distinct stacks, names, live blocks; see `crate::analysis::profile`), and the reader
//! checks as it goes that a frame holds no more than it declares. A frame is written once its
//! records reach [`FRAME_TARGET`] bytes and at every flush (every 200 ms of a session), so a
//! session that dies loses the records of its last frame at most.

use super::live_bits::LiveBits;
use super::pack::{Unpacker, KIND_PACKED};
use mprof_common::record::{
    ALLOC_FIXED, KIND_ALLOC, KIND_CODE, KIND_FREE, KIND_META, KIND_MODULE, KIND_THREAD, PREAMBLE,
};
use mprof_common::stacks::{KIND_BRIEF, KIND_SAMPLE, KIND_STACK, SAMPLE_FIXED};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// The kind of a FRAME record.
pub const KIND_FRAME: u16 = 15;
/// The codec of a frame's payload (the record's aux): a zstd frame.
pub const CODEC_ZSTD: u16 = 1;
/// Size of the declarations after the preamble.
pub const FRAME_FIXED: usize = 24;
/// A frame is compressed once its records reach this many bytes.
pub const FRAME_TARGET: usize = 1 << 20;
/// The most bytes a frame's records may take decompressed: the target plus one record of the
/// largest size a reader accepts, with room to spare.
pub const MAX_FRAME_RAW: usize = 8 << 20;
/// The largest FRAME record a reader accepts.
pub const MAX_FRAME_RECORD: usize = PREAMBLE + FRAME_FIXED + MAX_FRAME_RAW + (1 << 16);
/// The zstd level frames are written at: 1, the fastest, as the session compresses while the
/// program runs (see docs/reading.md for sizes).
const LEVEL: i32 = 1;

/// What one frame declares (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Declared {
    pub raw: u32,
    pub nodes: u32,
    pub text: u32,
    pub samples: u32,
    pub live: u32,
    pub stacks: u32,
}

impl Declared {
    /// Reads the declarations of a FRAME body (the bytes after the preamble).
    pub fn read(body: &[u8]) -> Option<Declared> {
        let word = |i: usize| u32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap());
        (body.len() >= FRAME_FIXED).then(|| Declared {
            raw: word(0),
            nodes: word(1),
            text: word(2),
            samples: word(3),
            live: word(4),
            stacks: word(5),
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        for word in [
            self.raw,
            self.nodes,
            self.text,
            self.samples,
            self.live,
            self.stacks,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
}

/// What a record counts towards a frame's declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counts {
    Node,
    /// Bytes of names and text.
    Text(u32),
    /// A sample at this address.
    Sample(u64),
    /// A free of this address.
    Free(u64),
    Nothing,
}

impl Counts {
    /// What the whole record `bytes` (its preamble first) counts for.
    pub fn of(bytes: &[u8]) -> Counts {
        let Some(head) = bytes.get(..PREAMBLE) else {
            return Counts::Nothing;
        };
        let kind = u16::from_le_bytes([head[4], head[5]]);
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        };
        match kind {
            KIND_STACK => Counts::Node,
            KIND_CODE | KIND_THREAD | KIND_META | KIND_MODULE => Counts::Text(bytes.len() as u32),
            // The address: ALLOC and SAMPLE after tid and flags, BRIEF first.
            KIND_ALLOC | KIND_SAMPLE => word(PREAMBLE + 8).map_or(Counts::Nothing, Counts::Sample),
            KIND_BRIEF => word(PREAMBLE).map_or(Counts::Nothing, Counts::Sample),
            KIND_FREE => word(PREAMBLE).map_or(Counts::Nothing, Counts::Free),
            _ => Counts::Nothing,
        }
    }
}

/// The part of a sample record (`bytes`, whole) that carries a stack whole, if it has one: an
/// ALLOC's frames and native section, a SAMPLE's native section (see `mprof_common::stacks`).
/// A reader interns each distinct one (see [`Declared::stacks`]).
pub fn whole_stack(bytes: &[u8]) -> Option<&[u8]> {
    let fixed = match u16::from_le_bytes([*bytes.get(4)?, *bytes.get(5)?]) {
        KIND_ALLOC => PREAMBLE + ALLOC_FIXED,
        KIND_SAMPLE => PREAMBLE + SAMPLE_FIXED,
        _ => return None,
    };
    bytes.get(fixed..).filter(|rest| !rest.is_empty())
}

/// The whole stacks seen so far in a capture, by a hash of their bytes, to count each distinct
/// one once. The hash is a quick one, a word at a time (a `--native --rate 1` session hashes
/// hundreds of MB a second): a crafted capture that makes two stacks collide only makes the
/// reader count fewer bytes than it reads, and the reader's memory is measured anyway.
#[derive(Default)]
pub struct SeenStacks {
    hashes: HashSet<u64, BuildHasherDefault<GroupHasher>>,
}

impl SeenStacks {
    /// The bytes of `bytes`' whole stack if it carries one not seen before (now seen), else 0.
    pub fn new_bytes(&mut self, bytes: &[u8]) -> u32 {
        let Some(stack) = whole_stack(bytes) else {
            return 0;
        };
        let mut hash = stack.len() as u64;
        for word in stack.chunks(8) {
            let mut w = [0u8; 8];
            w[..word.len()].copy_from_slice(word);
            hash = (hash ^ u64::from_le_bytes(w))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(29);
        }
        if self.hashes.insert(hash) {
            stack.len() as u32
        } else {
            0
        }
    }
}

/// Hashes a block's address for a table of live blocks (the writer's, and the reader's in
/// `crate::analysis`): a program allocates and frees in runs through the same pools, so the
/// four 16-byte granules of each 64 bytes of memory hash to four neighbouring buckets, and the
/// groups are scattered by a multiplicative hash; a run of samples touches fewer cache lines.
/// (Longer runs of neighbours, whole pages, make clusters that a probe walks for ever: a
/// `--rate 1` capture then took minutes to read.)
#[derive(Default)]
pub struct GroupHasher(u64);

impl Hasher for GroupHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, addr: u64) {
        self.0 = addr;
    }
    fn finish(&self) -> u64 {
        let addr = self.0;
        // hashbrown takes the bucket from the low bits and a tag from the top 7: the rotation
        // brings the product's best mixed bits (its high ones) down to the bucket.
        let group = (addr >> 6)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
        (group & !3) | (addr >> 4 & 3)
    }
}

/// The writer's side: the records of the frame being gathered, and what they declare.
#[derive(Default)]
pub struct FrameBuilder {
    raw: Vec<u8>,
    declared: Declared,
    /// The sampled blocks live now.
    live: LiveBits,
    /// The whole stacks of the capture so far.
    stacks: SeenStacks,
}

impl FrameBuilder {
    /// Counts what a record declares; `bytes` is the whole record. Packed samples and frees
    /// are counted one by one, before they join their PACKED run.
    pub fn count(&mut self, bytes: &[u8]) {
        let d = &mut self.declared;
        match Counts::of(bytes) {
            Counts::Node => d.nodes += 1,
            Counts::Text(n) => d.text = d.text.saturating_add(n),
            Counts::Sample(addr) => {
                d.samples += 1;
                self.live.insert(addr);
                d.live = d.live.max(self.live.declared());
                d.stacks = d.stacks.saturating_add(self.stacks.new_bytes(bytes));
            }
            Counts::Free(addr) => self.live.remove(addr),
            Counts::Nothing => {}
        }
    }

    /// Appends the bytes of records already counted.
    pub fn append(&mut self, bytes: &[u8]) {
        self.raw.extend_from_slice(bytes);
    }

    /// Bytes gathered.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The FRAME record of what was gathered (None if nothing was), and a fresh start. The
    /// live blocks carry over to the next frame: its `live` counts them too.
    pub fn take(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.raw.is_empty() {
            return Ok(None);
        }
        let mut declared = std::mem::take(&mut self.declared);
        declared.raw = self.raw.len() as u32;
        self.declared.live = self.live.declared();
        let mut compressor = zstd::bulk::Compressor::new(LEVEL)?;
        compressor.include_checksum(true)?;
        compressor.include_contentsize(true)?;
        let payload = compressor.compress(&self.raw)?;
        self.raw.clear();
        Ok(Some(encode(&declared, &payload)))
    }
}

/// A whole FRAME record of a payload compressed already (the writer's, and tests' crafted
/// frames).
pub fn encode(declared: &Declared, payload: &[u8]) -> Vec<u8> {
    let len = PREAMBLE + FRAME_FIXED + payload.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&KIND_FRAME.to_le_bytes());
    out.extend_from_slice(&CODEC_ZSTD.to_le_bytes());
    declared.write(&mut out);
    out.extend_from_slice(payload);
    out
}

/// The records of a frame, compressed as the writer compresses them, with the declarations
/// they make (for tests and tools that build captures by hand; PACKED runs among the records
/// count entry by entry, as the writer counts them before it packs them).
pub fn frame_of(records: &[u8]) -> Vec<u8> {
    let mut b = FrameBuilder::default();
    for_each_record(records, |r| {
        if u16::from_le_bytes([r[4], r[5]]) != KIND_PACKED {
            return b.count(r);
        }
        let mut entries = Unpacker::new(PREAMBLE, r.len());
        while let Some(Ok((item, _))) = entries.next_item(r) {
            let (bytes, len) = item.record();
            b.count(&bytes[..len]);
        }
    });
    b.append(records);
    b.take().expect("compressing in memory").unwrap_or_default()
}

/// Calls `f` with each whole record of `bytes` (records back to back); stops at the first
/// that is not whole.
fn for_each_record(bytes: &[u8], mut f: impl FnMut(&[u8])) {
    let mut at = 0;
    while let Ok((len, _, _)) = mprof_common::record::preamble(&bytes[at..]) {
        let Some(r) = bytes.get(at..at + len) else {
            return;
        };
        f(r);
        at += len;
    }
}

/// Why a frame cannot be read.
#[derive(Debug)]
pub enum FrameError {
    /// Not a frame this reader knows how to decode (a codec of a newer mprof).
    Codec(u16),
    /// A declaration or the payload is wrong.
    Corrupt(String),
}

/// Decompresses the payload of a FRAME body into `out` (cleared first), checking it against
/// its declarations' `raw`.
pub fn decompress(
    codec: u16,
    body: &[u8],
    out: &mut Vec<u8>,
    decompressor: &mut zstd::bulk::Decompressor<'static>,
) -> Result<Declared, FrameError> {
    if codec != CODEC_ZSTD {
        return Err(FrameError::Codec(codec));
    }
    let declared = Declared::read(body)
        .ok_or_else(|| FrameError::Corrupt("a frame shorter than its declarations".into()))?;
    let raw = declared.raw as usize;
    if raw > MAX_FRAME_RAW {
        return Err(FrameError::Corrupt(format!(
            "a frame declares {raw} bytes of records"
        )));
    }
    out.clear();
    out.reserve(raw);
    let n = decompressor
        .decompress_to_buffer(&body[FRAME_FIXED..], out)
        .map_err(|e| FrameError::Corrupt(format!("a frame does not decompress ({e})")))?;
    if n != raw {
        return Err(FrameError::Corrupt(format!(
            "a frame holds {n} bytes of records, declares {raw}"
        )));
    }
    Ok(declared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::record::{encode as encode_record, Record};
    use mprof_common::stacks::{encode_brief, encode_stack, Node};

    #[test]
    fn a_frame_declares_what_it_holds() {
        let mut records = Vec::new();
        records.extend(encode_record(&Record::Meta {
            text: "rate=1\n".into(),
        }));
        records.extend(encode_stack(1, &Node::default()));
        for addr in [16u64, 32, 48, 16] {
            records.extend(encode_brief(addr, 8, 1, 1));
        }
        records.extend(encode_record(&Record::Free { addr: 32 }));
        records.extend(encode_brief(64, 8, 1, 1));
        let frame = frame_of(&records);
        let declared = Declared::read(&frame[PREAMBLE..]).unwrap();
        assert_eq!(
            declared,
            Declared {
                raw: records.len() as u32,
                nodes: 1,
                text: 8 + 7,
                samples: 5,
                live: 3,
                stacks: 0,
            }
        );
        let mut out = Vec::new();
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        let got = decompress(CODEC_ZSTD, &frame[PREAMBLE..], &mut out, &mut d).unwrap();
        assert_eq!((got, &out), (declared, &records));
        let mut bad = frame.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decompress(CODEC_ZSTD, &bad[PREAMBLE..], &mut out, &mut d).is_err());
        assert!(matches!(
            decompress(7, &frame[PREAMBLE..], &mut out, &mut d),
            Err(FrameError::Codec(7))
        ));
    }

    /// The whole stacks of samples are declared by their bytes, each distinct one once in the
    /// capture, whatever the frame it comes back in.
    #[test]
    fn each_distinct_whole_stack_is_declared_once() {
        use mprof_common::stacks::{encode_sample, Sample};
        let sample = |addr: u64, native: &[u64]| {
            let s = Sample {
                tid: 1,
                flags: mprof_common::record::ALLOC_NATIVE_STACK,
                addr,
                size: 8,
                time_ns: 1,
                stack: 1,
            };
            encode_sample(&s, 1, Some(native))
        };
        let (a, b) = ([1u64, 2, 3], [1u64, 2, 3, 4]);
        let mut builder = FrameBuilder::default();
        let mut declared = |records: &[Vec<u8>]| {
            for r in records {
                builder.count(r);
                builder.append(r);
            }
            let frame = builder.take().unwrap().unwrap();
            Declared::read(&frame[PREAMBLE..]).unwrap().stacks
        };
        // A native section: its count and its addresses (8 + 8 per address).
        let first = declared(&[sample(16, &a), sample(32, &a), sample(48, &b)]);
        assert_eq!(first, (8 + 24) + (8 + 32));
        assert_eq!(declared(&[sample(64, &b), sample(80, &a)]), 0);
        assert_eq!(declared(&[sample(96, &[9])]), 8 + 8);
    }
}
