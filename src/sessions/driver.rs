//! The session driver: the one loop that `record` and `attach` run while the target samples.
//!
//! Each round it drains the program's ring into its capture (through the live view when there
//! is one), takes the rings of followed children and drains them into theirs (the view sees
//! their records too), writes what the capture should know once (the Python version), says
//! when the capture grows fast, then asks the command's [`Watch`] whether the session is over
//! (the program exited, a signal came, the duration is up, the agent stopped...). Between
//! rounds it sleeps [`POLL`], unless the round moved a lot or a ring is filling up: with many
//! rings, data arrives in every round, and a loop that sleeps only when nothing moved would
//! spin. Quiet rounds in a row double the sleep up to [`IDLE_POLL`] ([`QUIET_POLL`] when
//! something waits on the loop: the live view's keys and redraws, the native stacks' map
//! handshake, which the agent waits for): on a shared core every wake-up costs the program
//! (about 100 µs of the core in a VM, 2% of it at 200 wake-ups a second), and at the default
//! rate a ring takes seconds to fill; a round that moves anything worth a note brings the
//! sleep back to [`POLL`].
//!
//! What differs between the commands is only how a session starts and stops:
//! `crate::sessions::record` spawns the program and waits for it, `crate::sessions::attach`
//! injects the agent and detaches; both hand the rest to [`Session`].

use crate::sessions::children::{Children, Event, Rendezvous};
use crate::sessions::continuous::Continuous;
use crate::sessions::hints::GrowthWatch;
use crate::sessions::reader::{Reader, RingMem};
use crate::sessions::sampling::SamplingArgs;
use crate::views::live::{Closed, Live};
use anyhow::Result;
use mprof_common::record::Record;
use std::time::{Duration, Instant};

/// Sleep between rounds that moved little.
pub const POLL: Duration = Duration::from_millis(5);
/// The longest sleep, after quiet rounds in a row, with a live view or native stacks.
pub const QUIET_POLL: Duration = Duration::from_millis(40);
/// The longest sleep, after quiet rounds in a row, when nothing waits on the loop. The
/// reader's share of a web server's CPU went from 0.36% to 0.26% against 40 ms
/// (`benches/reader_cpu.py`). The agent gives up on a reader silent for 1.5 s; a burst after
/// a quiet spell fills at most a few MiB of the ring in this time, even at `--rate 1`.
pub const IDLE_POLL: Duration = Duration::from_millis(100);
/// A round that moved less than this is quiet.
const QUIET_BYTES: usize = 64 << 10;
/// A round that moved this many bytes goes on at once.
const BUSY_BYTES: usize = 256 << 10;
/// A ring this full is drained at once.
const FILLING: f64 = 1.0 / 16.0;

/// The processes followed besides the program (`--follow-children`).
pub struct Followed {
    pub rendezvous: Rendezvous,
    pub children: Children,
}

/// Decides when a session's loop ends: the part of the loop that differs between `record`
/// and `attach`.
pub trait Watch {
    /// Why the loop ended, as the command needs to know it.
    type Ending;

    /// Called after every round; `closed` says whether (and why) the live view closed in it
    /// (it is dropped by then). Returns why the session ends, or `None` to go on.
    fn check(&mut self, s: &mut Session, closed: Option<Closed>) -> Result<Option<Self::Ending>>;
}

/// A running session: the program's ring and capture, the live view, the followed children.
pub struct Session<'r> {
    pub reader: Reader<&'r RingMem>,
    pub view: Option<Live>,
    pub followed: Option<Followed>,
    /// `--every`: the intervals' profiles (never with a live view).
    pub continuous: Option<Continuous>,
    growth: GrowthWatch,
    /// The longest sleep between rounds ([`QUIET_POLL`] or [`IDLE_POLL`]).
    longest_poll: Duration,
    /// Whether the capture still waits for the Python version (`record`: the agent says it
    /// after the interpreter started; `attach` knows it before).
    announce_python: bool,
}

impl<'r> Session<'r> {
    /// A session that drains `reader` (sampled as `sampling` says), shows `view`, follows
    /// `followed`. `announce_python`: write the version into the capture once the agent says
    /// it.
    pub fn new(
        reader: Reader<&'r RingMem>,
        sampling: &SamplingArgs,
        view: Option<Live>,
        followed: Option<Followed>,
        announce_python: bool,
    ) -> Session<'r> {
        let longest_poll = if view.is_some() || sampling.native {
            QUIET_POLL
        } else {
            IDLE_POLL
        };
        Session {
            reader,
            view,
            followed,
            continuous: None,
            growth: GrowthWatch::new(sampling.rate),
            longest_poll,
            announce_python,
        }
    }

    /// The program's ring.
    pub fn ring(&self) -> &'r RingMem {
        self.reader.ring_ref()
    }

    /// Runs rounds until `watch` says the session is over.
    pub fn run<W: Watch>(&mut self, watch: &mut W) -> Result<W::Ending> {
        let mut poll = POLL;
        loop {
            let (moved, closed) = self.round()?;
            if let Some(ending) = watch.check(self, closed)? {
                return Ok(ending);
            }
            let fill = self.fill();
            if moved >= BUSY_BYTES || fill >= FILLING {
                poll = POLL;
                continue;
            }
            match &self.followed {
                // Woken at once by a child that announces itself.
                Some(f) => f.rendezvous.wait(poll),
                None => std::thread::sleep(poll),
            }
            poll = if moved < QUIET_BYTES && fill < FILLING / 4.0 {
                (poll * 2).min(self.longest_poll)
            } else {
                POLL
            };
        }
    }

    /// One round (see the module doc): returns the bytes moved, and why the view closed if
    /// it did.
    pub fn round(&mut self) -> Result<(usize, Option<Closed>)> {
        let ring = self.ring();
        let (mut moved, closed) =
            pump_program(&mut self.view, &mut self.continuous, &mut self.reader)?;
        moved += self.pump_children()?;
        if let Some(c) = &mut self.continuous {
            c.tick(ring.dropped(), || ring.python_version());
        }
        if self.view.is_none() {
            let written = self.written();
            if let Some(note) = self.growth.check(Instant::now(), written) {
                crate::say!("{note}");
            }
        }
        if self.announce_python && !ring.python_version().is_empty() {
            self.announce_python = false;
            self.reader.capture.write(&Record::Meta {
                text: format!("python={}\n", ring.python_version()),
            })?;
        }
        Ok((moved, closed))
    }

    /// Drains the followed children's rings, showing their records to the view.
    pub fn pump_children(&mut self) -> Result<usize> {
        let Session {
            reader,
            view,
            followed,
            continuous,
            ..
        } = self;
        let Some(f) = followed.as_mut() else {
            return Ok(0);
        };
        let mut replaced = Ok(());
        let moved = f.children.pump(&f.rendezvous, &mut |e| {
            if let Event::ProgramReplaced(pid) = e {
                replaced = program_replaced(reader, view, continuous);
                show_child(view, continuous, &Event::Ended(pid));
                return;
            }
            show_child(view, continuous, &e)
        })?;
        replaced?;
        Ok(moved)
    }

    /// Bytes written to every capture of the session.
    fn written(&self) -> u64 {
        let children = self.followed.as_ref().map_or(0, |f| f.children.written());
        self.reader.capture.written() + children
    }

    /// How full the fullest ring is (0 to 1).
    fn fill(&self) -> f64 {
        let children = self.followed.as_ref().map_or(0.0, |f| f.children.fill());
        self.ring().fill().max(children)
    }

    /// Closes the view (the terminal is the user's again) and drains what the program's
    /// agent published: the end of the program's capture, before [`Session::finish`].
    pub fn drain(&mut self) -> Result<()> {
        self.view = None;
        while pump_program(&mut self.view, &mut self.continuous, &mut self.reader)?.0 > 0 {}
        Ok(())
    }

    /// Drains the children still running for up to `grace` and finishes their captures,
    /// then writes mprof's own CPU time and the closing record into the program's capture.
    pub fn finish(&mut self, grace: Duration) -> Result<()> {
        self.view = None;
        if let Some(f) = self.followed.as_mut() {
            let continuous = &mut self.continuous;
            f.children.finish(&f.rendezvous, grace, &mut |e: Event| {
                if let Some(c) = continuous.as_mut() {
                    c.child(&e);
                }
            })?;
        }
        if let Some(c) = self.continuous.take() {
            let ring = self.ring();
            let said = c.finish(ring.dropped(), || ring.python_version());
            crate::say!("{said}");
        }
        self.reader.capture.write(&Record::Meta {
            text: format!("reader_cpu_ms={}\n", own_cpu_ms()),
        })?;
        self.reader.finish()
    }

    /// How many children were profiled, and where their captures are (under
    /// `--follow-children`).
    pub fn children_note(&self) -> Option<String> {
        let f = self.followed.as_ref()?;
        let empty = match f.children.empty_forks() {
            0 => String::new(),
            n => format!(
                " ({n} forked process(es) took no sample, e.g. a fork that ran another program \
                 at once, and have no capture)"
            ),
        };
        let refused = match f.children.refused() {
            0 => String::new(),
            n => format!("; {n} ring(s) handed over were refused (see the warnings above)"),
        };
        Some(format!(
            "mprof: {} capture(s) of followed processes are in {}{empty}{refused}",
            f.children.profiled(),
            f.children.dir().display()
        ))
    }
}

/// The program ran a new Python by exec (see `Event::ProgramReplaced`): the pid's RSS, now the
/// new program's, is no longer read into its capture; what its old program left in the ring
/// goes into the capture (and the view), then the capture says how it ended.
fn program_replaced(
    reader: &mut Reader<&RingMem>,
    view: &mut Option<Live>,
    continuous: &mut Option<Continuous>,
) -> Result<()> {
    reader.program_replaced();
    while pump_program(view, continuous, reader)?.0 > 0 {}
    reader.capture.write(&Record::Meta {
        text: format!(
            "ended_by=exec\nreplaced_unix_ms={}\n",
            crate::base::clock::unix_ms()
        ),
    })
}

/// Drains the program's ring into its capture and, with a view, shows the view every record
/// written (see [`Live::program_feed`]), then lets it serve the keyboard and the screen;
/// under `--every` (never with a view) the continuous side sees every record instead.
/// Returns the bytes moved and, when the view closed, why; it is dropped here then, so the
/// terminal is back to normal on return.
fn pump_program(
    view: &mut Option<Live>,
    continuous: &mut Option<Continuous>,
    reader: &mut Reader<&RingMem>,
) -> Result<(usize, Option<Closed>)> {
    let Some(live) = view else {
        let moved = match continuous {
            Some(c) => {
                c.enter_program();
                reader.pump_observed(|bytes| c.observe(bytes))?
            }
            None => reader.pump()?,
        };
        return Ok((moved, None));
    };
    let ring = *reader.ring_ref(); // the ring itself, not a borrow of the reader
    let moved = {
        let mut feed = live.program_feed(|| ring.fill());
        reader.pump_observed(|bytes| feed.record(bytes))?
    };
    live.ring_status(ring.dropped(), || ring.python_version());
    let closed = live.serve();
    if closed.is_some() {
        *view = None;
    }
    Ok((moved, closed))
}

/// Shows the view, if there is one, what happened to a followed child (and tells the
/// continuous side, if there is one).
fn show_child(view: &mut Option<Live>, continuous: &mut Option<Continuous>, event: &Event) {
    if let Some(c) = continuous {
        c.child(event);
    }
    let Some(live) = view else {
        return;
    };
    match *event {
        Event::Started(pid, command) => live.process_started(pid, command),
        Event::Record(pid, bytes) => live.process_record(pid, bytes),
        Event::Ended(pid) => live.process_ended(pid),
        // The session ends the program's own stream, then sends `Ended`.
        Event::ProgramReplaced(_) => {}
    }
}

/// The CPU time mprof itself has used (user and system), in milliseconds: what reading the
/// rings cost (`benches/workers.py` reports it).
pub fn own_cpu_ms() -> u64 {
    // SAFETY: plain data; all zeroes is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}
