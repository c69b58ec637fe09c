//! What mprof tells a user who would otherwise be stuck, during and after a session:
//! - the capture grows fast (`--rate 1` writes hundreds of MB a second): said once, after a few
//!   seconds, when it grows by more than [`GROWTH_NOTE`] bytes a second ([`GrowthWatch`]);
//! - an attach sampled little, and the target has Python children that may do the work (a
//!   gunicorn master, a multiprocessing parent): they are named ([`children_hint`]);
//! - an attach waits for an earlier session whose mprof was killed to time out: said when the
//!   wait lasts ([`noting_a_stale_session`]).
//!
//! The tests lower the growth threshold with `MPROF_TEST_GROWTH_NOTE` (bytes a second), so that
//! they do not depend on how fast the machine runs.

use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::sessions::procfs::parent_of;
use std::fmt::Write as _;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The capture growth (bytes a second) above which mprof says how fast the capture grows.
pub const GROWTH_NOTE: f64 = 50e6;
/// How long the capture's growth is measured over, each time.
pub const GROWTH_WINDOW: Duration = Duration::from_secs(3);
/// An attach that sampled fewer samples or bytes than these "sampled little".
pub const LITTLE_SAMPLES: u64 = 10;
pub const LITTLE_BYTES: f64 = 1024.0 * 1024.0;
/// Children named at most in the hint.
const MAX_CHILDREN: usize = 8;
/// How long an inspection may wait silently for an earlier session to time out.
pub const STALE_NOTE_AFTER: Duration = Duration::from_millis(500);

/// Watches how fast the capture grows, window by window, and has a note once it grows too
/// fast.
pub struct GrowthWatch {
    rate: u64,
    limit: f64,
    window: (Instant, u64),
    said: bool,
}

impl GrowthWatch {
    /// A watch for a session sampling at `rate`, starting now with an empty capture.
    pub fn new(rate: u64) -> GrowthWatch {
        let limit = std::env::var("MPROF_TEST_GROWTH_NOTE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(GROWTH_NOTE);
        GrowthWatch::with_limit(rate, limit, Instant::now())
    }

    fn with_limit(rate: u64, limit: f64, now: Instant) -> GrowthWatch {
        GrowthWatch {
            rate,
            limit,
            window: (now, 0),
            said: false,
        }
    }

    /// The note to print, once: the capture holds `bytes` at `now`. Each [`GROWTH_WINDOW`]
    /// the growth over that window is compared with the limit.
    pub fn check(&mut self, now: Instant, bytes: u64) -> Option<String> {
        let (since, from) = self.window;
        let took = now.saturating_duration_since(since);
        if self.said || took < GROWTH_WINDOW {
            return None;
        }
        self.window = (now, bytes);
        let per_second = bytes.saturating_sub(from) as f64 / took.as_secs_f64();
        if per_second <= self.limit {
            return None;
        }
        self.said = true;
        let rate = match self.rate {
            1 => "--rate 1 records every allocation".to_owned(),
            r => format!("at --rate {}", human_bytes(r as f64)),
        };
        Some(format!(
            "mprof: note: the capture grows by {}/s ({rate}); a minute of this is {}. \
             A larger --rate (the default is {}) keeps it small.",
            human_bytes(per_second),
            human_bytes(per_second * 60.0),
            crate::sessions::sampling::DEFAULT_RATE
        ))
    }
}

/// The command line of every Python process whose parent is `pid`, by PID.
pub fn python_children(pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid) && is_python(child))
        .map(|child| (child, crate::sessions::procfs::command_line(child)))
        .collect();
    out.sort();
    out
}

/// Whether `pid` runs CPython: its executable is `python…`, or it maps a libpython.
fn is_python(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let named = exe
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("python"));
    named
        || std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|maps| maps.contains("/libpython3"))
}

/// The lines to print after an attach to `pid` that sampled little (`samples`, `allocated`
/// bytes) while the target has Python `children`; `None` otherwise.
pub fn children_hint(
    pid: u32,
    samples: u64,
    allocated: f64,
    children: &[(u32, String)],
) -> Option<String> {
    if children.is_empty() || (samples >= LITTLE_SAMPLES && allocated >= LITTLE_BYTES) {
        return None;
    }
    let n = children.len();
    let mut out = format!(
        "mprof: PID {pid} itself allocated little ({samples} samples), but it has {n} Python \
         child process{}, which may do the work:",
        if n == 1 { "" } else { "es" }
    );
    for (child, command) in children.iter().take(MAX_CHILDREN) {
        let _ = write!(out, "\nmprof:   PID {child}: {}", printable(command));
    }
    if n > MAX_CHILDREN {
        let _ = write!(out, "\nmprof:   ... and {} more", n - MAX_CHILDREN);
    }
    let _ = write!(
        out,
        "\nmprof: attach with --follow-children to profile them too (or attach to one, \
         e.g. mprof attach --pid {})",
        children[0].0
    );
    Some(out)
}

/// Runs `inspect`, which waits while an earlier session in `pid` may still have a live mprof
/// (its heartbeat is watched until it is old, about two seconds). If it still runs after
/// [`STALE_NOTE_AFTER`] and the target maps an mprof ring, says what mprof is waiting for.
pub fn noting_a_stale_session<T>(pid: u32, inspect: impl FnOnce() -> T) -> T {
    let (done, waiting) = channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let slow = waiting.recv_timeout(STALE_NOTE_AFTER) == Err(RecvTimeoutError::Timeout);
            let ring = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .is_ok_and(|maps| maps.contains("mprof-ring"));
            if slow && ring {
                crate::say!("{}", stale_note(pid));
            }
        });
        let out = inspect();
        drop(done);
        out
    })
}

/// What mprof says while it waits for an earlier session to time out.
pub fn stale_note(pid: u32) -> String {
    format!(
        "mprof: PID {pid} has a profiling session whose mprof stopped answering (killed?); \
         waiting up to 2 s for it to time out, then taking it over"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_growth_note_comes_once_when_a_window_grows_too_fast() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut w = GrowthWatch::with_limit(1, GROWTH_NOTE, t0);
        assert_eq!(w.check(at(1.0), 400_000_000), None, "too early");
        // 30 MB/s over the first window: quiet.
        assert_eq!(w.check(at(3.0), 90_000_000), None);
        assert_eq!(w.check(at(5.0), 900_000_000), None, "window not over");
        let note = w.check(at(6.0), 390_000_000).expect("100 MB/s");
        assert_eq!(
            note,
            "mprof: note: the capture grows by 95.37 MiB/s (--rate 1 records every \
             allocation); a minute of this is 5.59 GiB. A larger --rate (the default is \
             128KiB) keeps it small."
        );
        assert_eq!(w.check(at(9.0), 990_000_000), None, "said once");
        let mut sampled = GrowthWatch::with_limit(4096, GROWTH_NOTE, t0);
        let note = sampled.check(at(3.0), 300_000_000).unwrap();
        assert!(note.contains("(at --rate 4.00 KiB)"), "{note}");
    }

    #[test]
    fn the_children_hint_names_them_when_the_parent_sampled_little() {
        let children = [
            (4243, "gunicorn: worker [app:app]".to_owned()),
            (4244, "python3 worker.py \u{1b}[2J".to_owned()),
        ];
        assert_eq!(
            children_hint(4242, 3, 400_000.0, &children).unwrap(),
            "mprof: PID 4242 itself allocated little (3 samples), but it has 2 Python child \
             processes, which may do the work:\n\
             mprof:   PID 4243: gunicorn: worker [app:app]\n\
             mprof:   PID 4244: python3 worker.py \\u{1b}[2J\n\
             mprof: attach with --follow-children to profile them too (or attach to one, \
             e.g. mprof attach --pid 4243)"
        );
        assert_eq!(children_hint(4242, 500, 80e6, &children), None);
        assert_eq!(children_hint(4242, 0, 0.0, &[]), None);
        let many: Vec<_> = (0..10).map(|i| (100 + i, "python3".to_owned())).collect();
        let text = children_hint(1, 0, 0.0, &many).unwrap();
        assert!(text.contains("10 Python child processes"), "{text}");
        assert!(text.contains("\nmprof:   ... and 2 more\n"), "{text}");
    }

    #[test]
    fn this_process_has_no_python_children_and_a_parent() {
        let me = std::process::id();
        assert!(parent_of(me).is_some_and(|p| p > 0));
        assert_eq!(python_children(me), []);
    }

    #[test]
    fn an_inspection_returns_its_value() {
        assert_eq!(noting_a_stale_session(std::process::id(), || 7), 7);
    }
}
