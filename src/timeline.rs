//! placeholder
use anyhow::Result;
use std::path::Path;
/// placeholder
pub fn run(_: &Path, _: &Path, _: usize) -> Result<()> {
    anyhow::bail!("todo")
}
