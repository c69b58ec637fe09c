//! The sessions stage: profiling a running program, from the first sample to the capture
//! file's last record.
//!
//! - [`record`] (launch a program) and [`attach`] (inject the agent into a running one), over
//!   the one loop both run, [`driver`]; [`inprocess`] (a program's session on itself, for
//!   pymprof);
//! - [`reader`]: the ring a target's agent writes, drained into the capture (and shown to the
//!   live view, which the driver feeds);
//! - [`children`] (followed child processes, each with its ring and capture) and
//!   [`rendezvous`] (how a child hands its ring over);
//! - [`sampling`] (the settings both commands take), [`procfs`] (what /proc says of a
//!   process), [`hints`] (what a user who would otherwise be stuck is told).

pub mod attach;
pub mod children;
pub mod continuous;
pub mod driver;
pub mod hints;
pub mod inprocess;
pub mod procfs;
pub mod reader;
pub mod record;
pub mod rendezvous;
pub mod sampling;
