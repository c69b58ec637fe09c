use super::*;
use crate::record::{decode, native_stack, Frame, Record, ALLOC_TRUNCATED};

fn node(parent: u32, code: u64, line: u32, entry: bool) -> Node {
    Node {
        parent,
        code,
        line,
        entry,
    }
}

fn sample(stack: u32) -> Sample {
    Sample {
        tid: 7,
        flags: ALLOC_TRUNCATED,
        addr: 0x1000,
        size: 64,
        time_ns: 5,
        stack,
    }
}

fn alloc_of(e: Expanded) -> Record {
    match e {
        Expanded::Alloc(bytes) => decode(&bytes).unwrap().0,
        other => panic!("not a sample: {other:?}"),
    }
}

#[test]
fn a_sample_expands_to_the_alloc_it_stands_for() {
    let mut x = Expander::new();
    for (id, n) in [
        (1, node(0, 0xa0, 1, true)),
        (2, node(1, 0xb0, 2, false)),
        (3, node(2, 0xc0, 3, true)),
        (4, node(1, 0xd0, 4, false)),
    ] {
        assert_eq!(x.feed(&encode_stack(id, &n)), Expanded::Consumed);
    }
    let got = alloc_of(x.feed(&encode_sample(&sample(3), 3, None)));
    let frames = vec![
        Frame {
            code: 0xc0,
            line: 3,
        },
        Frame {
            code: 0xb0,
            line: 2,
        },
        Frame {
            code: 0xa0,
            line: 1,
        },
    ];
    assert_eq!(
        got,
        Record::Alloc {
            tid: 7,
            flags: ALLOC_TRUNCATED,
            addr: 0x1000,
            size: 64,
            time_ns: 5,
            frames,
            native: None,
        }
    );
    // A sibling branch, and a sample with no Python frame.
    let sibling = alloc_of(x.feed(&encode_sample(&sample(4), 2, None)));
    assert!(matches!(sibling, Record::Alloc { ref frames, .. } if frames.len() == 2));
    let bare = alloc_of(x.feed(&encode_sample(&sample(0), 0, None)));
    assert!(matches!(bare, Record::Alloc { ref frames, .. } if frames.is_empty()));
}

#[test]
fn the_native_section_gets_its_entry_marks_back() {
    let mut x = Expander::new();
    x.feed(&encode_stack(1, &node(0, 0xa0, 1, true)));
    x.feed(&encode_stack(2, &node(1, 0xb0, 2, false)));
    x.feed(&encode_stack(3, &node(2, 0xc0, 3, true)));
    let mut s = sample(3);
    s.flags |= ALLOC_NATIVE_STACK;
    let Expanded::Alloc(bytes) = x.feed(&encode_sample(&s, 3, Some(&[0x10, 0x20]))) else {
        panic!("not expanded");
    };
    let body = &bytes[PREAMBLE..];
    let native = native_stack(body, 3, s.flags).expect("a native section");
    assert_eq!(native.addrs, vec![0x10, 0x20]);
    // Innermost first: c (entry), b, a (entry).
    assert!(native.is_entry(0) && !native.is_entry(1) && native.is_entry(2));
    // What the session reads from the SAMPLE itself, to describe the modules first.
    let raw = encode_sample(&s, 3, Some(&[0x10, 0x20]));
    assert_eq!(
        sample_native_addrs(&raw[PREAMBLE..]),
        Some(vec![0x10, 0x20])
    );
    for cut in PREAMBLE..raw.len() {
        assert_eq!(sample_native_addrs(&raw[PREAMBLE..cut]), None, "cut {cut}");
    }
    assert_eq!(
        sample_native_addrs(&encode_sample(&sample(3), 3, None)[PREAMBLE..]),
        None
    );
}

#[test]
fn redefined_ids_replace_the_old_node() {
    let mut x = Expander::new();
    x.feed(&encode_stack(1, &node(0, 0xa0, 1, false)));
    x.feed(&encode_stack(1, &node(0, 0xee, 9, false)));
    let got = alloc_of(x.feed(&encode_sample(&sample(1), 1, None)));
    assert!(
        matches!(got, Record::Alloc { ref frames, .. } if frames == &[Frame { code: 0xee, line: 9 }])
    );
}

#[test]
fn lies_are_skipped_not_believed() {
    let mut x = Expander::new();
    let bad = |e: Expanded| assert!(matches!(e, Expanded::Bad(_)), "{e:?}");
    bad(x.feed(&encode_stack(0, &node(0, 1, 1, false))));
    bad(x.feed(&encode_stack(5, &node(5, 1, 1, false))));
    bad(x.feed(&encode_stack(6, &node(9, 1, 1, false))));
    bad(x.feed(&encode_stack(7, &node(3, 1, 1, false))));
    bad(x.feed(&encode_stack(MAX_STACK_ID + 1, &node(0, 1, 1, false))));
    x.feed(&encode_stack(1, &node(0, 0xa0, 1, false)));
    bad(x.feed(&encode_sample(&sample(2), 1, None)));
    bad(x.feed(&encode_sample(&sample(1), 2, None)));
    bad(x.feed(&encode_sample(&sample(1), 0, None)));
    bad(x.feed(&encode_sample(&sample(1), 60_000, None)));
    let mut native = sample(1);
    native.flags |= ALLOC_NATIVE_STACK;
    bad(x.feed(&encode_sample(&native, 1, None)));
    let mut long = encode_sample(&native, 1, Some(&[1, 2]));
    long.truncate(long.len() - 8);
    let len = long.len() as u32;
    long[..4].copy_from_slice(&len.to_le_bytes());
    bad(x.feed(&long));
    // Short bodies.
    let mut short = encode_stack(2, &node(1, 1, 1, false));
    short.truncate(PREAMBLE + 4);
    short[..4].copy_from_slice(&((PREAMBLE + 4) as u32).to_le_bytes());
    bad(x.feed(&short));
    // Other records pass untouched.
    let free = crate::record::encode(&Record::Free { addr: 1 });
    assert_eq!(x.feed(&free), Expanded::Pass(&free));
}

#[test]
fn the_largest_id_is_accepted() {
    let mut x = Expander::new();
    assert_eq!(
        x.feed(&encode_stack(MAX_STACK_ID, &node(0, 1, 1, false))),
        Expanded::Consumed
    );
    let got = alloc_of(x.feed(&encode_sample(&sample(MAX_STACK_ID), 1, None)));
    assert!(matches!(got, Record::Alloc { ref frames, .. } if frames.len() == 1));
}

/// A BRIEF with its CONTEXT expands to the same ALLOC as the SAMPLE it is short for.
#[test]
fn a_brief_sample_is_the_sample_it_is_short_for() {
    let mut x = Expander::new();
    x.feed(&encode_stack(1, &node(0, 0xa0, 1, true)));
    x.feed(&encode_stack(2, &node(1, 0xb0, 2, false)));
    let mut s = sample(2);
    s.flags = ALLOC_TRUNCATED | crate::record::Allocator::Mmap.flags();
    s.size = u32::MAX as u64;
    let aux = brief_aux(2, s.flags).unwrap();
    assert_eq!(
        x.feed(&encode_context(s.tid, s.time_ns)),
        Expanded::Consumed
    );
    let brief = alloc_of(x.feed(&encode_brief(s.addr, s.size as u32, s.stack, aux)));
    assert_eq!(brief, alloc_of(x.feed(&encode_sample(&s, 2, None))));
    assert_eq!(encode_brief(1, 2, 3, aux).len(), 24);
    // The next context applies to what follows it only.
    x.feed(&encode_context(9, 77));
    let later = alloc_of(x.feed(&encode_brief(s.addr, 8, 0, 0)));
    assert!(matches!(
        later,
        Record::Alloc { tid: 9, time_ns: 77, size: 8, flags: 0, ref frames, .. } if frames.is_empty()
    ));
    // What a BRIEF cannot say.
    assert_eq!(brief_aux(2, ALLOC_NATIVE_STACK), None);
    assert_eq!(brief_aux(512, 0), None);
    assert_eq!(brief_aux(MAX_STACK_DEPTH as u16, 7), Some(256 | 7 << 12));
}

#[test]
fn brief_lies_are_skipped_not_believed() {
    let bad = |e: Expanded| assert!(matches!(e, Expanded::Bad(_)), "{e:?}");
    let mut x = Expander::new();
    x.feed(&encode_stack(1, &node(0, 0xa0, 1, false)));
    bad(x.feed(&encode_brief(0x10, 1, 1, 1)));
    let mut short = encode_context(1, 2);
    short.truncate(PREAMBLE + 8);
    short[..4].copy_from_slice(&((PREAMBLE + 8) as u32).to_le_bytes());
    bad(x.feed(&short));
    x.feed(&encode_context(1, 2));
    bad(x.feed(&encode_brief(0x10, 1, 1, 2)));
    bad(x.feed(&encode_brief(0x10, 1, 2, 1)));
    bad(x.feed(&encode_brief(0x10, 1, 1, 0x1ff)));
    let mut short = encode_brief(0x10, 1, 1, 1);
    short.truncate(PREAMBLE + 12);
    short[..4].copy_from_slice(&((PREAMBLE + 12) as u32).to_le_bytes());
    bad(x.feed(&short));
    assert!(matches!(
        x.feed(&encode_brief(0x10, 1, 1, 1)),
        Expanded::Alloc(_)
    ));
}
