//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! `sampled` profile per view (allocated, live at the end, live at the peak) in bytes, over
//! shared frames with their file and line. Each stack is weighted by its estimated bytes,
//! rounded; stacks that round to 0 are left out. With `--by-allocator` every stack starts with
//! its allocator's frame (`<allocator native>`). Open it at speedscope.app (it stays in the
//! browser) or with `npx speedscope FILE`.

use crate::analysis::profile::{Profile, View};
use crate::base::text::printable;
use crate::views::about::view_title;
use crate::views::export::folded::allocator_frame;
use anyhow::Result;
use serde::Serialize;
use std::collections::HashMap;

/// The speedscope export.
pub struct Speedscope;

impl super::Exporter for Speedscope {
    fn format(&self) -> super::Format {
        super::Format::Speedscope
    }

    fn export(&self, p: &Profile, options: &super::Options) -> Result<Vec<u8>> {
        let mut text = serde_json::to_string(&file(p, options.view, options.by_allocator))?;
        text.push('\n');
        Ok(text.into_bytes())
    }
}

/// The file.
#[derive(Serialize)]
pub struct File {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Serialize, Clone)]
struct Frame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    r#type: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    /// Stacks of frame indices, outermost frame first.
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// The speedscope file of a capture; `active` is the view shown first; `by_allocator` puts
/// the allocator at the root of every stack.
pub fn file(p: &Profile, active: View, by_allocator: bool) -> File {
    let mut frames: Vec<Frame> = Vec::new();
    let mut index: HashMap<(String, String, u32), usize> = HashMap::new();
    let mut stacks: Vec<(Vec<usize>, [u64; 3])> = Vec::new();
    for (id, figures) in p.stacks() {
        let mut stack: Vec<usize> = p
            .frames(id)
            .map(|loc| {
                let key = (loc.file.to_owned(), loc.function.to_owned(), loc.line);
                let next = frames.len();
                *index.entry(key).or_insert_with(|| {
                    let pseudo = loc.file == loc.function;
                    frames.push(Frame {
                        name: printable(loc.function).into_owned(),
                        file: (!pseudo).then(|| printable(loc.file).into_owned()),
                        line: (!pseudo).then_some(loc.line),
                    });
                    next
                })
            })
            .collect();
        if by_allocator {
            let name = allocator_frame(p.allocator(id));
            let next = frames.len();
            let key = (name.clone(), name.clone(), 0);
            stack.push(*index.entry(key).or_insert_with(|| {
                frames.push(Frame {
                    name,
                    file: None,
                    line: None,
                });
                next
            }));
        }
        stack.reverse();
        let bytes = View::ALL.map(|v| figures.get(v).bytes.round().max(0.0) as u64);
        stacks.push((stack, bytes));
    }
    let profiles = View::ALL
        .iter()
        .enumerate()
        .map(|(i, &view)| {
            let (samples, weights): (Vec<_>, Vec<_>) = stacks
                .iter()
                .filter(|(_, b)| b[i] > 0)
                .map(|(s, b)| (s.clone(), b[i]))
                .unzip();
            SampledProfile {
                r#type: "sampled",
                name: view_title(view).to_owned(),
                unit: "bytes",
                start_value: 0,
                // Saturating: a crafted capture's weights need not add up in a u64.
                end_value: weights.iter().fold(0u64, |sum, &w| sum.saturating_add(w)),
                samples,
                weights,
            }
        })
        .collect();
    let command = p.meta.get("command").map_or("", |c| c);
    File {
        schema: "https://www.speedscope.app/file-format-schema.json",
        shared: Shared { frames },
        profiles,
        name: if command.is_empty() {
            "mprof capture".to_owned()
        } else {
            format!("mprof: {}", printable(command))
        },
        active_profile_index: View::ALL.iter().position(|&v| v == active).unwrap_or(0),
        exporter: format!("mprof {}", env!("CARGO_PKG_VERSION")),
    }
}
