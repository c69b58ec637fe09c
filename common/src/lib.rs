//! What the mprof agent (inside the target) and the mprof CLI agree on, and nothing else:
//! the shared-memory ring, the record encoding (also used by capture files) and the per-version
//! CPython layouts. No dependencies, so the agent can be built with a bare `rustc`.

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod children;
pub mod layout;
pub mod record;
pub mod ring;
pub mod ring_reader;
pub mod stacks;
