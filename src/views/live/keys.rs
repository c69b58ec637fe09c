//! What each key does to the view: the bytes typed on the terminal are read in `mod.rs`,
//! turned into [`Key`]s here, and applied to the [`ViewState`] the screen is drawn from.
//!
//! mprof reads and parses the terminal's bytes itself rather than through crossterm's event
//! reader, which spins forever once the terminal hangs up (its read loop retries end-of-file
//! and errors); here a hang-up is an error the session survives.

use super::model::{Column, Process, Settings, Thread};

/// A key's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// `q`: close the view.
    Quit,
    /// Esc: close the help overlay when it is open, the view otherwise.
    Esc,
    /// Ctrl-C: close the view and interrupt the program, as the terminal would have.
    Interrupt,
    /// `s`, Tab: next sort column; `1`–`4`: that column.
    Sort(Option<Column>),
    /// `g`: next grouping.
    Group,
    /// `t`: own ↔ total bytes.
    Inclusive,
    /// `f`: next thread (all threads, then each one seen).
    Thread,
    /// `c`: next process (all processes, then each one seen), with `--follow-children`.
    Process,
    /// `p`, space: freeze or unfreeze the display.
    Pause,
    /// `?`, `h`, F1: the help.
    Help,
    /// Arrows and `j`/`k`, PgUp/PgDn (in pages of the table's height), Home/End.
    Scroll(Scroll),
    /// Anything else.
    Other,
}

/// How far a scroll key moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scroll {
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
}

const ESC: u8 = 0x1b;

/// The keys in the bytes of one read from a terminal in raw mode. An escape sequence (arrows,
/// PgUp...) arrives whole in one read; an ESC at the end of the bytes is the Esc key.
pub fn parse(bytes: &[u8]) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut rest = bytes;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        let key = match b {
            0x03 => Key::Interrupt,
            b'q' | b'Q' => Key::Quit,
            b's' | b'\t' => Key::Sort(None),
            b'1'..=b'4' => Key::Sort(Some(Column::ALL[usize::from(b - b'1')])),
            b'g' => Key::Group,
            b't' => Key::Inclusive,
            b'f' => Key::Thread,
            b'c' => Key::Process,
            b'p' | b' ' => Key::Pause,
            b'?' | b'h' => Key::Help,
            b'k' => Key::Scroll(Scroll::Up),
            b'j' => Key::Scroll(Scroll::Down),
            ESC => {
                let (key, used) = escape(rest);
                rest = &rest[used..];
                key
            }
            _ => Key::Other,
        };
        keys.push(key);
    }
    keys
}

/// The key of the escape sequence whose bytes after ESC start `rest`, and how many of them it
/// used: `ESC [ params final` (CSI) or `ESC O final` (SS3); a lone ESC is Esc.
fn escape(rest: &[u8]) -> (Key, usize) {
    match rest.first() {
        None => (Key::Esc, 0),
        Some(b'[') | Some(b'O') => {
            let body = &rest[1..];
            let Some(end) = body.iter().position(|b| (0x40..=0x7e).contains(b)) else {
                return (Key::Other, rest.len());
            };
            let params = &body[..end];
            let key = match (body[end], params) {
                (b'A', _) => Key::Scroll(Scroll::Up),
                (b'B', _) => Key::Scroll(Scroll::Down),
                (b'H', _) | (b'~', b"1") | (b'~', b"7") => Key::Scroll(Scroll::Top),
                (b'F', _) | (b'~', b"4") | (b'~', b"8") => Key::Scroll(Scroll::Bottom),
                (b'~', b"5") => Key::Scroll(Scroll::PageUp),
                (b'~', b"6") => Key::Scroll(Scroll::PageDown),
                (b'P', b"") | (b'~', b"11") => Key::Help,
                _ => Key::Other,
            };
            (key, 1 + end + 1)
        }
        // Alt and a key.
        Some(_) => (Key::Other, 1),
    }
}

/// The user's side of the view: table settings and the display state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewState {
    pub settings: Settings,
    /// The display is frozen (sampling and the capture go on).
    pub paused: bool,
    /// The help overlay is open.
    pub help: bool,
    /// First table row shown.
    pub scroll: usize,
}

impl ViewState {
    /// Applies `key`; `threads` and `processes` are those seen so far and `page` the table's
    /// height. Returns the key back when it closes the view (`Quit`, `Interrupt`).
    pub fn apply(
        &mut self,
        key: Key,
        threads: &[Thread],
        processes: &[Process],
        page: usize,
    ) -> Option<Key> {
        if self.help && !matches!(key, Key::Quit | Key::Interrupt | Key::Other) {
            // Any key closes the help; it does nothing else.
            self.help = false;
            return None;
        }
        let s = &mut self.settings;
        match key {
            Key::Quit | Key::Interrupt => return Some(key),
            Key::Esc => return Some(Key::Quit),
            Key::Sort(column) => s.sort = column.unwrap_or(s.sort.next()),
            Key::Group => s.group = s.group.next_in_live_view(),
            Key::Inclusive => s.inclusive = !s.inclusive,
            Key::Thread => {
                // Only the threads of the process shown, when one is.
                let shown: Vec<Thread> = threads
                    .iter()
                    .filter(|t| s.process.is_none_or(|p| p == t.pid))
                    .cloned()
                    .collect();
                s.thread = next_thread(s.thread, &shown);
            }
            Key::Process => {
                s.process = next_process(s.process, processes);
                s.thread = None;
            }
            Key::Pause => self.paused = !self.paused,
            Key::Help => self.help = true,
            Key::Scroll(how) => self.scroll(how, page),
            Key::Other => {}
        }
        if matches!(
            key,
            Key::Sort(_) | Key::Group | Key::Inclusive | Key::Thread | Key::Process
        ) {
            self.scroll = 0;
        }
        None
    }

    fn scroll(&mut self, how: Scroll, page: usize) {
        let page = page.max(1);
        self.scroll = match how {
            Scroll::Up => self.scroll.saturating_sub(1),
            Scroll::Down => self.scroll + 1,
            Scroll::PageUp => self.scroll.saturating_sub(page),
            Scroll::PageDown => self.scroll + page,
            Scroll::Top => 0,
            // Clamped to the last page when drawn.
            Scroll::Bottom => usize::MAX / 2,
        };
    }
}

/// All threads → the first thread → ... → the last → all threads.
fn next_thread(current: Option<u32>, threads: &[Thread]) -> Option<u32> {
    match current {
        None => threads.first().map(|t| t.tid),
        Some(tid) => {
            let at = threads.iter().position(|t| t.tid == tid)?;
            threads.get(at + 1).map(|t| t.tid)
        }
    }
}

/// All processes → the first process → ... → the last → all processes.
fn next_process(current: Option<u32>, processes: &[Process]) -> Option<u32> {
    match current {
        None => processes.first().map(|p| p.pid),
        Some(pid) => {
            let at = processes.iter().position(|p| p.pid == pid)?;
            processes.get(at + 1).map(|p| p.pid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::grouping::Grouping;

    #[test]
    fn bytes_parse_into_keys() {
        use Scroll::*;
        assert_eq!(parse(b"\x03"), [Key::Interrupt]);
        assert_eq!(parse(b"q\x1b"), [Key::Quit, Key::Esc]);
        assert_eq!(
            parse(b"3\tgx"),
            [
                Key::Sort(Some(Column::Live)),
                Key::Sort(None),
                Key::Group,
                Key::Other
            ]
        );
        assert_eq!(
            parse(b"\x1b[A\x1bOB\x1b[5~\x1b[6~\x1b[H\x1b[4~\x1bOP"),
            [
                Key::Scroll(Up),
                Key::Scroll(Down),
                Key::Scroll(PageUp),
                Key::Scroll(PageDown),
                Key::Scroll(Top),
                Key::Scroll(Bottom),
                Key::Help
            ]
        );
        // Alt-q and an unknown sequence are nothing; a cut sequence does not run on.
        assert_eq!(
            parse(b"\x1bq\x1b[1;5Cq"),
            [Key::Other, Key::Other, Key::Quit]
        );
        assert_eq!(parse(b"\x1b[12"), [Key::Other]);
    }

    #[test]
    fn cycling_settings_and_threads() {
        let threads = [
            Thread {
                tid: 5,
                name: None,
                pid: 5,
            },
            Thread {
                tid: 9,
                name: Some("w".into()),
                pid: 5,
            },
        ];
        let mut v = ViewState::default();
        v.apply(Key::Sort(None), &threads, &[], 10);
        assert_eq!(v.settings.sort, Column::Allocated);
        assert_eq!(v.settings.group, Grouping::YourCode);
        for _ in 0..3 {
            v.apply(Key::Group, &threads, &[], 10);
        }
        assert_eq!(v.settings.group, Grouping::File);
        let tids: Vec<_> = (0..3)
            .map(|_| {
                v.apply(Key::Thread, &threads, &[], 10);
                v.settings.thread
            })
            .collect();
        assert_eq!(tids, [Some(5), Some(9), None]);
        v.apply(Key::Scroll(Scroll::PageDown), &threads, &[], 10);
        assert_eq!(v.scroll, 10);
        v.apply(Key::Inclusive, &threads, &[], 10);
        assert!(v.settings.inclusive);
        assert_eq!(v.scroll, 0);
    }

    #[test]
    fn help_swallows_one_key_but_not_quit() {
        let mut v = ViewState::default();
        v.apply(Key::Help, &[], &[], 10);
        assert!(v.help);
        assert_eq!(v.apply(Key::Pause, &[], &[], 10), None);
        assert!(!v.help && !v.paused);
        v.apply(Key::Help, &[], &[], 10);
        assert_eq!(v.apply(Key::Quit, &[], &[], 10), Some(Key::Quit));
    }

    #[test]
    fn esc_closes_the_help_alone_and_otherwise_the_view() {
        let mut v = ViewState::default();
        v.apply(Key::Help, &[], &[], 10);
        assert_eq!(v.apply(Key::Esc, &[], &[], 10), None);
        assert!(!v.help);
        assert_eq!(v.apply(Key::Esc, &[], &[], 10), Some(Key::Quit));
    }

    #[test]
    fn cycling_processes_narrows_the_threads() {
        let thread = |tid, pid| Thread {
            tid,
            name: None,
            pid,
        };
        let threads = [thread(5, 5), thread(6, 5), thread(8, 8)];
        let process = |pid| Process {
            pid,
            command: String::new(),
            ended: false,
        };
        let processes = [process(5), process(8)];
        let mut v = ViewState::default();
        v.apply(Key::Process, &threads, &processes, 10);
        assert_eq!(v.settings.process, Some(5));
        v.apply(Key::Thread, &threads, &processes, 10);
        v.apply(Key::Thread, &threads, &processes, 10);
        assert_eq!(v.settings.thread, Some(6));
        v.apply(Key::Thread, &threads, &processes, 10);
        assert_eq!(v.settings.thread, None, "thread 8 is another process's");
        v.apply(Key::Process, &threads, &processes, 10);
        assert_eq!(v.settings.process, Some(8));
        v.apply(Key::Thread, &threads, &processes, 10);
        assert_eq!(v.settings.thread, Some(8));
        v.apply(Key::Process, &threads, &processes, 10);
        assert_eq!((v.settings.process, v.settings.thread), (None, None));
        assert_eq!(parse(b"c"), [Key::Process]);
    }
}
