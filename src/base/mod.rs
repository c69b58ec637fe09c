//! The bottom of the pipeline: what every stage may use, and nothing of mprof's own.

pub mod clock;
pub mod limits;
pub mod memory;
pub mod output;
pub mod progress;
pub mod signals;
pub mod text;
pub mod units;

/// Makes a FIFO at `path` (mode 0600), for tests of what refuses to read or write one.
pub fn make_fifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path, `c`, alive for the call.
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(made, 0, "{}", path.display());
}
