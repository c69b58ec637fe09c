//! `mprof attach --pid PID`. (stub, to be written)
use crate::SamplingArgs;
use anyhow::{bail, Result};
use std::path::Path;
use std::process::ExitCode;

pub fn run(
    _pid: u32,
    _duration: Option<f64>,
    _output: &Path,
    _sampling: &SamplingArgs,
    _quiet: bool,
) -> Result<ExitCode> {
    bail!("attach is not implemented yet")
}
