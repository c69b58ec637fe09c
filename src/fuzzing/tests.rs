//! The bounded fuzz run that CI does, and crafted worst cases.

use super::*;
use crate::capture::pack::{Packer, KIND_PACKED};
use mprof_common::record::{
    encode, Frame, Module, ModuleRange, NativeStack, Record, KIND_ALLOC, KIND_CODE, PREAMBLE,
};
use mprof_common::stacks::{
    brief_aux, encode_brief, encode_context, encode_sample, encode_stack, Node, Sample, KIND_BRIEF,
    KIND_CONTEXT, KIND_SAMPLE, KIND_STACK,
};

/// A small deterministic random source (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn header() -> Vec<u8> {
    let mut bytes = b"MPROFCAP".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes
}

/// A name that is short and plain, or long, or full of control characters.
fn name(rng: &mut Rng) -> String {
    let len = match rng.below(8) {
        0 => 300 + rng.below(3000),
        1 => 0,
        _ => 1 + rng.below(40),
    };
    (0..len)
        .map(|_| match rng.below(6) {
            0 => char::from(rng.below(32) as u8),
            1 => ['\u{9b}', '\u{202e}', 'é', '名', '\x7f'][rng.below(5)],
            _ => char::from(b'a' + rng.below(26) as u8),
        })
        .collect()
}

/// A random but well-formed record stream: the reader must take it like a real capture.
fn generated(rng: &mut Rng) -> Vec<u8> {
    let mut bytes = header();
    let codes = 1 + rng.below(40) as u64;
    // Interned stacks: ids defined so far (a SAMPLE may also name one never defined).
    let mut nodes = 0u32;
    for _ in 0..rng.below(400) {
        if rng.below(12) == 0 {
            bytes.extend_from_slice(&packed(rng, codes, &mut nodes));
            continue;
        }
        if rng.below(4) == 0 {
            bytes.extend_from_slice(&interned(rng, codes, &mut nodes));
            continue;
        }
        let record = match rng.below(14) {
            0..=1 => Record::Code {
                code: rng.below(codes as usize) as u64,
                firstline: rng.next() as u32,
                filename: name(rng),
                name: name(rng),
            },
            2..=6 => {
                let depth = match rng.below(20) {
                    0 => 250 + rng.below(400),
                    _ => rng.below(12),
                };
                Record::Alloc {
                    native: (rng.below(3) == 0).then(|| native_stack(rng)),
                    tid: rng.below(4) as u32,
                    // Truncated or not, every allocator (and the unused value 3).
                    flags: rng.below(8) as u32,
                    addr: rng.below(64) as u64,
                    size: [0, 1, 1000, u64::MAX, rng.next() % 100_000][rng.below(5)],
                    time_ns: rng.next() % 1_000_000,
                    frames: (0..depth)
                        .map(|_| Frame {
                            code: rng.below(codes as usize + 2) as u64,
                            line: rng.below(50) as u32,
                        })
                        .collect(),
                }
            }
            7..=8 => Record::Free {
                addr: rng.below(64) as u64,
            },
            9 => Record::Meta {
                text: format!(
                    "rate={}\n{}={}\ncommand={}\n",
                    [0, 1, 4096, u64::MAX][rng.below(4)],
                    name(rng),
                    name(rng),
                    name(rng)
                ),
            },
            10 => Record::Thread {
                tid: rng.below(4) as u32,
                name: name(rng),
            },
            11 => Record::Stats {
                samples: rng.next(),
                dropped: rng.next(),
            },
            _ => Record::Module(module(rng)),
        };
        bytes.extend_from_slice(&encode(&record));
    }
    bytes
}

/// Native addresses land in the few ranges [`module`] maps, or anywhere.
fn native_address(rng: &mut Rng) -> u64 {
    match rng.below(4) {
        0 => rng.next(),
        _ => 0x10_0000 * (1 + rng.below(4) as u64) + rng.below(0x2000) as u64,
    }
}

/// A native stack (`--native`) over the Python frames of a generated sample.
fn native_stack(rng: &mut Rng) -> NativeStack {
    NativeStack {
        addrs: (0..rng.below(40)).map(|_| native_address(rng)).collect(),
        entries: (0..rng.below(5)).map(|_| rng.next()).collect(),
    }
}

/// A MODULE record: overlapping ranges, files that are missing, not files, not ELF, or this
/// very test binary; build ids that match or not.
fn module(rng: &mut Rng) -> Module {
    let path = match rng.below(6) {
        0 => "/nonexistent/libgone.so".to_owned(),
        1 => "/dev/zero".to_owned(),
        2 => "/proc/self/status".to_owned(),
        3 => "/memfd:mprof-agent.so (deleted)".to_owned(),
        4 => name(rng),
        _ => "/".to_owned(),
    };
    Module {
        bias: [0, 0x10_0000, rng.next()][rng.below(3)],
        file_size: [0, 1, rng.next()][rng.below(3)],
        flags: rng.below(8) as u32,
        build_id: (0..[0, 20, 64][rng.below(3)])
            .map(|_| rng.next() as u8)
            .collect(),
        path,
        ranges: (0..rng.below(4))
            .map(|_| {
                let start = native_address(rng) & !0xfff;
                ModuleRange {
                    start,
                    end: start.wrapping_add(rng.below(0x4000) as u64),
                    offset: rng.next() % 0x10_0000,
                }
            })
            .collect(),
    }
}

/// A STACK, SAMPLE, CONTEXT or BRIEF record: mostly well formed (parents defined before their
/// children, depths that match), sometimes not (a parent from the future, a wrong depth, a huge
/// id, a BRIEF before any CONTEXT).
fn interned(rng: &mut Rng, codes: u64, nodes: &mut u32) -> Vec<u8> {
    if rng.below(2) == 0 || *nodes == 0 {
        let id = match rng.below(30) {
            0 => [0, u32::MAX, 1 << 20, (1 << 20) + 1][rng.below(4)],
            _ => *nodes + 1,
        };
        let parent = match rng.below(30) {
            0 => id.wrapping_add(rng.below(3) as u32),
            _ => rng.below(*nodes as usize + 1) as u32,
        };
        *nodes = (*nodes).max(id.min(1 << 20));
        let node = Node {
            parent,
            code: rng.below(codes as usize + 2) as u64,
            line: rng.below(50) as u32,
            entry: rng.below(3) == 0,
        };
        return encode_stack(id, &node);
    }
    let stack = rng.below(*nodes as usize + 2) as u32;
    let depth = match rng.below(10) {
        0 => [0, 256, 257, u16::MAX][rng.below(4)],
        _ => rng.below(12) as u16,
    };
    let sample = Sample {
        tid: rng.below(4) as u32,
        flags: rng.below(8) as u32,
        addr: rng.below(64) as u64,
        size: [0, 1, 1000, u64::MAX, rng.next() % 100_000][rng.below(5)],
        time_ns: rng.next() % 1_000_000,
        stack,
    };
    match rng.below(4) {
        0 => encode_context(sample.tid, sample.time_ns),
        1 => {
            let aux = brief_aux(depth, sample.flags).unwrap_or(depth);
            encode_brief(sample.addr, sample.size as u32, stack, aux)
        }
        _ => {
            let native: Vec<u64> = (0..rng.below(5)).map(|_| native_address(rng)).collect();
            encode_sample(&sample, depth, (rng.below(2) == 0).then_some(&native[..]))
        }
    }
}

/// A PACKED record (see `capture::pack`) of a run of BRIEF and FREE records as `interned`
/// makes them (the other kinds it makes are left out), or now and then of random bytes.
fn packed(rng: &mut Rng, codes: u64, nodes: &mut u32) -> Vec<u8> {
    if rng.below(8) == 0 {
        let body: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        let mut out = ((PREAMBLE + body.len()) as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&KIND_PACKED.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&body);
        return out;
    }
    let mut packer = Packer::default();
    for _ in 0..1 + rng.below(80) {
        let record = match rng.below(3) {
            0 => encode(&Record::Free {
                addr: rng.below(64) as u64,
            }),
            _ => interned(rng, codes, nodes),
        };
        packer.add(&record);
    }
    packer.take().unwrap_or_default()
}

/// Offsets of the records in a capture, as far as they parse.
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut at = 16;
    let mut starts = Vec::new();
    while at + PREAMBLE <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len < PREAMBLE || at + len > bytes.len() {
            break;
        }
        starts.push(at);
        at += len;
    }
    starts
}

/// The records of a capture (a header, then records) put in frames as the writer does, in
/// runs of random length; now and then a frame declares less or more than it holds (a
/// crafted capture), or declares a huge amount.
fn framed(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    use crate::capture::frame::{encode, frame_of, Declared};
    let mut out = bytes[..16].to_vec();
    out[8..12].copy_from_slice(&5u32.to_le_bytes());
    let mut starts = record_starts(bytes);
    let end = starts.last().map_or(16, |&s| {
        s + u32::from_le_bytes(bytes[s..s + 4].try_into().unwrap()) as usize
    });
    starts.push(end);
    let mut i = 0;
    while i + 1 < starts.len() {
        let j = (i + 1 + rng.below(60)).min(starts.len() - 1);
        let mut frame = frame_of(&bytes[starts[i]..starts[j]]);
        if rng.below(6) == 0 && frame.len() >= PREAMBLE + 24 {
            let mut d = Declared::read(&frame[PREAMBLE..]).unwrap();
            match rng.below(8) {
                0 => d.nodes = d.nodes.saturating_sub(1 + rng.below(3) as u32),
                1 => d.text = d.text.saturating_sub(1 + rng.below(100) as u32),
                2 => d.samples = d.samples.saturating_sub(1),
                3 => d.live = d.live.saturating_sub(1 + rng.below(3) as u32),
                4 => d.raw = d.raw.wrapping_add(1),
                5 => d.stacks = d.stacks.saturating_sub(1 + rng.below(64) as u32),
                6 => d.stacks = u32::MAX,
                _ => d.live = u32::MAX,
            }
            frame = encode(&d, &frame[PREAMBLE + 24..]);
        }
        out.extend_from_slice(&frame);
        i = j;
    }
    out.extend_from_slice(&bytes[end.min(bytes.len())..]);
    out
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    7,
    8,
    0x7f,
    0xff,
    0xffff,
    0xffff_ffff,
    u64::MAX,
    1 << 24,
];

/// One random change to `bytes`, some of them aware of the record layout.
fn mutate(bytes: &mut Vec<u8>, rng: &mut Rng) {
    let len = bytes.len().max(1);
    match rng.below(9) {
        0 => {
            let at = rng.below(len);
            if let Some(b) = bytes.get_mut(at) {
                *b ^= 1 << rng.below(8);
            }
        }
        1 => {
            let at = rng.below(len);
            let width = [1, 2, 4, 8][rng.below(4)];
            let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
            for (i, byte) in v.iter().take(width).enumerate() {
                if let Some(b) = bytes.get_mut(at + i) {
                    *b = *byte;
                }
            }
        }
        2 => bytes.truncate(rng.below(len + 1)),
        3 => {
            // Duplicate a stretch somewhere else (repeated records, torn records).
            let from = rng.below(len);
            let n = rng.below(4096).min(bytes.len().saturating_sub(from));
            let chunk = bytes[from..from + n].to_vec();
            let to = rng.below(bytes.len() + 1);
            bytes.splice(to..to, chunk);
        }
        4 => {
            let to = rng.below(bytes.len() + 1);
            let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            bytes.splice(to..to, junk);
        }
        _ => {
            // A field of one record: its length, kind, or aux (the frame count of an Alloc).
            let starts = record_starts(bytes);
            if starts.is_empty() {
                return;
            }
            let at = starts[rng.below(starts.len())];
            let v = INTERESTING[rng.below(INTERESTING.len())];
            match rng.below(5) {
                0 => bytes[at..at + 4].copy_from_slice(&(v as u32).to_le_bytes()),
                3 => {
                    // The counts of a Module record: ranges, build id, path.
                    if bytes.len() >= at + PREAMBLE + 26 {
                        let f = at + PREAMBLE + 20 + 2 * rng.below(3);
                        bytes[f..f + 2].copy_from_slice(&(v as u16).to_le_bytes());
                    }
                }
                1 => {
                    let kind = [
                        KIND_ALLOC,
                        KIND_CODE,
                        KIND_STACK,
                        KIND_SAMPLE,
                        KIND_CONTEXT,
                        KIND_BRIEF,
                        KIND_PACKED,
                        0xffff,
                    ][rng.below(8)];
                    bytes[at + 4..at + 6].copy_from_slice(&kind.to_le_bytes());
                }
                2 => bytes[at + 6..at + 8].copy_from_slice(&(v as u16).to_le_bytes()),
                _ => {
                    // The name lengths of a Code record.
                    if bytes.len() >= at + PREAMBLE + 16 {
                        let f = at + PREAMBLE + 12 + 2 * rng.below(2);
                        bytes[f..f + 2].copy_from_slice(&(v as u16).to_le_bytes());
                    }
                }
            }
        }
    }
}

/// The real captures the fuzzer starts from (recorded by mprof from `tests/py/hostile_names.py`
/// under CPython; see `tests/fuzz/README.md`).
fn real_seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("tests/fuzz")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "mprof"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    assert!(!seeds.is_empty(), "no seed capture in {}", dir.display());
    seeds.sort();
    seeds
}

/// A window of a real capture: its header and a run of whole records, so that mutations work
/// on small inputs and every part of the seed gets its turn.
fn window(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let starts = record_starts(seed);
    let mut bytes = header();
    if starts.is_empty() {
        return bytes;
    }
    let first = rng.below(starts.len());
    let last = (first + 1 + rng.below(300)).min(starts.len());
    let end = starts.get(last).copied().unwrap_or(seed.len());
    bytes.extend_from_slice(&seed[starts[first]..end]);
    bytes
}

/// Mutated inputs per run: `MPROF_FUZZ_ITERATIONS`, else 3,000, or 300 in the test suite's fast
/// tier (`MPROF_TESTS=fast`, docs/testing.md), which still runs every seed and crafted case.
fn iterations() -> usize {
    let fast = std::env::var("MPROF_TESTS").is_ok_and(|t| t == "fast");
    std::env::var("MPROF_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if fast { 300 } else { 3000 })
}

#[test]
fn mutated_captures_keep_every_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.mprof");
    let seeds = real_seeds();
    let mut rng = Rng(0x6d70_726f_6620_6675);
    let (mut loaded, mut worst_excess, mut worst_ratio, mut worst_output) =
        (0, 0isize, 0.0f64, 0.0f64);
    let (mut max_top, mut bytes_in, mut with_views) = (0, 0, 0);
    let n = iterations();
    for i in 0..n {
        let mut input = match rng.below(3) {
            0 => generated(&mut rng),
            _ => window(&seeds[rng.below(seeds.len())], &mut rng),
        };
        for _ in 0..rng.below(8) {
            mutate(&mut input, &mut rng);
        }
        if input.len() >= 16 && rng.below(3) == 0 {
            // In frames, as format 5 writes them, and now and then damaged after.
            input = framed(&input, &mut rng);
            if rng.below(4) == 0 {
                mutate(&mut input, &mut rng);
            }
        }
        let views = i % VIEWS_EVERY == 0;
        let cost = check_some(&input, &path, views);
        loaded += cost.loaded as usize;
        with_views += (views && cost.loaded) as usize;
        bytes_in += input.len();
        let len = input.len().max(1) as f64;
        worst_excess = worst_excess.max(cost.peak_memory as isize - 4 * input.len() as isize);
        if input.len() >= 64 << 10 {
            worst_ratio = worst_ratio.max(cost.peak_memory as f64 / len);
        }
        worst_output = worst_output.max(cost.all_output as f64 / len);
        max_top = max_top.max(cost.top_output);
    }
    // The whole real seeds too, unmutated.
    for seed in &seeds {
        let cost = check(seed, &path);
        assert!(cost.loaded);
        eprintln!(
            "fuzz: a real seed of {} bytes takes {} bytes to read",
            seed.len(),
            cost.peak_memory
        );
    }
    eprintln!(
        "fuzz: {n} inputs ({} MB), {loaded} loaded ({with_views} of them through every view), \
         0 panics; memory: at most {} KiB beyond 4x the input (allowance {} MiB), at most \
         {worst_ratio:.2}x for inputs of 64 KiB or more; output: at most {worst_output:.1} bytes \
         per input byte, longest 20-row report {max_top} bytes",
        bytes_in >> 20,
        worst_excess >> 10,
        MEMORY_FIXED >> 20
    );
    assert!(
        loaded > n / 10,
        "the mutations leave too few loadable inputs"
    );
}

fn capture(records: &[Record]) -> Vec<u8> {
    let mut bytes = header();
    for r in records {
        bytes.extend_from_slice(&encode(r));
    }
    bytes
}

/// The case: one stack of 65,535 frames over a 60 KB name. Reading it takes a bounded
/// amount of memory and the reports stay small.
#[test]
fn a_giant_stack_over_a_giant_name_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.mprof");
    let giant = "\x1b[2J".repeat(15_000);
    let frames: Vec<Frame> = (0..65_535).map(|i| Frame { code: 1, line: i }).collect();
    let mut records = vec![
        Record::Meta {
            text: "rate=1\n".into(),
        },
        Record::Code {
            code: 1,
            firstline: 1,
            filename: giant.clone(),
            name: giant,
        },
    ];
    for addr in 0..2 {
        records.push(Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr,
            size: 100,
            time_ns: addr,
            frames: frames.clone(),
        });
    }
    let bytes = capture(&records);
    let cost = check(&bytes, &path);
    assert!(cost.loaded);
    let p = Profile::load(&path).unwrap();
    let (id, _) = p.stacks().next().unwrap();
    let stack: Vec<_> = p.frames(id).collect();
    assert_eq!(
        stack.len(),
        crate::analysis::profile::MAX_DEPTH + 1,
        "cut, plus the pseudo-frame"
    );
    assert_eq!(
        stack.last().unwrap().file,
        crate::analysis::profile::TRUNCATED
    );
    assert!(stack[0].function.len() <= crate::analysis::profile::MAX_NAME);
    eprintln!(
        "giant stack: {} bytes in, {} bytes of memory, {} bytes of JSON at most",
        bytes.len(),
        cost.peak_memory,
        cost.all_output
    );
}

/// Distinct deep stacks over long names: the JSON of every stack grows with the capture, by
/// a bounded factor, and the default report stays the same size whatever the capture.
#[test]
fn many_deep_stacks_print_a_bounded_amount() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.mprof");
    let long = "x".repeat(5000);
    let mut records = vec![Record::Code {
        code: 1,
        firstline: 1,
        filename: long.clone(),
        name: long,
    }];
    for i in 0..300u32 {
        let frames = (0..256)
            .map(|d| Frame {
                code: 1,
                line: i * 1000 + d,
            })
            .collect();
        records.push(Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr: i as u64,
            size: 1,
            time_ns: 0,
            frames,
        });
    }
    let bytes = capture(&records);
    let cost = check(&bytes, &path);
    assert!(cost.loaded);
    eprintln!(
        "deep stacks: {} bytes in, {:.1} bytes of output per byte (--top 0), {} bytes (top 20)",
        bytes.len(),
        cost.all_output as f64 / bytes.len() as f64,
        cost.top_output
    );
}

/// Records that make the reader build the most per byte (all-new one-frame stacks at new
/// addresses, new code objects with new one-byte names) are refused once they exceed the
/// allowance, instead of taking memory without bound.
#[test]
fn dense_crafted_captures_are_refused_within_the_memory_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dense.mprof");
    let mut bytes = header();
    for i in 0..2_000_000u64 {
        let code = Record::Code {
            code: i,
            firstline: 0,
            filename: String::new(),
            name: format!("{i:x}"),
        };
        bytes.extend_from_slice(&encode(&code));
        let alloc = Record::Alloc {
            native: None,
            tid: 0,
            flags: 0,
            addr: i,
            size: 1,
            time_ns: 0,
            frames: vec![Frame { code: i, line: 0 }],
        };
        bytes.extend_from_slice(&encode(&alloc));
    }
    let cost = check(&bytes, &path);
    eprintln!(
        "dense: {} MB in, loaded: {}, {:.2} bytes of memory per byte",
        bytes.len() >> 20,
        cost.loaded,
        cost.peak_memory as f64 / bytes.len() as f64
    );
}

/// A packed `--rate 1` capture of an older format (PACKED records outside frames) whose
/// blocks all stay live: its memory allowance is that of the same records unpacked (a packed
/// sample takes a few bytes of the file and its live block far more of the reader).
#[test]
fn a_packed_capture_of_live_blocks_reads_within_its_unpacked_allowance() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packed.mprof");
    let mut bytes = header();
    let code = Record::Code {
        code: 0x1000,
        firstline: 1,
        filename: "a.py".into(),
        name: "f".into(),
    };
    bytes.extend_from_slice(&encode(&code));
    let node = Node {
        parent: 0,
        code: 0x1000,
        line: 2,
        entry: false,
    };
    bytes.extend_from_slice(&encode_stack(1, &node));
    bytes.extend_from_slice(&encode_context(1, 1));
    let (mut packer, mut unpacked) = (Packer::default(), bytes.len());
    let aux = brief_aux(1, 0).unwrap();
    for i in 0..240_000u64 {
        let brief = encode_brief(0x7f00_0000_0000 + 32 * i, 32, 1, aux);
        unpacked += brief.len();
        packer.add(&brief).unwrap();
        if packer.len() >= crate::capture::pack::PACK_TARGET {
            bytes.extend_from_slice(&packer.take().unwrap());
        }
    }
    bytes.extend_from_slice(&packer.take().unwrap());
    let cost = check_some(&bytes, &path, false);
    assert!(cost.loaded, "{} bytes, {unpacked} unpacked", bytes.len());
    assert!(cost.peak_memory <= memory_bound(unpacked));
    eprintln!(
        "packed: {} bytes of file ({unpacked} unpacked) took {} bytes to read",
        bytes.len(),
        cost.peak_memory
    );
}

/// A capture that becomes shorter while it is read (rewritten in place) is an error, not a
/// damaged tail or a panic.
#[test]
fn a_capture_that_shrinks_while_it_is_read_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shrinks.mprof");
    let mut records = vec![Record::Meta {
        text: "rate=1\n".into(),
    }];
    for addr in 0..5000 {
        records.push(Record::Alloc {
            native: None,
            tid: 1,
            flags: 0,
            addr,
            size: 10,
            time_ns: 0,
            frames: vec![],
        });
    }
    let bytes = capture(&records);
    std::fs::write(&path, &bytes).unwrap();
    let set =
        crate::capture::processes::CaptureSet::open(&path, crate::capture::processes::Pick::All)
            .unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!("{:#}", Profile::read_set(&set).err().expect("an error"));
    assert!(err.contains("changed while it was being read"), "{err}");
}
