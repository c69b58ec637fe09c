//! Text from a capture made safe to show.
//!
//! Names in a capture (files, functions, threads, the command line) come from the profiled
//! program and from a file anyone can hand over: they are untrusted. A function named
//! `"\x1b]52;c;...\x07"` would set the clipboard of whoever prints a report in a terminal, and
//! `"\x1b[2J"` would clear the screen. [`printable`] is the one place that neutralises them;
//! every string enters the profile through it (see [`crate::names`]) and every text view
//! passes what it prints through it again, which changes nothing for a clean string.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal or a document as it is: control characters (C0,
/// DEL, C1) and the Unicode controls that reorder or hide text (bidirectional overrides and
/// isolates, zero-width joiners are allowed).
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every unsafe character written as a visible escape (`\x1b` → `\u{1b}`). The
/// result contains no unsafe character, so applying it twice changes nothing more; a string
/// without unsafe characters is returned as it is, without copying.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` escaped for XML and HTML text and attribute values, after [`printable`].
pub fn xml_escape(s: &str) -> String {
    let s = printable(s);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_sequences_and_leaves_clean_text_alone() {
        let osc52 = "f\x1b]52;c;aGVsbG8=\x07";
        assert_eq!(printable(osc52), "f\\u{1b}]52;c;aGVsbG8=\\u{7}");
        assert_eq!(printable("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("x\u{9b}31m"), "x\\u{9b}31m");
        assert_eq!(
            printable("line\nbreak\ttab\r"),
            "line\\u{a}break\\u{9}tab\\u{d}"
        );
        assert_eq!(printable("abc\u{202e}cba"), "abc\\u{202e}cba");
        assert!(matches!(
            printable("build_index (app.py:12) é 漢"),
            Cow::Borrowed(_)
        ));
        let once = printable(osc52).into_owned();
        assert_eq!(printable(&once), once);
        assert!(!printable(osc52).chars().any(is_unsafe));
    }

    #[test]
    fn xml_escaping_also_neutralises_controls() {
        assert_eq!(
            xml_escape("<a href=\"x\">&'\x1b"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;\\u{1b}"
        );
    }
}
