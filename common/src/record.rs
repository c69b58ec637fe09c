//! Record encoding, shared by the ring and the capture file.
//!
//! Every record starts with an 8-byte preamble, then a kind-specific body. All integers are
//! little-endian (the agent writes native order; mprof supports x86-64 and aarch64 Linux only).
//!
//! ```text
//!  0        4      6      8
//!  +--------+------+------+---------------- ... ---+
//!  | len:u32|kind  | aux  | body (len - 8 bytes)    |
//!  +--------+------+------+---------------- ... ---+
//! ```
//! `len` counts the whole record including the preamble. In the ring, records are padded to a
//! multiple of 8 (the padding is part of `len`); readers must ignore trailing bytes of a body.
//!
//! Kinds are only ever appended, never renumbered, so old captures keep loading. A reader skips
//! kinds it does not know.
//!
//! | kind | name    | aux       | body                                                        |
//! |------|---------|-----------|-------------------------------------------------------------|
//! | 0    | PAD     | -         | nothing (ring filler at the wrap point)                     |
//! | 1    | ALLOC   | nframes   | tid u32, flags u32, addr u64, size u64, time_ns u64, frames |
//! | 2    | FREE    | -         | addr u64                                                    |
//! | 3    | CODE    | -         | code u64, firstline u32, filename_len u16, name_len u16,    |
//! |      |         |           | filename bytes, name bytes (UTF-8)                          |
//! | 4    | THREAD  | -         | tid u32, name_len u32, name bytes                           |
//! | 5    | RSS     | -         | time_ns u64, rss_bytes u64                                  |
//! | 6    | END     | reason    | time_ns u64                                                 |
//! | 7    | META    | -         | UTF-8 text, `key=value` lines                               |
//! | 8    | STATS   | -         | samples u64, dropped u64                                    |
//! | 9    | MODULE  | -         | a loaded object and where it is mapped (see [`Module`])     |
//! | 20   | HEAP    | -         | the allocators' statistics (see [`HeapStats`])              |
//! | 21   | RESIDENT| -         | mappings and their resident bytes (see [`Resident`])        |
//! | 22   | SPAWN   | depth     | serial u32, tid u32, stack u32, flags u32 (see [`threads`]) |
//! | 23   | SPAWNED | -         | serial u32, pad u32, handle u64                             |
//! | 24   | HANDLE  | -         | tid u32, serial u32, handle u64                             |
//!
//! A frame in ALLOC is 16 bytes: code u64 (the code object's address, announced by a CODE
//! record before its first use), line u32, pad u32. Frames are innermost first. ALLOC flags:
//! bit 0 the stack was cut; bits 1–2 the allocator (0 Python's PEP 445 domains, 1 the C
//! allocator family `malloc`…, 2 anonymous `mmap`); bit 3 a native stack follows the frames
//! (`--native`, see [`NativeStack`]).
//! `time_ns` is CLOCK_MONOTONIC in nanoseconds; samples and RSS readings are stamped from its
//! coarse form (CLOCK_MONOTONIC_COARSE: to the kernel's tick, a few milliseconds).

use std::fmt;

mod allocator;
mod module;
mod native;
mod resident;
pub mod threads;
pub use allocator::{Allocator, ALLOCATOR_MASK, ALLOCATOR_SHIFT};
pub use module::{Module, ModuleRange, MODULE_BIAS_FROM_ELF, MODULE_DELETED, MODULE_MAIN};
pub use native::{native_stack, NativeStack, MAX_NATIVE_FRAMES};
pub use resident::{
    AnonMapping, HeapStats, Resident, MALLOC_GLIBC, MALLOC_JEMALLOC, MALLOC_OTHER, MALLOC_UNKNOWN,
    MAX_ANON, MAX_NAMED,
};

/// Size of the preamble that starts every record.
pub const PREAMBLE: usize = 8;
/// Size of the fixed part of an ALLOC body.
pub const ALLOC_FIXED: usize = 32;
/// Size of one frame in an ALLOC record.
pub const FRAME_SIZE: usize = 16;
/// Size of the fixed part of a CODE body.
pub const CODE_FIXED: usize = 16;
/// Largest record a reader accepts; anything larger is corruption.
pub const MAX_RECORD: usize = 1 << 24;

pub const KIND_PAD: u16 = 0;
pub const KIND_ALLOC: u16 = 1;
pub const KIND_FREE: u16 = 2;
pub const KIND_CODE: u16 = 3;
pub const KIND_THREAD: u16 = 4;
pub const KIND_RSS: u16 = 5;
pub const KIND_END: u16 = 6;
pub const KIND_META: u16 = 7;
pub const KIND_STATS: u16 = 8;
pub const KIND_MODULE: u16 = 9;
pub const KIND_HEAP: u16 = 20;
pub const KIND_RESIDENT: u16 = 21;
pub use threads::{KIND_HANDLE, KIND_SPAWN, KIND_SPAWNED};

/// ALLOC flag: the stack was cut at `max_depth`.
pub const ALLOC_TRUNCATED: u32 = 1;
/// ALLOC flag: a native stack section follows the Python frames (see [`NativeStack`]).
pub const ALLOC_NATIVE_STACK: u32 = 1 << 3;

/// Why the agent stopped sampling (the `aux` of an END record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum EndReason {
    /// The interpreter started finalizing: the program is done.
    Finalizing = 1,
    /// The reader asked the agent to stop (detach).
    Detached = 2,
    /// The reader stopped answering; the agent switched itself off.
    ReaderGone = 3,
}

impl EndReason {
    pub fn from_u16(v: u16) -> Option<EndReason> {
        match v {
            1 => Some(EndReason::Finalizing),
            2 => Some(EndReason::Detached),
            3 => Some(EndReason::ReaderGone),
            _ => None,
        }
    }
}

/// One frame of a sampled stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    pub code: u64,
    pub line: u32,
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Alloc {
        tid: u32,
        flags: u32,
        addr: u64,
        size: u64,
        time_ns: u64,
        frames: Vec<Frame>,
        /// The native section (`--native`), when the flags say one follows.
        native: Option<NativeStack>,
    },
    Free {
        addr: u64,
    },
    Code {
        code: u64,
        firstline: u32,
        filename: String,
        name: String,
    },
    Thread {
        tid: u32,
        name: String,
    },
    Rss {
        time_ns: u64,
        rss_bytes: u64,
    },
    End {
        reason: u16,
        time_ns: u64,
    },
    Meta {
        text: String,
    },
    Stats {
        samples: u64,
        dropped: u64,
    },
    /// A loaded object (written by mprof from the target's memory map, for `--native`).
    Module(Module),
    /// The allocators' statistics (written by the agent).
    Heap(HeapStats),
    /// The process's mappings and their resident bytes (written by mprof).
    Resident(Resident),
    /// A thread is being created (see [`threads`]): `node` and `depth` name the creating
    /// thread's stack among the interned nodes, which only a reader that keeps them turns into
    /// `frames` (empty as decoded here).
    Spawn {
        serial: u32,
        tid: u32,
        node: u32,
        depth: u16,
        truncated: bool,
        frames: Vec<Frame>,
    },
    /// Creation `serial` returned the new thread's `pthread_t` (0: it failed).
    Spawned {
        serial: u32,
        handle: u64,
    },
    /// Thread `tid` is the one whose `pthread_t` is `handle`, made by creation `serial` if
    /// the agent could tell (else 0).
    Handle {
        tid: u32,
        handle: u64,
        serial: u32,
    },
    /// A kind this reader does not know (written by a newer mprof): skipped.
    Unknown {
        kind: u16,
    },
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the preamble or the declared length: a truncated tail.
    Truncated { needed: usize, have: usize },
    /// A length or field that cannot be right.
    Corrupt(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { needed, have } => {
                write!(f, "truncated record: needs {needed} bytes, {have} left")
            }
            DecodeError::Corrupt(why) => write!(f, "corrupt record: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Reads the preamble at the start of `buf`: `(len, kind, aux)`.
#[inline]
pub fn preamble(buf: &[u8]) -> Result<(usize, u16, u16), DecodeError> {
    if buf.len() < PREAMBLE {
        return Err(DecodeError::Truncated {
            needed: PREAMBLE,
            have: buf.len(),
        });
    }
    let len = u32_at(buf, 0) as usize;
    if !(PREAMBLE..=MAX_RECORD).contains(&len) {
        return Err(DecodeError::Corrupt(format!("record length {len}")));
    }
    Ok((len, u16_at(buf, 4), u16_at(buf, 6)))
}

/// Decodes the record at the start of `buf`; returns it and the number of bytes it used.
pub fn decode(buf: &[u8]) -> Result<(Record, usize), DecodeError> {
    let (len, kind, aux) = preamble(buf)?;
    if buf.len() < len {
        return Err(DecodeError::Truncated {
            needed: len,
            have: buf.len(),
        });
    }
    let body = &buf[PREAMBLE..len];
    let need = |n: usize| -> Result<(), DecodeError> {
        if body.len() < n {
            Err(DecodeError::Corrupt(format!(
                "kind {kind} body is {} bytes, needs {n}",
                body.len()
            )))
        } else {
            Ok(())
        }
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let record =
        match kind {
            KIND_ALLOC => {
                let nframes = aux as usize;
                need(ALLOC_FIXED + nframes * FRAME_SIZE)?;
                let frames = (0..nframes)
                    .map(|i| {
                        let at = ALLOC_FIXED + i * FRAME_SIZE;
                        Frame {
                            code: u64_at(body, at),
                            line: u32_at(body, at + 8),
                        }
                    })
                    .collect();
                let flags = u32_at(body, 4);
                Record::Alloc {
                    tid: u32_at(body, 0),
                    flags,
                    addr: u64_at(body, 8),
                    size: u64_at(body, 16),
                    time_ns: u64_at(body, 24),
                    frames,
                    native: native_stack(body, nframes, flags),
                }
            }
            KIND_FREE => {
                need(8)?;
                Record::Free {
                    addr: u64_at(body, 0),
                }
            }
            KIND_CODE => {
                need(CODE_FIXED)?;
                let flen = u16_at(body, 12) as usize;
                let nlen = u16_at(body, 14) as usize;
                need(CODE_FIXED + flen + nlen)?;
                let f = &body[CODE_FIXED..CODE_FIXED + flen];
                let n = &body[CODE_FIXED + flen..CODE_FIXED + flen + nlen];
                Record::Code {
                    code: u64_at(body, 0),
                    firstline: u32_at(body, 8),
                    filename: text(f),
                    name: text(n),
                }
            }
            KIND_THREAD => {
                need(8)?;
                let nlen = u32_at(body, 4) as usize;
                need(8 + nlen)?;
                Record::Thread {
                    tid: u32_at(body, 0),
                    name: text(&body[8..8 + nlen]),
                }
            }
            KIND_RSS => {
                need(16)?;
                Record::Rss {
                    time_ns: u64_at(body, 0),
                    rss_bytes: u64_at(body, 8),
                }
            }
            KIND_END => {
                need(8)?;
                Record::End {
                    reason: aux,
                    time_ns: u64_at(body, 0),
                }
            }
            KIND_META => Record::Meta {
                text: text(body.split(|&c| c == 0).next().unwrap_or(&[])),
            },
            KIND_HEAP => Record::Heap(HeapStats::read(body).ok_or_else(|| {
                DecodeError::Corrupt(format!("HEAP body is {} bytes", body.len()))
            })?),
            KIND_RESIDENT => Record::Resident(
                Resident::decode(body)
                    .ok_or_else(|| DecodeError::Corrupt("RESIDENT body out of bounds".into()))?,
            ),
            KIND_STATS => {
                need(16)?;
                Record::Stats {
                    samples: u64_at(body, 0),
                    dropped: u64_at(body, 8),
                }
            }
            KIND_MODULE => Record::Module(Module::decode(body).map_err(DecodeError::Corrupt)?),
            KIND_SPAWN => {
                let (serial, tid, node, flags) = threads::read_spawn(body)
                    .ok_or_else(|| DecodeError::Corrupt("SPAWN body too short".into()))?;
                Record::Spawn {
                    serial,
                    tid,
                    node,
                    depth: aux,
                    truncated: flags & threads::SPAWN_TRUNCATED != 0,
                    frames: Vec::new(),
                }
            }
            KIND_SPAWNED | KIND_HANDLE => {
                let (id, handle) = threads::read_handle(body)
                    .ok_or_else(|| DecodeError::Corrupt(format!("kind {kind} body too short")))?;
                match kind {
                    KIND_SPAWNED => Record::Spawned { serial: id, handle },
                    _ => Record::Handle {
                        tid: id,
                        handle,
                        serial: threads::handle_serial(body),
                    },
                }
            }
            other => Record::Unknown { kind: other },
        };
    Ok((record, len))
}

/// Encodes a record (used by the CLI for the records it adds, and by tests).
pub fn encode(record: &Record) -> Vec<u8> {
    let mut body = Vec::new();
    let mut aux = 0u16;
    let kind = match record {
        Record::Alloc {
            tid,
            flags,
            addr,
            size,
            time_ns,
            frames,
            native,
        } => {
            aux = frames.len() as u16;
            let flags = match native {
                Some(_) => flags | ALLOC_NATIVE_STACK,
                None => *flags,
            };
            body.extend_from_slice(&tid.to_le_bytes());
            body.extend_from_slice(&flags.to_le_bytes());
            body.extend_from_slice(&addr.to_le_bytes());
            body.extend_from_slice(&size.to_le_bytes());
            body.extend_from_slice(&time_ns.to_le_bytes());
            for f in frames {
                body.extend_from_slice(&f.code.to_le_bytes());
                body.extend_from_slice(&f.line.to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes());
            }
            if let Some(native) = native {
                body.extend_from_slice(&native.encode());
            }
            KIND_ALLOC
        }
        Record::Free { addr } => {
            body.extend_from_slice(&addr.to_le_bytes());
            KIND_FREE
        }
        Record::Code {
            code,
            firstline,
            filename,
            name,
        } => {
            body.extend_from_slice(&code.to_le_bytes());
            body.extend_from_slice(&firstline.to_le_bytes());
            body.extend_from_slice(&(filename.len() as u16).to_le_bytes());
            body.extend_from_slice(&(name.len() as u16).to_le_bytes());
            body.extend_from_slice(filename.as_bytes());
            body.extend_from_slice(name.as_bytes());
            KIND_CODE
        }
        Record::Thread { tid, name } => {
            body.extend_from_slice(&tid.to_le_bytes());
            body.extend_from_slice(&(name.len() as u32).to_le_bytes());
            body.extend_from_slice(name.as_bytes());
            KIND_THREAD
        }
        Record::Rss { time_ns, rss_bytes } => {
            body.extend_from_slice(&time_ns.to_le_bytes());
            body.extend_from_slice(&rss_bytes.to_le_bytes());
            KIND_RSS
        }
        Record::End { reason, time_ns } => {
            aux = *reason;
            body.extend_from_slice(&time_ns.to_le_bytes());
            KIND_END
        }
        Record::Meta { text } => {
            body.extend_from_slice(text.as_bytes());
            KIND_META
        }
        Record::Stats { samples, dropped } => {
            body.extend_from_slice(&samples.to_le_bytes());
            body.extend_from_slice(&dropped.to_le_bytes());
            KIND_STATS
        }
        Record::Module(module) => {
            module.encode(&mut body);
            KIND_MODULE
        }
        Record::Heap(stats) => {
            body.resize(HeapStats::BODY, 0);
            stats.write(&mut body);
            KIND_HEAP
        }
        Record::Resident(resident) => {
            resident.encode(&mut body);
            KIND_RESIDENT
        }
        Record::Spawn {
            serial,
            tid,
            node,
            depth,
            truncated,
            ..
        } => {
            aux = *depth;
            body.resize(threads::THREAD_BODY, 0);
            let flags = if *truncated {
                threads::SPAWN_TRUNCATED
            } else {
                0
            };
            threads::write_spawn(&mut body, *serial, *tid, *node, flags);
            KIND_SPAWN
        }
        Record::Spawned { serial, handle } => {
            body.resize(threads::THREAD_BODY, 0);
            threads::write_handle(&mut body, *serial, *handle);
            KIND_SPAWNED
        }
        Record::Handle {
            tid,
            handle,
            serial,
        } => {
            body.resize(threads::THREAD_BODY, 0);
            threads::write_handle(&mut body, *tid, *handle);
            body[4..8].copy_from_slice(&serial.to_le_bytes());
            KIND_HANDLE
        }
        Record::Unknown { kind } => *kind,
    };
    let len = PREAMBLE + body.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&aux.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests;
