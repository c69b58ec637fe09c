//! Flamegraphs: one view of a capture as an interactive SVG, drawn by `inferno`.
//!
//! Frames are labelled `function (short/file.py:line)` (see [`crate::frames`]) and truncated
//! from the right, so the function name is what survives in a narrow box. Each box's tooltip
//! has the full path, the estimated bytes ± standard error, the estimated allocations, the
//! samples behind it and its share. Import-system frames are folded away unless asked for
//! (an import of a module that allocates shows as the importer calling the module), colours
//! say which kind of code a frame runs (a legend is drawn under the title), `--inverted`
//! puts the allocation sites on top, `--thread` keeps one thread. `--diff BASE` draws the new
//! capture's boxes coloured by their growth since BASE (red grew, blue shrank), with the change
//! ± its combined standard error in the tooltip.
//!
//! When the output path ends in `.folded`, the folded stacks of [`crate::export::folded`] are
//! written instead of an SVG. When the view has no bytes at all (e.g. `live` for a program that
//! freed everything), a small valid SVG that says so is written, with a warning.

use crate::export::{check_output, folded, write_file, Format};
use crate::frames::{self, Kind};
use crate::profile::{Estimate, Profile, View};
use crate::report::{rate_text, view_title};
use crate::text::xml_escape;
use crate::units::human_bytes;
use anyhow::{bail, Context, Result};
use inferno::flamegraph::color::{Color, PaletteMap};
use inferno::flamegraph::{self as inferno_fg, Direction, Options, TextTruncateDirection};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

/// Width of the picture in pixels.
pub const WIDTH: usize = 1200;

/// What to draw.
#[derive(Clone, Debug)]
pub struct Settings {
    pub view: View,
    /// Only this thread's allocations.
    pub thread: Option<u32>,
    /// Keep the import system's frames instead of folding them away.
    pub keep_imports: bool,
    /// Allocation sites on top (an icicle of callers).
    pub inverted: bool,
}

/// `mprof flamegraph`: writes the flamegraph of `path` (or its folded stacks) to `out`; with
/// `diff`, the growth since that base capture.
pub fn run(path: &Path, out: &Path, settings: &Settings, diff: Option<&Path>) -> Result<()> {
    let folded_out = Format::of_path(out) == Some(Format::Folded);
    check_output(
        out,
        if folded_out {
            Format::Folded
        } else {
            Format::Svg
        },
    )?;
    if folded_out && (diff.is_some() || settings.thread.is_some() || settings.inverted) {
        bail!(
            "{}: folded stacks hold one whole view; --diff, --thread and --inverted draw SVG",
            out.display()
        );
    }
    let p = Profile::load(path)?;
    if let Some(tid) = settings.thread {
        let tids = p.thread_ids();
        if !tids.contains(&tid) {
            let known: Vec<String> = tids.iter().map(|&t| p.thread_label(t)).collect();
            bail!(
                "thread {tid} allocated nothing in {}; its threads: {}",
                path.display(),
                known.join(", ")
            );
        }
    }
    let bytes = if folded_out {
        folded::lines(&p, settings.view)
            .iter()
            .flat_map(|l| [l.as_str(), "\n"])
            .collect::<String>()
            .into_bytes()
    } else {
        let base = diff.map(Profile::load).transpose()?;
        svg(&p, settings, base.as_ref())?.into_bytes()
    };
    write_file(out, &bytes)
}

/// The flamegraph as SVG text; with `base`, the difference from it.
pub fn svg(p: &Profile, settings: &Settings, base: Option<&Profile>) -> Result<String> {
    let mut stacks = drawn(p, settings);
    if let Some(base) = base {
        for (labels, b) in drawn(base, settings) {
            let entry = stacks.entry(labels).or_insert_with(|| Drawn {
                frames: b.frames.clone(),
                new: Estimate::default(),
                base: None,
            });
            entry.base = Some(b.new);
        }
        for s in stacks.values_mut() {
            s.base.get_or_insert_with(Estimate::default);
        }
    }
    if stacks.values().all(|s| whole(s.new.bytes) == 0) {
        eprintln!(
            "mprof: warning: no {} in this capture; the flamegraph is empty",
            view_title(settings.view)
        );
        return Ok(empty_svg(p, settings.view));
    }
    let boxes = layout(&stacks);
    let lines: Vec<String> = stacks
        .iter()
        .map(|(labels, s)| match s.base {
            Some(b) => format!(
                "{} {} {}",
                labels.join(";"),
                whole(b.bytes),
                whole(s.new.bytes)
            ),
            None => format!("{} {}", labels.join(";"), whole(s.new.bytes)),
        })
        .collect();
    let mut palette = PaletteMap::default();
    for s in stacks.values() {
        for f in &s.frames {
            palette.insert(&f.label, colour(f.kind, &f.label));
        }
    }
    let mut options = Options::default();
    options.title = match base {
        Some(_) => format!(
            "mprof: growth of {} since the base capture",
            view_title(settings.view)
        ),
        None => format!("mprof: {}", view_title(settings.view)),
    };
    options.subtitle = Some(subtitle(p, settings));
    options.count_name = "bytes".to_owned();
    options.deterministic = true;
    options.no_sort = true;
    options.image_width = Some(WIDTH);
    options.text_truncate_direction = TextTruncateDirection::Right;
    options.palette_map = Some(&mut palette);
    if settings.inverted {
        options.direction = Direction::Inverted;
    }
    let mut out = Vec::new();
    inferno_fg::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .context("drawing the flamegraph")?;
    let svg = String::from_utf8(out).context("inferno wrote invalid UTF-8")?;
    let total = total_of(&stacks);
    Ok(add_legend(&retitle(&svg, &boxes, &total), base.is_some()))
}

/// One frame as drawn.
#[derive(Clone, Debug)]
struct DrawnFrame {
    label: String,
    /// `/full/path.py:line` (or the pseudo-frame's name), for the tooltip.
    place: String,
    kind: Kind,
}

/// One stack as drawn: frames from the bottom of the picture up, and its figures.
#[derive(Clone, Debug)]
struct Drawn {
    frames: Vec<DrawnFrame>,
    new: Estimate,
    /// The base capture's figures, when drawing a difference.
    base: Option<Estimate>,
}

fn labels_of(frames: &[DrawnFrame]) -> Vec<String> {
    frames.iter().map(|f| f.label.clone()).collect()
}

fn whole(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// The stacks of `p` as drawn, by their labels (the order inferno merges them in).
fn drawn(p: &Profile, settings: &Settings) -> BTreeMap<Vec<String>, Drawn> {
    let mut out: BTreeMap<Vec<String>, Drawn> = BTreeMap::new();
    for (id, figures) in p.stacks_of(settings.thread) {
        let estimate = *figures.get(settings.view);
        if estimate.samples == 0 {
            continue;
        }
        let mut frames: Vec<DrawnFrame> = Vec::new();
        let all: Vec<_> = p.frames(id).collect(); // innermost first
        let mut caller_is_site = false;
        for loc in all.iter().rev() {
            // A `.pth` line runs as `<string>` code called from site.py: import system too.
            let import = frames::is_import(loc) || (caller_is_site && loc.file == "<string>");
            caller_is_site =
                frames::is_site(loc.file) || (caller_is_site && loc.file == "<string>");
            if !settings.keep_imports && import {
                continue;
            }
            frames.push(DrawnFrame {
                label: frame_name(&frames::label(loc)),
                place: if loc.file == loc.function {
                    loc.function.to_owned()
                } else {
                    format!("{}:{}", loc.file, loc.line)
                },
                kind: frames::kind(loc.file, loc.function),
            });
        }
        if frames.is_empty() {
            // Only import frames: the allocation happened in the import system itself.
            frames.push(DrawnFrame {
                label: "<import system>".into(),
                place: "importlib".into(),
                kind: Kind::Import,
            });
        }
        if settings.inverted {
            frames.reverse();
        }
        let entry = out.entry(labels_of(&frames)).or_insert_with(|| Drawn {
            frames,
            new: Estimate::default(),
            base: None,
        });
        entry.new.merge(&estimate);
    }
    out
}

/// A frame name that cannot break a folded line: no `;` (the separator) and no control
/// characters.
pub fn frame_name(name: &str) -> String {
    crate::text::printable(name).replace(';', ",")
}

/// What one box of the picture stands for.
#[derive(Clone, Debug, Default)]
struct BoxInfo {
    new: Estimate,
    base: Option<Estimate>,
    place: String,
}

/// The boxes inferno will draw, keyed by (first byte, width in bytes, label), found by merging
/// the lines in order exactly as inferno does (`no_sort`): consecutive lines that share a
/// prefix share its boxes. Boxes of zero width are not drawn and not listed.
fn layout(stacks: &BTreeMap<Vec<String>, Drawn>) -> HashMap<(u64, u64, String), BoxInfo> {
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
    for s in stacks.values() {
        let width = whole(s.new.bytes);
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
fn total_of(stacks: &BTreeMap<Vec<String>, Drawn>) -> BoxInfo {
    let mut total = BoxInfo {
        place: "all".into(),
        ..BoxInfo::default()
    };
    for s in stacks.values() {
        if whole(s.new.bytes) == 0 {
            continue;
        }
        total.new.merge(&s.new);
        if let Some(b) = s.base {
            total.base.get_or_insert_with(Estimate::default).merge(&b);
        }
    }
    total
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
            "{place}: {} ± {}, {} allocations, {} samples, {share:.2}%",
            human_bytes(e.bytes),
            human_bytes(e.stderr()),
            whole(e.count),
            e.samples
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
fn retitle(svg: &str, boxes: &HashMap<(u64, u64, String), BoxInfo>, total: &BoxInfo) -> String {
    let frames_width = (WIDTH - 20) as f64;
    let root_width = whole(total.new.bytes).max(1) as f64;
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
fn attr(element: &str, name: &str) -> Option<u64> {
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

/// The fill of a frame: its kind's colour, a little lighter or darker by name so that
/// neighbours stand apart.
fn colour(kind: Kind, label: &str) -> Color {
    let (r, g, b) = kind.rgb();
    let hash = label
        .bytes()
        .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
    let shift = (hash % 31) as i32 - 15;
    let adjust = |c: u8| (c as i32 + shift).clamp(0, 255) as u8;
    Color {
        r: adjust(r),
        g: adjust(g),
        b: adjust(b),
    }
}

/// Pixels added under the subtitle for the legend.
const LEGEND_HEIGHT: usize = 18;

/// The legend: one swatch per kind of code (or the diff's two colours), under the subtitle.
/// The picture grows by [`LEGEND_HEIGHT`] and the frames and the bottom line move down.
fn add_legend(svg: &str, diff: bool) -> String {
    let Some(height) = svg
        .find("<svg version=")
        .and_then(|at| attr(&svg[at..at + svg[at..].find('>').unwrap_or(0)], "height"))
    else {
        return svg.to_owned();
    };
    let grown = height as usize + LEGEND_HEIGHT;
    let mut legend = String::from("<g id=\"legend\" font-size=\"11\" font-family=\"Verdana\">");
    let entries: Vec<((u8, u8, u8), &str)> = if diff {
        vec![
            ((230, 80, 80), "grew since the base"),
            ((80, 120, 230), "shrank since the base"),
        ]
    } else {
        Kind::ALL.iter().map(|k| (k.rgb(), k.name())).collect()
    };
    let mut x = 10usize;
    for ((r, g, b), name) in entries {
        let _ = write!(
            legend,
            "<rect x=\"{x}\" y=\"58\" width=\"10\" height=\"10\" fill=\"rgb({r},{g},{b})\"/>\
             <text x=\"{}\" y=\"67\">{}</text>",
            x + 14,
            xml_escape(name)
        );
        x += 14 + 7 * name.len() + 18;
    }
    legend.push_str("</g>");
    let mut out = svg
        .replacen(
            &format!("height=\"{height}\""),
            &format!("height=\"{grown}\""),
            1,
        )
        .replacen(
            &format!("viewBox=\"0 0 {WIDTH} {height}\""),
            &format!("viewBox=\"0 0 {WIDTH} {grown}\""),
            1,
        )
        .replacen(
            &format!("height=\"{height}\" fill=\"url(#background)\""),
            &format!("height=\"{grown}\" fill=\"url(#background)\""),
            1,
        );
    for id in ["details", "matched"] {
        let key = format!("<text id=\"{id}\"");
        if let Some(at) = out.find(&key) {
            let end = at + out[at..].find('>').unwrap_or(0);
            let element = &out[at..end];
            if let Some(y) = element
                .split("y=\"")
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse::<f64>().ok())
            {
                let moved = element.replace(
                    &format!("y=\"{y:.2}\""),
                    &format!("y=\"{:.2}\"", y + LEGEND_HEIGHT as f64),
                );
                out.replace_range(at..end, &moved);
            }
        }
    }
    match out.find("<svg id=\"frames\" x=\"10\"") {
        Some(at) => {
            let frames = format!("<svg id=\"frames\" x=\"10\" y=\"{LEGEND_HEIGHT}\"");
            out.replace_range(at..at + "<svg id=\"frames\" x=\"10\"".len(), &frames);
            out.insert_str(at, &legend);
            out
        }
        None => svg.to_owned(),
    }
}

fn subtitle(p: &Profile, settings: &Settings) -> String {
    let total = p.totals().get(settings.view);
    let mut text = format!(
        "{}, {} samples, {} dropped; total {} ± {}",
        rate_text(p),
        p.samples,
        p.dropped,
        human_bytes(total.bytes),
        human_bytes(total.stderr())
    );
    if let Some(tid) = settings.thread {
        let _ = write!(text, "; thread {}", p.thread_label(tid));
    }
    if !settings.keep_imports {
        text.push_str("; import frames folded");
    }
    if p.incomplete().is_some() {
        text.push_str("; INCOMPLETE capture (no END record)");
    }
    text
}

/// A valid SVG that says the view has nothing to draw.
fn empty_svg(p: &Profile, view: View) -> String {
    let title = format!("mprof: {}", view_title(view));
    let settings = Settings {
        view,
        thread: None,
        keep_imports: true,
        inverted: false,
    };
    let note = format!("No samples in this view ({})", subtitle(p, &settings));
    format!(
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"90\" viewBox=\"0 0 1200 90\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<title>{title}</title>\n",
            "<rect x=\"0\" y=\"0\" width=\"1200\" height=\"90\" fill=\"#eef2ee\"/>\n",
            "<text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"17\">{title}</text>\n",
            "<text x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"12\">{note}</text>\n",
            "</svg>\n"
        ),
        title = xml_escape(&title),
        note = xml_escape(&note)
    )
}

#[cfg(test)]
mod tests;
