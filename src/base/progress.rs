//! Progress of a long read on standard error: once a view has taken more than a second, a
//! line `mprof: reading 42% (1.2 GiB of 2.9 GiB), about 3 s left` is drawn and redrawn in
//! place (at most 4 times a second), and cleared at the end. It is drawn when standard error
//! is a terminal, or always with `MPROF_PROGRESS=always` (then one line per update, for logs
//! and tests); never with `MPROF_PROGRESS=never`.

use crate::base::units::human_bytes;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The environment variable that forces progress on (`always`) or off (`never`).
pub const PROGRESS_ENV: &str = "MPROF_PROGRESS";
/// How long a read goes on before its progress is shown.
const QUIET: Duration = Duration::from_secs(1);
/// Least time between two updates.
const EVERY: Duration = Duration::from_millis(250);

/// How progress is drawn, if at all.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Off,
    /// Redrawn in place (a terminal).
    InPlace,
    /// A line per update.
    Lines,
}

/// The progress of one read of `total` bytes.
pub struct Progress {
    what: &'static str,
    total: u64,
    started: Instant,
    last: Option<Instant>,
    mode: Mode,
    drawn: bool,
}

impl Progress {
    /// Starts timing a read of `total` bytes; `what` names it (`reading`).
    pub fn new(what: &'static str, total: u64) -> Progress {
        let mode = match std::env::var(PROGRESS_ENV).as_deref() {
            Ok("always") => Mode::Lines,
            Ok("never") => Mode::Off,
            _ if std::io::stderr().is_terminal() => Mode::InPlace,
            _ => Mode::Off,
        };
        Progress {
            what,
            total,
            started: Instant::now(),
            last: None,
            mode,
            drawn: false,
        }
    }

    /// `done` bytes of the total are read.
    pub fn update(&mut self, done: u64) {
        if self.mode == Mode::Off {
            return;
        }
        let now = Instant::now();
        let elapsed = now - self.started;
        if elapsed < QUIET || self.last.is_some_and(|t| now - t < EVERY) || self.total == 0 {
            return;
        }
        self.last = Some(now);
        let share = (done as f64 / self.total as f64).clamp(0.0, 1.0);
        let left = match share > 0.0 {
            true => format!(
                ", about {:.0} s left",
                elapsed.as_secs_f64() * (1.0 - share) / share
            ),
            false => String::new(),
        };
        let text = format!(
            "mprof: {} {:.0}% ({} of {}){left}",
            self.what,
            share * 100.0,
            human_bytes(done as f64),
            human_bytes(self.total as f64)
        );
        let mut err = std::io::stderr().lock();
        let _ = match self.mode {
            Mode::InPlace => write!(err, "\r\x1b[K{text}"),
            _ => writeln!(err, "{text}"),
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// The read is over: the line drawn in place is cleared.
    pub fn finish(&mut self) {
        if self.drawn && self.mode == Mode::InPlace {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
        self.drawn = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
