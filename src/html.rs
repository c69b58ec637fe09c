//! placeholder
use anyhow::Result;
use std::path::Path;
/// placeholder
pub fn run(_: &Path, _: &Path) -> Result<()> {
    anyhow::bail!("todo")
}
