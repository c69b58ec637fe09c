//! mprof: a low-overhead sampling memory profiler for CPython. This is the command-line front
//! end (clap's arguments, one call per command); everything it runs lives in the `mprof`
//! library, whose stages are `sessions` (record, attach) and `views` (the rest).

#![warn(clippy::undocumented_unsafe_blocks)]

use anyhow::Result;
use clap::{Parser, Subcommand};
use mprof::analysis::allocators::{self, Allocator, Allocators};
use mprof::analysis::grouping::Grouping;
use mprof::analysis::profile::{Lens, View};
use mprof::capture::processes::{Pick, PidArgs};
use mprof::sessions::continuous::ContinuousArgs;
use mprof::sessions::sampling::SamplingArgs;
use mprof::sessions::{attach, record};
use mprof::views::formats::Format;
use mprof::views::timeline::ByFrame;
use mprof::views::{diff, export, flamegraph, html, report, timeline};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Where a CPython program allocates memory: sampled, cheap enough for production.
#[derive(Parser)]
#[command(name = "mprof", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// With native stacks (`--native`): keep the interpreter's own C frames (the bytecode loop,
    /// call machinery, allocator internals, start-up) that are hidden by default.
    #[arg(long, global = true)]
    show_interpreter_frames: bool,
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
        #[arg(long, conflicts_with = "every")]
        live: bool,
        /// Profile the program's child processes too: forked ones (multiprocessing, pre-fork
        /// servers) and Pythons it starts (spawn, subprocess); their captures go to CAPTURE.d/.
        #[arg(long)]
        follow_children: bool,
        #[command(flatten)]
        continuous: ContinuousArgs,
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
        /// Attach to the target's Python child processes too (as they are now, and those it
        /// forks while attached); their captures go to CAPTURE.d/.
        #[arg(long)]
        follow_children: bool,
        /// Show a live view of the allocation sites while attached (q detaches).
        #[arg(long, conflicts_with = "every")]
        live: bool,
        #[command(flatten)]
        continuous: ContinuousArgs,
    },
    /// Show the top allocation sites of a capture.
    Report {
        /// Capture file, or a directory of interval profiles (--every --profiles-dir) or
        /// DIR@FROM..TO for a time range of it (`@..1h`, `@-1h..`), or one pprof file.
        file: PathBuf,
        /// Which bytes to count.
        #[arg(long, value_enum, default_value = "allocated")]
        view: View,
        /// How to group rows.
        #[arg(long, value_enum, default_value = "your-code")]
        by: Grouping,
        /// How many rows (0 = all).
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Print JSON (schema in docs/json.md).
        #[arg(long)]
        json: bool,
        /// Count the files under PATH as your code for `--by your-code`, library or not
        /// (repeatable; a relative PATH also matches that run of directories anywhere).
        #[arg(long = "focus", value_name = "PATH")]
        focus: Vec<PathBuf>,
        /// Only these allocators: python, native, mmap (repeat it, or separate with commas;
        /// default: all).
        #[arg(long = "allocator", value_name = "ALLOCATOR", value_delimiter = ',',
              value_parser = allocators::parse)]
        allocators: Vec<Allocator>,
        #[command(flatten)]
        processes: PidArgs,
        /// List the processes of the capture (pid, parent, command, samples, bytes) instead of
        /// the allocation sites.
        #[arg(long)]
        per_process: bool,
    },
    /// Write a flamegraph SVG of a capture.
    Flamegraph {
        /// Capture file, or a directory of interval profiles (--every --profiles-dir) or
        /// DIR@FROM..TO for a time range of it (`@..1h`, `@-1h..`), or one pprof file.
        file: PathBuf,
        /// SVG file to write (a name ending in `.folded` writes the folded stacks instead; `-`
        /// writes the SVG to standard output).
        #[arg(short, long, default_value = "mprof-flamegraph.svg")]
        output: PathBuf,
        /// Which bytes to count.
        #[arg(long, value_enum, default_value = "allocated")]
        view: View,
        /// Only this thread's allocations (a thread id, as `report --by thread` lists them).
        #[arg(long)]
        thread: Option<u32>,
        /// Keep the import system's frames (importlib, site.py) instead of folding them away.
        #[arg(long)]
        keep_imports: bool,
        /// Allocation sites on top, callers below (an icicle graph, for leak hunting).
        #[arg(long)]
        inverted: bool,
        /// Draw the growth since this base capture (or DIR@FROM..TO) instead (red grew, blue
        /// shrank).
        #[arg(long, value_name = "BASE")]
        diff: Option<PathBuf>,
        /// Only these allocators: python, native, mmap (repeat it, or separate with commas;
        /// default: all).
        #[arg(long = "allocator", value_name = "ALLOCATOR", value_delimiter = ',',
              value_parser = allocators::parse)]
        allocators: Vec<Allocator>,
        /// The allocator as the root frame of every stack (`<allocator native>`).
        #[arg(long)]
        by_allocator: bool,
        #[command(flatten)]
        processes: PidArgs,
    },
    /// Write a timeline SVG: RSS, the estimated live heap and the top sites over time.
    Timeline {
        /// Capture file, or a directory of interval profiles (--every --profiles-dir) or
        /// DIR@FROM..TO for a time range of it (`@..1h`, `@-1h..`), or one pprof file.
        file: PathBuf,
        /// SVG file to write (`-`: standard output); a name ending in `.csv` gets the
        /// points as a table instead.
        #[arg(short, long, default_value = "mprof-timeline.svg")]
        output: PathBuf,
        /// How many allocation sites get their own area.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// How to group the sites, as report does.
        #[arg(long, value_enum, default_value = "your-code")]
        by: ByFrame,
        /// Count the files under PATH as your code for `--by your-code`, library or not
        /// (repeatable; a relative PATH also matches that run of directories anywhere).
        #[arg(long = "focus", value_name = "PATH")]
        focus: Vec<PathBuf>,
        #[command(flatten)]
        processes: PidArgs,
    },
    /// Write a self-contained HTML report (summary, timeline, flamegraphs, top sites).
    Html {
        /// Capture file, or a directory of interval profiles (--every --profiles-dir) or
        /// DIR@FROM..TO for a time range of it (`@..1h`, `@-1h..`), or one pprof file.
        file: PathBuf,
        /// HTML file to write (`-`: standard output).
        #[arg(short, long, default_value = "mprof-report.html")]
        output: PathBuf,
        /// How to group the top sites and the timeline's areas, as report does.
        #[arg(long, value_enum, default_value = "your-code")]
        by: ByFrame,
        /// Count the files under PATH as your code for `--by your-code`, library or not
        /// (repeatable; a relative PATH also matches that run of directories anywhere).
        #[arg(long = "focus", value_name = "PATH")]
        focus: Vec<PathBuf>,
        #[command(flatten)]
        processes: PidArgs,
    },
    /// Compare two captures: per site the change in bytes ± its standard error, largest
    /// growth first; changes within 2 standard errors are marked as noise.
    Diff {
        /// The capture to compare against (before); like the others, a directory of interval
        /// profiles or a time range of it (DIR@..1h: the first hour) reads too.
        base: PathBuf,
        /// The capture compared (after), e.g. DIR@-1h.. (the last hour of DIR).
        new: PathBuf,
        /// Which bytes to count.
        #[arg(long, value_enum, default_value = "live")]
        view: View,
        /// How to group rows.
        #[arg(long, value_enum, default_value = "your-code")]
        by: Grouping,
        /// How many rows (0 = all).
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Count the files under PATH as your code for `--by your-code`, library or not
        /// (repeatable; a relative PATH also matches that run of directories anywhere).
        #[arg(long = "focus", value_name = "PATH")]
        focus: Vec<PathBuf>,
        /// Only these allocators: python, native, mmap (repeat it, or separate with commas;
        /// default: all).
        #[arg(long = "allocator", value_name = "ALLOCATOR", value_delimiter = ',',
              value_parser = allocators::parse)]
        allocators: Vec<Allocator>,
        /// Only this process of NEW (a capture recorded with --follow-children; default: all
        /// its processes merged).
        #[arg(long)]
        pid: Option<u32>,
        /// Only this process of BASE (default: all its processes merged).
        #[arg(long)]
        base_pid: Option<u32>,
    },
    /// Write a capture in a format other tools read: pprof, speedscope, folded stacks, JSON.
    Export {
        /// Capture file, or a directory of interval profiles (--every --profiles-dir) or
        /// DIR@FROM..TO for a time range of it (`@..1h`, `@-1h..`), or one pprof file.
        file: PathBuf,
        /// Output format (default: the one the output name says).
        #[arg(short, long, value_enum)]
        format: Option<Format>,
        /// File to write (default: beside the capture, with the format's extension; `-`:
        /// standard output, with --format).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The view of single-view formats (folded); the others hold every view.
        #[arg(long, value_enum, default_value = "allocated")]
        view: View,
        /// Only these allocators: python, native, mmap (repeat it, or separate with commas;
        /// default: all).
        #[arg(long = "allocator", value_name = "ALLOCATOR", value_delimiter = ',',
              value_parser = allocators::parse)]
        allocators: Vec<Allocator>,
        /// The allocator as the outermost frame of every stack (folded, speedscope; pprof has
        /// an `allocator` label anyway).
        #[arg(long)]
        by_allocator: bool,
        #[command(flatten)]
        processes: PidArgs,
    },
    /// The reader of a session a Python program starts on itself (pymprof): see
    /// `mprof::sessions::inprocess`. Not for people to run.
    #[command(name = "_inprocess", hide = true)]
    Inprocess {
        /// The program's process id (this command's parent).
        #[arg(long)]
        pid: u32,
        /// The program's memory file for the ring (inherited).
        #[arg(long)]
        ring_fd: i32,
        /// The program's memory file for the agent's image (inherited).
        #[arg(long)]
        agent_fd: i32,
        /// Capture file to write as well.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err("a number of seconds above 0 and at most 3600".into()),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let done = |r: Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cli.command {
        Command::Record {
            output,
            sampling,
            quiet,
            live,
            follow_children,
            continuous,
            command,
        } => record::run(
            &command,
            &output,
            &sampling,
            quiet,
            live,
            follow_children,
            &continuous,
        ),
        Command::Attach {
            pid,
            duration,
            timeout,
            output,
            sampling,
            quiet,
            live,
            follow_children,
            continuous,
        } => attach::run(attach::Options {
            pid,
            duration,
            timeout: Duration::from_secs_f64(timeout),
            output: &output,
            sampling: &sampling,
            quiet,
            live,
            follow_children,
            continuous: &continuous,
        }),
        Command::Report {
            file,
            view,
            by,
            top,
            json,
            focus,
            allocators,
            processes,
            per_process,
        } => {
            let lens = Lens {
                focus: &focus,
                allocators: Allocators::of(&allocators),
                pick: processes.pick(),
            };
            done(match per_process {
                true => report::run_per_process(&file, json, &lens),
                false => report::run(&file, view, by, top, json, &lens),
            })
        }
        Command::Flamegraph {
            file,
            output,
            view,
            thread,
            keep_imports,
            inverted,
            diff,
            allocators,
            by_allocator,
            processes,
        } => {
            let settings = flamegraph::Settings {
                view,
                thread,
                keep_imports,
                inverted,
                by_allocator,
                allocators: Allocators::of(&allocators),
            };
            let pick = processes.pick();
            done(flamegraph::run(
                &file,
                &output,
                &settings,
                diff.as_deref(),
                pick,
            ))
        }
        Command::Timeline {
            file,
            output,
            top,
            by,
            focus,
            processes,
        } => done(timeline::run(
            &file,
            &output,
            top,
            &timeline::Sites {
                by: by.into(),
                focus: &focus,
                pick: processes.pick(),
            },
        )),
        Command::Html {
            file,
            output,
            by,
            focus,
            processes,
        } => done(html::run(
            &file,
            &output,
            &timeline::Sites {
                by: by.into(),
                focus: &focus,
                pick: processes.pick(),
            },
        )),
        Command::Diff {
            base,
            new,
            view,
            by,
            top,
            json,
            focus,
            allocators,
            pid,
            base_pid,
        } => done(diff::run(
            (&base, Pick::of(base_pid)),
            &new,
            view,
            by,
            top,
            json,
            &Lens {
                focus: &focus,
                allocators: Allocators::of(&allocators),
                pick: Pick::of(pid),
            },
        )),
        Command::Export {
            file,
            format,
            output,
            view,
            allocators,
            by_allocator,
            processes,
        } => done(export::run(
            &file,
            format,
            output.as_deref(),
            &export::Options {
                view,
                allocators: Allocators::of(&allocators),
                by_allocator,
            },
            processes.pick(),
        )),
        Command::Inprocess {
            pid,
            ring_fd,
            agent_fd,
            output,
            sampling,
        } => done(mprof::sessions::inprocess::run(
            mprof::sessions::inprocess::Options {
                pid,
                ring_fd,
                agent_fd,
                output: output.as_deref(),
                sampling: &sampling,
            },
        )),
    }
}

fn main() -> ExitCode {
    mprof::base::memory::return_large_blocks();
    let cli = Cli::parse();
    mprof::analysis::symbols::set_show_interpreter_frames(cli.show_interpreter_frames);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            mprof::say!("mprof: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
