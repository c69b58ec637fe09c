use super::*;

fn roundtrip(r: Record) {
    let bytes = encode(&r);
    let (back, used) = decode(&bytes).unwrap();
    assert_eq!(back, r);
    assert_eq!(used, bytes.len());
}

#[test]
fn every_kind_round_trips() {
    roundtrip(Record::Alloc {
        tid: 7,
        flags: ALLOC_TRUNCATED,
        addr: 0xdead_beef,
        size: 1234,
        time_ns: 99,
        frames: vec![Frame { code: 1, line: 2 }, Frame { code: 3, line: 4 }],
        native: None,
    });
    roundtrip(Record::Spawn {
        serial: 3,
        tid: 7,
        node: 12,
        depth: 4,
        truncated: true,
        frames: Vec::new(),
    });
    roundtrip(Record::Spawned {
        serial: 3,
        handle: 0x7f12_3456_7000,
    });
    roundtrip(Record::Handle {
        tid: 8,
        handle: 0x7f12_3456_7000,
        serial: 3,
    });
    roundtrip(Record::Alloc {
        tid: 7,
        flags: ALLOC_NATIVE_STACK,
        addr: 1,
        size: 2,
        time_ns: 3,
        frames: vec![Frame { code: 1, line: 2 }],
        native: Some(NativeStack {
            addrs: vec![0x1000, 0x2000],
            entries: vec![1],
        }),
    });
    roundtrip(Record::Module(Module {
        bias: 0x7f00_0000_0000,
        file_size: 4096,
        flags: MODULE_MAIN,
        build_id: vec![1, 2, 3],
        path: "/usr/lib/libx.so".into(),
        ranges: vec![ModuleRange {
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_2000,
            offset: 0x1000,
        }],
    }));
    roundtrip(Record::Free { addr: 42 });
    roundtrip(Record::Code {
        code: 5,
        firstline: 10,
        filename: "a.py".into(),
        name: "f".into(),
    });
    roundtrip(Record::Thread {
        tid: 3,
        name: "worker".into(),
    });
    roundtrip(Record::Rss {
        time_ns: 1,
        rss_bytes: 2,
    });
    roundtrip(Record::End {
        reason: EndReason::Detached as u16,
        time_ns: 3,
    });
    roundtrip(Record::Meta {
        text: "pid=1\n".into(),
    });
    roundtrip(Record::Stats {
        samples: 1,
        dropped: 2,
    });
}

#[test]
fn truncated_and_corrupt_input_is_an_error_not_a_panic() {
    let bytes = encode(&Record::Free { addr: 1 });
    for cut in 0..bytes.len() {
        assert!(matches!(
            decode(&bytes[..cut]),
            Err(DecodeError::Truncated { .. })
        ));
    }
    let mut bad = bytes.clone();
    bad[0..4].copy_from_slice(&3u32.to_le_bytes());
    assert!(matches!(decode(&bad), Err(DecodeError::Corrupt(_))));
    let mut short_alloc = encode(&Record::Free { addr: 1 });
    short_alloc[4] = KIND_ALLOC as u8;
    assert!(matches!(decode(&short_alloc), Err(DecodeError::Corrupt(_))));
}

#[test]
fn unknown_kinds_are_skipped() {
    let bytes = encode(&Record::Unknown { kind: 999 });
    assert_eq!(decode(&bytes).unwrap().0, Record::Unknown { kind: 999 });
}
