//! cargo-fuzz target: any bytes as the records of a format 5 capture, put in compressed frames
//! as `mprof record` writes them (the `capture` target's random bytes seldom make a zstd frame
//! whose checksum holds), through the reader, the aggregation and every rendering.

#![no_main]

use libfuzzer_sys::fuzz_target;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary directory");
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = mprof::capture::file::MAGIC.to_vec();
    bytes.extend_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    // The first byte splits the records into two frames (the second may hold a cut record).
    let (split, records) = data.split_first().unwrap_or((&0, &[]));
    let at = (*split as usize * records.len() / 255).min(records.len());
    for part in [&records[..at], &records[at..]] {
        bytes.extend_from_slice(&mprof::capture::frame::frame_of(part));
    }
    DIR.with(|dir| {
        mprof::fuzzing::check(&bytes, &dir.path().join("input.mprof"));
    });
});
