//! Text that came from a capture or from the target (file and function names, thread names,
//! the agent's messages) made safe to print on a terminal.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` could change what a terminal shows beyond itself: C0 and C1 control characters
/// and DEL (escape sequences, screen clears, OSC clipboard writes, title changes...) and the
/// bidirectional overrides that reorder the text around them.
fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control character written as an escape (`\x1b`, `\u{9b}`, `\u{202e}`), so
/// that printing it shows the characters instead of obeying them. Borrows when there is
/// nothing to escape (the usual case).
pub fn escape_control(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !is_unsafe(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert!(matches!(escape_control("parse_rows"), Cow::Borrowed(_)));
        assert_eq!(
            escape_control("a\x1b]52;c;aGk=\x07b"),
            "a\\x1b]52;c;aGk=\\x07b"
        );
        assert_eq!(escape_control("\n\t\x7f"), "\\x0a\\x09\\x7f");
        assert_eq!(escape_control("x\u{9b}2J\u{202e}y"), "x\\u{9b}2J\\u{202e}y");
        assert_eq!(escape_control("crème brûlée 名前"), "crème brûlée 名前");
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let escaped = escape_control(&c.to_string()).into_owned();
            assert!(!escaped.chars().any(is_unsafe), "{c:?}");
        }
    }
}
