//! What the mprof agent (inside the target) and the mprof CLI agree on, and nothing else:
//! the shared-memory ring, the record encoding (also used by capture files) and the per-version
//! CPython layouts. No dependencies, so the agent can be built with a bare `rustc`.

// Every unsafe operation, in an `unsafe fn` too, sits in an `unsafe` block whose SAFETY comment
// says why it is sound (attributes of the crate root: the agent's bare-rustc build obeys them).
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod children;
pub mod layout;
pub mod record;
pub mod ring;
pub mod ring_reader;
pub mod stacks;
