//! What /proc says of a process: its command line and its parent.

/// The parent of `pid`, from `/proc/PID/stat` (the fields after the command name's `)`).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The command line of `pid`, from /proc (arguments joined by spaces; empty if unreadable).
pub fn command_line(pid: u32) -> String {
    arguments(pid).join(" ")
}

/// The arguments of `pid`, from /proc (empty if unreadable).
pub fn arguments(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}
