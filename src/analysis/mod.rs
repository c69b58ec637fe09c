//! The analysis stage: from a capture's records to figures per stack, site and process.
//!
//! - [`estimate`]: what a sample stands for (bytes, count, standard error);
//! - [`allocators`]: which allocator the bytes came from;
//! - [`names`]: interning of names and stacks (the trie), native stacks resolved into it;
//! - [`symbols`]: native stacks: the target's modules, symbolization, the merge with Python
//!   frames;
//! - [`frames`]: labels and kinds of code; [`focus`]: which code is yours, [`launchers`]: the
//!   code that only starts a program (console-script stubs, runpy), which is not;
//! - [`aggregate`]: records replayed one at a time (the live view uses it directly), the
//!   live blocks in their table (`live`);
//! - [`profile`]: a whole capture (or set of captures), within its memory allowance;
//! - [`grouping`] and [`sites`]: the rows every table shows;
//! - [`origins`]: which stack created each thread (its samples are grafted onto it);
//! - [`resident`]: where the RSS is (live blocks, allocators' free memory, mappings).

pub mod aggregate;
pub mod allocators;
pub mod estimate;
pub mod focus;
pub mod frames;
pub mod grouping;
pub mod launchers;
pub(crate) mod live;
pub mod names;
pub mod origins;
pub mod profile;
pub mod resident;
pub mod sites;
pub mod symbols;
