//! Which box of inferno's picture stands for what, and the rewriting of each box: mprof's
//! tooltip (full path, bytes ± standard error, allocations, samples, share) instead of
//! inferno's, and a label that fits the box.

use super::{whole, width, Drawn, WIDTH};
use crate::analysis::allocators::Allocator;
use crate::analysis::profile::Estimate;
use crate::base::text::xml_escape;
use crate::base::units::human_bytes;
use std::collections::{BTreeMap, HashMap};

/// What one box of the picture stands for.
#[derive(Clone, Debug, Default)]
pub(super) struct BoxInfo {
    new: Estimate,
    /// `new` per allocator.
    split: [Estimate; 3],
    base: Option<Estimate>,
    place: String,
}

/// The boxes inferno will draw, keyed by (first byte, width in bytes, label), found by merging
/// the stacks in the order of their lines exactly as inferno does (`no_sort`): consecutive
/// lines that share a prefix share its boxes. Boxes of zero width are not drawn and not listed.
pub(super) fn layout<'a>(
    stacks: impl Iterator<Item = &'a Drawn>,
    unit: f64,
) -> HashMap<(u64, u64, String), BoxInfo> {
    let mut done = HashMap::new();
    // Open boxes: (label, start, info).
    let mut open: Vec<(String, u64, BoxInfo)> = Vec::new();
    let mut t = 0u64;
    let mut close = |open: &mut Vec<(String, u64, BoxInfo)>, keep: usize, t: u64| {
        while open.len() > keep {
            let (label, start, info) = open.pop().unwrap();
            if t > start {
                done.insert((start, t - start, label), info);
            }
        }
    };
    for s in stacks {
        let width = width(s.new.bytes, unit);
        if width == 0 {
            continue;
        }
        let shared = open
            .iter()
            .zip(&s.frames)
            .take_while(|((label, _, _), f)| *label == f.label)
            .count();
        close(&mut open, shared, t);
        for f in &s.frames[shared..] {
            let info = BoxInfo {
                place: f.place.clone(),
                base: s.base.map(|_| Estimate::default()),
                ..BoxInfo::default()
            };
            open.push((f.label.clone(), t, info));
        }
        for (_, _, info) in open.iter_mut() {
            info.new.merge(&s.new);
            merge_split(&mut info.split, &s.split);
            if let (Some(b), Some(sb)) = (info.base.as_mut(), s.base) {
                b.merge(&sb);
            }
        }
        t += width;
    }
    close(&mut open, 0, t);
    done
}

/// Totals of the drawn stacks (the root box).
pub(super) fn total_of(stacks: &BTreeMap<Vec<String>, Drawn>, unit: f64) -> BoxInfo {
    let mut total = BoxInfo {
        place: "all".into(),
        ..BoxInfo::default()
    };
    for s in stacks.values() {
        if width(s.new.bytes, unit) == 0 {
            continue;
        }
        total.new.merge(&s.new);
        merge_split(&mut total.split, &s.split);
        if let Some(b) = s.base {
            total.base.get_or_insert_with(Estimate::default).merge(&b);
        }
    }
    total
}

fn merge_split(into: &mut [Estimate; 3], from: &[Estimate; 3]) {
    into.iter_mut().zip(from).for_each(|(a, b)| a.merge(b));
}

/// How the allocators share a box's bytes (`; native 80%, python 20%`), when they are not all
/// Python's; empty otherwise.
fn allocator_shares(split: &[Estimate; 3]) -> String {
    let bytes = Allocator::ALL.map(|a| (a, split[a as usize].bytes));
    match crate::analysis::allocators::shares(&bytes) {
        s if s.is_empty() => s,
        s if s.contains('%') => format!("; {s}"),
        s => format!("; {s} 100%"),
    }
}

/// A tooltip's figures. Parentheses are avoided inside: inferno's script finds a box's label
/// by removing the last parenthesised group of its title.
fn tooltip(info: &BoxInfo, total: f64) -> String {
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

/// Rewrites inferno's boxes: mprof's tooltip instead of `label (N bytes, P%)`, and a label
/// that fits the box (see [`fitted_label`]).
pub(super) fn retitle(
    svg: &str,
    boxes: &HashMap<(u64, u64, String), BoxInfo>,
    total: &BoxInfo,
    unit: f64,
) -> String {
    let frames_width = (WIDTH - 20) as f64;
    let root_width = width(total.new.bytes, unit).max(1) as f64;
    let mut out = String::with_capacity(svg.len() + svg.len() / 2);
    let mut rest = svg;
    while let Some(at) = rest.find("<g><title>") {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let Some(end) = after.find("</g>") else {
            break;
        };
        let (group, tail) = after.split_at(end);
        rest = tail;
        let Some(rewritten) = rewrite_box(group, boxes, total, |w| {
            w as f64 / root_width * frames_width
        }) else {
            out.push_str(group);
            continue;
        };
        out.push_str(&rewritten);
    }
    out.push_str(rest);
    out
}

/// One `<g><title>…</title><rect …/><text …>…</text>` group rewritten, if it is a box mprof
/// knows.
fn rewrite_box(
    group: &str,
    boxes: &HashMap<(u64, u64, String), BoxInfo>,
    total: &BoxInfo,
    pixels: impl Fn(u64) -> f64,
) -> Option<String> {
    let title_end = group.find("</title>")?;
    let title = &group["<g><title>".len()..title_end];
    let rect_end = title_end + group[title_end..].find("/>")? + 2;
    let rect = &group[title_end + "</title>".len()..rect_end];
    let text_start = rect_end + group[rect_end..].find('>')? + 1;
    let text_end = text_start + group[text_start..].find("</text>")?;
    let (x, w) = (attr(rect, "fg:x")?, attr(rect, "fg:w")?);
    let label = unescape(title.rsplit_once(" (").map_or(title, |(l, _)| l));
    let (label, info) = match boxes.get(&(x, w, label.clone())) {
        Some(info) => (label, info),
        None if title.starts_with("all (") => ("all".to_owned(), total),
        None => return None,
    };
    Some(format!(
        "<g><title>{} ({})</title>{rect}{}{}{}",
        xml_escape(&label),
        xml_escape(&tooltip(info, total.new.bytes)),
        &group[rect_end..text_start],
        xml_escape(&fitted_label(&label, pixels(w))),
        &group[text_end..]
    ))
}

/// Characters of inferno's font (12 px, 0.59 em wide) that fit in `pixels`, less its margin.
fn chars_that_fit(pixels: f64) -> usize {
    ((pixels - 3.0) / (12.0 * 0.59)).max(0.0) as usize
}

/// The label shown in a box `pixels` wide: `function (pkg/file.py:line)` when it fits, else
/// `function (file.py:line)`, else the function alone, else the function cut from the right.
/// The function name is the last thing to go.
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

/// The numeric value of `name="…"` in an element's text.
pub(super) fn attr(element: &str, name: &str) -> Option<u64> {
    let key = format!("{name}=\"");
    let start = element.find(&key)? + key.len();
    let len = element[start..].find('"')?;
    element[start..start + len].parse().ok()
}

/// XML text back to the string inferno was given.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}
