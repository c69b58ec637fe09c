//! Packed samples: the capture file's compact form of the two records a busy session is mostly
//! made of, BRIEF (24 bytes in the ring: a sample) and FREE (16 bytes: a sampled block's free).
//!
//! The writer gathers runs of them into PACKED records (kind 14), whose body is a sequence of
//! entries, each a tag byte and then unsigned LEB128 numbers:
//!
//! ```text
//!  FREE   tag = 0b0000_0A00                        address
//!  BRIEF  tag = 0b0000_0AX1  [aux if X = 0]  size  address  node
//! ```
//! - `address`: the zigzag difference from the previous entry's address (the addresses a
//!   program allocates and frees in a row lie close together), divided by 16 when `A` is set
//!   (the difference was a multiple of 16, as it is between two blocks of any allocator);
//! - `aux`: the BRIEF's aux (depth and flags), left out when `X` says it is the previous
//!   BRIEF's;
//! - `node`: the zigzag difference from the previous BRIEF's stack node.
//!
//! Every PACKED record starts from zero (address 0, node 0, no aux), so each reads alone. The
//! reader turns entries back into the BRIEF and FREE records they stand for, byte for byte.
//! Nothing else is packed: a BRIEF or FREE of an unexpected length stays a record of its own.

use mprof_common::record::{KIND_FREE, PREAMBLE};
use mprof_common::stacks::{BRIEF_BODY, KIND_BRIEF};

/// The kind of a PACKED record.
pub const KIND_PACKED: u16 = 14;
/// A PACKED record is written once its body reaches this size (or before any other record,
/// and at every flush).
pub const PACK_TARGET: usize = 64 << 10;

const TAG_BRIEF: u8 = 1;
const TAG_SAME_AUX: u8 = 2;
const TAG_BY16: u8 = 4;
const TAG_ALL: u8 = TAG_BRIEF | TAG_SAME_AUX | TAG_BY16;

/// Length of the FREE record packed entries stand for.
const FREE_LEN: usize = PREAMBLE + 8;
/// Length of the BRIEF record packed entries stand for.
const BRIEF_LEN: usize = PREAMBLE + BRIEF_BODY;

/// What a run of entries carries from one to the next.
#[derive(Clone, Copy, Default)]
struct State {
    addr: u64,
    node: u32,
    aux: Option<u16>,
}

/// Builds the body of a PACKED record.
#[derive(Default)]
pub struct Packer {
    body: Vec<u8>,
    state: State,
}

impl Packer {
    /// Adds `record` (a whole encoded record) if it is a BRIEF or FREE of the usual length;
    /// returns the bytes it added, None when it is not packed.
    pub fn add(&mut self, record: &[u8]) -> Option<usize> {
        let kind = u16::from_le_bytes(record.get(4..6)?.try_into().ok()?);
        let len = u32::from_le_bytes(record.get(..4)?.try_into().ok()?) as usize;
        let aux = u16::from_le_bytes(record.get(6..8)?.try_into().ok()?);
        let before = self.body.len();
        let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap());
        match (kind, len, record.len()) {
            (KIND_FREE, FREE_LEN, FREE_LEN) if aux == 0 => {
                self.body.push(0);
                self.body[before] = self.address(word(PREAMBLE));
            }
            (KIND_BRIEF, BRIEF_LEN, BRIEF_LEN) => {
                let size = u32::from_le_bytes(record[16..20].try_into().unwrap());
                let node = u32::from_le_bytes(record[20..24].try_into().unwrap());
                let mut tag = TAG_BRIEF;
                self.body.push(0);
                if self.state.aux == Some(aux) {
                    tag |= TAG_SAME_AUX;
                } else {
                    put(&mut self.body, aux as u64);
                    self.state.aux = Some(aux);
                }
                put(&mut self.body, size as u64);
                tag |= self.address(word(PREAMBLE));
                put(
                    &mut self.body,
                    zigzag(node.wrapping_sub(self.state.node) as i32 as i64),
                );
                self.state.node = node;
                self.body[before] = tag;
            }
            _ => return None,
        }
        Some(self.body.len() - before)
    }

    /// Appends an address as its difference from the previous one; returns its tag bits.
    fn address(&mut self, addr: u64) -> u8 {
        let delta = addr.wrapping_sub(self.state.addr) as i64;
        self.state.addr = addr;
        if delta % 16 == 0 {
            put(&mut self.body, zigzag(delta / 16));
            TAG_BY16
        } else {
            put(&mut self.body, zigzag(delta));
            0
        }
    }

    /// Bytes gathered so far.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// The PACKED record of what was gathered (None if nothing was), and a fresh start.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        if self.body.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(PREAMBLE + self.body.len());
        out.extend_from_slice(&((PREAMBLE + self.body.len()) as u32).to_le_bytes());
        out.extend_from_slice(&KIND_PACKED.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.body);
        self.body.clear();
        self.state = State::default();
        Some(out)
    }
}

/// Reads the entries of one PACKED record back. It holds no bytes of its own: each call is
/// given the body it reads from (the same body every time), so that a reader can unpack in
/// place, inside the frame that holds the run.
#[derive(Clone, Copy)]
pub struct Unpacker {
    at: usize,
    end: usize,
    state: State,
}

/// One entry read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// A FREE of this address.
    Free(u64),
    /// A BRIEF: its aux, size, address and stack node.
    Brief {
        aux: u16,
        size: u32,
        addr: u64,
        node: u32,
    },
}

impl Default for Item {
    fn default() -> Item {
        Item::Free(0)
    }
}

/// One entry read back as the record it stands for, in a buffer big enough for either kind.
pub struct Entry {
    bytes: [u8; BRIEF_LEN],
    len: usize,
    packed: usize,
}

impl Entry {
    /// The record the entry stands for.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The entry's own size in the PACKED record.
    pub fn packed(&self) -> usize {
        self.packed
    }
}

impl Item {
    /// The record the entry stands for, byte for byte.
    pub fn record(&self) -> ([u8; BRIEF_LEN], usize) {
        let mut bytes = [0u8; BRIEF_LEN];
        match *self {
            Item::Free(addr) => {
                header(&mut bytes, FREE_LEN, KIND_FREE, 0);
                bytes[PREAMBLE..FREE_LEN].copy_from_slice(&addr.to_le_bytes());
                (bytes, FREE_LEN)
            }
            Item::Brief {
                aux,
                size,
                addr,
                node,
            } => {
                header(&mut bytes, BRIEF_LEN, KIND_BRIEF, aux);
                bytes[8..16].copy_from_slice(&addr.to_le_bytes());
                bytes[16..20].copy_from_slice(&size.to_le_bytes());
                bytes[20..24].copy_from_slice(&node.to_le_bytes());
                (bytes, BRIEF_LEN)
            }
        }
    }

    /// The address of the block the entry allocates or frees.
    pub fn addr(&self) -> u64 {
        match *self {
            Item::Free(addr) | Item::Brief { addr, .. } => addr,
        }
    }

    /// The length of the record it stands for.
    pub fn unpacked_len(&self) -> usize {
        match self {
            Item::Free(_) => FREE_LEN,
            Item::Brief { .. } => BRIEF_LEN,
        }
    }
}

impl Unpacker {
    /// The entries of the PACKED body `body[start..end]`.
    pub fn new(start: usize, end: usize) -> Unpacker {
        Unpacker {
            at: start,
            end,
            state: State::default(),
        }
    }

    /// The next entry of `body` (the body this unpacker was made for) and its own size;
    /// None at the end; an error for a malformed entry (after which nothing more is read).
    #[inline(always)]
    pub fn next_item(&mut self, body: &[u8]) -> Option<Result<(Item, usize), &'static str>> {
        if self.at >= self.end {
            return None;
        }
        let start = self.at;
        let body = &body[..self.end.min(body.len())];
        let item = self.read(body);
        if item.is_err() {
            self.at = self.end;
        }
        Some(item.map(|i| (i, self.at - start)))
    }

    /// [`Unpacker::next_item`] as the record the entry stands for.
    pub fn next_entry(&mut self, body: &[u8]) -> Option<Result<Entry, &'static str>> {
        self.next_item(body).map(|r| {
            r.map(|(item, packed)| {
                let (bytes, len) = item.record();
                Entry { bytes, len, packed }
            })
        })
    }

    #[inline(always)]
    fn read(&mut self, body: &[u8]) -> Result<Item, &'static str> {
        let tag = *body.get(self.at).ok_or("packed entry cut short")?;
        self.at += 1;
        if tag & !TAG_ALL != 0 || tag & (TAG_BRIEF | TAG_SAME_AUX) == TAG_SAME_AUX {
            return Err("packed entry with an unknown tag");
        }
        if tag & TAG_BRIEF == 0 {
            return Ok(Item::Free(self.address(body, tag)?));
        }
        let aux = if tag & TAG_SAME_AUX != 0 {
            self.state
                .aux
                .ok_or("packed entry repeats an aux before any")?
        } else {
            let aux = u16::try_from(self.number(body)?).map_err(|_| "packed aux out of range")?;
            self.state.aux = Some(aux);
            aux
        };
        let size = u32::try_from(self.number(body)?).map_err(|_| "packed size out of range")?;
        let addr = self.address(body, tag)?;
        let step = unzigzag(self.number(body)?);
        let step = i32::try_from(step).map_err(|_| "packed node step out of range")?;
        let node = self.state.node.wrapping_add(step as u32);
        self.state.node = node;
        Ok(Item::Brief {
            aux,
            size,
            addr,
            node,
        })
    }

    #[inline(always)]
    fn address(&mut self, body: &[u8], tag: u8) -> Result<u64, &'static str> {
        let delta = unzigzag(self.number(body)?);
        let delta = if tag & TAG_BY16 != 0 {
            delta
                .checked_mul(16)
                .ok_or("packed address step out of range")?
        } else {
            delta
        };
        self.state.addr = self.state.addr.wrapping_add(delta as u64);
        Ok(self.state.addr)
    }

    /// An unsigned LEB128 number of at most 64 bits.
    #[inline(always)]
    fn number(&mut self, body: &[u8]) -> Result<u64, &'static str> {
        // The bytes of the longest number are there (most are): one bounds check for all.
        if let Some(bytes) = body.get(self.at..self.at + 10) {
            let bytes: &[u8; 10] = bytes.try_into().expect("ten bytes");
            let mut value = 0u64;
            for (i, &byte) in bytes.iter().enumerate() {
                value |= ((byte & 0x7f) as u64) << (7 * i);
                if byte & 0x80 == 0 {
                    self.at += i + 1;
                    return match i == 9 && byte > 1 {
                        true => Err("packed number over 64 bits"),
                        false => Ok(value),
                    };
                }
            }
            self.at += 10;
            return Err("packed number over 64 bits");
        }
        self.number_bytewise(body)
    }

    /// [`Unpacker::number`] byte by byte, within ten bytes of the end of the body.
    #[cold]
    fn number_bytewise(&mut self, body: &[u8]) -> Result<u64, &'static str> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = body.get(self.at) else {
                return Err("packed entry cut short");
            };
            self.at += 1;
            let bits = (byte & 0x7f) as u64;
            if shift == 63 && bits > 1 {
                return Err("packed number over 64 bits");
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("packed number over 64 bits")
    }
}

fn header(out: &mut [u8], len: usize, kind: u16, aux: u16) {
    out[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    out[4..6].copy_from_slice(&kind.to_le_bytes());
    out[6..8].copy_from_slice(&aux.to_le_bytes());
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::record::{encode, Record};
    use mprof_common::stacks::encode_brief;

    fn brief(aux: u16, addr: u64, size: u32, node: u32) -> Vec<u8> {
        encode_brief(addr, size, node, aux)
    }

    fn free(addr: u64) -> Vec<u8> {
        encode(&Record::Free { addr })
    }

    fn unpack(record: &[u8]) -> Vec<Vec<u8>> {
        let mut u = Unpacker::new(PREAMBLE, record.len());
        let mut out = Vec::new();
        while let Some(e) = u.next_entry(record) {
            out.push(e.unwrap().bytes().to_vec());
        }
        out
    }

    /// Records of every shape (aligned and odd addresses, steps up and down, extreme values,
    /// repeated and changing aux and nodes) read back byte for byte.
    #[test]
    fn packed_records_read_back_byte_for_byte() {
        let mut records = vec![
            brief(3, 0x7f00_0000_1000, 100, 7),
            free(0x7f00_0000_1000),
            brief(3, 0x7f00_0000_1010, 200, 8),
            brief(3, 0x7f00_0000_0ff0, u32::MAX, 2),
            brief(0x8005, 0x5555_0000_0008, 0, u32::MAX),
            free(u64::MAX),
            free(0),
            brief(0xffff, 1, 1, 0),
            brief(0, u64::MAX - 7, 24, 1 << 31),
            free(0x7f00_0000_1010),
        ];
        for i in 0..1000u64 {
            records.push(brief(
                5,
                0x7f12_3400_0000 + (i * 7919 % 4096) * 16,
                64,
                (i % 9) as u32,
            ));
            records.push(free(0x7f12_3400_0000 + (i * 104_729 % 4096) * 16));
        }
        let mut p = Packer::default();
        let mut packed_bytes = 0;
        for r in &records {
            packed_bytes += p.add(r).expect("packed");
        }
        let whole: usize = records.iter().map(Vec::len).sum();
        let record = p.take().unwrap();
        assert_eq!(record.len(), PREAMBLE + packed_bytes);
        assert!(p.take().is_none());
        assert_eq!(unpack(&record), records);
        assert!(
            record.len() * 3 < whole,
            "{} packed bytes for {whole}",
            record.len()
        );
    }

    /// The number read from a window of ten bytes and the number read byte by byte agree,
    /// value, length and error alike: on every length and on random bytes, overlong and over
    /// 64 bits among them.
    #[test]
    fn numbers_read_as_words_as_byte_by_byte() {
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for bits in 0..64 {
            for v in [1u64 << bits, (1u64 << bits) - 1, u64::MAX >> bits] {
                let mut b = Vec::new();
                put(&mut b, v);
                inputs.push(b);
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly high bits set, so that long numbers come often.
            let bytes = x
                .to_le_bytes()
                .map(|b| if b & 3 != 0 { b | 0x80 } else { b });
            inputs.push([bytes, x.rotate_left(17).to_le_bytes()].concat());
        }
        for input in inputs {
            for pad in [0, 3, 12] {
                let mut body = input.clone();
                body.extend(std::iter::repeat_n(0x80, pad));
                let (mut word, mut byte) =
                    (Unpacker::new(0, body.len()), Unpacker::new(0, body.len()));
                let got = word.number(&body);
                let want = byte.number_bytewise(&body);
                assert_eq!(got, want, "{body:02x?}");
                if want.is_ok() {
                    assert_eq!(word.at, byte.at, "{body:02x?}");
                }
            }
        }
    }

    #[test]
    fn other_records_are_not_packed() {
        let mut p = Packer::default();
        let code = encode(&Record::End {
            reason: 1,
            time_ns: 5,
        });
        assert_eq!(p.add(&code), None);
        let mut long_free = free(16);
        long_free[0] = 24;
        long_free.extend_from_slice(&[0; 8]);
        assert_eq!(p.add(&long_free), None);
        assert_eq!(p.add(&free(16)[..12]), None);
        assert!(p.is_empty());
    }

    /// Every cut and every flipped byte of a packed record either reads or says why, and
    /// never reads past the body.
    #[test]
    fn damaged_packs_read_or_fail_cleanly() {
        let mut p = Packer::default();
        for i in 0..50u64 {
            p.add(&brief(
                i as u16 % 3,
                0x1000 + i * 48,
                i as u32,
                i as u32 * 3,
            ));
            p.add(&free(0x1000 + i * 32 + 8));
        }
        let record = p.take().unwrap();
        let body = &record[PREAMBLE..];
        for cut in 0..body.len() {
            let mut u = Unpacker::new(0, cut);
            while let Some(e) = u.next_entry(body) {
                if e.is_err() {
                    break;
                }
            }
        }
        for at in 0..body.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = body.to_vec();
                bad[at] ^= flip;
                let mut u = Unpacker::new(0, bad.len());
                let mut n = 0;
                while let Some(e) = u.next_entry(&bad) {
                    n += 1;
                    if e.is_err() {
                        break;
                    }
                }
                assert!(n <= body.len());
            }
        }
        let one = |body: &[u8]| {
            let mut u = Unpacker::new(0, body.len());
            let first = u.next_entry(body).unwrap().is_err();
            first && u.next_entry(body).is_none()
        };
        assert!(one(&[TAG_BRIEF | TAG_SAME_AUX, 0, 0, 0]));
        assert!(one(&[0x40]));
        assert!(one(&[vec![0], vec![0xff; 10], vec![0x7f]].concat()));
    }
}
