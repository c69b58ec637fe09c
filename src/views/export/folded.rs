//! Folded stacks: one line per stack, outermost frame first, frames written
//! `function (file:line)` with the full file path and separated by `;`, then a space and the
//! view's estimated bytes, rounded. Stacks that round to 0 bytes in the view are left out;
//! import frames are kept (this is data, not a picture). inferno, flamegraph.pl and speedscope
//! read it. With `--by-allocator` every stack starts with its allocator's frame
//! (`<allocator native>`).

use crate::analysis::allocators::Allocator;
use crate::analysis::profile::{Profile, View};
use anyhow::Result;
use std::collections::BTreeMap;

/// The folded export of one view.
pub struct Folded;

impl super::Exporter for Folded {
    fn format(&self) -> super::Format {
        super::Format::Folded
    }

    fn export(&self, p: &Profile, options: &super::Options) -> Result<Vec<u8>> {
        let text: String = lines_by(p, options.view, options.by_allocator)
            .iter()
            .flat_map(|l| [l.as_str(), "\n"])
            .collect();
        Ok(text.into_bytes())
    }
}

/// The folded stacks of a view, sorted.
pub fn lines(p: &Profile, view: View) -> Vec<String> {
    lines_by(p, view, false)
}

/// [`lines`], with the allocator as the outermost frame when `by_allocator`.
pub fn lines_by(p: &Profile, view: View, by_allocator: bool) -> Vec<String> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for (id, figures) in p.stacks() {
        let bytes = figures.get(view).bytes.round().max(0.0) as u64;
        if bytes == 0 {
            continue;
        }
        let mut frames: Vec<String> = p.frames(id).map(|f| frame_name(&f.to_string())).collect();
        if by_allocator {
            frames.push(allocator_frame(p.allocator(id)));
        }
        frames.reverse();
        *stacks.entry(frames.join(";")).or_default() += bytes;
    }
    stacks
        .into_iter()
        .map(|(stack, bytes)| format!("{stack} {bytes}"))
        .collect()
}

/// The root frame of an allocator's stacks under `--by-allocator` (in the flamegraph and
/// speedscope too).
pub fn allocator_frame(a: Allocator) -> String {
    format!("<allocator {}>", a.name())
}

/// A frame name that cannot break a folded line (nor a flamegraph's): no `;` (the separator),
/// no control characters, no surrounding blanks (inferno trims lines), never empty.
pub fn frame_name(name: &str) -> String {
    let name = crate::base::text::printable(name).replace(';', ",");
    match name.trim() {
        "" => "<no name>".to_owned(),
        trimmed if trimmed.len() == name.len() => name,
        trimmed => trimmed.to_owned(),
    }
}
