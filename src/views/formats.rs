//! Every format mprof writes and where it goes. A file name says its format:
//! [`Format::of_path`] knows every extension mprof writes, and [`check_output`] refuses to
//! write one format under another format's name (`-o out.json` never gets an SVG). Files are
//! written through [`crate::base::output`]; `-` is standard output.

use anyhow::{bail, Context, Result};
use std::io::Write as _;
use std::path::Path;

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
    /// A table of comma-separated values (the timeline's points: `mprof timeline -o t.csv`;
    /// not an export format).
    #[value(skip)]
    Csv,
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
            Format::Csv => "csv",
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
            Format::Csv => "CSV table",
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
            Format::Csv => &[".csv"],
        }
    }

    const ALL: [Format; 7] = [
        Format::Pprof,
        Format::Speedscope,
        Format::Folded,
        Format::Json,
        Format::Svg,
        Format::Html,
        Format::Csv,
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
pub fn hint(format: Format) -> String {
    match format {
        Format::Svg => "use `mprof flamegraph` or `mprof timeline`".into(),
        Format::Html => "use `mprof html`".into(),
        Format::Csv => "use `mprof timeline -o FILE.csv`".into(),
        f => format!("use `mprof export --format {}`", f.name()),
    }
}

/// Writes an output file (see [`crate::base::output`]: created under a temporary name, never
/// through someone else's symlink, then renamed into place) and says so on stderr; `-` is
/// standard output. `label` names the file in errors.
pub fn write_file(path: &Path, label: &'static str, bytes: &[u8]) -> Result<()> {
    if path == Path::new(STDOUT) {
        return write_binary_stdout(label, bytes);
    }
    let written =
        crate::base::output::write_file(path, label, bytes, crate::base::output::Access::Shared)?;
    crate::say!("mprof: wrote {}", written.display());
    Ok(())
}

/// The output name that means standard output.
const STDOUT: &str = "-";

/// Writes `bytes` to standard output. A reader that stops early (`| head`) is no error; a
/// gzipped profile is not written to a terminal.
fn write_binary_stdout(label: &str, bytes: &[u8]) -> Result<()> {
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

/// Writes to stdout; a closed pipe (`mprof report x | head`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
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
