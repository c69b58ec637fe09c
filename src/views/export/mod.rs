//! Output formats that other tools read, one file per format behind [`Exporter`]: pprof
//! (gzipped protobuf), speedscope JSON, folded stacks, and mprof's own JSON report.
//! Which format a file name means, and the writing of the file, are
//! [`crate::views::formats`]'s.

pub mod folded;
pub mod interval;
pub mod json;
pub mod otlp;
pub mod pprof;
pub mod speedscope;

use crate::analysis::allocators::Allocators;
use crate::analysis::profile::{Profile, Source, View};
use crate::views::formats::{check_output, hint, write_file, Format};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

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
        Format::Svg | Format::Html | Format::Csv => None,
    }
}

/// `mprof export`: writes `input` (the processes `pick` says) in `format` (or the format
/// `output` names) to `output` (or beside the input, with the format's extension).
pub fn run(
    input: &Path,
    format: Option<Format>,
    output: Option<&Path>,
    options: &Options,
    pick: crate::capture::processes::Pick,
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
    let mut p = Source::open(input, pick)?.load()?;
    p.select(options.allocators);
    let bytes = exporter.export(&p, options)?;
    write_file(&output, format.label(), &bytes)
}

/// `input` with its extension replaced by the format's (`app.mprof` → `app.pb.gz`); for a
/// time range of a directory of interval profiles (`DIR@..1h`), beside the directory.
fn beside(input: &Path, format: Format) -> PathBuf {
    let spec = crate::capture::rolling::Spec::of(input).ok().flatten();
    let input = spec.as_ref().map_or(input, |s| s.path.as_path());
    let stem = input.file_stem().unwrap_or_default().to_string_lossy();
    let name = format!("{stem}{}", format.extensions()[0]);
    input.with_file_name(name)
}
