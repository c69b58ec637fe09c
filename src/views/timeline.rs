//! The timeline: RSS and the estimated live heap over the capture, with the top allocation
//! sites' live bytes as stacked areas and the peak marked (the moment `--view peak` shows),
//! drawn as SVG by `plotters`.
//!
//! The points come from the series the profile recorded in its one pass over the capture
//! (`crate::analysis::profile::series`): the last RSS reading, the live heap, and the live
//! bytes of each top site (grouped as the reports group them, by your code unless `--by`
//! says otherwise, ranked by their bytes at the peak). A profile without a series (too many
//! stacks changing too often to keep them) has the capture read once more,
//! through the same descriptors ([`CaptureSet`]: with followed children, all their captures
//! merged, so RSS is the sum of the processes' and the heap theirs together), the same
//! [`Aggregator`] as every view and the same memory allowance (`Budget`): after each timed
//! record (samples, RSS readings, the END) that is at least 1/[`POINTS`] of the capture after
//! the previous point, a point is taken.

use crate::analysis::aggregate::{Aggregator, Change};
use crate::analysis::focus::Memo;
use crate::analysis::grouping::{Grouping, Key, YourNodes};
use crate::analysis::names::StackId;
use crate::analysis::profile::series::{HeapRange, Recorded};
use crate::analysis::profile::{Budget, FastMap, Keep, Profile, Source, View};
use crate::analysis::sites::{rows, Row};
use crate::base::units::human_bytes;
use crate::capture::processes::{CaptureSet, Pick};
use crate::capture::records::Event;
use crate::views::about::rate_text;
use crate::views::formats::{check_output, write_file, Format};
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// Points taken over a capture, at most (plus the last one).
pub const POINTS: usize = 800;
/// Size of the picture in pixels.
pub const SIZE: (u32, u32) = (1200, 500);

/// One moment of the capture.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Seconds since the first timed record.
    pub seconds: f64,
    /// The last RSS reading (bytes), if there was one yet.
    pub rss: Option<f64>,
    /// The estimated live heap (bytes).
    pub heap: f64,
    /// The lowest and highest live heap since the point before, and whether the highest came
    /// first: what happened between two points (a temporary allocated and freed) still shows.
    pub heap_lo: f64,
    pub heap_hi: f64,
    pub hi_first: bool,
    /// Live bytes of each top site, in the order of [`Timeline::sites`].
    pub sites: Vec<f64>,
}

/// A capture over time.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub points: Vec<Point>,
    /// Labels of the top sites (`function (file:line)`), largest at the peak first.
    pub sites: Vec<String>,
    /// (seconds, bytes) of the peak live heap.
    pub peak: Option<(f64, f64)>,
    /// Where the RSS was at each breakdown (see `crate::analysis::resident`): seconds, and the
    /// bytes of each of [`RSS_BANDS`], stacked in that order above the live heap.
    pub rss_parts: Vec<(f64, [f64; RSS_BANDS.len()])>,
}

/// The parts of the RSS beside the sampled live heap, as the timeline stacks them above it
/// (their legend labels and colours).
pub const RSS_BANDS: [(&str, RGBColor); 5] = [
    ("RSS: live, not sampled", RGBColor(196, 170, 230)),
    ("RSS: free in pymalloc's arenas", RGBColor(250, 200, 140)),
    ("RSS: free memory malloc keeps", RGBColor(245, 225, 120)),
    ("RSS: sampled mappings, resident", RGBColor(150, 215, 230)),
    ("RSS: the rest (code, stacks, ...)", RGBColor(215, 215, 225)),
];

/// The bytes of [`RSS_BANDS`] in one breakdown.
fn bands(b: &crate::analysis::resident::Parts) -> [f64; RSS_BANDS.len()] {
    [
        b.live_unseen,
        b.pymalloc_free.unwrap_or(0) as f64,
        b.malloc_free.unwrap_or(0) as f64,
        b.mmap_resident.bytes,
        b.unexplained,
    ]
}

/// The timeline of the captures `set`, whose profile is `p`, with `top` sites: from the series
/// the profile recorded in its pass (see `crate::analysis::profile::series`), or, when it has
/// none, from one more pass over the captures.
pub fn load(set: &CaptureSet, p: &Profile, top: usize, by: Grouping) -> Result<Timeline> {
    load_from(Some(set), p, top, by)
}

/// [`load`] of what a view's path names ([`Source`]): interval profiles have no captures to
/// read again, only the series their profile recorded.
pub fn load_source(source: &Source, p: &Profile, top: usize, by: Grouping) -> Result<Timeline> {
    load_from(source.captures(), p, top, by)
}

/// [`load_source`] given the profile's rows for `by` sorted by the peak
/// ([`crate::analysis::sites::rows`]; the first `top` of them are enough), when the caller
/// has them already.
pub fn load_source_with(
    source: &Source,
    p: &Profile,
    top: usize,
    by: Grouping,
    peak_rows: &[Row],
) -> Result<Timeline> {
    load_rows(source.captures(), p, top, check_grouping(by)?, peak_rows)
}

fn load_from(set: Option<&CaptureSet>, p: &Profile, top: usize, by: Grouping) -> Result<Timeline> {
    let by = check_grouping(by)?;
    load_rows(set, p, top, by, &rows(p, View::Peak, by))
}

fn load_rows(
    set: Option<&CaptureSet>,
    p: &Profile,
    top: usize,
    by: Grouping,
    peak_rows: &[Row],
) -> Result<Timeline> {
    let keys: Vec<(String, String, u32)> = peak_rows
        .iter()
        .filter(|r| r.figures.peak.bytes >= 0.5)
        .take(top)
        .map(|r| (r.file.to_owned(), r.function.to_owned(), r.line))
        .collect();
    let points = match (p.series(), set) {
        (Some(series), _) => from_series(p, series, &keys, by),
        (None, Some(set)) => read_again(set, p, &keys, by)?,
        (None, None) => {
            return Err(anyhow!(
                "these interval profiles hold too many changing stacks to draw their timeline \
                 (more than {} changes); pick a shorter time range (DIR@FROM..TO)",
                crate::analysis::profile::series::MAX_LOG
            ))
        }
    };
    let sites = keys
        .iter()
        .map(|(file, function, line)| match function.is_empty() {
            true => crate::base::text::printable(&crate::analysis::frames::short_file(file))
                .into_owned(),
            false => crate::analysis::frames::label(&crate::analysis::names::Location {
                file,
                function,
                line: *line,
                firstline: *line,
                module: None,
            }),
        })
        .collect();
    let start_ns = p.start_ns.unwrap_or(0);
    // Breakdowns without the allocators' figures (a reading of the mappings far from any)
    // would draw their free memory as gone: left out when others have them.
    let known = p.breakdowns.iter().any(|b| b.malloc_free.is_some());
    let rss_parts = p
        .breakdowns
        .iter()
        .filter(|b| !known || b.malloc_free.is_some())
        .map(|b| (b.time_ns.saturating_sub(start_ns) as f64 / 1e9, bands(b)))
        .collect();
    Ok(Timeline {
        points,
        sites,
        peak: p.peak_seconds.map(|s| (s, p.totals().peak.bytes)),
        rss_parts,
    })
}

/// The points of a recorded series, with the live bytes of the lines `keys`.
fn from_series(
    p: &Profile,
    series: &Recorded,
    keys: &[(String, String, u32)],
    by: Grouping,
) -> Vec<Point> {
    let mut memo = Memo::default();
    let mut nodes = YourNodes::new(p);
    let key_of: Vec<Option<usize>> = series
        .lines
        .iter()
        .map(|&stack| {
            let key = match by {
                Grouping::YourCode => nodes
                    .find(p.focus(), stack)
                    .map(|(_, at, _)| Grouping::Line.frame_key(&at)),
                _ => by.stack_key(p.focus(), &mut memo, p.frames_with_origin(stack)),
            };
            site_of(keys, key)
        })
        .collect();
    let start_ns = p.start_ns.unwrap_or(0);
    let mut live = vec![0.0f64; keys.len()];
    // Each stack's bytes now: a site sums the stacks grouped into it.
    let mut stack_bytes = vec![0.0f64; series.lines.len()];
    let mut log = series.log.iter().peekable();
    let mut points = Vec::with_capacity(series.points.len());
    for (i, pt) in series.points.iter().enumerate() {
        while let Some(&&(_, line, bytes)) = log.peek().filter(|e| e.0 as usize <= i) {
            if let Some(k) = key_of[line as usize] {
                live[k] += bytes - stack_bytes[line as usize];
                stack_bytes[line as usize] = bytes;
            }
            log.next();
        }
        points.push(Point {
            seconds: pt.time_ns.saturating_sub(start_ns) as f64 / 1e9,
            rss: pt.rss.map(|r| r as f64),
            heap: pt.heap,
            heap_lo: pt.lo,
            heap_hi: pt.hi,
            hi_first: pt.hi_first,
            sites: live.iter().map(|b| b.max(0.0)).collect(),
        });
    }
    points
}

/// The points of the captures `set`, read once more.
fn read_again(
    set: &CaptureSet,
    p: &Profile,
    keys: &[(String, String, u32)],
    by: Grouping,
) -> Result<Vec<Point>> {
    let mut builder = Builder::new(p, keys.len());
    let mut key_of: FastMap<StackId, Option<usize>> = FastMap::default();
    let budget = Budget::new(Some(set.size()));
    let mut failure = None;
    set.for_each(|event, at| {
        builder.agg.enter(at.process);
        let change = match event {
            Event::Sample(b) => builder.agg.apply_sample(b, at.records.stacks()),
            Event::Free(addr) => builder.agg.apply_free(*addr),
            Event::Record(r) => builder.agg.apply(r),
        };
        let mut site = |agg: &Aggregator, stack: StackId| {
            *key_of.entry(stack).or_insert_with(|| {
                let key = by.stack_key(
                    p.focus(),
                    &mut Memo::default(),
                    agg.frames_with_origin(stack),
                );
                site_of(keys, key)
            })
        };
        match change {
            Change::Alloc { block, replaced } => {
                if let Some(old) = replaced {
                    if let Some(k) = site(&builder.agg, old.stack) {
                        builder.live[k] -= old.sample().bytes();
                    }
                }
                if let Some(k) = site(&builder.agg, block.stack) {
                    builder.live[k] += block.sample().bytes();
                }
            }
            Change::Free(old) => {
                if let Some(k) = site(&builder.agg, old.stack) {
                    builder.live[k] -= old.sample().bytes();
                }
            }
            Change::Ended(blocks) => {
                for old in builder.agg.ended.drain(blocks).collect::<Vec<_>>() {
                    if let Some(k) = site(&builder.agg, old.stack) {
                        builder.live[k] -= old.sample().bytes();
                    }
                }
            }
            Change::Other => {}
        }
        builder.observe();
        if let Some(t) = event.time_ns() {
            builder.at(t, false);
        }
        // The debug information of the files on this machine that the native frames need is
        // not the capture's (as in `Profile::build`).
        failure = budget
            .check(at.declared, builder.agg.resolver.symbol_memory())
            .err();
        failure.is_none()
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    builder.finish();
    Ok(builder.points)
}

/// The groupings by frame, which the timeline and the HTML report take (`--by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ByFrame {
    /// The innermost frame in your code (not the standard library, site-packages or the
    /// import system; see `--focus`), as report groups by default.
    YourCode,
    /// The innermost frame's file, function and line.
    Line,
    /// The innermost frame's function.
    Function,
    /// The innermost frame's file.
    File,
}

impl From<ByFrame> for Grouping {
    fn from(by: ByFrame) -> Grouping {
        match by {
            ByFrame::YourCode => Grouping::YourCode,
            ByFrame::Line => Grouping::Line,
            ByFrame::Function => Grouping::Function,
            ByFrame::File => Grouping::File,
        }
    }
}

/// How the timeline and the HTML report pick their sites: the grouping (`--by`, your code by
/// default as in every view), the files that count as your code besides the capture's
/// (`--focus`), the processes (`--pid`).
pub struct Sites<'a> {
    pub by: Grouping,
    pub focus: &'a [std::path::PathBuf],
    pub pick: Pick,
}

/// The index in `keys` of the row key `key`, if it is one of them.
fn site_of(keys: &[(String, String, u32)], key: Option<Key>) -> Option<usize> {
    let (file, function, line) = key?;
    keys.iter()
        .position(|(f, n, l)| (f.as_str(), n.as_str(), *l) == (file, function, line))
}

/// The grouping the timeline (and the HTML report) can draw: one by frame (your code, line,
/// function, file); the others are refused with a clear error.
pub fn check_grouping(by: Grouping) -> Result<Grouping> {
    match by {
        Grouping::Stack | Grouping::Thread => Err(anyhow!(
            "the timeline groups by your-code, line, function or file, not by {}",
            by.name()
        )),
        by => Ok(by),
    }
}

/// Collects points while the records are applied.
struct Builder {
    agg: Aggregator,
    live: Vec<f64>,
    points: Vec<Point>,
    start_ns: u64,
    step_ns: u64,
    last_ns: Option<u64>,
    last_point_ns: Option<u64>,
    /// The live heap's range since the last point.
    range: HeapRange,
}

impl Builder {
    /// After every event: the live heap now, for the range between points.
    fn observe(&mut self) {
        self.range.observe(self.agg.live_bytes);
    }

    fn new(p: &Profile, sites: usize) -> Builder {
        Builder {
            agg: Aggregator::new(p.rate),
            live: vec![0.0; sites],
            points: Vec::new(),
            start_ns: p.start_ns.unwrap_or(0),
            step_ns: ((p.duration_seconds * 1e9) as u64 / POINTS as u64).max(1),
            last_ns: None,
            last_point_ns: None,
            range: HeapRange::default(),
        }
    }

    /// Takes a point at `time_ns` if it is far enough from the last one (or `always`).
    fn at(&mut self, time_ns: u64, always: bool) {
        self.last_ns = Some(time_ns);
        if !always
            && self
                .last_point_ns
                .is_some_and(|t| time_ns.saturating_sub(t) < self.step_ns)
        {
            return;
        }
        self.last_point_ns = Some(time_ns);
        let heap = self.agg.live_bytes.max(0.0);
        let (heap_lo, heap_hi, hi_first) = self.range.take(heap);
        self.points.push(Point {
            seconds: time_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            rss: self.agg.last_rss.map(|r| r as f64),
            heap,
            heap_lo,
            heap_hi,
            hi_first,
            sites: self.live.iter().map(|b| b.max(0.0)).collect(),
        });
    }

    /// The last point: the state after the last record.
    fn finish(&mut self) {
        if let Some(t) = self.last_ns {
            if self.last_point_ns != Some(t) || self.points.is_empty() {
                self.at(t, true);
            } else if let Some(last) = self.points.last_mut() {
                last.heap = self.agg.live_bytes.max(0.0);
                last.heap_lo = last.heap_lo.min(last.heap);
                last.heap_hi = last.heap_hi.max(last.heap);
                last.rss = self.agg.last_rss.map(|r| r as f64);
                last.sites = self.live.iter().map(|b| b.max(0.0)).collect();
            }
        }
    }
}

/// Colours of the top sites' areas.
const SITE_COLOURS: [RGBColor; 8] = [
    RGBColor(235, 130, 60),
    RGBColor(90, 150, 215),
    RGBColor(95, 180, 95),
    RGBColor(165, 110, 200),
    RGBColor(220, 190, 60),
    RGBColor(70, 190, 190),
    RGBColor(215, 95, 140),
    RGBColor(140, 140, 100),
];

/// The timeline as SVG text.
pub fn svg(p: &Profile, t: &Timeline) -> Result<String> {
    let mut out = String::new();
    draw(p, t, &mut out).map_err(|e| anyhow!("drawing the timeline: {e}"))?;
    Ok(out)
}

/// The live heap's line: through each point, and through the lowest and highest values
/// between it and the point before (in the order they came), a third and two thirds of the
/// way: at any zoom, a temporary allocated and freed between two points draws its rise and
/// its drop.
pub fn heap_path(points: &[Point]) -> Vec<(f64, f64)> {
    let mut path = Vec::with_capacity(points.len() * 3);
    let mut before = None;
    for pt in points {
        if let Some(t0) = before {
            let dt = pt.seconds - t0;
            let (first, second) = if pt.hi_first {
                (pt.heap_hi, pt.heap_lo)
            } else {
                (pt.heap_lo, pt.heap_hi)
            };
            if pt.heap_hi > pt.heap_lo {
                path.push((t0 + dt / 3.0, first));
                path.push((t0 + 2.0 * dt / 3.0, second));
            }
        }
        path.push((pt.seconds, pt.heap));
        before = Some(pt.seconds);
    }
    path
}

/// The width of the legend, right of the plot: the legend never covers the curves.
const LEGEND_WIDTH: u32 = 340;

/// What a legend entry shows beside its label.
enum Mark {
    Area(RGBColor),
    Line(RGBColor),
    Tick(RGBColor),
}

fn draw(p: &Profile, t: &Timeline, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut caption = format!("mprof timeline: {}", rate_text(p));
    if p.incomplete().is_some() {
        caption.push_str(" — INCOMPLETE capture (no END record)");
    }
    let root = root.titled(&caption, ("sans-serif", 18))?;
    let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let end = t.points.last().map_or(0.0, |pt| pt.seconds).max(1e-3);
    let top = t
        .points
        .iter()
        .map(|pt| pt.heap_hi.max(pt.rss.unwrap_or(0.0)))
        .fold(1.0f64, f64::max)
        * 1.08;
    // The y axis counts in one binary unit, so that its ticks fall on round numbers of it
    // (20 MiB, 40 MiB), not on round numbers of bytes printed in MiB (47.68 MiB).
    let (scale, unit) = crate::base::units::binary_unit(top);
    let top = top / scale;
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..end, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("bytes")
        .y_label_formatter(&|v| format!("{} {unit}", round_tick(*v)))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    // A crafted capture's figures can lie far outside the axes, or be no number at all:
    // plotters turns coordinates into pixels with integer arithmetic, so every point drawn
    // is kept inside the chart (a real capture's are inside already).
    let clip = |points: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        points
            .into_iter()
            .map(|(x, y)| (inside(x, end), inside(y, top)))
            .collect()
    };
    let series = |f: &dyn Fn(&Point) -> f64| -> Vec<(f64, f64)> {
        clip(
            t.points
                .iter()
                .map(|pt| (pt.seconds, f(pt) / scale))
                .collect(),
        )
    };
    // The RSS's parts beside the live heap, stacked above the sampled live heap of their
    // moment (python_live + native_live), drawn first: the sites cover the heap below them.
    let mut rss_entries = Vec::new();
    if !t.rss_parts.is_empty() {
        let heap_at = |seconds: f64| {
            let i = t.points.partition_point(|pt| pt.seconds <= seconds);
            i.checked_sub(1).map_or(0.0, |i| t.points[i].heap)
        };
        for k in (0..RSS_BANDS.len()).rev() {
            if t.rss_parts.iter().all(|(_, b)| b[k] <= 0.0) {
                continue;
            }
            let (label, colour) = RSS_BANDS[k];
            let stacked: Vec<(f64, f64)> = t
                .rss_parts
                .iter()
                .map(|(s, b)| (*s, (heap_at(*s) + b[..=k].iter().sum::<f64>()) / scale))
                .collect();
            chart.draw_series(AreaSeries::new(clip(stacked), 0.0, colour.mix(0.9)))?;
            rss_entries.push((Mark::Area(colour), label.to_owned()));
        }
        rss_entries.reverse();
    }
    let grey = RGBColor(200, 200, 200);
    let heap: Vec<(f64, f64)> = clip(
        heap_path(&t.points)
            .into_iter()
            .map(|(s, b)| (s, b / scale))
            .collect(),
    );
    chart.draw_series(AreaSeries::new(heap.clone(), 0.0, grey.mix(0.5)))?;
    let mut entries = vec![(Mark::Area(grey), "other sites".to_owned())];
    // The legend lists the sites largest first; the areas are stacked by drawing the largest
    // cumulative area first and each smaller one over it.
    for (k, site) in t.sites.iter().enumerate() {
        entries.push((
            Mark::Area(SITE_COLOURS[k % SITE_COLOURS.len()]),
            site.clone(),
        ));
    }
    for k in (0..t.sites.len()).rev() {
        let colour = SITE_COLOURS[k % SITE_COLOURS.len()];
        chart.draw_series(AreaSeries::new(
            series(&|pt| pt.sites[..=k].iter().sum()),
            0.0,
            colour.mix(0.85),
        ))?;
    }
    chart.draw_series(LineSeries::new(heap, BLACK.stroke_width(2)))?;
    entries.push((Mark::Line(BLACK), "live heap (estimated)".to_owned()));
    let rss: Vec<(f64, f64)> = clip(
        t.points
            .iter()
            .filter_map(|pt| pt.rss.map(|r| (pt.seconds, r / scale)))
            .collect(),
    );
    if !rss.is_empty() {
        chart.draw_series(LineSeries::new(rss, RED.stroke_width(2)))?;
        entries.push((Mark::Line(RED), "RSS".to_owned()));
    }
    entries.extend(rss_entries);
    if let Some(reserved) = crate::views::about::reserved_above_rss(p) {
        // The live heap drawn above the RSS line: what the sampled mappings map, not what is
        // resident.
        entries.push((
            Mark::Line(RGBColor(120, 120, 120)),
            format!("heap above RSS: {} reserved", human_bytes(reserved)),
        ));
    }
    if let Some((at, bytes)) = t.peak {
        chart.draw_series(LineSeries::new(
            clip(vec![(at, 0.0), (at, top)]),
            BLUE.mix(0.6).stroke_width(1),
        ))?;
        entries.push((
            Mark::Tick(BLUE),
            format!("peak {} at {at:.2} s (--view peak)", human_bytes(bytes)),
        ));
    }
    draw_legend(&legend, &entries)?;
    root.present()?;
    Ok(())
}

/// The legend, one entry a line from the top of its panel; labels cut to the panel's width.
fn draw_legend(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    entries: &[(Mark, String)],
) -> Result<(), Box<dyn std::error::Error>> {
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    // About 7 pixels a character at 13 px, after the mark.
    let chars = (LEGEND_WIDTH as usize - 40) / 7;
    for (i, (mark, label)) in entries.iter().enumerate() {
        let y = 24 + 20 * i as i32;
        match mark {
            Mark::Area(c) => {
                area.draw(&Rectangle::new([(4, y - 5), (16, y + 5)], c.filled()))?;
            }
            Mark::Line(c) => {
                area.draw(&PathElement::new(vec![(4, y), (16, y)], c.stroke_width(2)))?;
            }
            Mark::Tick(c) => {
                area.draw(&PathElement::new(vec![(10, y - 6), (10, y + 6)], *c))?;
            }
        }
        let text = crate::base::text::elide(label, chars);
        area.draw(&Text::new(text.into_owned(), (24, y - 7), font.clone()))?;
    }
    Ok(())
}

/// `v` within 0 and `max` (0 when it is no number).
fn inside(v: f64, max: f64) -> f64 {
    if v.is_finite() {
        v.clamp(0.0, max.max(0.0))
    } else {
        0.0
    }
}

/// A tick's value as the axis prints it: whole numbers bare, others with what they need.
fn round_tick(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `mprof timeline`: writes the timeline of `path` (the processes `pick` says) to `out` (SVG).
pub fn run(path: &Path, out: &Path, top: usize, sites: &Sites) -> Result<()> {
    let csv = Format::of_path(out) == Some(Format::Csv);
    check_output(out, if csv { Format::Csv } else { Format::Svg })?;
    let by = check_grouping(sites.by)?;
    let source = Source::open(path, sites.pick)?;
    let mut p = source.load_keeping(Keep::Series)?;
    p.set_focus(sites.focus);
    let t = load_source(&source, &p, top, by)?;
    if t.points.is_empty() {
        crate::say!("mprof: warning: the capture has no timed record; the timeline is empty");
    }
    if csv {
        return write_file(out, "timeline", table(&t).as_bytes());
    }
    write_file(out, "timeline", svg(&p, &t)?.as_bytes())
}

/// The timeline's points as CSV: seconds, RSS, the live heap at the point and its lowest and
/// highest since the point before, each top site's live bytes (a column per site, named by
/// its label), and each part of the RSS as last broken down (empty before the first).
pub fn table(t: &Timeline) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut out = String::from("seconds,rss,heap,heap_min,heap_max");
    for site in &t.sites {
        out.push(',');
        out.push_str(&quote(site));
    }
    for (label, _) in RSS_BANDS {
        out.push(',');
        out.push_str(&quote(label));
    }
    out.push('\n');
    let mut parts = t.rss_parts.iter().peekable();
    let mut current = None;
    for pt in &t.points {
        while let Some((_, b)) = parts.next_if(|(s, _)| *s <= pt.seconds) {
            current = Some(b);
        }
        let rss = pt.rss.map_or(String::new(), |r| format!("{r:.0}"));
        let _ = write!(
            out,
            "{:.9},{rss},{:.0},{:.0},{:.0}",
            pt.seconds, pt.heap, pt.heap_lo, pt.heap_hi
        );
        for b in &pt.sites {
            let _ = write!(out, ",{b:.0}");
        }
        for k in 0..RSS_BANDS.len() {
            match current {
                Some(b) => {
                    let _ = write!(out, ",{:.0}", b[k]);
                }
                None => out.push(','),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::testing::CaptureBuilder;
    use mprof_common::record::Record;

    #[test]
    fn the_y_axis_ticks_are_round() {
        assert_eq!(round_tick(20.0), "20");
        assert_eq!(round_tick(2.5), "2.5");
        assert_eq!(round_tick(0.0), "0");
    }

    /// A temporary allocated and freed between two points (no timed record in between) shows
    /// in the point's range, in the line drawn and in the CSV table.
    #[test]
    fn a_temporary_between_two_points_is_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = CaptureBuilder::new();
        c.meta("rate=1").code(1, "a.py", "f", 1);
        c.alloc(1, 1000, 1_000_000_000, &[(1, 2)]);
        c.alloc(2, 100_000, 1_000_000_100, &[(1, 3)]);
        c.free(2);
        c.alloc(3, 10, 1_000_000_200, &[(1, 4)]);
        c.alloc(4, 10, 2_000_000_000, &[(1, 4)]);
        let path = c.write(dir.path(), "t.mprof");
        let set = CaptureSet::open(&path, Pick::All).unwrap();
        let p = Profile::load_set_keeping(&set, Keep::Series).unwrap();
        let t = load(&set, &p, 5, Grouping::Line).unwrap();
        let last = t.points.last().unwrap();
        assert_eq!(last.seconds, 1.0);
        assert_eq!(last.heap, 1020.0);
        assert_eq!((last.heap_lo, last.heap_hi), (1000.0, 101_000.0));
        assert!(last.hi_first);
        let path = heap_path(&t.points);
        let top = path.iter().position(|&(_, b)| b == 101_000.0).unwrap();
        assert_eq!(
            path[top + 1].1,
            1000.0,
            "the drop follows the rise: {path:?}"
        );
        let csv = table(&t);
        assert!(
            csv.starts_with("seconds,rss,heap,heap_min,heap_max,"),
            "{csv}"
        );
        assert!(csv
            .lines()
            .last()
            .unwrap()
            .starts_with("1.000000000,,1020,1000,101000,"));
    }

    #[test]
    fn points_follow_the_heap_rss_and_top_sites() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = CaptureBuilder::new();
        c.meta("rate=1")
            .code(1, "a.py", "f", 1)
            .code(2, "a.py", "g", 5);
        c.alloc(1, 1000, 1_000_000_000, &[(1, 2)]);
        c.push(Record::Rss {
            time_ns: 1_500_000_000,
            rss_bytes: 10_000,
        });
        c.alloc(2, 300, 2_000_000_000, &[(2, 6)]);
        c.free(1);
        c.alloc(3, 100, 3_000_000_000, &[(2, 6)]);
        let path = c.write(dir.path(), "t.mprof");
        let set = CaptureSet::open(&path, Pick::All).unwrap();
        let p = Profile::load_set_keeping(&set, Keep::Series).unwrap();
        let t = load(&set, &p, 5, Grouping::Line).unwrap();
        assert_eq!(t.sites, ["f (a.py:2)", "g (a.py:6)"]);
        let at = |s: f64| {
            t.points
                .iter()
                .find(|pt| (pt.seconds - s).abs() < 1e-9)
                .unwrap()
        };
        assert_eq!(at(0.0).heap, 1000.0);
        assert_eq!(at(0.0).rss, None);
        assert_eq!(at(0.5).rss, Some(10_000.0));
        assert_eq!(at(1.0).sites, [1000.0, 300.0]);
        assert_eq!(at(2.0).heap, 400.0);
        assert_eq!(at(2.0).sites, [0.0, 400.0]);
        assert_eq!(t.peak, Some((1.0, 1300.0)));
        let svg = svg(&p, &t).unwrap();
        assert!(svg.contains("<svg") && svg.contains("f (a.py:2)"));
        assert!(svg.contains("peak 1.27 KiB at 1.00 s"), "{svg}");
    }

    /// A library line reached from two lines of yours: by your code (the default of every
    /// view) two areas, one per line of yours, from the series and from a second reading
    /// alike; by line, one.
    #[test]
    fn areas_are_grouped_as_the_reports_group_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = CaptureBuilder::new();
        c.meta("rate=1\ncwd=/srv\nprogram_dir=/srv\n")
            .code(1, "/srv/app.py", "main", 1)
            .code(2, "/usr/lib/python3.11/json/encoder.py", "encode", 100);
        c.alloc(1, 1000, 1_000_000_000, &[(2, 105), (1, 10)]);
        c.alloc(2, 500, 2_000_000_000, &[(2, 105), (1, 20)]);
        let path = c.write(dir.path(), "t.mprof");
        let set = CaptureSet::open(&path, Pick::All).unwrap();
        let p = Profile::load_set_keeping(&set, Keep::Series).unwrap();
        let t = load(&set, &p, 5, Grouping::YourCode).unwrap();
        assert_eq!(t.sites, ["main (/srv/app.py:10)", "main (/srv/app.py:20)"]);
        assert_eq!(t.points.last().unwrap().sites, [1000.0, 500.0]);
        let keys: Vec<(String, String, u32)> = [10, 20]
            .map(|l| ("/srv/app.py".to_owned(), "main".to_owned(), l))
            .to_vec();
        let again = read_again(&set, &p, &keys, Grouping::YourCode).unwrap();
        assert_eq!(again.last().unwrap().sites, [1000.0, 500.0]);
        let t = load(&set, &p, 5, Grouping::Line).unwrap();
        assert_eq!(t.sites, ["encode (json/encoder.py:105)"]);
        assert_eq!(t.points.last().unwrap().sites, [1500.0]);
        assert!(check_grouping(Grouping::Stack).is_err());
    }
}
