//! Flamegraphs: one view of a capture as an interactive SVG (drawn by `inferno`), or as folded
//! stacks for other tools.
//!
//! A folded line is the stack from outermost to innermost frame, each frame written
//! `function (file:line)` and separated by `;`, then a space and the view's estimated bytes,
//! rounded. Stacks that round to 0 bytes in the view are left out.
//!
//! When the output path ends in `.folded`, the folded lines are written instead of an SVG (for
//! speedscope, inferno's own tools or a diff). When the view has no bytes at all (e.g. `live` for
//! a program that freed everything), a small valid SVG that says so is written, with a warning.

use crate::profile::{Profile, View};
use crate::report::{rate_text, view_title};
use crate::units::human_bytes;
use anyhow::{Context, Result};
use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Options};
use std::collections::BTreeMap;
use std::path::Path;

/// `mprof flamegraph`: writes the flamegraph of `path`'s `view` to `out`.
pub fn run(path: &Path, out: &Path, view: View) -> Result<()> {
    let p = Profile::load(path)?;
    let lines = folded(&p, view);
    let bytes = if out.extension().is_some_and(|e| e == "folded") {
        lines
            .iter()
            .flat_map(|l| [l.as_str(), "\n"])
            .collect::<String>()
            .into_bytes()
    } else if lines.is_empty() {
        eprintln!(
            "mprof: warning: no {} in this capture; the flamegraph is empty",
            view_title(view)
        );
        empty_svg(&p, view).into_bytes()
    } else {
        svg(&p, view, &lines)?
    };
    let written =
        crate::output::write_file(out, "flamegraph", &bytes, crate::output::Access::Shared)?;
    eprintln!("mprof: wrote {}", written.display());
    Ok(())
}

/// The folded stacks of a view, sorted.
pub fn folded(p: &Profile, view: View) -> Vec<String> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for (id, figures) in p.stacks() {
        let bytes = figures.get(view).bytes.round().max(0.0) as u64;
        if bytes == 0 {
            continue;
        }
        let mut frames: Vec<String> = p.frames(id).map(|f| frame_name(&f.to_string())).collect();
        frames.reverse();
        *stacks.entry(frames.join(";")).or_default() += bytes;
    }
    stacks
        .into_iter()
        .map(|(stack, bytes)| format!("{stack} {bytes}"))
        .collect()
}

/// A frame name that cannot break a folded line: no `;` (the separator) and no line breaks.
fn frame_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

/// The title of the graph: `mprof: allocated bytes`.
fn title(view: View) -> String {
    format!("mprof: {}", view_title(view))
}

fn subtitle(p: &Profile, view: View) -> String {
    let total = p.totals().get(view);
    format!(
        "{}, {} samples, {} dropped; total {} ± {}",
        rate_text(p),
        p.samples,
        p.dropped,
        human_bytes(total.bytes),
        human_bytes(total.stderr())
    )
}

fn svg(p: &Profile, view: View, lines: &[String]) -> Result<Vec<u8>> {
    let mut options = Options::default();
    options.title = title(view);
    options.subtitle = Some(subtitle(p, view));
    options.count_name = "bytes".to_owned();
    options.colors = Palette::Basic(BasicPalette::Mem);
    options.deterministic = true;
    let mut svg = Vec::new();
    inferno_fg::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .context("drawing the flamegraph")?;
    Ok(svg)
}

/// A valid SVG that says the view has nothing to draw.
fn empty_svg(p: &Profile, view: View) -> String {
    let title = title(view);
    let note = format!("No samples in this view ({})", subtitle(p, view));
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

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::record::{Frame, Record};

    fn profile() -> Profile {
        let alloc = |addr: u64, size: u64, frames: Vec<Frame>| Record::Alloc {
            tid: 1,
            flags: 0,
            addr,
            size,
            time_ns: 0,
            frames,
        };
        Profile::from_records(&[
            Record::Meta {
                text: "rate=1".into(),
            },
            Record::Code {
                code: 1,
                firstline: 1,
                filename: "a;b.py".into(),
                name: "<module>".into(),
            },
            Record::Code {
                code: 2,
                firstline: 3,
                filename: "a;b.py".into(),
                name: "f".into(),
            },
            alloc(
                1,
                10,
                vec![Frame { code: 2, line: 4 }, Frame { code: 1, line: 9 }],
            ),
            alloc(2, 5, vec![Frame { code: 1, line: 9 }]),
            alloc(3, 7, vec![]),
            Record::Free { addr: 2 },
        ])
    }

    #[test]
    fn folded_lines_go_outermost_first_and_are_safe() {
        let p = profile();
        assert_eq!(
            folded(&p, View::Allocated),
            [
                "<module> (a,b.py:9) 5",
                "<module> (a,b.py:9);f (a,b.py:4) 10",
                "<no Python frame> 7",
            ]
        );
        assert_eq!(folded(&p, View::Live).len(), 2);
    }

    #[test]
    fn svg_has_title_and_frames() {
        let p = profile();
        let svg =
            String::from_utf8(svg(&p, View::Allocated, &folded(&p, View::Allocated)).unwrap())
                .unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("mprof: allocated bytes"));
        assert!(svg.contains("f (a,b.py:4)"));
    }

    #[test]
    fn an_empty_view_is_a_valid_svg() {
        let p = Profile::from_records(&[]);
        let svg = empty_svg(&p, View::Peak);
        assert!(svg.starts_with("<?xml"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("mprof: live bytes at the peak"));
        assert!(!svg.contains("<no"));
    }
}
