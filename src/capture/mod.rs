//! The capture stage: the `.mprof` file a session writes and every view reads.
//!
//! - [`mod@file`]: the format (records back to back after a header), and a capture opened;
//! - [`format`]: its constants, and what its readers share;
//! - [`writer`] and [`records`]: writing it as records arrive, reading it back;
//! - [`frame`]: records compressed in frames, each declaring what it holds;
//! - [`live_bits`]: the writer's count of the sampled blocks live, for those declarations;
//! - [`pack`]: runs of samples and frees written packed;
//! - [`stacks`]: the interned stack nodes of a capture, as its reader keeps them;
//! - [`meta`]: the `key=value` lines of the captures' Meta records;
//! - [`processes`]: a capture and the captures of its followed processes, read as one set;
//! - [`directory`]: a directory of untrusted files, its entries opened without following
//!   symlinks;
//! - [`pprof`]: pprof's messages, which mprof writes and reads back, and their bounded reader;
//! - [`rolling`]: a directory of rolling interval profiles (`--every --profiles-dir`), its
//!   files named, listed, and selected by a time range (`DIR@FROM..TO`);
//! - [`testing`]: records and capture files built by hand, for the tests.

pub mod directory;
pub mod file;
pub mod format;
pub mod frame;
pub mod live_bits;
pub mod meta;
pub mod pack;
pub mod pprof;
pub mod processes;
pub mod records;
pub mod rolling;
pub mod stacks;
pub mod testing;
pub mod writer;
