//! `--live`: a full-screen terminal view of a running session, a `top` for allocations.
//!
//! The view is fed by the session: the session's driver drains the ring into the capture file
//! and shows every record it writes to the view ([`Live::program_feed`], and
//! [`Live::process_record`] for followed children), which adds them up in its
//! [`model::Model`] (the same aggregator the reports use); then [`Live::serve`] answers the
//! keyboard and redraws about once a second. The view knows nothing of rings or sessions. The
//! target pays for sampling and nothing more; the capture file is the same with or without the
//! view. When samples come faster than the view can add them up (the ring they come from is
//! over a quarter full), the view skips Alloc records until the reader has caught up, and says
//! how many it skipped; the capture still gets every one. (Measured: the view keeps up at
//! `--rate 256`, about 0.8 M samples/s; at `--rate 1` it skips, and nothing is dropped that
//! `record` alone would keep.)
//!
//! Under `record --live` the program's stdout and stderr go to `CAPTURE.out` and its stdin is
//! /dev/null, so it neither garbles the screen nor eats the keys.
//!
//! Feeding the view, once a round (what `crate::sessions::driver` does):
//! ```ignore
//! let mut live = Live::start(target)?;                   // with --live
//! let mut feed = live.program_feed(|| ring.fill());      // the program's records
//! reader.pump_observed(|bytes| feed.record(bytes))?;     // written, then shown
//! live.ring_status(ring.dropped(), || ring.python_version());
//! if let Some(why) = live.serve() { /* q, Ctrl-C, or a terminal error: drop the view */ }
//! ```
//! The terminal is restored (raw mode off, main screen back, cursor shown) when the view is
//! dropped, on every error path, and by a panic hook. A SIGINT/SIGTERM/SIGHUP that mprof's
//! loop notices should drop the view before anything else.

pub mod keys;
pub mod model;
pub mod ui;

use crate::base::clock::monotonic_ns;
use crate::base::signals::{self, Handler};
use anyhow::{bail, Context, Result};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use keys::{Key, ViewState};
use model::{Model, Snapshot};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{IsTerminal, Stdout};
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How often the screen is refreshed.
pub const REFRESH: Duration = Duration::from_secs(1);
/// How full the ring may be before the view stops adding up samples to let the reader catch
/// up (the capture still gets every record; see [`Feed`]).
const BEHIND: f64 = 0.25;

/// Which command runs the view; it decides what quitting means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `q` closes the view and mprof records on until the program ends.
    Record,
    /// `q` closes the view and detaches.
    Attach,
}

/// What the view is watching.
#[derive(Clone, Debug)]
pub struct Target {
    pub mode: Mode,
    pub pid: u32,
    /// The command line, as shown in the title.
    pub command: String,
    pub rate: u64,
    /// The capture file being written.
    pub capture: PathBuf,
    /// Where the program's stdout and stderr go while the view is up (record).
    pub program_output: Option<PathBuf>,
    /// Whether the agent leaves the C allocator family alone (`--python-only`).
    pub python_only: bool,
    /// Which files are your code, for the grouping by your code.
    pub focus: crate::analysis::focus::Focus,
}

/// Why the view closed.
#[derive(Debug)]
pub enum Closed {
    /// `q`, or Esc outside the help.
    Quit,
    /// Ctrl-C (in raw mode the terminal sends no SIGINT: the program has not been told).
    Interrupt,
    /// The terminal failed (gone, or an I/O error); the session should go on without a view.
    Failed(anyhow::Error),
}

/// Whether the terminal is in the view's modes (raw, alternate screen), for the restorers.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Set by SIGWINCH: the terminal changed size.
static RESIZED: AtomicBool = AtomicBool::new(false);
static HOOKS: Once = Once::new();

extern "C" fn on_winch(_: libc::c_int) {
    RESIZED.store(true, Ordering::Relaxed);
}

/// A panic hook that restores the terminal before the message is printed, and a SIGWINCH
/// handler; once per process.
fn install_hooks() {
    HOOKS.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        // SAFETY: on_winch only stores into an atomic: async-signal-safe.
        unsafe { signals::set_handler(libc::SIGWINCH, Handler::Plain(on_winch)) };
    });
}

/// The bytes typed on the terminal (stdin) since the last call, without waiting; an error
/// once the terminal has hung up.
fn typed() -> Result<Vec<u8>> {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes one pollfd, `fd`, a live local; timeout 0 never waits.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    if ready <= 0 {
        return Ok(Vec::new()); // nothing typed, or EINTR: next time
    }
    if fd.revents & libc::POLLIN == 0 {
        bail!("the terminal hung up");
    }
    let mut buf = [0u8; 512];
    // SAFETY: read writes at most `buf.len()` bytes into `buf`. Descriptor 0 is read directly
    // (not through std's buffered Stdin) so that poll sees every byte not yet taken.
    let got = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
    match got {
        0 => bail!("the terminal hung up"),
        n if n < 0 => {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => Ok(Vec::new()),
                _ => Err(e).context("reading the terminal"),
            }
        }
        n => Ok(buf[..n as usize].to_vec()),
    }
}

/// Leaves raw mode and the alternate screen and shows the cursor, once; safe to call from
/// anywhere, any number of times.
pub fn restore_terminal() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// The view, up on the terminal.
pub struct Live {
    /// Dropped by hand: see `Drop for Live`.
    terminal: ManuallyDrop<Terminal<CrosstermBackend<Stdout>>>,
    target: Target,
    model: Model,
    snapshot: Snapshot,
    view: ViewState,
    next_refresh: Instant,
}

impl Live {
    /// Checks that stdin and stdout are a terminal, then takes it over.
    pub fn check_terminal() -> Result<()> {
        if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
            bail!("--live needs a terminal on stdin and stdout");
        }
        Ok(())
    }

    /// Opens the view on the terminal.
    pub fn start(target: Target) -> Result<Live> {
        Live::check_terminal()?;
        install_hooks();
        let terminal = enter().inspect_err(|_| restore_terminal())?;
        let now = monotonic_ns();
        let mut model = Model::new(target.rate, now);
        model.set_focus(target.focus.clone());
        model.started(target.pid, &target.command);
        model.enter(target.pid);
        let snapshot = model.roll(now);
        let mut live = Live {
            terminal: ManuallyDrop::new(terminal),
            target,
            model,
            snapshot,
            view: ViewState::default(),
            next_refresh: Instant::now() + REFRESH,
        };
        live.draw()?;
        Ok(live)
    }

    /// Shows the view the program's records of one drain of its ring, in capture order: the
    /// ring's records byte for byte and the ones the reader adds (thread names, RSS readings).
    /// `fill` says how full that ring is (0 to 1); while it is over [`BEHIND`] the view skips
    /// samples, to let the reader catch up.
    pub fn program_feed<F: Fn() -> f64>(&mut self, fill: F) -> Feed<'_, F> {
        self.model.enter(self.target.pid);
        let behind = fill() > BEHIND;
        Feed {
            model: &mut self.model,
            fill,
            behind,
            seen: 0,
        }
    }

    /// What the program's ring says besides its records: how many records its agent dropped,
    /// and the Python version (`python` is asked only while the view still wants it).
    pub fn ring_status(&mut self, dropped: u64, python: impl FnOnce() -> String) {
        let python = if self.model.wants_python() {
            python()
        } else {
            String::new()
        };
        self.model.set_ring_status(dropped, &python);
    }

    /// Serves the keyboard and the screen. Returns why the view closed, if it did; the
    /// terminal is restored by then, and the view should be dropped.
    pub fn serve(&mut self) -> Option<Closed> {
        let closed = match self.serve_terminal() {
            Ok(closed) => closed,
            Err(e) => Some(Closed::Failed(e)),
        };
        if closed.is_some() {
            restore_terminal();
        }
        closed
    }

    /// Handles pending keys and refreshes the screen when due.
    fn serve_terminal(&mut self) -> Result<Option<Closed>> {
        let mut redraw = RESIZED.swap(false, Ordering::Relaxed);
        let typed = typed()?;
        if !typed.is_empty() {
            let page = ui::table_rows(self.terminal.size()?.height);
            for key in keys::parse(&typed) {
                let was_paused = self.view.paused;
                let snap = &self.snapshot;
                match self.view.apply(key, &snap.threads, &snap.processes, page) {
                    Some(Key::Interrupt) => return Ok(Some(Closed::Interrupt)),
                    Some(_) => return Ok(Some(Closed::Quit)),
                    None => redraw = true,
                }
                if was_paused && !self.view.paused {
                    // Show the latest figures at once, not the frozen ones.
                    self.next_refresh = Instant::now();
                }
            }
        }
        let now = Instant::now();
        if now >= self.next_refresh {
            self.next_refresh = now + REFRESH;
            // Intervals keep rolling while paused, so the rates stay per second.
            let snapshot = self.model.roll(monotonic_ns());
            if !self.view.paused {
                self.snapshot = snapshot;
                redraw = true;
            }
        }
        if redraw {
            self.draw()?;
        }
        Ok(None)
    }

    fn draw(&mut self) -> Result<()> {
        let screen = ui::Screen {
            target: &self.target,
            model: &self.model,
            snap: &self.snapshot,
            view: &self.view,
        };
        self.terminal
            .draw(|f| ui::draw(f, &screen))
            .context("drawing the live view")?;
        Ok(())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // ratatui's Terminal shows the cursor when dropped and prints to stderr when it cannot
        // (the terminal hung up), and printing to a dead terminal panics. So show the cursor
        // here, and when that fails leave the Terminal undropped (a few KiB, once).
        let shown = self.terminal.show_cursor().is_ok();
        restore_terminal();
        if shown {
            // SAFETY: this is `self`'s drop: the terminal is dropped here once and never used
            // again.
            unsafe { ManuallyDrop::drop(&mut self.terminal) };
        }
    }
}

/// Raw mode, alternate screen, hidden cursor.
fn enter() -> Result<Terminal<CrosstermBackend<Stdout>>> {
    terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
    ACTIVE.store(true, Ordering::SeqCst);
    let mut out = std::io::stdout();
    execute!(out, EnterAlternateScreen, cursor::Hide)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(out))?;
    terminal.clear()?;
    Ok(terminal)
}

impl Live {
    /// A followed process was admitted (its pid and command line).
    pub fn process_started(&mut self, pid: u32, command: &str) {
        self.model.started(pid, command);
    }

    /// A record went to the capture of followed process `pid`.
    pub fn process_record(&mut self, pid: u32, bytes: &[u8]) {
        self.model.enter(pid);
        self.model.observe(bytes);
    }

    /// Followed process `pid`'s capture is finished: it exited (or the session ended).
    pub fn process_ended(&mut self, pid: u32) {
        self.model.ended(pid);
    }
}

/// The program's records of one drain, on their way to the view (see [`Live::program_feed`]).
pub struct Feed<'a, F: Fn() -> f64> {
    model: &'a mut Model,
    /// How full the ring the records come from is.
    fill: F,
    /// Whether the ring was over [`BEHIND`] when last asked: samples are skipped.
    behind: bool,
    seen: u32,
}

impl<F: Fn() -> f64> Feed<'_, F> {
    /// One record, as written to the capture. The ring's fill is asked again every 256
    /// records.
    pub fn record(&mut self, bytes: &[u8]) {
        self.seen = self.seen.wrapping_add(1);
        if self.seen.is_multiple_of(256) {
            self.behind = (self.fill)() > BEHIND;
        }
        if self.behind {
            self.model.observe_but_skip_samples(bytes)
        } else {
            self.model.observe(bytes)
        }
    }
}

#[cfg(test)]
mod golden;
