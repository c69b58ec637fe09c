//! placeholder
use crate::grouping::Grouping;
use crate::profile::View;
use anyhow::Result;
use std::path::Path;
/// placeholder
pub fn run(_: &Path, _: &Path, _: View, _: Grouping, _: usize, _: bool) -> Result<()> {
    anyhow::bail!("todo")
}
