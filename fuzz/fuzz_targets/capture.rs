//! cargo-fuzz target: any bytes as a capture file, through the reader, the aggregation and
//! every rendering (`mprof::fuzzing::check` asserts no panic, bounded memory and output).

#![no_main]

use libfuzzer_sys::fuzz_target;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary directory");
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|dir| {
        mprof::fuzzing::check(data, &dir.path().join("input.mprof"));
    });
});
