//! The metadata of a capture: Meta records hold `key=value` lines (`rate=…`, `pid=…`,
//! `ended_by=exec`…), written by the sessions and read by every later stage.

/// The `rate` of a Meta record's text, if it has one.
pub fn meta_rate(text: &str) -> Option<u64> {
    meta_u64(text, "rate")
}

/// The last value of `key` in a Meta record's text that is a whole number, if any.
pub fn meta_u64(text: &str, key: &str) -> Option<u64> {
    meta_pairs(text)
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, v)| v.trim().parse().ok())
        .last()
}

/// Whether a Meta record says its process ran a new program by exec (`ended_by=exec`): its
/// capture ends there, and the new program's is another one.
pub fn ended_by_exec(text: &str) -> bool {
    meta_pairs(text).any(|(k, v)| k == "ended_by" && v == "exec")
}

/// The key and value of each `key=value` line of a Meta record's text, trimmed.
pub fn meta_pairs(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
}
