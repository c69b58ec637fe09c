//! The flamegraph's layout, computed once: where each box of the picture goes and what it
//! stands for (its frame, its figures, its tooltip), and the label that fits it.

use super::{whole, width, Drawn, Labels};
use crate::analysis::allocators::{self, Allocator};
use crate::analysis::frames::Kind;
use crate::analysis::profile::Estimate;
use crate::base::units::human_bytes;
use std::collections::BTreeMap;
use std::rc::Rc;

/// Boxes narrower than this share of the whole width are not drawn (nor their callees).
const MIN_SHARE: f64 = 1e-4;

/// What one box of the picture stands for.
#[derive(Clone, Debug, Default)]
pub(super) struct BoxInfo {
    pub new: Estimate,
    /// `new` per allocator.
    split: [Estimate; 3],
    pub base: Option<Estimate>,
    place: Rc<str>,
}

/// One box of the picture.
#[derive(Clone, Debug)]
pub(super) struct Placed {
    pub label: Rc<str>,
    /// The kind of code of its frame; `None` for the root box (`all`).
    pub kind: Option<Kind>,
    /// 0 for the root box, 1 for the frames next to it, and so on.
    pub depth: usize,
    /// Where the box starts and how wide it is, in units of width.
    pub start: u64,
    pub width: u64,
    pub info: BoxInfo,
    /// The change since the base (a difference) of the stacks that end in this box: its own
    /// growth, not its callees'.
    pub own_change: f64,
}

/// The boxes to draw, the root first.
pub(super) struct Layout {
    pub boxes: Vec<Placed>,
    /// The root's width in units of width (at least 1).
    pub total: u64,
    /// The deepest box drawn.
    pub depth: usize,
}

impl Layout {
    /// The root box's figures (the sum of the stacks drawn).
    pub fn root(&self) -> &BoxInfo {
        &self.boxes[0].info
    }
}

/// Lays the stacks out side by side in their order (the map's: by frames, so stacks that share
/// a prefix are neighbours and share its boxes), each `width(bytes, unit)` units wide, under a
/// root box `all`. Stacks of zero width, and boxes narrower than [`MIN_SHARE`] of the root, are
/// left out.
pub(super) fn layout(stacks: &BTreeMap<Labels, Drawn>, unit: f64) -> Layout {
    let mut root = Placed {
        label: "all".into(),
        kind: None,
        depth: 0,
        start: 0,
        width: 0,
        info: BoxInfo {
            place: "all".into(),
            ..BoxInfo::default()
        },
        own_change: 0.0,
    };
    let mut done: Vec<Placed> = Vec::new();
    // The boxes of the previous stack, still open to the next one that shares their frames.
    let mut open: Vec<Placed> = Vec::new();
    let mut t = 0u64;
    for (frames, s) in stacks {
        let width = width(s.new.bytes, unit);
        if width == 0 {
            continue;
        }
        let shared = open
            .iter()
            .zip(frames.0.iter())
            .take_while(|(b, f)| b.label == f.label)
            .count();
        close(&mut open, &mut done, shared, t);
        for f in &frames.0[shared..] {
            open.push(Placed {
                label: f.label.clone(),
                kind: Some(f.kind),
                depth: open.len() + 1,
                start: t,
                width: 0,
                info: BoxInfo {
                    place: f.place.clone(),
                    base: s.base.map(|_| Estimate::default()),
                    ..BoxInfo::default()
                },
                own_change: 0.0,
            });
        }
        if let (Some(innermost), Some(b)) = (open.last_mut(), s.base) {
            innermost.own_change += s.new.bytes - b.bytes;
        }
        for info in open.iter_mut().map(|b| &mut b.info).chain([&mut root.info]) {
            info.new.merge(&s.new);
            merge_split(&mut info.split, &s.split);
            if let Some(sb) = s.base {
                info.base.get_or_insert_with(Estimate::default).merge(&sb);
            }
        }
        t += width;
    }
    close(&mut open, &mut done, 0, t);
    root.width = t;
    let total = t.max(1);
    let min = (total as f64 * MIN_SHARE).ceil() as u64;
    let mut boxes = vec![root];
    boxes.extend(done.into_iter().filter(|b| b.width >= min));
    let depth = boxes.iter().map(|b| b.depth).max().unwrap_or(0);
    Layout {
        boxes,
        total,
        depth,
    }
}

/// Closes the open boxes beyond the first `keep`: they end at `t`.
fn close(open: &mut Vec<Placed>, done: &mut Vec<Placed>, keep: usize, t: u64) {
    while open.len() > keep {
        let mut b = open.pop().unwrap();
        b.width = t - b.start;
        done.push(b);
    }
}

fn merge_split(into: &mut [Estimate; 3], from: &[Estimate; 3]) {
    into.iter_mut().zip(from).for_each(|(a, b)| a.merge(b));
}

/// How the allocators share a box's bytes (`; native 80%, python 20%`), when they are not all
/// Python's; empty otherwise.
fn allocator_shares(split: &[Estimate; 3]) -> String {
    let bytes = Allocator::ALL.map(|a| (a, split[a as usize].bytes));
    match allocators::shares(&bytes) {
        s if s.is_empty() => s,
        s if s.contains('%') => format!("; {s}"),
        s => format!("; {s} 100%"),
    }
}

/// A tooltip's figures; `total` is the root's bytes. Parentheses are avoided inside: the
/// picture's script finds a box's label by removing the last parenthesised group of its title.
pub(super) fn tooltip(info: &BoxInfo, total: f64) -> String {
    let place = info.place.replace(['(', ')'], "");
    let share = if total > 0.0 {
        100.0 * info.new.bytes / total
    } else {
        0.0
    };
    let e = &info.new;
    match info.base {
        None => format!(
            "{place}: {} ± {}, {} allocations, {} samples, {share:.2}%{}",
            human_bytes(e.bytes),
            human_bytes(e.stderr()),
            whole(e.count),
            e.samples,
            allocator_shares(&info.split)
        ),
        Some(b) => {
            let change = e.bytes - b.bytes;
            let sigma = (e.variance + b.variance).sqrt();
            let noise = if change.abs() <= 2.0 * sigma {
                " — within 2σ: noise"
            } else {
                ""
            };
            format!(
                "{place}: {} → {}, change {}{} ± {}{noise}, samples {} → {}",
                human_bytes(b.bytes),
                human_bytes(e.bytes),
                if change >= 0.0 { "+" } else { "" },
                human_bytes(change),
                human_bytes(sigma),
                b.samples,
                e.samples
            )
        }
    }
}

/// Characters of the picture's font (12 px monospace, 0.59 em wide) that fit in `pixels`, less
/// a margin of 3 pixels.
fn chars_that_fit(pixels: f64) -> usize {
    ((pixels - 3.0) / (12.0 * 0.59)).max(0.0) as usize
}

/// The label shown in a box `pixels` wide: `function (pkg/file.py:line)` when it fits, else
/// `function (file.py:line)`, else the function alone, else the function cut from the right.
/// The function name is the last thing to go. (The picture's script does the same when a zoom
/// widens the box.)
pub fn fitted_label(label: &str, pixels: f64) -> String {
    let fit = chars_that_fit(pixels);
    let len = |s: &str| s.chars().count();
    if len(label) <= fit {
        return label.to_owned();
    }
    if let Some((function, place)) = label.rsplit_once(" (") {
        let file = place.rsplit('/').next().unwrap_or(place);
        let shorter = format!("{function} ({file}");
        if len(&shorter) <= fit {
            return shorter;
        }
        if len(function) <= fit {
            return function.to_owned();
        }
    }
    if fit < 3 {
        return String::new();
    }
    let kept: String = label.chars().take(fit - 2).collect();
    format!("{kept}..")
}
