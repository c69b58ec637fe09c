//! Text from a capture or from the target made safe to show, and kept to a bounded size.
//!
//! Names in a capture (files, functions, threads, the command line) and what the target puts
//! in its ring (the Python version, the agent's messages) come from the profiled program and
//! from a file anyone can hand over: they are untrusted. A function named
//! `"\x1b]52;c;...\x07"` would set the clipboard of whoever prints a report in a terminal, and
//! `"\x1b[2J"` would clear the screen. [`printable`] is the one place that neutralises them:
//! the profile keeps names exactly as the capture has them (cut to a bounded length by
//! [`elide`]), and every view passes what it shows through [`printable`] (or [`xml_escape`],
//! which calls it). JSON keeps names exact, with the same characters written as JSON escapes
//! ([`json_safe`]), so no JSON document carries them as bytes either.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal or a document as it is: control characters (C0,
/// DEL, C1) and the Unicode controls that reorder or hide text (bidirectional marks,
/// overrides and isolates; zero-width joiners are allowed).
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every unsafe character written as a visible escape (`\x1b` → `\u{1b}`). The
/// result contains no unsafe character, so applying it twice changes nothing more; a string
/// without unsafe characters is returned as it is, without copying.
pub fn printable(s: &str) -> Cow<'_, str> {
    escaped(s, is_unsafe)
}

/// `s` with every character `escape` picks written as a visible escape.
fn escaped(s: &str, escape: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` as [`printable`] makes it, but for its line breaks and tabs, which stay: a message of
/// several lines for a terminal. Every message mprof prints goes through it (`say!`).
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    escaped(s, |c| is_unsafe(c) && !matches!(c, '\n' | '\t'))
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

/// JSON text (as serde_json writes it) with every unsafe character written as a JSON
/// `\uXXXX` escape: the document means the same (names stay exact), but its bytes carry no
/// control character. serde_json escapes C0 inside strings itself, so the only C0 characters
/// left are the layout's own whitespace (kept); the other unsafe characters (DEL, C1,
/// bidirectional controls) can only be inside strings, where the escape is valid.
pub fn json_safe(json: String) -> String {
    let escape = |c: char| is_unsafe(c) && !matches!(c, '\n' | '\r' | '\t');
    if !json.chars().any(escape) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if escape(c) {
            // Every unsafe character is in the Basic Multilingual Plane: one escape each.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` cut to at most `max` bytes (on character boundaries) by replacing its middle with `…`.
pub fn elide(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let keep = max.saturating_sub('…'.len_utf8()) / 2;
    let mut head = keep;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - keep;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    Cow::Owned(format!("{}…{}", &s[..head], &s[tail..]))
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
    fn control_characters_are_shown_not_obeyed() {
        assert!(matches!(printable("parse_rows"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\x1b]52;c;aGk=\x07b"),
            "a\\u{1b}]52;c;aGk=\\u{7}b"
        );
        assert_eq!(printable("\n\t\x7f"), "\\u{a}\\u{9}\\u{7f}");
        assert_eq!(printable("x\u{9b}2J\u{202e}y"), "x\\u{9b}2J\\u{202e}y");
        assert_eq!(printable("crème brûlée 名前"), "crème brûlée 名前");
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let escaped = printable(&c.to_string()).into_owned();
            assert!(!escaped.chars().any(is_unsafe), "{c:?}");
        }
    }

    #[test]
    fn xml_escaping_also_neutralises_controls() {
        assert_eq!(
            xml_escape("<a href=\"x\">&'\x1b"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;\\u{1b}"
        );
    }

    #[test]
    fn json_keeps_names_exact_without_control_bytes() {
        let name = "boom\x1b]0;pwned\x07\x7f\u{9b}\u{202e}é\n";
        let json = json_safe(serde_json::to_string(&[name]).unwrap());
        assert!(!json.chars().any(is_unsafe), "{json}");
        assert!(
            json.contains("\\u009b") && json.contains("\\u202e"),
            "{json}"
        );
        let back: Vec<String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [name]);
        // Pretty-printed: the layout's newlines stay, the strings' controls are escaped.
        let pretty = json_safe(serde_json::to_string_pretty(&[name, "x"]).unwrap());
        assert!(pretty.contains("\n  \"x\""), "{pretty}");
        assert!(
            !pretty.chars().any(|c| is_unsafe(c) && c != '\n'),
            "{pretty}"
        );
        let back: Vec<String> = serde_json::from_str(&pretty).unwrap();
        assert_eq!(back, [name, "x"]);
        let clean = serde_json::to_string(&["a", "é"]).unwrap();
        assert_eq!(json_safe(clean.clone()), clean);
    }

    #[test]
    fn long_names_keep_their_ends() {
        assert!(matches!(elide("short", 256), Cow::Borrowed(_)));
        let long = format!("{}{}", "a".repeat(300), "名".repeat(100));
        let cut = elide(&long, 256);
        assert!(cut.len() <= 256, "{}", cut.len());
        assert!(cut.starts_with("aaa") && cut.ends_with('名') && cut.contains('…'));
    }
}
