//! The live view's help overlay: what each key does, and how to read the figures.

use super::super::{Mode, Target};
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

/// The help overlay's text.
pub fn help_text(t: &Target) -> Vec<String> {
    let mut lines: Vec<String> = [
        "s, Tab    next sort column; 1-4 sort by ALLOC/s, ALLOCATED, LIVE, SAMPLES",
        "g         group by your code (← innermost) → line → function → file",
        "t         own bytes ↔ total bytes (a site and everything it calls)",
        "f, c      next thread, next process (--follow-children): all → each seen",
        "p, space  pause the display; sampling and the capture go on",
        "↑ ↓ PgUp PgDn Home End  scroll        ?, h  this help (a key closes it)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    match t.mode {
        Mode::Record => lines.extend([
            "q, Esc    close the view (Esc on this help closes the help): mprof".into(),
            "          records on until the program ends,".into(),
            "          then prints its summary (Ctrl-C then stops the program)".into(),
            "Ctrl-C    close the view and interrupt the program (SIGINT)".into(),
        ]),
        Mode::Attach => lines.extend([
            "q, Esc, Ctrl-C  close the view and detach (Esc on this help closes".into(),
            "          the help): the process runs on as before, and mprof prints".into(),
            "          its summary".into(),
        ]),
    }
    lines.extend([
        String::new(),
        "Figures are estimates from samples; SAMPLES says how many stand behind".into(),
        "a row. ALLOC/s covers the last refresh (about a second). LIVE: sampled".into(),
        "blocks not freed yet. RSS − heap: memory the process holds beyond the".into(),
        "live blocks of all allocators (free lists, fragmentation, unseen memory).".into(),
        "When samples come faster than the view can add them up, it skips some".into(),
        "(\"view skipped N\"); the capture file still gets every one.".into(),
    ]);
    if let Some(out) = &t.program_output {
        lines.push(format!(
            "The program's stdout and stderr go to {}.",
            out.display()
        ));
    }
    lines.push(format!(
        "The capture is written to {}.",
        t.capture.display()
    ));
    lines
}

pub(super) fn draw_help(frame: &mut Frame, t: &Target, area: Rect) {
    let text: Vec<Line> = help_text(t).into_iter().map(Line::raw).collect();
    let w = area.width.min(78);
    let h = area.height.min(text.len() as u16 + 2);
    let rect = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    frame.render_widget(Clear, rect);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" mprof live view: keys ");
    frame.render_widget(
        Paragraph::new(text).block(block).wrap(Wrap { trim: false }),
        rect,
    );
}
