//! The flamegraph's SVG, drawn from mprof's own layout ([`super::boxes`]) in one pass: the
//! title and subtitle, a legend, then one `<g>` per box (its label and figures in a `<title>`,
//! a `<rect>`, the label that fits in a `<text>`), and a short script of mprof's own
//! (`script.js`) for the figures under the picture, zooming and searching.
//!
//! ```text
//!  y 0   ┌──────────────── title, subtitle; "Reset Zoom" left, "Search" right ──────────────┐
//!   LEGEND_Y          legend: one swatch per kind of code (or grew / shrank)
//!   FRAMES_Y ┌──────── #frames (x 10, 1180 wide): ROW px a level, the root at the bottom ─────┐
//!            └─────────────────────────── (at the top with --inverted) ──────────────────────┘
//!            details of the box pointed at                                         Matched: …
//! ```

use super::boxes::{fitted_label, tooltip, Layout, Placed};
use super::WIDTH;
use crate::base::text::xml_escape;
use std::fmt::Write as _;

/// Height of a level of boxes (a box is one pixel less, so that levels stand apart).
const ROW: usize = 16;
/// Top of the legend's swatches.
const LEGEND_Y: usize = 54;
/// Top of the boxes.
const FRAMES_Y: usize = 74;
/// Margin left and right of the boxes.
const MARGIN: usize = 10;
/// From the bottom of the boxes to the details line, and below it to the picture's end.
const DETAILS_GAP: usize = 18;
const BOTTOM: usize = 12;

/// The script, included as it is in the repository.
const SCRIPT: &str = include_str!("script.js");

const STYLE: &str = "text { font-family: monospace; font-size: 12px; fill: rgb(0,0,0); }
#title { text-anchor: middle; font-size: 17px; }
#subtitle { text-anchor: middle; }
#search, #matched { text-anchor: end; }
#search { opacity: 0.3; cursor: pointer; }
#search:hover, #search.show { opacity: 1; }
#unzoom { cursor: pointer; }
#frames > g { cursor: pointer; }
#frames > g:hover > rect { stroke: black; stroke-width: 0.5; }
.hide { display: none; }
.parent { opacity: 0.5; }
";

/// What the picture shows besides its boxes.
pub(super) struct Page<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    /// The legend's swatches: a colour and what it means.
    pub legend: &'a [((u8, u8, u8), &'a str)],
    /// The root at the top (callers below their callees).
    pub inverted: bool,
}

/// The SVG of `layout`, each box filled as `fill` says, and its height in pixels.
pub(super) fn draw(
    page: &Page,
    layout: &Layout,
    fill: impl Fn(&Placed) -> (u8, u8, u8),
) -> (String, usize) {
    let levels = layout.depth + 1;
    let frames_height = levels * ROW;
    let details_y = FRAMES_Y + frames_height + DETAILS_GAP;
    let height = details_y + BOTTOM;
    let frames_width = WIDTH - 2 * MARGIN;
    let mut out = String::with_capacity(4096 + layout.boxes.len() * 300);
    let _ = write!(
        out,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" onload=\"init()\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <title>{title}</title>\n\
         <style type=\"text/css\">\n{STYLE}</style>\n\
         <script type=\"text/ecmascript\"><![CDATA[\n{SCRIPT}]]></script>\n\
         <rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"rgb(246,246,240)\"/>\n\
         <text id=\"title\" x=\"50%\" y=\"24\">{title}</text>\n\
         <text id=\"subtitle\" x=\"50%\" y=\"44\">{subtitle}</text>\n\
         <text id=\"unzoom\" class=\"hide\" x=\"{MARGIN}\" y=\"24\">Reset Zoom</text>\n\
         <text id=\"search\" x=\"{right}\" y=\"24\">Search</text>\n",
        title = xml_escape(page.title),
        subtitle = xml_escape(page.subtitle),
        right = WIDTH - MARGIN,
    );
    legend(&mut out, page.legend);
    let _ = writeln!(
        out,
        "<svg id=\"frames\" x=\"{MARGIN}\" y=\"{FRAMES_Y}\" width=\"{frames_width}\" \
         height=\"{frames_height}\" data-total=\"{}\" data-inverted=\"{}\">",
        layout.total,
        u8::from(page.inverted)
    );
    let total_bytes = layout.root().new.bytes;
    for b in &layout.boxes {
        let level = if page.inverted {
            b.depth
        } else {
            levels - 1 - b.depth
        };
        let y = level * ROW;
        let x = b.start as f64 / layout.total as f64 * 100.0;
        let w = b.width as f64 / layout.total as f64 * 100.0;
        let (r, g, bl) = fill(b);
        let _ = writeln!(
            out,
            "<g><title>{} ({})</title><rect x=\"{x:.4}%\" y=\"{y}\" width=\"{w:.4}%\" \
             height=\"{}\" fill=\"rgb({r},{g},{bl})\" data-x=\"{}\" data-w=\"{}\"/>\
             <text x=\"{:.4}%\" y=\"{}\">{}</text></g>",
            xml_escape(&b.label),
            xml_escape(&tooltip(&b.info, total_bytes)),
            ROW - 1,
            b.start,
            b.width,
            x + 0.25,
            y + 11,
            xml_escape(&fitted_label(&b.label, w / 100.0 * frames_width as f64)),
        );
    }
    let _ = write!(
        out,
        "</svg>\n\
         <text id=\"details\" x=\"{MARGIN}\" y=\"{details_y}\"> </text>\n\
         <text id=\"matched\" x=\"{}\" y=\"{details_y}\"> </text>\n\
         </svg>\n",
        WIDTH - MARGIN
    );
    (out, height)
}

/// The legend: a swatch and a name for each entry, in a row under the subtitle.
fn legend(out: &mut String, entries: &[((u8, u8, u8), &str)]) {
    out.push_str("<g id=\"legend\">");
    let mut x = MARGIN;
    for ((r, g, b), name) in entries {
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{LEGEND_Y}\" width=\"10\" height=\"10\" \
             fill=\"rgb({r},{g},{b})\"/><text x=\"{}\" y=\"{}\">{}</text>",
            x + 14,
            LEGEND_Y + 9,
            xml_escape(name)
        );
        x += 14 + 7 * name.len() + 18;
    }
    out.push_str("</g>\n");
}
