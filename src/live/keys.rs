//! What each key does to the view: the keys are read in `mod.rs`, turned into a [`Key`] here,
//! and applied to the [`ViewState`] the screen is drawn from.

use super::model::{Column, Settings, Thread};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// A key's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// `q`, Esc: close the view.
    Quit,
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
    /// `p`, space: freeze or unfreeze the display.
    Pause,
    /// `?`, `h`: the help.
    Help,
    /// Arrows, PgUp/PgDn (in pages of the table's height), Home/End.
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

/// The meaning of a key event (key releases and repeats of Ctrl-C are `Other`).
pub fn key(ev: &KeyEvent) -> Key {
    if ev.kind == KeyEventKind::Release {
        return Key::Other;
    }
    let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
    match ev.code {
        KeyCode::Char('c') | KeyCode::Char('C') if ctrl => Key::Interrupt,
        _ if ctrl => Key::Other,
        KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => Key::Quit,
        KeyCode::Char('s') | KeyCode::Tab => Key::Sort(None),
        KeyCode::Char(c @ '1'..='4') => Key::Sort(Some(Column::ALL[c as usize - '1' as usize])),
        KeyCode::Char('g') => Key::Group,
        KeyCode::Char('t') => Key::Inclusive,
        KeyCode::Char('f') => Key::Thread,
        KeyCode::Char('p') | KeyCode::Char(' ') => Key::Pause,
        KeyCode::Char('?') | KeyCode::Char('h') | KeyCode::F(1) => Key::Help,
        KeyCode::Up | KeyCode::Char('k') => Key::Scroll(Scroll::Up),
        KeyCode::Down | KeyCode::Char('j') => Key::Scroll(Scroll::Down),
        KeyCode::PageUp => Key::Scroll(Scroll::PageUp),
        KeyCode::PageDown => Key::Scroll(Scroll::PageDown),
        KeyCode::Home => Key::Scroll(Scroll::Top),
        KeyCode::End => Key::Scroll(Scroll::Bottom),
        _ => Key::Other,
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
    /// Applies `key`; `threads` are the threads seen so far and `page` the table's height.
    /// Returns the key back when it closes the view (`Quit`, `Interrupt`).
    pub fn apply(&mut self, key: Key, threads: &[Thread], page: usize) -> Option<Key> {
        if self.help && !matches!(key, Key::Quit | Key::Interrupt | Key::Other) {
            // Any key closes the help; it does nothing else.
            self.help = false;
            return None;
        }
        let s = &mut self.settings;
        match key {
            Key::Quit | Key::Interrupt => return Some(key),
            Key::Sort(column) => s.sort = column.unwrap_or(s.sort.next()),
            Key::Group => s.group = s.group.next(),
            Key::Inclusive => s.inclusive = !s.inclusive,
            Key::Thread => s.thread = next_thread(s.thread, threads),
            Key::Pause => self.paused = !self.paused,
            Key::Help => self.help = true,
            Key::Scroll(how) => self.scroll(how, page),
            Key::Other => {}
        }
        if matches!(
            key,
            Key::Sort(_) | Key::Group | Key::Inclusive | Key::Thread
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::model::Group;

    fn press(code: KeyCode, modifiers: KeyModifiers) -> Key {
        key(&KeyEvent::new(code, modifiers))
    }

    #[test]
    fn keys_map_to_their_meaning() {
        let none = KeyModifiers::NONE;
        assert_eq!(
            press(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Key::Interrupt
        );
        assert_eq!(press(KeyCode::Char('q'), none), Key::Quit);
        assert_eq!(press(KeyCode::Esc, none), Key::Quit);
        assert_eq!(
            press(KeyCode::Char('3'), none),
            Key::Sort(Some(Column::Live))
        );
        assert_eq!(press(KeyCode::Char('s'), KeyModifiers::CONTROL), Key::Other);
        assert_eq!(press(KeyCode::Char('x'), none), Key::Other);
    }

    #[test]
    fn cycling_settings_and_threads() {
        let threads = [
            Thread { tid: 5, name: None },
            Thread {
                tid: 9,
                name: Some("w".into()),
            },
        ];
        let mut v = ViewState::default();
        v.apply(Key::Sort(None), &threads, 10);
        assert_eq!(v.settings.sort, Column::Allocated);
        v.apply(Key::Group, &threads, 10);
        v.apply(Key::Group, &threads, 10);
        assert_eq!(v.settings.group, Group::File);
        let tids: Vec<_> = (0..3)
            .map(|_| {
                v.apply(Key::Thread, &threads, 10);
                v.settings.thread
            })
            .collect();
        assert_eq!(tids, [Some(5), Some(9), None]);
        v.apply(Key::Scroll(Scroll::PageDown), &threads, 10);
        assert_eq!(v.scroll, 10);
        v.apply(Key::Inclusive, &threads, 10);
        assert!(v.settings.inclusive);
        assert_eq!(v.scroll, 0);
    }

    #[test]
    fn help_swallows_one_key_but_not_quit() {
        let mut v = ViewState::default();
        v.apply(Key::Help, &[], 10);
        assert!(v.help);
        assert_eq!(v.apply(Key::Pause, &[], 10), None);
        assert!(!v.help && !v.paused);
        v.apply(Key::Help, &[], 10);
        assert_eq!(v.apply(Key::Quit, &[], 10), Some(Key::Quit));
    }
}
