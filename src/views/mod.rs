//! The views stage: what a user reads of an analysed capture.
//!
//! - [`report`] (text and `--json`), [`process_table`] (`report --per-process`), [`diff`];
//! - [`flamegraph`], [`timeline`] (SVG pictures) and [`html`] (all of them in one page);
//! - [`export`]: pprof, speedscope, folded stacks, JSON;
//! - [`live`]: the terminal view of a running session, fed record by record by the session;
//! - [`resident`]: where the RSS is (the report's section, the summary's line, the JSON);
//! - [`formats`] (every format's name and where it is written) and [`about`] (the lines every
//!   view says about a capture before its figures), which the others share.

pub mod about;
pub mod diff;
pub mod export;
pub mod flamegraph;
pub mod formats;
pub mod html;
pub mod live;
pub mod process_table;
pub mod report;
pub mod resident;
pub mod timeline;

#[cfg(test)]
mod tests;
