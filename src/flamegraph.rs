//! Flamegraph SVG. (stub, to be written)
use crate::profile::View;
use anyhow::Result;
use std::path::Path;
pub fn run(_p: &Path, _o: &Path, _v: View) -> Result<()> { anyhow::bail!("not yet") }
