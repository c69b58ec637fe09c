//! A profile's allocation sites as rows: grouped by a [`Grouping`], sorted by a view.
//!
//! Rows are sorted by the view's bytes (rounded to whole bytes), largest first; ties go by file,
//! function, line, thread and then the stack, so the same capture always gives the same rows.
//! Every location that has at least one sample is a row, in every view.

use crate::analysis::allocators::ByAllocator;
use crate::analysis::grouping::{Beside, Grouping, YourCodeGroups, YourNodes};
use crate::analysis::profile::{Figures, Location, Profile, View};
use std::cmp::Reverse;
use std::collections::HashMap;

/// One row: a location (or a thread) and its figures.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    /// By thread: the file of the function the thread runs (see [`thread_entry`]), or empty.
    pub file: &'a str,
    /// Empty when grouping by file. By thread: the function the thread runs, or empty.
    pub function: &'a str,
    /// The line (the function's first line when grouping by function or thread, 0 by file).
    pub line: u32,
    /// When grouping by thread: the thread id.
    pub thread: Option<u32>,
    pub figures: Figures,
    /// `figures`, split by allocator (by stack, all of them are one allocator's).
    pub allocators: ByAllocator,
    /// When grouping by stack: the frames, innermost first. Empty otherwise.
    pub stack: Vec<Location<'a>>,
    /// When grouping by your code: the innermost frame beside the row's.
    pub beside: Option<Beside<'a>>,
}

impl Row<'_> {
    /// The location as text reports show it: `function (file:line)`, the file alone, or
    /// `thread 1234 name` (the name is added by [`Row::label_in`]). The innermost frame
    /// beside a row grouped by your code is not part of it (see [`Row::beside_text`]).
    pub fn label(&self) -> String {
        if let Some(tid) = self.thread {
            return format!("thread {tid}{}", self.entry_text());
        }
        if self.function.is_empty() {
            return self.file.to_owned();
        }
        self.location().to_string()
    }

    /// The row's frame as a location (its line standing for the first line too).
    fn location(&self) -> Location<'_> {
        Location {
            file: self.file,
            function: self.function,
            line: self.line,
            firstline: self.line,
            module: None,
        }
    }

    /// [`Row::label`], with the thread's name from `p` when grouping by thread.
    pub fn label_in(&self, p: &Profile) -> String {
        match self.thread {
            Some(tid) => format!("thread {}{}", p.thread_label(tid), self.entry_text()),
            None => self.label(),
        }
    }

    /// ` · runs work (app.py:12)` for a thread row whose function is known, or empty.
    fn entry_text(&self) -> String {
        if self.function.is_empty() {
            return String::new();
        }
        format!(" · runs {}", self.location())
    }

    /// `← function (file:line) +N more` beside a row grouped by your code, or empty (see
    /// [`crate::analysis::grouping::beside_text`]); not yet made printable.
    pub fn beside_text(&self) -> String {
        self.beside
            .map(|b| crate::analysis::grouping::beside_text(&b, self.file == self.function))
            .unwrap_or_default()
    }

    /// A key that identifies the row across two captures (for a diff).
    pub fn key(&self) -> String {
        let mut key = format!("{}\u{0}{}\u{0}{}", self.file, self.function, self.line);
        if let Some(tid) = self.thread {
            key = format!("thread {tid}");
        }
        for f in self.stack.iter().skip(1) {
            key.push_str(&format!(
                "\u{0}{}\u{0}{}\u{0}{}",
                f.file, f.function, f.line
            ));
        }
        key
    }
}

/// The function a thread runs, from one of its stacks (innermost first): the outermost Python
/// frame that is not the machinery that starts threads and programs (`threading.py`'s
/// bootstrap, `runpy`, the import system): a thread's target (`work`), a pool's worker loop,
/// the main thread's `<module>`. `None` for a stack without such a frame (native threads).
pub fn thread_entry<'a>(frames: impl Iterator<Item = Location<'a>>) -> Option<Location<'a>> {
    let frames: Vec<Location<'a>> = frames.collect();
    frames.into_iter().rev().find(|loc| {
        let machinery = loc.file.ends_with("/threading.py")
            || loc.file.ends_with("/runpy.py")
            || loc.file == "<frozen runpy>"
            || loc.file.starts_with("<frozen importlib");
        !machinery && !loc.is_native() && loc.file != loc.function && !loc.file.is_empty()
    })
}

/// Whole bytes, as reports and JSON show them.
pub fn whole(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

/// The figures of every allocator together.
fn sum(split: &ByAllocator) -> Figures {
    let mut all = Figures::default();
    split.0.iter().for_each(|f| all.merge(f));
    all
}

/// The profile's rows for `by`, sorted by `view` (see the module doc for the order).
pub fn rows(p: &Profile, view: View, by: Grouping) -> Vec<Row<'_>> {
    top_rows_by_views(p, &[view], by, usize::MAX)
        .pop()
        .unwrap_or_default()
}

/// The first `top` of [`rows`] for each of `views`: the stacks are grouped once for all of
/// them when the groups do not depend on the view (all groupings but by thread).
pub fn top_rows_by_views<'p>(
    p: &'p Profile,
    views: &[View],
    by: Grouping,
    top: usize,
) -> Vec<Vec<Row<'p>>> {
    let sorted = |rows, view| sorted(rows, view, top);
    match by {
        Grouping::Thread => views
            .iter()
            .map(|&view| sorted(thread_rows(p, view), view))
            .collect(),
        Grouping::YourCode => {
            let mut groups = YourCodeGroups::new(p.focus());
            let mut nodes = YourNodes::new(p);
            for (id, f) in p.stacks() {
                let mut one = ByAllocator::default();
                one.add(p.allocator(id), f);
                if let Some(found) = nodes.find(p.focus(), id) {
                    groups.add_found(found, &one, ByAllocator::merge);
                }
            }
            views
                .iter()
                .map(|&view| {
                    let rows = groups
                        .groups(|split| whole(sum(split).get(view).bytes))
                        .into_iter()
                        .map(|(key, allocators, beside)| group_row(key, allocators, Some(beside)))
                        .collect();
                    sorted(rows, view)
                })
                .collect()
        }
        _ => {
            let rows = frame_rows(p, by);
            views
                .iter()
                .map(|&view| sorted(rows.clone(), view))
                .collect()
        }
    }
}

/// The rows by thread: each thread's entry function is the one with the most bytes in `view`.
fn thread_rows(p: &Profile, view: View) -> Vec<Row<'_>> {
    // Per entry function: whether it is your code, and its bytes.
    type Entries<'p> = HashMap<(&'p str, &'p str, u32), (bool, u64)>;
    let mut threads: HashMap<u32, (ByAllocator, Entries)> = HashMap::new();
    let mut memo = Default::default();
    for ((id, tid), f) in p.sites() {
        let (allocators, entries) = threads.entry(*tid).or_default();
        allocators.add(p.allocator(*id), f);
        if let Some(entry) = thread_entry(p.frames(*id)) {
            let key = (entry.file, entry.function, entry.firstline);
            let yours = p.focus().is_yours(&entry, &mut memo);
            let e = entries.entry(key).or_insert((yours, 0));
            e.1 += whole(f.get(view).bytes) + 1;
        }
    }
    threads
        .into_iter()
        .map(|(tid, (allocators, entries))| {
            // The function with the most bytes, your code's first (the main thread runs the
            // program's `<module>`, however much the start-up imports allocated under
            // `site`); ties: the first by name.
            let entry = entries
                .into_iter()
                .max_by_key(|&(key, (yours, bytes))| (yours, bytes, Reverse(key)))
                .map(|(key, _)| key);
            let (file, function, line) = entry.unwrap_or(("", "", 0));
            Row {
                file,
                function,
                line,
                thread: Some(tid),
                figures: sum(&allocators),
                allocators,
                stack: Vec::new(),
                beside: None,
            }
        })
        .collect()
}

/// The rows by stack, or by a frame of each stack (line, function, file), unsorted.
fn frame_rows(p: &Profile, by: Grouping) -> Vec<Row<'_>> {
    if by == Grouping::Stack {
        return p
            .stacks()
            .map(|(id, f)| {
                let loc = p.innermost(id);
                let mut allocators = ByAllocator::default();
                allocators.add(p.allocator(id), f);
                Row {
                    file: loc.file,
                    function: loc.function,
                    line: loc.line,
                    thread: None,
                    figures: *f,
                    allocators,
                    stack: p.frames_with_origin(id).collect(),
                    beside: None,
                }
            })
            .collect();
    }
    let mut groups: HashMap<(&str, &str, u32), ByAllocator> = HashMap::new();
    for (id, f) in p.stacks() {
        let key = by.frame_key(&p.innermost(id));
        groups.entry(key).or_default().add(p.allocator(id), f);
    }
    groups
        .into_iter()
        .map(|(key, allocators)| group_row(key, allocators, None))
        .collect()
}

/// The row of a group of stacks by a frame (file, function, line).
fn group_row<'p>(
    (file, function, line): (&'p str, &'p str, u32),
    allocators: ByAllocator,
    beside: Option<Beside<'p>>,
) -> Row<'p> {
    Row {
        file,
        function,
        line,
        thread: None,
        figures: sum(&allocators),
        allocators,
        stack: Vec::new(),
        beside,
    }
}

/// The first `top` of `rows` sorted by `view` (see the module doc for the order: no two rows
/// are equal in it, so the first `top` are picked out before the rest is sorted).
fn sorted(mut rows: Vec<Row<'_>>, view: View, top: usize) -> Vec<Row<'_>> {
    let order = |a: &Row, b: &Row| {
        let bytes = |r: &Row| Reverse(whole(r.figures.get(view).bytes));
        bytes(a)
            .cmp(&bytes(b))
            .then_with(|| (a.file, a.function, a.line).cmp(&(b.file, b.function, b.line)))
            .then_with(|| a.thread.cmp(&b.thread))
            .then_with(|| a.stack.cmp(&b.stack))
    };
    if rows.len() > top {
        rows.select_nth_unstable_by(top, order);
        rows.truncate(top);
    }
    rows.sort_by(order);
    rows
}
