//! mprof: a low-overhead sampling memory profiler for CPython.

mod attach;
mod capture;
mod flamegraph;
#[cfg(any(test, fuzzing))]
mod fuzzing;
mod live;
mod memory;
mod output;
mod profile;
mod record;
mod report;
mod session;
mod signals;
mod text;
mod units;

use anyhow::Result;
use clap::{Parser, Subcommand};
use profile::View;
use report::By;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Where a CPython program allocates memory: sampled, cheap enough for production.
#[derive(Parser)]
#[command(name = "mprof", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Sampling settings shared by `record` and `attach`.
#[derive(clap::Args, Clone)]
pub struct SamplingArgs {
    /// Mean bytes allocated between two samples (`512KiB`, `1MiB`, plain bytes); 1 records
    /// every allocation.
    #[arg(long, default_value = "128KiB", value_parser = units::parse_size)]
    pub rate: u64,
    /// Deepest Python stack recorded, innermost frames kept.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_depth: u32,
    /// Seed for the sampling random numbers, for repeatable runs (0 picks one).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Python command and profile it from the first line of its main script.
    Record {
        /// Capture file to write.
        #[arg(short, long, default_value = "mprof.out.mprof")]
        output: PathBuf,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Print no summary at the end.
        #[arg(short, long)]
        quiet: bool,
        /// Show a live view of the allocation sites while recording (the program's output then
        /// goes to CAPTURE.out).
        #[arg(long)]
        live: bool,
        /// The command, e.g. `python app.py`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Attach to a running CPython process, sample it, then detach and leave it running.
    Attach {
        /// Process id of the target.
        #[arg(long)]
        pid: u32,
        /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
        #[arg(long)]
        duration: Option<f64>,
        /// How long to wait for a thread of the target to reach a safe point before giving up
        /// (seconds; nothing is changed in the target then).
        #[arg(long, default_value_t = 5.0, value_parser = parse_timeout)]
        timeout: f64,
        /// Capture file to write.
        #[arg(short, long, default_value = "mprof.out.mprof")]
        output: PathBuf,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Print no summary at the end.
        #[arg(short, long)]
        quiet: bool,
        /// Show a live view of the allocation sites while attached (q detaches).
        #[arg(long)]
        live: bool,
    },
    /// Show the top allocation sites of a capture.
    Report {
        /// Capture file.
        file: PathBuf,
        /// Which bytes to count.
        #[arg(long, value_enum, default_value = "allocated")]
        view: View,
        /// How to group.
        #[arg(long, value_enum, default_value = "line")]
        by: By,
        /// How many rows (0 = all).
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Print JSON (schema in the README).
        #[arg(long)]
        json: bool,
    },
    /// Write a flamegraph SVG of a capture.
    Flamegraph {
        /// Capture file.
        file: PathBuf,
        /// SVG file to write (a name ending in `.folded` writes the folded stacks instead).
        #[arg(short, long, default_value = "mprof-flamegraph.svg")]
        output: PathBuf,
        /// Which bytes to count.
        #[arg(long, value_enum, default_value = "allocated")]
        view: View,
    },
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err("a number of seconds between 0 and 3600".into()),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Record {
            output,
            sampling,
            quiet,
            live,
            command,
        } => record::run(&command, &output, &sampling, quiet, live),
        Command::Attach {
            pid,
            duration,
            timeout,
            output,
            sampling,
            quiet,
            live,
        } => attach::run(
            pid,
            duration,
            Duration::from_secs_f64(timeout),
            &output,
            &sampling,
            quiet,
            live,
        ),
        Command::Report {
            file,
            view,
            by,
            top,
            json,
        } => report::run(&file, view, by, top, json).map(|()| ExitCode::SUCCESS),
        Command::Flamegraph { file, output, view } => {
            flamegraph::run(&file, &output, view).map(|()| ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mprof: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
