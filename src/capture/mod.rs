//! The capture stage: the `.mprof` file a session writes and every view reads.
//!
//! - [`mod@file`]: the format, its writer and its reader (records back to back after a header);
//! - [`pack`]: runs of samples and frees written packed;
//! - [`meta`]: the `key=value` lines of the captures' Meta records;
//! - [`processes`]: a capture and the captures of its followed processes, read as one set;
//! - [`testing`]: records and capture files built by hand, for the tests.

pub mod file;
pub mod meta;
pub mod pack;
pub mod processes;
pub mod testing;
