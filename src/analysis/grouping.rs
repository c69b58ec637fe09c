//! How allocation sites are grouped into rows: one type for the reports, the diff, the HTML
//! report and the live view.

use crate::analysis::focus::{Focus, Memo};
use crate::analysis::names::{
    FastMap, Location, Names, StackId, TrieMemo, NEW_THREAD, THREAD_STARTED_AT,
};
use crate::analysis::profile::Profile;

/// How rows are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Grouping {
    /// The innermost frame in your code (not the standard library, site-packages or the import
    /// system; see `--focus`), with the innermost frame beside it.
    YourCode,
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
            Grouping::YourCode => "your-code",
            Grouping::Line => "line",
            Grouping::Function => "function",
            Grouping::File => "file",
            Grouping::Stack => "stack",
            Grouping::Thread => "thread",
        }
    }

    /// What text reports say after "by": the name, or for [`Grouping::YourCode`] what it means.
    pub fn title(self) -> &'static str {
        match self {
            Grouping::YourCode => "your code's line (innermost frame beside it)",
            other => other.name(),
        }
    }

    /// The next grouping in the order the live view's `g` key cycles: your code, line,
    /// function, file.
    pub fn next_in_live_view(self) -> Grouping {
        match self {
            Grouping::YourCode => Grouping::Line,
            Grouping::Line => Grouping::Function,
            Grouping::Function => Grouping::File,
            _ => Grouping::YourCode,
        }
    }

    /// The row key of one frame: (file, function, line). By function the line is the
    /// function's first line, by file the function is empty and the line 0. Groupings that
    /// are not by frame (your code, stack, thread) key the frame by its line.
    pub fn frame_key<'a>(self, loc: &Location<'a>) -> (&'a str, &'a str, u32) {
        match self {
            Grouping::Function => (loc.file, loc.function, loc.firstline),
            Grouping::File => (loc.file, "", 0),
            _ => (loc.file, loc.function, loc.line),
        }
    }
}

/// The frame a stack (innermost first) is grouped at by your code, with its innermost frame
/// and whether the frame is yours: the innermost frame in your code, or the innermost frame
/// when none is. A stack grafted onto the stack that created its thread (see
/// [`crate::analysis::names::NEW_THREAD`]) whose thread ran none of your code is grouped at
/// the creator's innermost frame in your code, as "thread started at" that line
/// ([`THREAD_STARTED_AT`]). None for an empty stack.
fn your_frame<'a>(
    focus: &Focus,
    memo: &mut Memo<'a>,
    frames: impl IntoIterator<Item = Location<'a>>,
) -> Option<(Location<'a>, Location<'a>, bool)> {
    let mut frames = frames.into_iter();
    let innermost = frames.next()?;
    let mut started = is_new_thread(&innermost);
    let at = match focus.is_yours(&innermost, memo) {
        true => Some(innermost),
        false => frames.find(|loc| {
            started |= is_new_thread(loc);
            focus.is_yours(loc, memo)
        }),
    };
    let at = match at {
        Some(loc) if started => Some(Location {
            function: THREAD_STARTED_AT,
            firstline: loc.line,
            ..loc
        }),
        other => other,
    };
    Some((innermost, at.unwrap_or(innermost), at.is_some()))
}

/// What [`your_frame`] finds: the innermost frame, the frame the stack is grouped at, and
/// whether that frame is yours.
pub(crate) type Found<'a> = (Location<'a>, Location<'a>, bool);

/// [`your_frame`] of the stacks of a profile, each node of its stack trie worked out once: a
/// node's stack is grouped at the node's own frame when that is yours, else where its
/// caller's stack is, so the stacks that share their callers (a deep server's, most of them)
/// share the walk instead of each going through all its frames.
pub(crate) struct YourNodes<'a> {
    names: &'a Names,
    files: Memo<'a>,
    /// Per node: the frame its stack is grouped at ([`NONE`]: no frame of yours), and whether
    /// a [`NEW_THREAD`] frame lies between the node and it.
    memo: TrieMemo,
}

/// The frame of [`YourNodes::memo`] when the stack has no frame of yours.
const NONE: u32 = u32::MAX;

impl<'a> YourNodes<'a> {
    /// Nothing worked out yet, for the stacks of `p`.
    pub(crate) fn new(p: &'a Profile) -> YourNodes<'a> {
        let names = p.trie();
        YourNodes {
            names,
            files: Memo::default(),
            memo: TrieMemo::new(names),
        }
    }

    /// What [`your_frame`] finds for the frames of `stack` with its origin
    /// ([`Profile::frames_with_origin`]); None for an empty stack.
    pub(crate) fn find(&mut self, focus: &Focus, stack: StackId) -> Option<Found<'a>> {
        let names = self.names;
        let (_, frame) = names.link(stack.0)?;
        let innermost = names.location(frame);
        let files = &mut self.files;
        let (found, started) = self.memo.get(
            names,
            stack.0,
            (NONE, false),
            |_| false,
            |(at, started), frame| {
                let loc = names.location(frame);
                let here = is_new_thread(&loc);
                match focus.is_yours(&loc, files) {
                    true => (frame, here),
                    false => (at, started || here),
                }
            },
        );
        let at = (found != NONE).then(|| {
            let loc = names.location(found);
            match started {
                false => loc,
                true => Location {
                    function: THREAD_STARTED_AT,
                    firstline: loc.line,
                    ..loc
                },
            }
        });
        Some((innermost, at.unwrap_or(innermost), at.is_some()))
    }
}

/// Whether `loc` is the pseudo-frame between a thread's frames and its creator's.
fn is_new_thread(loc: &Location) -> bool {
    loc.file == NEW_THREAD && loc.function == NEW_THREAD
}

impl Grouping {
    /// The row key of a stack (frames innermost first), for the groupings by frame: by your
    /// code, that of the frame [`YourCodeGroups`] groups it at; by line, function or file,
    /// the innermost frame's ([`Grouping::frame_key`]). None for an empty stack and for the
    /// groupings not by frame (stack, thread).
    pub fn stack_key<'a>(
        self,
        focus: &Focus,
        memo: &mut Memo<'a>,
        frames: impl IntoIterator<Item = Location<'a>>,
    ) -> Option<Key<'a>> {
        match self {
            Grouping::YourCode => {
                your_frame(focus, memo, frames).map(|(_, at, _)| Grouping::Line.frame_key(&at))
            }
            Grouping::Line | Grouping::Function | Grouping::File => {
                frames.into_iter().next().map(|loc| self.frame_key(&loc))
            }
            Grouping::Stack | Grouping::Thread => None,
        }
    }
}

/// What a row grouped by your code shows beside its frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beside<'a> {
    /// Whether the row's frame is in your code. False when none of the row's stacks has a
    /// frame of yours: the row is then their innermost frame.
    pub yours: bool,
    /// The innermost frame below the row's frame with the most bytes, when the row's stacks
    /// go deeper than its frame and it has more bytes than the row's frame allocated itself
    /// (else naming it would point away from where most of the bytes come from).
    pub innermost: Option<Location<'a>>,
    /// How many other innermost frames below the row's frame its stacks end in (all of them
    /// when `innermost` is none).
    pub more: usize,
}

/// A row key: (file, function, line).
pub type Key<'a> = (&'a str, &'a str, u32);

/// One group of [`YourCodeGroups`].
struct Group<'a, F> {
    figures: F,
    /// The figures of the stacks that end at the group's own frame.
    direct: F,
    yours: bool,
    innermost: FastMap<Location<'a>, F>,
}

/// Stacks grouped by their innermost frame in your code ([`Grouping::YourCode`]), with
/// figures of type `F` per group and per innermost frame below it.
pub struct YourCodeGroups<'a, 'f, F> {
    focus: &'f Focus,
    memo: Memo<'a>,
    groups: FastMap<Key<'a>, Group<'a, F>>,
}

impl<'a, 'f, F: Default> YourCodeGroups<'a, 'f, F> {
    /// No groups yet; `focus` says which files are yours.
    pub fn new(focus: &'f Focus) -> Self {
        YourCodeGroups {
            focus,
            memo: Memo::default(),
            groups: FastMap::default(),
        }
    }

    /// Adds one stack, given by its frames innermost first, with its figures (`merge` adds
    /// figures up).
    pub fn add(
        &mut self,
        frames: impl IntoIterator<Item = Location<'a>>,
        figures: &F,
        merge: impl Fn(&mut F, &F),
    ) {
        if let Some(found) = your_frame(self.focus, &mut self.memo, frames) {
            self.add_found(found, figures, merge);
        }
    }

    /// [`YourCodeGroups::add`] of a stack whose frame was found already ([`YourNodes::find`]).
    pub(crate) fn add_found(
        &mut self,
        (innermost, at, yours): Found<'a>,
        figures: &F,
        merge: impl Fn(&mut F, &F),
    ) {
        let group = self
            .groups
            .entry(Grouping::Line.frame_key(&at))
            .or_insert_with(|| Group {
                figures: F::default(),
                direct: F::default(),
                yours,
                innermost: FastMap::default(),
            });
        merge(&mut group.figures, figures);
        if Grouping::Line.frame_key(&innermost) != Grouping::Line.frame_key(&at) {
            merge(group.innermost.entry(innermost).or_default(), figures);
        } else {
            merge(&mut group.direct, figures);
        }
    }

    /// The groups: key, figures, and what goes beside; the innermost frame shown is the one
    /// with the largest `weight` (ties: the first in file, function, line order), if it
    /// outweighs what the group's own frame allocated. The groups stay, for another `weight`
    /// (another view).
    pub fn groups(&self, weight: impl Fn(&F) -> u64) -> Vec<(Key<'a>, F, Beside<'a>)>
    where
        F: Clone,
    {
        self.groups
            .iter()
            .map(|(&key, g)| {
                let mut top: Option<(&Location, u64)> = None;
                for (loc, f) in &g.innermost {
                    let w = weight(f);
                    if top.is_none_or(|(at, best)| w > best || (w == best && loc < at)) {
                        top = Some((loc, w));
                    }
                }
                let top = top.filter(|&(_, w)| w > weight(&g.direct));
                let beside = Beside {
                    yours: g.yours,
                    innermost: top.map(|(loc, _)| *loc),
                    more: g.innermost.len() - top.is_some() as usize,
                };
                (key, g.figures.clone(), beside)
            })
            .collect()
    }
}

/// `← function (short/file.py:line) +N more` for a row's [`Beside`], or `← (no frame in your
/// code)`; empty when there is nothing to say. Not yet made printable.
pub fn beside_text(beside: &Beside, pseudo: bool) -> String {
    let mut out = String::new();
    if let Some(loc) = &beside.innermost {
        out = format!("← {}", crate::analysis::frames::label(loc));
        if beside.more > 0 {
            out.push_str(&format!(" +{} more", beside.more));
        }
    } else if !beside.yours && !pseudo {
        out = "← (no frame in your code)".to_owned();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(file: &'static str, line: u32) -> Location<'static> {
        Location {
            module: None,
            file,
            function: "f",
            line,
            firstline: 1,
        }
    }

    #[test]
    fn stacks_group_at_your_first_frame_with_the_largest_innermost_beside() {
        let focus = Focus::default();
        let json = "/usr/lib/python3.11/json/encoder.py";
        let mut g = YourCodeGroups::new(&focus);
        let add = |g: &mut YourCodeGroups<u64>, frames: &[Location<'static>], n: u64| {
            g.add(frames.iter().copied(), &n, |a, b| *a += b)
        };
        add(
            &mut g,
            &[loc(json, 200), loc("app.py", 9), loc("app.py", 1)],
            10,
        );
        add(
            &mut g,
            &[loc(json, 258), loc("app.py", 9), loc("app.py", 2)],
            30,
        );
        add(&mut g, &[loc("app.py", 9), loc("app.py", 2)], 20);
        add(&mut g, &[loc("app.py", 12)], 5);
        // Line 30 allocates most of its bytes itself: the frame below it is not named.
        add(&mut g, &[loc("app.py", 30)], 90);
        add(&mut g, &[loc(json, 258), loc("app.py", 30)], 9);
        add(&mut g, &[loc(json, 200), loc("app.py", 30)], 1);
        add(&mut g, &[loc(json, 7)], 1);
        let mut rows = g.groups(|n| *n);
        rows.sort_by_key(|(k, _, _)| *k);
        let app9 = &rows[1];
        assert_eq!(app9.0, ("app.py", "f", 9));
        assert_eq!(app9.1, 60);
        assert_eq!(app9.2.innermost, Some(loc(json, 258)));
        assert_eq!((app9.2.yours, app9.2.more), (true, 1));
        assert_eq!(
            beside_text(&app9.2, false),
            "← f (json/encoder.py:258) +1 more"
        );
        assert_eq!(rows[2].2.innermost, None);
        assert_eq!(beside_text(&rows[2].2, false), "");
        let app30 = &rows[3];
        assert_eq!((app30.0, app30.1), (("app.py", "f", 30), 100));
        assert_eq!((app30.2.innermost, app30.2.more), (None, 2));
        assert_eq!(beside_text(&app30.2, false), "");
        let lib = &rows[0];
        assert_eq!((lib.0, lib.2.yours), ((json, "f", 7), false));
        assert_eq!(beside_text(&lib.2, false), "← (no frame in your code)");
    }

    #[test]
    fn a_thread_with_no_frame_of_yours_groups_at_the_line_that_started_it() {
        let focus = Focus::default();
        let lib = "/venv/lib/python3.11/site-packages/lib/pool.py";
        let marker = Location {
            module: None,
            file: NEW_THREAD,
            function: NEW_THREAD,
            line: 0,
            firstline: 0,
        };
        let mut g = YourCodeGroups::new(&focus);
        // The worker ran the library only: grouped at the creator's line of yours.
        let worker = [
            loc(lib, 40),
            loc(lib, 12),
            marker,
            loc(lib, 3),
            loc("app.py", 7),
        ];
        g.add(worker.iter().copied(), &100u64, |a, b| *a += b);
        // A worker that ran code of yours is grouped there, as any stack.
        let own = [loc("job.py", 5), marker, loc("app.py", 7)];
        g.add(own.iter().copied(), &10u64, |a, b| *a += b);
        // The line itself allocating on its own thread: a row of its own.
        g.add([loc("app.py", 7)], &1u64, |a, b| *a += b);
        let mut rows = g.groups(|n| *n);
        rows.sort_by_key(|(k, _, _)| *k);
        let keys: Vec<_> = rows.iter().map(|(k, n, _)| (*k, *n)).collect();
        assert_eq!(
            keys,
            [
                (("app.py", "f", 7), 1),
                (("app.py", THREAD_STARTED_AT, 7), 100),
                (("job.py", "f", 5), 10),
            ]
        );
        let started = &rows[1].2;
        assert!(started.yours);
        assert_eq!(started.innermost, Some(loc(lib, 40)));
        let shown = Location {
            function: THREAD_STARTED_AT,
            ..loc("app.py", 7)
        };
        assert_eq!(shown.to_string(), "thread started at app.py:7");
    }

    /// Worked out once per trie node, the frame of every stack is the one found by walking
    /// its frames: stacks that share callers, of every depth, yours or not, across a
    /// `<new thread>` frame, and stacks met again after their callers were worked out.
    #[test]
    fn each_node_worked_out_once_finds_what_the_walk_finds() {
        use crate::capture::testing::{alloc, code, meta};
        let lib = "/usr/lib/python3.11/json/encoder.py";
        let mut records = vec![
            meta("rate=1\ncwd=/app\nprogram_dir=/app\n"),
            code(1, "/app/main.py", "main", 1),
            code(2, lib, "encode", 10),
            code(3, "/app/util.py", "helper", 5),
            code(4, NEW_THREAD, NEW_THREAD, 0),
            code(5, "/venv/lib/python3.11/site-packages/pool.py", "work", 3),
        ];
        let stacks: [&[(u64, u32)]; 8] = [
            &[(2, 11), (3, 6), (1, 2)],
            &[(2, 12), (2, 11), (3, 6), (1, 2)],
            &[(3, 7), (1, 2)],
            &[(2, 11), (5, 4), (4, 0), (1, 3)],
            &[(5, 4), (4, 0), (3, 8), (1, 3)],
            &[(2, 13), (5, 4), (4, 0), (5, 9)],
            &[(2, 11)],
            &[(1, 2)],
        ];
        for (i, frames) in stacks.iter().chain(stacks.iter().rev()).enumerate() {
            records.push(alloc(1, 0x1000 + 16 * i as u64, 8, i as u64, frames));
        }
        let p = Profile::from_records(&records);
        let focus = p.focus();
        let mut nodes = YourNodes::new(&p);
        let mut memo = Memo::default();
        let mut seen = 0;
        for (id, _) in p.stacks() {
            let walked = your_frame(focus, &mut memo, p.frames_with_origin(id));
            assert_eq!(nodes.find(focus, id), walked, "{id:?}");
            seen += 1;
        }
        assert_eq!(seen, stacks.len());
        let started = p
            .stacks()
            .filter_map(|(id, _)| nodes.find(focus, id))
            .filter(|(_, at, _)| at.function == THREAD_STARTED_AT)
            .count();
        assert_eq!(started, 2);
    }

    #[test]
    fn the_live_view_cycles_through_every_frame_grouping() {
        let mut g = Grouping::YourCode;
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(g.name());
            g = g.next_in_live_view();
        }
        assert_eq!(g, Grouping::YourCode);
        assert_eq!(seen, ["your-code", "line", "function", "file"]);
    }
}
