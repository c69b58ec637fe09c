//! Sending intervals to an OpenTelemetry Collector (OTLP over HTTP, protobuf) from a thread of
//! its own, so that a collector that is down or slow never holds the session's loop (and so
//! the agent's ring) back.
//!
//! Requests wait in a queue of at most `capacity` bytes; when a new one does not fit, the
//! oldest are dropped and counted. A request the collector does not take stays first in the
//! queue and is tried again after a pause that doubles up to [`LONGEST_PAUSE`]. At the end the
//! queue has [`Sender::close`]'s grace to empty; what is left is counted as dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest pause between two tries of a request the collector did not take.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// How long one request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the sender has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// Requests the collector took.
    pub sent: u64,
    /// Requests dropped: the queue was full, or the session ended before they went.
    pub dropped: u64,
    /// Tries that failed.
    pub failures: u64,
    /// Bytes waiting now, and the most that ever waited.
    pub queued_bytes: usize,
    pub most_queued_bytes: usize,
    /// Why the last try failed, if the last try failed.
    pub failing: Option<String>,
}

struct State {
    queue: VecDeque<Vec<u8>>,
    closing: bool,
    counts: Counts,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The sending thread and its queue.
pub struct Sender {
    shared: Arc<Shared>,
    capacity: usize,
    thread: Option<JoinHandle<()>>,
    /// The failure last said on stderr (said once until the collector takes a request again).
    said: Option<String>,
    url: String,
}

impl Sender {
    /// A sender to `url` (the full OTLP/HTTP path) whose queue holds at most `capacity` bytes.
    pub fn start(url: &str, headers: Vec<(String, String)>, capacity: usize) -> Sender {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                closing: false,
                counts: Counts::default(),
            }),
            wake: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            let url = url.to_owned();
            std::thread::Builder::new()
                .name("mprof-otlp".into())
                .spawn(move || send_loop(&shared, &url, &headers))
                .ok()
        };
        Sender {
            shared,
            capacity,
            thread,
            said: None,
            url: url.to_owned(),
        }
    }

    /// Queues one request; the oldest are dropped to make room. Never waits for the network.
    pub fn push(&mut self, request: Vec<u8>) {
        {
            let mut s = lock(&self.shared);
            let len = request.len();
            if len > self.capacity {
                s.counts.dropped += 1;
            } else {
                while s.counts.queued_bytes + len > self.capacity {
                    let Some(old) = s.queue.pop_front() else {
                        break;
                    };
                    s.counts.queued_bytes -= old.len();
                    s.counts.dropped += 1;
                }
                s.counts.queued_bytes += len;
                s.counts.most_queued_bytes = s.counts.most_queued_bytes.max(s.counts.queued_bytes);
                s.queue.push_back(request);
            }
        }
        self.shared.wake.notify_all();
        self.say_changes();
    }

    /// What the sender has done so far.
    pub fn counts(&self) -> Counts {
        lock(&self.shared).counts.clone()
    }

    /// Says on stderr when the collector starts refusing, and when it takes requests again.
    fn say_changes(&mut self) {
        let failing = lock(&self.shared).counts.failing.clone();
        match (&failing, &self.said) {
            (Some(why), None) => crate::say!(
                "mprof: warning: the collector at {} did not take a profile ({why}); profiles \
                 wait (up to {}) and are sent again",
                self.url,
                crate::base::units::human_bytes(self.capacity as f64)
            ),
            (None, Some(_)) => {
                crate::say!("mprof: the collector at {} takes profiles again", self.url)
            }
            _ => {}
        }
        self.said = failing;
    }

    /// Gives the queue up to `grace` to empty, then stops; what is left is counted as
    /// dropped. Returns the final counts.
    pub fn close(mut self, grace: Duration) -> Counts {
        let deadline = Instant::now() + grace;
        {
            let mut s = lock(&self.shared);
            s.closing = true;
            self.shared.wake.notify_all();
            while !s.queue.is_empty() && s.counts.failing.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                s = self
                    .shared
                    .wake
                    .wait_timeout(s, left.min(Duration::from_millis(50)))
                    .map(|(s, _)| s)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            let left = s.queue.len() as u64;
            s.counts.dropped += left;
            s.counts.queued_bytes = 0;
            s.queue.clear();
        }
        self.shared.wake.notify_all();
        // The thread may be inside a request (at most REQUEST_TIMEOUT): it is left to end by
        // itself rather than waited for.
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
        self.say_changes();
        self.counts()
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The thread: sends the first request waiting, again and again until it is taken.
fn send_loop(shared: &Shared, url: &str, headers: &[(String, String)]) {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(REQUEST_TIMEOUT))
        .http_status_as_error(true)
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut pause = Duration::from_millis(500);
    loop {
        let request = {
            let mut s = lock(shared);
            loop {
                if let Some(r) = s.queue.front() {
                    break r.clone();
                }
                if s.closing {
                    return;
                }
                s = shared.wake.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let mut post = agent
            .post(url)
            .header("Content-Type", "application/x-protobuf");
        for (name, value) in headers {
            post = post.header(name.as_str(), value.as_str());
        }
        let outcome = post.send(&request[..]);
        let mut s = lock(shared);
        match outcome {
            Ok(_) => {
                // Unless the queue dropped it meanwhile (it is still the first one then).
                if s.queue.front().is_some_and(|r| *r == request) {
                    s.queue.pop_front();
                    s.counts.queued_bytes -= request.len();
                }
                s.counts.sent += 1;
                s.counts.failing = None;
                pause = Duration::from_millis(500);
                shared.wake.notify_all();
            }
            Err(e) => {
                s.counts.failures += 1;
                s.counts.failing = Some(one_line(&e.to_string()));
                shared.wake.notify_all();
                if s.closing {
                    return;
                }
                // Wakes early only to close.
                let (guard, _) = shared
                    .wake
                    .wait_timeout_while(s, pause, |s| !s.closing)
                    .unwrap_or_else(|e| e.into_inner());
                if guard.closing {
                    return;
                }
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

/// An error's text on one line, cut to a reasonable length.
fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    crate::base::text::elide(line, 200).into_owned()
}
