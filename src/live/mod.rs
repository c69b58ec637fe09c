//! `--live`: a full-screen terminal view of a running session, a `top` for allocations.
//!
//! The view lives in mprof's own loop: the reader drains the ring into the capture file and
//! shows every record it writes to the [`model::Model`] (the same aggregator the reports use),
//! then [`Live::pump`] answers the keyboard and redraws about once a second. The target pays
//! for sampling and nothing more; the capture file is the same with or without the view. When
//! samples come faster than the view can add them up (the ring is over a quarter full), the
//! view skips Alloc records until the reader has caught up, and says how many it skipped; the
//! capture still gets every one. (Measured: the view keeps up at `--rate 256`, about 0.8 M
//! samples/s; at `--rate 1` it skips, and nothing is dropped that `record` alone would keep.)
//!
//! Under `record --live` the program's stdout and stderr go to `CAPTURE.out` and its stdin is
//! /dev/null, so it neither garbles the screen nor eats the keys.
//!
//! Wiring a session loop (record and attach alike):
//! ```ignore
//! let mut view = Some(Live::start(target)?);             // None without --live
//! loop {
//!     let (moved, closed) = live::pump(&mut view, &mut reader, &ring)?;  // instead of reader.pump()
//!     if let Some(why) = closed { /* q, Ctrl-C, or a terminal error: the terminal is restored */ }
//!     ...
//! }
//! ```
//! The terminal is restored (raw mode off, main screen back, cursor shown) when the view is
//! dropped, on every error path, and by a panic hook. A SIGINT/SIGTERM/SIGHUP that mprof's
//! loop notices should drop the view before anything else.

pub mod keys;
pub mod model;
pub mod ui;

use crate::children::Event;
use crate::session::{monotonic_ns, Reader, RingMem};
use crate::signals::{self, Handler};
use anyhow::{bail, Context, Result};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use keys::{Key, ViewState};
use model::{Model, Snapshot};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{IsTerminal, Stdout};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How often the screen is refreshed.
pub const REFRESH: Duration = Duration::from_secs(1);
/// How full the ring may be before the view stops adding up samples to let the reader catch
/// up (the capture still gets every record).
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
    pub focus: crate::focus::Focus,
}

impl Target {
    /// The target of `mprof attach --live`: its command line is read from /proc; `focus`
    /// says which files are your code.
    pub fn attach(
        pid: u32,
        sampling: &crate::SamplingArgs,
        capture: &Path,
        focus: crate::focus::Focus,
    ) -> Target {
        let command = crate::attach::command_line(pid);
        Target {
            mode: Mode::Attach,
            pid,
            command,
            rate: sampling.rate,
            capture: capture.to_path_buf(),
            program_output: None,
            python_only: sampling.python_only,
            focus,
        }
    }
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

    /// Drains the ring through the model into the capture (see [`Reader::pump_observed`]),
    /// then serves the keyboard and the screen. Returns the bytes moved and, when the view
    /// closed, why; the terminal is restored by then.
    pub fn pump(
        &mut self,
        reader: &mut Reader<&RingMem>,
        ring: &RingMem,
    ) -> Result<(usize, Option<Closed>)> {
        let model = &mut self.model;
        model.enter(self.target.pid);
        let mut behind = ring.fill() > BEHIND;
        let mut seen = 0u32;
        let moved = reader.pump_observed(|bytes| {
            seen = seen.wrapping_add(1);
            if seen.is_multiple_of(256) {
                behind = ring.fill() > BEHIND;
            }
            if behind {
                model.observe_but_skip_samples(bytes)
            } else {
                model.observe(bytes)
            }
        })?;
        let python = if model.wants_python() {
            ring.python_version()
        } else {
            String::new()
        };
        model.set_ring_status(ring.dropped(), &python);
        let closed = match self.serve() {
            Ok(closed) => closed,
            Err(e) => Some(Closed::Failed(e)),
        };
        if closed.is_some() {
            restore_terminal();
        }
        Ok((moved, closed))
    }

    /// Handles pending keys and refreshes the screen when due.
    fn serve(&mut self) -> Result<Option<Closed>> {
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
    /// Shows the view what happened to a followed child (see [`Event`]).
    pub fn child(&mut self, event: &Event) {
        match *event {
            Event::Started(pid, command) => self.model.started(pid, command),
            Event::Record(pid, bytes) => {
                self.model.enter(pid);
                self.model.observe(bytes);
            }
            Event::Ended(pid) => self.model.ended(pid),
            // The session ends the program's own stream, then sends `Ended`.
            Event::ProgramReplaced(_) => {}
        }
    }
}

/// [`Live::child`] on an optional view.
pub fn child_event(view: &mut Option<Live>, event: &Event) {
    if let Some(live) = view {
        live.child(event);
    }
}

/// [`Live::pump`] on an optional view: without one it is `reader.pump()`. When the view
/// closes it is dropped here, so the caller's terminal is back to normal on return.
pub fn pump(
    view: &mut Option<Live>,
    reader: &mut Reader<&RingMem>,
    ring: &RingMem,
) -> Result<(usize, Option<Closed>)> {
    let Some(live) = view else {
        return Ok((reader.pump()?, None));
    };
    let (moved, closed) = live.pump(reader, ring)?;
    if closed.is_some() {
        *view = None;
    }
    Ok((moved, closed))
}

#[cfg(test)]
mod golden;
