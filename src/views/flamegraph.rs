//! Flamegraphs: one view of a capture as an interactive SVG. mprof lays the boxes out once
//! ([`boxes`]) and draws the picture from that layout ([`svg`]), with a script of its own for
//! zooming and searching.
//!
//! Frames are labelled `function (short/file.py:line)` (see [`crate::analysis::frames`]); a
//! narrow box drops the directories, then the place, then cuts the function name from the
//! right, so the function name is what survives ([`fitted_label`]). Each box's tooltip
//! has the full path, the estimated bytes ± standard error, the estimated allocations, the
//! samples behind it and its share. Import-system frames are folded away unless asked for
//! (an import of a module that allocates shows as the importer calling the module), colours
//! say which kind of code a frame runs (a legend is drawn under the title), `--inverted`
//! puts the allocation sites on top, `--thread` keeps one thread. `--diff BASE` draws the new
//! capture's boxes coloured by their growth since BASE (red grew, blue shrank), with the change
//! ± its combined standard error in the tooltip.
//!
//! A box whose bytes are not all from Python's allocators says how the allocators share them
//! in its tooltip (`native 80%, python 20%`); `--by-allocator` puts the allocator at the root
//! of every stack instead (`<allocator native>`), and `--allocator` keeps only some.
//!
//! When the output path ends in `.folded`, the folded stacks of
//! [`crate::views::export::folded`] are written instead of an SVG. When the view has no bytes
//! at all (e.g. `live` for a program that freed everything), a small valid SVG that says so is
//! written, with a warning.

use crate::analysis::allocators::Allocator;
use crate::analysis::allocators::Allocators;
use crate::analysis::frames::{self, Kind};
use crate::analysis::names::{FastMap, Named, Names, TrieMemo};
use crate::analysis::profile::{Estimate, Profile, Source, View};
use crate::base::text::xml_escape;
use crate::base::units::human_bytes;
use crate::capture::processes::Pick;
use crate::views::about::{rate_text, view_title};
use crate::views::export::folded::{self, allocator_frame, frame_name};
use crate::views::formats::{check_output, write_file, Format};
use anyhow::{bail, Result};
pub use boxes::fitted_label;
use boxes::{layout, Placed};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::rc::Rc;

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
    /// The allocator as the root frame of every stack.
    pub by_allocator: bool,
    /// The allocators drawn (the caller selects them in the profile, see [`Profile::select`]).
    pub allocators: Allocators,
}

impl Settings {
    /// The plain flamegraph of `view`: every thread and allocator, import frames folded.
    pub fn of(view: View) -> Settings {
        Settings {
            view,
            thread: None,
            keep_imports: false,
            inverted: false,
            by_allocator: false,
            allocators: Allocators::ALL,
        }
    }
}

/// `mprof flamegraph`: writes the flamegraph of `path` (the processes `pick` says; or its
/// folded stacks) to `out`; with `diff`, the growth since that base capture (all its
/// processes).
pub fn run(
    path: &Path,
    out: &Path,
    settings: &Settings,
    diff: Option<&Path>,
    pick: Pick,
) -> Result<()> {
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
    let mut p = Source::open(path, pick)?.load()?;
    p.select(settings.allocators);
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
        folded::lines_by(&p, settings.view, settings.by_allocator)
            .iter()
            .flat_map(|l| [l.as_str(), "\n"])
            .collect::<String>()
            .into_bytes()
    } else {
        let mut base = diff.map(Profile::load).transpose()?;
        if let Some(base) = &mut base {
            base.select(settings.allocators);
        }
        svg(&p, settings, base.as_ref())?.into_bytes()
    };
    write_file(out, "flamegraph", &bytes)
}

/// The flamegraph as SVG text; with `base`, the difference from it.
pub fn svg(p: &Profile, settings: &Settings, base: Option<&Profile>) -> Result<String> {
    Ok(picture(p, settings, base)?.svg)
}

/// A flamegraph drawn: the SVG text and its height in pixels (its width is [`WIDTH`]).
pub struct Picture {
    pub svg: String,
    pub height: usize,
}

/// The flamegraph of `p` (with `base`, the difference from it) and its height.
pub fn picture(p: &Profile, settings: &Settings, base: Option<&Profile>) -> Result<Picture> {
    let mut stacks = drawn(p, settings);
    if let Some(base) = base {
        for (labels, b) in drawn(base, settings) {
            let entry = stacks.entry(labels).or_insert_with(|| Drawn {
                new: Estimate::default(),
                split: Default::default(),
                base: None,
            });
            entry.base = Some(b.new);
        }
        for s in stacks.values_mut() {
            s.base.get_or_insert_with(Estimate::default);
        }
    }
    draw_stacks(p, settings, &stacks, base.is_some())
}

/// The flamegraphs of `views` of `p`, drawn as `settings` says otherwise: the stacks are
/// worked out once for all of them ([`drawn_views`]).
pub fn pictures(p: &Profile, settings: &Settings, views: &[View]) -> Result<Vec<Picture>> {
    let entries = drawn_entries(p, settings, views);
    views
        .iter()
        .enumerate()
        .map(|(i, &view)| {
            let settings = Settings {
                view,
                ..settings.clone()
            };
            draw_stacks(p, &settings, &view_of(&entries, i), false)
        })
        .collect()
}

/// The picture of `stacks` (a difference when `diff`: each has its base figures).
fn draw_stacks(
    p: &Profile,
    settings: &Settings,
    stacks: &BTreeMap<Labels, Drawn>,
    diff: bool,
) -> Result<Picture> {
    if stacks.values().all(|s| whole(s.new.bytes) == 0) {
        crate::say!(
            "mprof: warning: no {} in this capture; the flamegraph is empty",
            view_title(settings.view)
        );
        return Ok(Picture {
            svg: empty_svg(p, settings.view),
            height: EMPTY_HEIGHT,
        });
    }
    let layout = layout(stacks, unit_of(stacks));
    let title = if diff {
        format!(
            "mprof: growth of {} since the base capture",
            view_title(settings.view)
        )
    } else {
        format!("mprof: {}", view_title(settings.view))
    };
    let legend: Vec<((u8, u8, u8), &str)> = if diff {
        vec![
            (GREW, "grew since the base"),
            (SHRANK, "shrank since the base"),
        ]
    } else {
        Kind::ALL.iter().map(|k| (k.rgb(), k.name())).collect()
    };
    let page = svg::Page {
        title: &title,
        subtitle: &subtitle(p, settings),
        legend: &legend,
        inverted: settings.inverted,
    };
    let (svg, height) = if diff {
        let largest = layout
            .boxes
            .iter()
            .map(|b| b.own_change.abs())
            .fold(0.0, f64::max);
        svg::draw(&page, &layout, |b| growth_colour(b, largest))
    } else {
        svg::draw(&page, &layout, |b| match b.kind {
            Some(kind) => colour(kind, &b.label),
            None => ROOT_COLOUR,
        })
    };
    Ok(Picture { svg, height })
}

/// One frame as drawn, shared by every stack and box it appears in: a capture of tens of
/// thousands of stacks forty frames deep has a few thousand distinct frames.
type DrawnFrame = Rc<FrameText>;

/// What a frame shows.
#[derive(Debug)]
struct FrameText {
    label: Rc<str>,
    /// `/full/path.py:line` (or the pseudo-frame's name), for the tooltip.
    place: Rc<str>,
    kind: Kind,
}

/// A stack's frames as drawn, from the bottom of the picture up, ordered by their labels (the
/// order the stacks are laid out in).
#[derive(Clone, Debug)]
struct Labels(Rc<[DrawnFrame]>);

impl Ord for Labels {
    fn cmp(&self, other: &Labels) -> std::cmp::Ordering {
        self.0
            .iter()
            .map(|f| &f.label)
            .cmp(other.0.iter().map(|f| &f.label))
    }
}

impl PartialOrd for Labels {
    fn partial_cmp(&self, other: &Labels) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Labels {
    fn eq(&self, other: &Labels) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Labels {}

/// The figures of one stack as drawn (its frames are its key, [`Labels`]).
#[derive(Clone, Debug)]
struct Drawn {
    new: Estimate,
    /// `new` per allocator.
    split: [Estimate; 3],
    /// The base capture's figures, when drawing a difference.
    base: Option<Estimate>,
}

fn whole(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// Largest sum of widths laid out (they add up in a `u64`).
const MAX_WIDTHS: f64 = (1u64 << 60) as f64;

/// Bytes per unit of width: 1, unless the widths would not add up in a `u64` (only a crafted
/// capture comes near; then every width is scaled down alike).
fn unit_of(stacks: &BTreeMap<Labels, Drawn>) -> f64 {
    let sum: f64 = stacks
        .values()
        .map(|s| s.new.bytes.max(s.base.map_or(0.0, |b| b.bytes)).max(0.0))
        .sum();
    (sum / MAX_WIDTHS).ceil().max(1.0)
}

/// The width `bytes` are drawn with, in units of width.
fn width(bytes: f64, unit: f64) -> u64 {
    whole(bytes / unit)
}

/// The stacks of `p` as drawn, by their labels (the order they are laid out in).
fn drawn(p: &Profile, settings: &Settings) -> BTreeMap<Labels, Drawn> {
    view_of(&drawn_entries(p, settings, &[settings.view]), 0)
}

/// A stack as drawn in several views: its labels, its frames, and per view its figures and
/// their split by allocator (None: no sample in that view).
type Entry = (Labels, [PerView; View::ALL.len()]);
type PerView = Option<(Estimate, [Estimate; 3])>;

/// The stacks of [`drawn`] in the `i`th view of [`drawn_entries`].
fn view_of(entries: &[Entry], i: usize) -> BTreeMap<Labels, Drawn> {
    entries
        .iter()
        .filter_map(|(labels, per_view)| {
            let (new, split) = per_view[i]?;
            let drawn = Drawn {
                new,
                split,
                base: None,
            };
            Some((labels.clone(), drawn))
        })
        .collect()
}

/// The stacks of `p` as drawn in each of `views` (`settings.view` aside), in the order they
/// are laid out in. Each node of the profile's stack trie is drawn once ([`DrawnNodes`]), and
/// each distinct drawn stack labelled once, for all the views: a stack's figures go to the
/// entry of its labels, in the stacks' order, in each view where a sample is behind them.
fn drawn_entries(p: &Profile, settings: &Settings, views: &[View]) -> Vec<Entry> {
    assert!(views.len() <= View::ALL.len(), "at most one entry per view");
    let mut nodes = DrawnNodes::new(p, settings.keep_imports);
    // Per entry: the numbers of its labels, and the entry.
    let mut entries: Vec<(Vec<u32>, Entry)> = Vec::new();
    // Per drawn path (and allocator, when drawn), its entry; per labels, their entry.
    let mut entry_of: FastMap<(u32, u8), usize> = FastMap::default();
    let mut by_labels: FastMap<Vec<u32>, usize> = FastMap::default();
    for (id, figures) in p.stacks_of(settings.thread) {
        if views.iter().all(|&v| figures.get(v).samples == 0) {
            continue;
        }
        let path = nodes.path_of(id.0);
        let allocator = p.allocator(id);
        let key = (
            path,
            if settings.by_allocator {
                allocator as u8
            } else {
                0
            },
        );
        let at = match entry_of.get(&key) {
            Some(&at) => at,
            None => {
                let (frames, ids) = nodes.frames(path, allocator, settings);
                let at = *by_labels.entry(ids.clone()).or_insert_with(|| {
                    let entry = (Labels(frames.into()), Default::default());
                    entries.push((ids, entry));
                    entries.len() - 1
                });
                entry_of.insert(key, at);
                at
            }
        };
        for (&view, per_view) in views.iter().zip(&mut entries[at].1 .1) {
            let estimate = figures.get(view);
            if estimate.samples == 0 {
                continue;
            }
            let (new, split) = per_view.get_or_insert_with(Default::default);
            new.merge(estimate);
            split[allocator as usize].merge(estimate);
        }
    }
    // By labels: sorted by their ranks first (whole numbers, in the labels' order), which the
    // maps then find in order. The ranks are compared as big-endian bytes: the same order,
    // one `memcmp` per pair of entries (no two entries have the same labels).
    let ranks = nodes.label_ranks();
    entries.sort_by_cached_key(|(ids, _)| {
        let mut key = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            key.extend_from_slice(&ranks[id as usize].to_be_bytes());
        }
        key
    });
    entries.into_iter().map(|(_, entry)| entry).collect()
}

/// The stacks of a profile as a flamegraph draws them, each node of its stack trie worked out
/// once: a node's drawn frames are its caller's, and its own frame unless that is folded away
/// (the import system's), so the stacks that share their callers share the work.
struct DrawnNodes<'p> {
    names: &'p Names,
    keep_imports: bool,
    /// Per trie node: its drawn path ([`DrawnNodes::paths`]), and whether its frame is
    /// site.py's (or a `.pth` line it runs).
    memo: TrieMemo,
    /// Drawn paths: (caller's path, frame in [`DrawnNodes::frames`]); path 0 has no frame.
    paths: Vec<(u32, u32)>,
    path_ids: FastMap<(u32, u32), u32>,
    /// The frames drawn, each made once (by the profile's frame id: one per location), with
    /// the number of its label.
    frames: Vec<(DrawnFrame, u32)>,
    frame_ids: FastMap<u32, u32>,
    /// Per file: whether it is the import system's, and whether it is site.py.
    files: FastMap<Named<'p>, (bool, bool)>,
    /// Each distinct label text, numbered.
    labels: std::collections::HashMap<Rc<str>, usize>,
}

impl<'p> DrawnNodes<'p> {
    fn new(p: &'p Profile, keep_imports: bool) -> DrawnNodes<'p> {
        let names = p.trie();
        DrawnNodes {
            names,
            keep_imports,
            memo: TrieMemo::new(names),
            paths: vec![(0, u32::MAX)],
            path_ids: FastMap::default(),
            frames: Vec::new(),
            frame_ids: FastMap::default(),
            files: FastMap::default(),
            labels: Default::default(),
        }
    }

    /// The drawn path of the stack ending at `node` (its own frames, as [`Profile::frames`]).
    fn path_of(&mut self, node: u32) -> u32 {
        let names = self.names;
        let mut memo = std::mem::take(&mut self.memo);
        let (path, _) = memo.get(
            names,
            node,
            (0, false),
            |frame| names.is_new_thread(frame),
            |state, frame| self.step(state, frame),
        );
        self.memo = memo;
        path
    }

    /// The state after `frame`, called from a caller whose state is `(path, caller_is_site)`.
    fn step(&mut self, (path, caller_is_site): (u32, bool), frame: u32) -> (u32, bool) {
        let loc = self.names.location(frame);
        let (import_file, site) = *self
            .files
            .entry(Named(loc.file))
            .or_insert_with(|| (frames::is_import_file(loc.file), frames::is_site(loc.file)));
        // A `.pth` line runs as `<string>` code called from site.py: import system too.
        let string = loc.file == "<string>";
        let import = import_file || (caller_is_site && string);
        let site = site || (caller_is_site && string);
        if !self.keep_imports && import {
            return (path, site);
        }
        let next = self.frames.len() as u32;
        let drawn = *self.frame_ids.entry(frame).or_insert(next);
        if drawn == next {
            let frame = Rc::new(FrameText {
                label: frame_name(&frames::label(&loc)).into(),
                place: if loc.file == loc.function {
                    loc.function.into()
                } else {
                    format!("{}:{}", loc.file, loc.line).into()
                },
                kind: frames::kind_of(&loc),
            });
            let label = self.label_id(&frame.label);
            self.frames.push((frame, label));
        }
        let next = self.paths.len() as u32;
        let id = *self.path_ids.entry((path, drawn)).or_insert(next);
        if id == next {
            self.paths.push((path, drawn));
        }
        (id, site)
    }

    /// The frames of a stack drawn along `path` from `allocator`, from the bottom of the
    /// picture up, and the numbers of their labels.
    fn frames(
        &mut self,
        path: u32,
        allocator: Allocator,
        settings: &Settings,
    ) -> (Vec<DrawnFrame>, Vec<u32>) {
        let mut frames = Vec::new();
        let mut at = path;
        while at != 0 {
            let (caller, frame) = self.paths[at as usize];
            frames.push(self.frames[frame as usize].clone());
            at = caller;
        }
        frames.reverse();
        if frames.is_empty() {
            // Only import frames: the allocation happened in the import system itself.
            let frame = Rc::new(FrameText {
                label: "<import system>".into(),
                place: "importlib".into(),
                kind: Kind::Import,
            });
            let label = self.label_id(&frame.label);
            frames.push((frame, label));
        }
        if settings.inverted {
            frames.reverse();
        }
        if settings.by_allocator {
            let frame = Rc::new(FrameText {
                label: allocator_frame(allocator).into(),
                place: format!("{} allocations", allocator.name()).into(),
                kind: Kind::Pseudo,
            });
            let label = self.label_id(&frame.label);
            frames.insert(0, (frame, label));
        }
        frames.into_iter().unzip()
    }

    /// The number of a label's text.
    fn label_id(&mut self, label: &Rc<str>) -> u32 {
        let next = self.labels.len();
        *self.labels.entry(label.clone()).or_insert(next) as u32
    }

    /// Per label number, its rank in the labels' order.
    fn label_ranks(&self) -> Vec<u32> {
        let mut sorted: Vec<(&Rc<str>, usize)> = self.labels.iter().map(|(l, &i)| (l, i)).collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut ranks = vec![0; sorted.len()];
        for (rank, (_, i)) in sorted.into_iter().enumerate() {
            ranks[i] = rank as u32;
        }
        ranks
    }
}

/// The fill of a frame: its kind's colour, a little lighter or darker by name so that
/// neighbours stand apart.
fn colour(kind: Kind, label: &str) -> (u8, u8, u8) {
    let (r, g, b) = kind.rgb();
    let hash = label
        .bytes()
        .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
    let shift = (hash % 31) as i32 - 15;
    let adjust = |c: u8| (c as i32 + shift).clamp(0, 255) as u8;
    (adjust(r), adjust(g), adjust(b))
}

/// The fill of the root box (`all`).
const ROOT_COLOUR: (u8, u8, u8) = (200, 200, 190);
/// A difference's colours at their strongest: grew, shrank, and no change.
const GREW: (u8, u8, u8) = (230, 80, 80);
const SHRANK: (u8, u8, u8) = (80, 120, 230);
const UNCHANGED: (u8, u8, u8) = (250, 250, 250);

/// The fill of a box of a difference, by the change of its own bytes (those of the stacks that
/// end in it, as differential flamegraphs colour): red for growth, blue for shrinking, the
/// stronger the larger the change against the `largest` such change of any box.
fn growth_colour(b: &Placed, largest: f64) -> (u8, u8, u8) {
    let change = b.own_change;
    if largest <= 0.0 || change == 0.0 {
        return UNCHANGED;
    }
    let to = if change > 0.0 { GREW } else { SHRANK };
    let t = (change.abs() / largest).clamp(0.0, 1.0);
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t).round() as u8;
    (
        mix(UNCHANGED.0, to.0),
        mix(UNCHANGED.1, to.1),
        mix(UNCHANGED.2, to.2),
    )
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
    if !p.selection().is_all() {
        let _ = write!(text, "; {} allocations only", p.selection().names());
    }
    if p.native_recorded() == Some(false) {
        text.push_str("; native allocations not recorded");
    }
    if !settings.keep_imports {
        text.push_str("; import frames folded");
    }
    if p.incomplete().is_some() {
        text.push_str("; INCOMPLETE capture (no END record)");
    }
    text
}

/// The height of [`empty_svg`].
const EMPTY_HEIGHT: usize = 90;

/// A valid SVG that says the view has nothing to draw.
fn empty_svg(p: &Profile, view: View) -> String {
    let title = format!("mprof: {}", view_title(view));
    let settings = Settings {
        keep_imports: true,
        ..Settings::of(view)
    };
    let note = format!("No samples in this view ({})", subtitle(p, &settings));
    format!(
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"{WIDTH}\" height=\"{h}\" viewBox=\"0 0 {WIDTH} {h}\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<title>{title}</title>\n",
            "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{h}\" fill=\"#eef2ee\"/>\n",
            "<text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"17\">{title}</text>\n",
            "<text x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"12\">{note}</text>\n",
            "</svg>\n"
        ),
        title = xml_escape(&title),
        note = xml_escape(&note),
        h = EMPTY_HEIGHT,
        WIDTH = WIDTH,
    )
}

mod boxes;
mod svg;
#[cfg(test)]
mod tests;
