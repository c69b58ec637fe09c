//! What enters the target process: the agent library, embedded in the mprof binary, and the
//! means of loading it (a preload for `record`, ptrace for `attach`).

pub mod agent;
