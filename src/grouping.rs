//! How allocation sites are grouped into rows: one type for the reports, the diff, the HTML
//! report and the live view.

use crate::names::Location;

/// How rows are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Grouping {
    /// The innermost frame's file, function and line.
    Line,
    /// The innermost frame's function (its line is the function's first line).
    Function,
    /// The innermost frame's file (line 0, function empty).
    File,
    /// The whole stack.
    Stack,
    /// The thread that allocated.
    Thread,
}

impl Grouping {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Grouping::Line => "line",
            Grouping::Function => "function",
            Grouping::File => "file",
            Grouping::Stack => "stack",
            Grouping::Thread => "thread",
        }
    }

    /// The next grouping in the order the live view's `g` key cycles: line, function, file.
    pub fn next_in_live_view(self) -> Grouping {
        match self {
            Grouping::Line => Grouping::Function,
            Grouping::Function => Grouping::File,
            _ => Grouping::Line,
        }
    }

    /// The row key of one frame: (file, function, line). By function the line is the
    /// function's first line, by file the function is empty and the line 0. Groupings that
    /// are not by frame (stack, thread) key the frame by its line.
    pub fn frame_key<'a>(self, loc: &Location<'a>) -> (&'a str, &'a str, u32) {
        match self {
            Grouping::Function => (loc.file, loc.function, loc.firstline),
            Grouping::File => (loc.file, "", 0),
            _ => (loc.file, loc.function, loc.line),
        }
    }
}
