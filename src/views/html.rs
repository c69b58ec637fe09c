//! `mprof html`: one self-contained HTML file: the summary, the timeline, the flamegraph of each
//! view behind a selector, and the top sites table (sortable by view).
//!
//! Nothing is fetched when the page is viewed: the pictures are inline (the timeline as SVG,
//! each flamegraph as a `data:` frame, since its script expects its own document), the
//! table is built by a short inline script from JSON embedded in the page, and a
//! Content-Security-Policy forbids every network request.

use crate::analysis::allocators::split_text;
use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Completeness, Keep, Profile, Source, View};
use crate::analysis::sites::{top_rows_by_views, whole, Row};
use crate::base::text::xml_escape;
use crate::views::about::{
    peak_text, plus_minus, python_version, rate_text, target_text, view_title, NOT_NATIVE,
};
use crate::views::flamegraph::{self, Settings};
use crate::views::formats::{check_output, write_file, Format};
use crate::views::timeline;
use anyhow::Result;
use base64::Engine as _;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Rows of the sites table.
pub const TOP_SITES: usize = 50;
/// Sites the timeline draws: the first rows by the peak, which the table's rows include.
const TIMELINE_SITES: usize = 5;
const _: () = assert!(TIMELINE_SITES <= TOP_SITES);

/// `mprof html`: writes the report of `path` to `out`, its timeline and top sites grouped as
/// `sites` says (the processes it picks).
pub fn run(path: &Path, out: &Path, sites: &timeline::Sites) -> Result<()> {
    check_output(out, Format::Html)?;
    let by = timeline::check_grouping(sites.by)?;
    let source = Source::open(path, sites.pick)?;
    let mut p = source.load_keeping(Keep::Series)?;
    p.set_focus(sites.focus);
    let rows = top_rows_by_views(&p, &View::ALL, by, TOP_SITES);
    let peak = View::ALL.iter().position(|&v| v == View::Peak);
    let peak_rows = peak.map_or(&[][..], |i| &rows[i][..]);
    let t = timeline::load_source_with(&source, &p, TIMELINE_SITES, by, peak_rows)?;
    write_file(out, "HTML report", page_with(&p, &t, by, &rows)?.as_bytes())
}

#[derive(Serialize)]
struct SiteRow {
    location: String,
    file: String,
    /// bytes, stderr, samples per view: allocated, live, peak.
    figures: [[u64; 3]; 3],
}

/// The page.
pub fn page(p: &Profile, t: &timeline::Timeline, by: Grouping) -> Result<String> {
    page_with(p, t, by, &top_rows_by_views(p, &View::ALL, by, TOP_SITES))
}

/// [`page`], given the profile's first [`TOP_SITES`] rows for `by` sorted by each of
/// [`View::ALL`].
fn page_with(
    p: &Profile,
    t: &timeline::Timeline,
    by: Grouping,
    rows: &[Vec<Row>],
) -> Result<String> {
    let mut html = String::new();
    let title = match target_text(p) {
        Some(target) => format!("mprof report: {target}"),
        None => "mprof report".to_owned(),
    };
    let _ = write!(
        html,
        concat!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; ",
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; ",
            "frame-src data:\">\n<title>{}</title>\n<style>{}</style>\n</head><body>\n"
        ),
        xml_escape(&title),
        STYLE
    );
    let _ = writeln!(html, "<h1>{}</h1>", xml_escape(&title));
    summary(&mut html, p);
    let _ = writeln!(html, "<h2>Memory over time</h2>\n<div id=\"timeline\">");
    html.push_str(svg_body(&timeline::svg(p, t)?));
    html.push_str("</div>\n");
    let rss = crate::views::resident::section(p);
    if !rss.trim().is_empty() {
        let _ = writeln!(
            html,
            "<h2>Where the RSS is</h2>\n<pre id=\"rss\">{}</pre>",
            xml_escape(
                rss.trim()
                    .trim_start_matches("Where the RSS is")
                    .trim_start()
            )
        );
    }
    flamegraphs(&mut html, p)?;
    sites(&mut html, p, by, rows)?;
    html.push_str("</body></html>\n");
    Ok(html)
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right}\
td.loc,th.loc{text-align:left;font-family:monospace}tr:nth-child(even){background:#f4f4f4}\
.warning{background:#fff0c0;border:1px solid #d0a000;padding:6px}\
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:bold}\
iframe{border:0;width:100%}";

/// The page's `<dl>` of facts about the capture, and its warnings.
fn summary(html: &mut String, p: &Profile) {
    for w in p.warnings() {
        let _ = writeln!(html, "<p class=\"warning\">warning: {}</p>", xml_escape(&w));
    }
    html.push_str("<dl id=\"summary\">\n");
    let mut item = |name: &str, value: String| {
        let _ = writeln!(html, "<dt>{name}</dt><dd>{}</dd>", xml_escape(&value));
    };
    if let Some(target) = target_text(p) {
        item("target", target);
    }
    if let Some(python) = python_version(p) {
        item("Python", python.to_owned());
    }
    item("sampling", rate_text(p));
    item("samples", format!("{} ({} dropped)", p.samples, p.dropped));
    item("duration", format!("{:.2} s", p.duration_seconds));
    let split = p.native_recorded() != Some(false);
    for view in View::ALL {
        let e = p.totals().get(view);
        let mut value = plus_minus(e.bytes, e.stderr());
        if split {
            let shares = split_text(p.by_allocator(), view, p.selection());
            let _ = write!(value, " = {}", shares.replace(", ", " + "));
        }
        item(view_title(view), value);
    }
    if !split {
        item("native allocations", NOT_NATIVE.to_owned());
    }
    item("peak", peak_text(p));
    if let Some(from) = &p.intervals {
        item("read from", from.text());
        item("figures", from.how().to_owned());
    }
    item(
        "capture",
        match p.completeness {
            _ if p.intervals.is_some() => "interval profiles, each complete",
            _ if p.sampling_stopped_early() => "sampling stopped early (see the warning)",
            Completeness::Ended => "complete (END record)",
            Completeness::Finished => "finished by mprof (no END record)",
            Completeness::Incomplete => "INCOMPLETE (no END record)",
        }
        .to_owned(),
    );
    html.push_str("</dl>\n");
}

/// An SVG document without its XML declaration, to inline in HTML.
fn svg_body(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |at| &svg[at..])
}

/// One flamegraph per view, shown one at a time.
fn flamegraphs(html: &mut String, p: &Profile) -> Result<()> {
    html.push_str(
        "<h2>Flamegraph</h2>\n<label>view <select id=\"fg-view\" \
         onchange=\"showFlamegraph(this.value)\">",
    );
    for view in View::ALL {
        let _ = write!(
            html,
            "<option value=\"{0}\">{1}</option>",
            view.name(),
            view_title(view)
        );
    }
    html.push_str("</select></label>\n");
    let pictures = flamegraph::pictures(p, &Settings::of(View::ALL[0]), &View::ALL)?;
    for (i, (view, picture)) in View::ALL.into_iter().zip(pictures).enumerate() {
        let height = picture.height;
        let data = base64::engine::general_purpose::STANDARD.encode(picture.svg.as_bytes());
        let _ = writeln!(
            html,
            "<iframe id=\"fg-{}\" title=\"flamegraph of {}\" height=\"{}\" {} \
             src=\"data:image/svg+xml;base64,{data}\"></iframe>",
            view.name(),
            view_title(view),
            height + 10,
            if i == 0 { "" } else { "hidden" }
        );
    }
    html.push_str(
        "<script>function showFlamegraph(v){for(const f of document.querySelectorAll\
         ('iframe[id^=\"fg-\"]'))f.hidden=f.id!=='fg-'+v;}</script>\n",
    );
    Ok(())
}

/// The top sites table: JSON in the page, rows built by a script, sorted by the chosen view.
fn sites(html: &mut String, p: &Profile, by: Grouping, rows: &[Vec<Row>]) -> Result<()> {
    let mut data: Vec<SiteRow> = Vec::new();
    for rows in rows {
        for row in rows.iter().take(TOP_SITES) {
            // As the text report labels it: the row, the innermost frame beside it (by your
            // code), the allocators.
            let mut location = row.label_in(p);
            for extra in [row.beside_text(), row.allocators.tag(View::Allocated)] {
                if !extra.is_empty() {
                    let _ = write!(location, "  {extra}");
                }
            }
            let location = crate::base::text::printable(&location).into_owned();
            if data.iter().any(|r| r.location == location) {
                continue;
            }
            let f = &row.figures;
            let cell = |e: &crate::analysis::estimate::Estimate| {
                [whole(e.bytes), whole(e.stderr()), e.samples]
            };
            data.push(SiteRow {
                location,
                file: crate::base::text::printable(row.file).into_owned(),
                figures: [cell(&f.allocated), cell(&f.live), cell(&f.peak)],
            });
        }
    }
    // Inside a script element, `</script` would end it early and `<!--` would change how the
    // parser looks for its end (names in a capture can be anything): no `<`, `>` or `&` is
    // left as such. They only occur inside JSON strings, where `\u003c` means the same.
    let json = script_safe_json(&serde_json::to_string(&data)?);
    let _ = writeln!(
        html,
        "<h2>Top allocation sites</h2>\n<p>By {} (--by).</p>",
        xml_escape(by.title())
    );
    html.push_str(
        "<label>sort by <select id=\"sites-view\" \
         onchange=\"fillSites()\"><option value=\"0\">allocated</option>\
         <option value=\"1\">live at the end</option><option value=\"2\">live at the peak\
         </option></select></label>\n<table id=\"sites\"><thead><tr><th>bytes</th>\
         <th>± stderr</th><th>samples</th><th class=\"loc\">location</th></tr></thead>\
         <tbody></tbody></table>\n",
    );
    let _ = writeln!(
        html,
        "<script type=\"application/json\" id=\"sites-data\">{json}</script>"
    );
    html.push_str(SITES_SCRIPT);
    Ok(())
}

/// JSON text with `<`, `>` and `&` written as JSON escapes, for a `<script>` element.
fn script_safe_json(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// Builds the sites table from the embedded JSON (text nodes only: no markup from data).
const SITES_SCRIPT: &str = r#"<script>
const SITES = JSON.parse(document.getElementById('sites-data').textContent);
function human(b) {
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  if (b < 1024) return b + ' B';
  let v = b / 1024, u = 0;
  while (v >= 1024 && u + 1 < units.length) { v /= 1024; u++; }
  return v.toFixed(2) + ' ' + units[u];
}
function fillSites() {
  const view = +document.getElementById('sites-view').value;
  const body = document.querySelector('#sites tbody');
  body.replaceChildren();
  const rows = SITES.filter(s => s.figures[view][0] > 0)
    .sort((a, b) => b.figures[view][0] - a.figures[view][0]).slice(0, 50);
  for (const s of rows) {
    const tr = document.createElement('tr');
    const f = s.figures[view];
    for (const [text, cls] of [[human(f[0])], [human(f[1])], [String(f[2])], [s.location, 'loc']]) {
      const td = document.createElement('td');
      td.textContent = text;
      if (cls) { td.className = cls; td.title = s.file; }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
fillSites();
</script>
"#;
