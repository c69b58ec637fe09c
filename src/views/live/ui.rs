//! Drawing the live view with ratatui.
//!
//! ```text
//!  mprof record · PID 4242 · python3 app.py                       title
//!  Python 3.12.1 · rate 128.00 KiB · up 0:01:05 · 40 samples/s …  session
//!  RSS           50.00 MiB ▁▂▃▅▆▇██  alloc rate 2.00 MiB/s        sparklines, one point a refresh
//!  live heap     20.00 MiB ▁▁▂▃▄▅▆▇  peak 21.00 MiB
//!  RSS − heap    30.00 MiB  python 5.00 MiB · native 14.0 MiB · …  heap by allocator
//!  by your code (← innermost) · own bytes · all threads · rows 1-15  what the table shows
//!  ALLOC/s ▼ALLOCATED   LIVE SAMPLES FUNCTION   FILE:LINE         table
//!  q quit  ? help  s sort  g group …                              keys
//!  program output → app.mprof.out · capture → app.mprof           where things go
//! ```
//! Everything is written out in text: the sort column is marked `▼`, a paused display says
//! PAUSED, and reverse video only helps the eye, so the view reads the same without colours.
//! When the terminal is narrow, segments of a line are dropped whole, table columns go (never
//! the one sorted by), and paths lose their beginning, not their end.

use super::keys::ViewState;
use super::model::{rows, Column, Model, Row, Snapshot};
use super::{Mode, Target};
use crate::analysis::allocators::Allocator;
use crate::analysis::grouping::Grouping;
use crate::base::text::printable;
use crate::base::units::human_bytes;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table};
use ratatui::Frame;

/// Lines above the table, and below it.
const HEADER_LINES: u16 = 6;
const FOOTER_LINES: u16 = 2;
/// Width of each figure column of the table.
const FIGURE_WIDTH: usize = 8;
const SAMPLES_WIDTH: usize = 8;
/// Columns of the table left to the function and the location before figures are dropped.
const NAME_WIDTH_WANTED: usize = 28;
/// Width of the labels and values in front of the sparklines.
const LABEL_WIDTH: usize = 11;
const VALUE_WIDTH: usize = 11;

/// What one frame of the screen is drawn from.
pub struct Screen<'a> {
    pub target: &'a Target,
    pub model: &'a Model,
    pub snap: &'a Snapshot,
    pub view: &'a ViewState,
}

/// How many table rows fit in a terminal `height` lines high.
pub fn table_rows(height: u16) -> usize {
    height.saturating_sub(HEADER_LINES + FOOTER_LINES + 1) as usize
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, s: &Screen) {
    let area = frame.area();
    let [header, table, footer] = Layout::vertical([
        Constraint::Length(HEADER_LINES.min(area.height)),
        Constraint::Min(0),
        Constraint::Length(FOOTER_LINES),
    ])
    .areas(area);
    let width = area.width as usize;
    let rows = rows(s.model, s.snap, &s.view.settings);
    let page = table.height.saturating_sub(1) as usize;
    let first = s.view.scroll.min(rows.len().saturating_sub(page));
    let mut lines = header_lines(s, width);
    lines.push(table_title(s, &rows, first, page, width));
    frame.render_widget(Paragraph::new(lines), header);
    frame.render_widget(site_table(s, &rows[first..], width), table);
    let followed = s.snap.processes.len() > 1;
    frame.render_widget(
        Paragraph::new(footer_lines(s.target, followed, width)),
        footer,
    );
    if s.view.help {
        draw_help(frame, s.target, area);
    }
}

fn reversed() -> Style {
    Style::default().add_modifier(Modifier::REVERSED)
}

/// The lines above the table title.
fn header_lines(s: &Screen, width: usize) -> Vec<Line<'static>> {
    let t = s.target;
    let snap = s.snap;
    let mode = match t.mode {
        Mode::Record => "record",
        Mode::Attach => "attach",
    };
    let title = format!(" mprof {mode} · PID {} · {}", t.pid, printable(&t.command));
    let python = if snap.python.is_empty() {
        "Python ?".to_owned()
    } else {
        format!("Python {}", printable(&snap.python))
    };
    let rate = if snap.rate <= 1 {
        "rate 1 (every allocation)".to_owned()
    } else {
        format!("rate {}", human_bytes(snap.rate as f64))
    };
    let mut parts = vec![
        python,
        rate,
        format!("up {}", clock(snap.elapsed_s)),
        format!("{} dropped", snap.dropped),
    ];
    if snap.skipped > 0 {
        parts.push(format!("view skipped {}", snap.skipped));
    }
    parts.push(format!("{:.0} samples/s", snap.sample_rate));
    let session = fit(&parts, " · ", width);
    let spark_width = width
        .saturating_sub(LABEL_WIDTH + VALUE_WIDTH + 2 + 24)
        .min(30);
    let rss = snap.rss.map(|r| r as f64);
    let gap = rss.map(|r| r - snap.live_heap);
    vec![
        Line::styled(pad(&title, width), reversed()),
        Line::raw(session),
        gauge(
            "RSS",
            rss,
            &snap.rss_history,
            spark_width,
            &format!("alloc rate {}/s", human_bytes(snap.alloc_rate)),
        ),
        gauge(
            "live heap",
            Some(snap.live_heap),
            &snap.heap_history,
            spark_width,
            &format!("peak {}", human_bytes(snap.peak_heap)),
        ),
        gap_line(s, gap, width),
    ]
}

/// `RSS − heap  30.00 MiB  python 5.00 MiB · native 14.0 MiB · mmap 2.00 MiB`: the gap
/// between RSS and the live heap (all allocators), and how the allocators share the heap; the
/// gap's meaning when there is room.
fn gap_line(s: &Screen, gap: Option<f64>, width: usize) -> Line<'static> {
    let split = &s.snap.live_split;
    let value = format!(
        "{:<LABEL_WIDTH$}{:>VALUE_WIDTH$}",
        "RSS − heap",
        gap.map_or("?".into(), human_bytes)
    );
    let room = width.saturating_sub(value.chars().count() + 2);
    let shares = |names: [&str; 3], sep: &str| {
        Allocator::ALL
            .iter()
            .map(|&a| format!("{} {}", names[a as usize], compact_bytes(split[a as usize])))
            .collect::<Vec<_>>()
            .join(sep)
    };
    let heap = if s.target.python_only {
        "python only (--python-only: the gap holds native memory)".to_owned()
    } else {
        // The short form when the long one does not fit; none when neither does.
        [
            shares(["python", "native", "mmap"], " · "),
            shares(["py", "nat", "mmap"], " "),
        ]
        .into_iter()
        .find(|t| t.chars().count() <= room)
        .unwrap_or_default()
    };
    let gap = match &s.snap.rss_parts {
        Some(b) => kept_text(b),
        None => "gap: allocator-held, fragmented or unseen memory".to_owned(),
    };
    let parts = [value, heap, gap];
    Line::raw(fit(&parts, "  ", width))
}

/// `kept: malloc free 190 MiB · rest 9.00 MiB · pymalloc free 1.00 MiB`: what holds the RSS
/// beside the live heap at the latest reading of the allocators' figures, largest first.
fn kept_text(b: &crate::analysis::resident::Parts) -> String {
    let short = |part: &str| match part {
        "live_unseen" => "unsampled live",
        "pymalloc_free" => "pymalloc free",
        "malloc_free" => "malloc free",
        "mmap_resident" => "mmaps",
        _ => "rest",
    };
    // Sampled mappings mostly not resident come first: the live heap counts what they map,
    // and is above the RSS by them.
    let reserved = b.reserved();
    let reserved = (reserved >= crate::analysis::resident::RESERVED_NOTE).then_some(reserved);
    let kept: Vec<String> = b
        .ranked()
        .into_iter()
        .filter(|(part, bytes)| !part.ends_with("_live") && *bytes >= 1.0)
        .take(if reserved.is_some() { 1 } else { 3 })
        .map(|(part, bytes)| format!("{} {}", short(part), compact_bytes(bytes)))
        .collect();
    let kept = format!("kept: {}", kept.join(" · "));
    match reserved {
        Some(r) => format!(
            "reserved {} (mapped, not resident) · {kept}",
            compact_bytes(r)
        ),
        None => kept,
    }
}

/// `label  value ▁▂▃▅  extra`.
fn gauge(
    label: &str,
    value: Option<f64>,
    history: &[f64],
    width: usize,
    extra: &str,
) -> Line<'static> {
    let value = value.map_or("?".into(), human_bytes);
    let mut text = format!("{label:<LABEL_WIDTH$}{value:>VALUE_WIDTH$}");
    if width > 0 {
        text.push(' ');
        text.push_str(&sparkline(history, width));
    }
    text.push_str("  ");
    text.push_str(extra);
    Line::raw(text)
}

/// The last `width` values as bars `▁`–`█` scaled to the largest shown (from zero); zero is a
/// blank, and the line is padded on the right while the history is short.
pub fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let shown = &values[values.len().saturating_sub(width)..];
    let max = shown.iter().cloned().fold(0.0, f64::max);
    let mut out = String::new();
    for &v in shown {
        if v <= 0.0 || max <= 0.0 {
            out.push(' ');
        } else {
            let level = ((v / max) * 7.0).round() as usize;
            out.push(BARS[level.min(7)]);
        }
    }
    out.extend(std::iter::repeat_n(' ', width - shown.len()));
    out
}

/// What the table shows, on the line above it.
fn table_title(s: &Screen, rows: &[Row], first: usize, page: usize, width: usize) -> Line<'static> {
    let set = &s.view.settings;
    let mut parts = Vec::new();
    if s.view.paused {
        parts.push("PAUSED (p resumes)".to_owned());
    }
    parts.push(match set.group {
        Grouping::YourCode => "by your code (← innermost)".to_owned(),
        other => format!("by {}", other.name()),
    });
    parts.push(if set.inclusive {
        "total bytes (with callees)".to_owned()
    } else {
        "own bytes".to_owned()
    });
    let processes = &s.snap.processes;
    match set.process {
        None if processes.len() > 1 => {
            let running = processes.iter().filter(|p| !p.ended).count();
            parts.push(format!(
                "all {} processes ({running} running)",
                processes.len()
            ));
        }
        None => {}
        Some(pid) => parts.push(match processes.iter().find(|p| p.pid == pid) {
            Some(p) if !p.command.is_empty() => {
                let command = cut_right(&printable(&p.command), 40);
                let ended = if p.ended { ", ended" } else { "" };
                format!("PID {pid} ({command}{ended})")
            }
            _ => format!("PID {pid}"),
        }),
    }
    parts.push(match set.thread {
        None => "all threads".to_owned(),
        Some(tid) => match s.snap.threads.iter().find(|t| t.tid == tid) {
            Some(t) => format!("thread {}", printable(&t.label())),
            None => format!("thread {tid}"),
        },
    });
    let shown = rows.len().saturating_sub(first).min(page);
    parts.push(if shown == 0 {
        "no rows yet".to_owned()
    } else {
        format!("rows {}-{} of {}", first + 1, first + shown, rows.len())
    });
    Line::styled(
        fit(&parts, " · ", width),
        Style::default().add_modifier(Modifier::BOLD),
    )
}

/// The figure columns shown at `width`: every column unless the names would get fewer than
/// [`NAME_WIDTH_WANTED`] columns; then samples, allocated, rate go in that order, but never
/// the sort column.
fn figure_columns(width: usize, sort: Column) -> Vec<Column> {
    let mut shown = Column::ALL.to_vec();
    let used = |cols: &[Column]| cols.iter().map(|&c| column_width(c) + 1).sum::<usize>();
    for drop in [Column::Samples, Column::Allocated, Column::Rate] {
        if width.saturating_sub(used(&shown)) >= NAME_WIDTH_WANTED {
            break;
        }
        if drop != sort {
            shown.retain(|&c| c != drop);
        }
    }
    shown
}

fn column_width(c: Column) -> usize {
    match c {
        Column::Samples => SAMPLES_WIDTH,
        Column::Allocated => FIGURE_WIDTH + 2,
        _ => FIGURE_WIDTH,
    }
}

/// The table of allocation sites.
fn site_table<'a>(s: &Screen, rows: &[Row], width: usize) -> Table<'a> {
    let sort = s.view.settings.sort;
    let by_file = s.view.settings.group == Grouping::File;
    let columns = figure_columns(width, sort);
    let names = width.saturating_sub(columns.iter().map(|&c| column_width(c) + 1).sum());
    let longest = rows
        .iter()
        .map(|r| r.function.chars().count())
        .max()
        .unwrap_or(0);
    let function_width = if by_file {
        0
    } else {
        longest.clamp(8, 8.max(names / 2)).min(names)
    };
    let location_width = names.saturating_sub(function_width + usize::from(!by_file));
    let mut widths: Vec<Constraint> = columns
        .iter()
        .map(|&c| Constraint::Length(column_width(c) as u16))
        .collect();
    let mut heading: Vec<Cell> = columns
        .iter()
        .map(|&c| {
            let mark = if c == sort { "▼" } else { "" };
            Cell::from(format!(
                "{:>w$}",
                format!("{mark}{}", c.heading()),
                w = column_width(c)
            ))
        })
        .collect();
    if !by_file {
        widths.push(Constraint::Length(function_width as u16));
        heading.push(Cell::from("FUNCTION"));
    }
    widths.push(Constraint::Length(location_width as u16));
    heading.push(Cell::from(if by_file { "FILE" } else { "FILE:LINE" }));
    let interval = s.snap.interval_s.max(1e-9);
    let body = rows.iter().map(|r| {
        let mut cells: Vec<Cell> = columns
            .iter()
            .map(|&c| {
                let f = &r.figures;
                let text = match c {
                    Column::Rate => compact_bytes(f.recent.bytes / interval),
                    Column::Allocated => compact_bytes(f.allocated.bytes),
                    Column::Live => compact_bytes(f.live.bytes),
                    Column::Samples => count(f.allocated.samples),
                };
                Cell::from(format!("{text:>w$}", w = column_width(c)))
            })
            .collect();
        if !by_file {
            cells.push(Cell::from(cut_right(
                &printable(r.function),
                function_width,
            )));
        }
        cells.push(Cell::from(location_cell(
            r,
            s.view.settings.group,
            location_width,
        )));
        TableRow::new(cells)
    });
    Table::new(body, widths)
        .header(TableRow::new(heading).style(reversed()))
        .column_spacing(1)
}

/// `file:line` (the function's first line by function, the file alone by file or without a
/// line, as for a C function known by its symbol or by function, `-` for a pseudo-frame).
fn location(r: &Row, group: Grouping) -> String {
    match group {
        _ if r.is_pseudo() && group != Grouping::File => "-".to_owned(),
        Grouping::File => r.file.to_owned(),
        _ => file_line(r.file, r.line),
    }
}

/// `file:line`, or `file` for line 0 (no line known), as the reports write it.
fn file_line(file: &str, line: u32) -> String {
    match line {
        0 => file.to_owned(),
        _ => format!("{file}:{line}"),
    }
}

/// The location column of a row, made printable, in `width` columns: [`location`], or for a
/// row grouped by your code whose stacks go deeper, both frames with their short file names
/// (`web/templates.py:97 ← json/encoder.py:200`), each losing its beginning when cut.
fn location_cell(r: &Row, group: Grouping, width: usize) -> String {
    let inner = match r.beside.and_then(|b| b.innermost) {
        Some(loc) if !r.is_pseudo() && width > 3 => loc,
        _ => return cut_left(&printable(&location(r, group)), width),
    };
    let short = |file: &str, line: u32| {
        printable(&file_line(&crate::analysis::frames::short_file(file), line)).into_owned()
    };
    let own = short(r.file, r.line);
    let inner = short(inner.file, inner.line);
    let (a, b) = share(width - 3, own.chars().count(), inner.chars().count());
    format!("{} ← {}", cut_left(&own, a), cut_left(&inner, b))
}

/// The key summary (with the process key when there is more than one process: `followed`)
/// and where the output goes.
fn footer_lines(t: &Target, followed: bool, width: usize) -> Vec<Line<'static>> {
    let quit = match t.mode {
        Mode::Record => " q close view",
        Mode::Attach => " q detach",
    };
    let mut keys = vec![
        quit.to_owned(),
        "? help".to_owned(),
        "s/1-4 sort".to_owned(),
        "g group".to_owned(),
        "t own/total".to_owned(),
        "f thread".to_owned(),
    ];
    if followed {
        keys.push("c process".to_owned());
    }
    keys.extend(["p pause".to_owned(), "↑↓ scroll".to_owned()]);
    let keys = fit(&keys, "  ", width);
    let capture = t.capture.display().to_string();
    let whereabouts = match &t.program_output {
        Some(out) => {
            let out = out.display().to_string();
            let (out_width, capture_width) = share(
                width.saturating_sub(30),
                out.chars().count(),
                capture.chars().count(),
            );
            format!(
                "program output → {} · capture → {}",
                cut_left(&out, out_width),
                cut_left(&capture, capture_width)
            )
        }
        None => format!("capture → {}", cut_left(&capture, width.saturating_sub(10))),
    };
    vec![
        Line::styled(pad(&keys, width), reversed()),
        Line::raw(cut_right(&whereabouts, width)),
    ]
}

/// Splits `width` columns between two texts `a` and `b` columns long: evenly, except that a
/// text shorter than its half leaves the rest to the other.
fn share(width: usize, a: usize, b: usize) -> (usize, usize) {
    let half = width / 2;
    match (a <= half, b <= width - half) {
        (true, _) => (a, width - a),
        (_, true) => (width - b, b),
        _ => (half, width - half),
    }
}

/// The parts that fit in `width`, in order, joined by `sep`; a part that does not fit is left
/// out whole.
fn fit(parts: &[String], sep: &str, width: usize) -> String {
    let mut out = String::new();
    for part in parts {
        let extra = if out.is_empty() {
            0
        } else {
            sep.chars().count()
        };
        if out.chars().count() + extra + part.chars().count() <= width {
            if !out.is_empty() {
                out.push_str(sep);
            }
            out.push_str(part);
        }
    }
    out
}

fn pad(text: &str, width: usize) -> String {
    let text = cut_right(text, width);
    let n = text.chars().count();
    format!("{text}{}", " ".repeat(width.saturating_sub(n)))
}

/// `text` in at most `width` columns, its end replaced by `…` when cut.
pub fn cut_right(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// `text` in at most `width` columns, its beginning replaced by `…` when cut (for paths).
pub fn cut_left(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut out = "…".to_owned();
    out.extend(text.chars().skip(n - (width - 1)));
    out
}

/// Bytes in at most 8 columns: `999 B`, `9.99 KiB`, `99.9 MiB`, `999 GiB`.
pub fn compact_bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = b.max(0.0);
    let mut unit = 0;
    loop {
        let text = match unit {
            0 => format!("{value:.0}"),
            _ if value < 9.995 => format!("{value:.2}"),
            _ if value < 99.95 => format!("{value:.1}"),
            _ => format!("{value:.0}"),
        };
        // 1023.6 KiB would need 5 digits: show 1.00 MiB.
        if text.len() <= 3 + usize::from(unit > 0 && text.contains('.')) || unit + 1 == UNITS.len()
        {
            return format!("{text} {}", UNITS[unit]);
        }
        value /= 1024.0;
        unit += 1;
    }
}

/// A count in at most 7 columns.
fn count(n: u64) -> String {
    match n {
        0..=9_999_999 => n.to_string(),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// `H:MM:SS`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

mod help;
use help::draw_help;
pub use help::help_text;

#[cfg(test)]
mod tests;
