//! Output formats that other tools read, one file per format behind [`Exporter`]: pprof
//! (gzipped protobuf), speedscope JSON, folded stacks, and mprof's own JSON report.
//!
//! A file name says its format: [`Format::of_path`] knows every extension mprof writes, and
//! [`check_output`] refuses to write one format under another format's name (`-o out.json`
//! never gets an SVG).

pub mod folded;
pub mod json;
pub mod pprof;
pub mod speedscope;

use crate::allocators::Allocators;
use crate::profile::{Profile, View};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Every format mprof writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Gzipped protobuf per pprof's profile.proto (`go tool pprof`, Pyroscope, Parca).
    Pprof,
    /// speedscope's file format (speedscope.app, or `npx speedscope`).
    Speedscope,
    /// Folded stacks, one line per stack (inferno, flamegraph.pl, speedscope).
    Folded,
    /// mprof's JSON report, by stack.
    Json,
    /// An SVG picture (flamegraph, timeline).
    Svg,
    /// A self-contained HTML report.
    Html,
}

impl Format {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Speedscope => "speedscope",
            Format::Folded => "folded",
            Format::Json => "json",
            Format::Svg => "svg",
            Format::Html => "html",
        }
    }

    /// What a file of this format is called in messages.
    pub fn label(self) -> &'static str {
        match self {
            Format::Pprof => "pprof profile",
            Format::Speedscope => "speedscope profile",
            Format::Folded => "folded stacks",
            Format::Json => "JSON report",
            Format::Svg => "picture",
            Format::Html => "HTML report",
        }
    }

    /// File name endings that mean this format, the usual one first.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Pprof => &[".pb.gz", ".pprof", ".pb"],
            Format::Speedscope => &[".speedscope.json"],
            Format::Folded => &[".folded"],
            Format::Json => &[".json"],
            Format::Svg => &[".svg"],
            Format::Html => &[".html", ".htm"],
        }
    }

    const ALL: [Format; 6] = [
        Format::Pprof,
        Format::Speedscope,
        Format::Folded,
        Format::Json,
        Format::Svg,
        Format::Html,
    ];

    /// The format a file name asks for, by its longest known ending (`x.speedscope.json` is
    /// speedscope, `x.json` JSON); `None` for a name mprof gives no meaning to.
    pub fn of_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        Format::ALL
            .iter()
            .flat_map(|&f| f.extensions().iter().map(move |e| (f, *e)))
            .filter(|(_, e)| name.ends_with(e) && name.len() > e.len())
            .max_by_key(|(_, e)| e.len())
            .map(|(f, _)| f)
    }
}

/// Picture and document endings mprof never writes: refused rather than filled with SVG.
const FOREIGN: [&str; 5] = [".png", ".jpg", ".jpeg", ".pdf", ".gif"];

/// Refuses to write `format` to a file whose name says another format.
pub fn check_output(path: &Path, format: Format) -> Result<()> {
    let name = path.to_string_lossy().to_ascii_lowercase();
    if let Some(ext) = FOREIGN.iter().find(|e| name.ends_with(*e)) {
        bail!(
            "{} ends in {ext}, but this command writes {} (mprof writes no {ext} files; name it {})",
            path.display(),
            format.name(),
            format.extensions()[0]
        );
    }
    match Format::of_path(path) {
        Some(named) if named != format => bail!(
            "{} names a {} file, but this command writes {}; name it {} or {}",
            path.display(),
            named.name(),
            format.name(),
            format.extensions()[0],
            hint(named)
        ),
        _ => Ok(()),
    }
}

/// How to get the format a name asked for.
fn hint(format: Format) -> String {
    match format {
        Format::Svg => "use `mprof flamegraph` or `mprof timeline`".into(),
        Format::Html => "use `mprof html`".into(),
        f => format!("use `mprof export --format {}`", f.name()),
    }
}

/// What an exporter writes.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The view of formats that hold one (folded); pprof and speedscope hold every view.
    pub view: View,
    /// The allocators exported (`--allocator`); the others are left out.
    pub allocators: Allocators,
    /// The allocator as the outermost frame of every stack (folded, speedscope); pprof has it
    /// as a label anyway.
    pub by_allocator: bool,
}

impl Options {
    /// Every allocator, one view, no allocator frames.
    pub fn of(view: View) -> Options {
        Options {
            view,
            allocators: Allocators::ALL,
            by_allocator: false,
        }
    }
}

/// One output format of `mprof export`.
pub trait Exporter {
    /// The format written.
    fn format(&self) -> Format;
    /// The file's bytes.
    fn export(&self, p: &Profile, options: &Options) -> Result<Vec<u8>>;
}

/// The exporter of a format, if `export` writes it.
pub fn exporter(format: Format) -> Option<Box<dyn Exporter>> {
    match format {
        Format::Pprof => Some(Box::new(pprof::Pprof)),
        Format::Speedscope => Some(Box::new(speedscope::Speedscope)),
        Format::Folded => Some(Box::new(folded::Folded)),
        Format::Json => Some(Box::new(json::Json)),
        Format::Svg | Format::Html => None,
    }
}

/// `mprof export`: writes `input` (the processes `pick` says) in `format` (or the format
/// `output` names) to `output` (or beside the input, with the format's extension).
pub fn run(
    input: &Path,
    format: Option<Format>,
    output: Option<&Path>,
    options: &Options,
    pick: crate::processes::Pick,
) -> Result<()> {
    let format = match (format, output.and_then(Format::of_path)) {
        (Some(f), _) => f,
        (None, Some(f)) => f,
        (None, None) => bail!("say which format: --format pprof|speedscope|folded|json"),
    };
    let Some(exporter) = exporter(format) else {
        let what = output.map_or_else(|| format.name().to_owned(), |o| o.display().to_string());
        bail!(
            "{what}: export writes pprof, speedscope, folded or json; {}",
            hint(format)
        );
    };
    let output = match output {
        Some(o) => o.to_path_buf(),
        None => beside(input, format),
    };
    check_output(&output, format)?;
    let set = crate::processes::CaptureSet::open(input, pick)?;
    let mut p = Profile::load_set(&set)?;
    p.select(options.allocators);
    let bytes = exporter.export(&p, options)?;
    write_file(&output, format.label(), &bytes)
}

/// `input` with its extension replaced by the format's (`app.mprof` → `app.pb.gz`).
fn beside(input: &Path, format: Format) -> PathBuf {
    let stem = input.file_stem().unwrap_or_default().to_string_lossy();
    let name = format!("{stem}{}", format.extensions()[0]);
    input.with_file_name(name)
}

/// Writes an output file (see [`crate::output`]: created under a temporary name, never
/// through someone else's symlink, then renamed into place) and says so on stderr; `-` is
/// standard output. `label` names the file in errors.
pub fn write_file(path: &Path, label: &'static str, bytes: &[u8]) -> Result<()> {
    if path == Path::new(STDOUT) {
        return write_stdout(label, bytes);
    }
    let written = crate::output::write_file(path, label, bytes, crate::output::Access::Shared)?;
    crate::say!("mprof: wrote {}", written.display());
    Ok(())
}

/// The output name that means standard output.
const STDOUT: &str = "-";

/// Writes `bytes` to standard output. A reader that stops early (`| head`) is no error; a
/// gzipped profile is not written to a terminal.
fn write_stdout(label: &str, bytes: &[u8]) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let mut out = std::io::stdout().lock();
    if bytes.starts_with(&[0x1f, 0x8b]) && out.is_terminal() {
        bail!(
            "not writing the {label} (gzipped binary) to a terminal: redirect it, or give -o FILE"
        );
    }
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).with_context(|| format!("writing the {label} to standard output"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_their_format_by_the_longest_ending() {
        let f = |s: &str| Format::of_path(Path::new(s));
        assert_eq!(f("a.speedscope.json"), Some(Format::Speedscope));
        assert_eq!(f("a.json"), Some(Format::Json));
        assert_eq!(f("dir/A.PB.GZ"), Some(Format::Pprof));
        assert_eq!(f("x.folded"), Some(Format::Folded));
        assert_eq!(f("x.svg"), Some(Format::Svg));
        assert_eq!(f("report.html"), Some(Format::Html));
        assert_eq!(f("x.out"), None);
        assert_eq!(f(".json"), None);
    }

    #[test]
    fn a_name_of_another_format_is_refused() {
        assert!(check_output(Path::new("out.json"), Format::Svg).is_err());
        assert!(check_output(Path::new("t.png"), Format::Svg).is_err());
        assert!(check_output(Path::new("x.speedscope.json"), Format::Json).is_err());
        assert!(check_output(Path::new("x.json"), Format::Speedscope).is_err());
        assert!(check_output(Path::new("x.svg"), Format::Svg).is_ok());
        assert!(check_output(Path::new("x"), Format::Svg).is_ok());
        let e = check_output(Path::new("out.json"), Format::Svg).unwrap_err();
        assert!(e.to_string().contains("mprof export --format json"), "{e}");
    }
}
