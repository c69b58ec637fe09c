//! A tmux server of a test's own, for the live view's tests: they type with `send-keys` and
//! read the screen with `capture-pane`.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a test waits for the screen or a file before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A tmux server of the test's own, killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts a detached `width`×`height` session running `command` in its one pane.
    pub fn start(command: &str, width: u16, height: u16) -> Tmux {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let socket = format!(
            "mprof-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let tmux = Tmux { socket };
        let (w, h) = (width.to_string(), height.to_string());
        tmux.run(&["new-session", "-d", "-x", &w, "-y", &h, command]);
        tmux
    }

    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-f", "/dev/null", "-L", &self.socket])
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"])
    }

    /// Types keys (tmux key names: `q`, `C-c`, `Enter`...).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Whether the pane shows the alternate screen.
    pub fn alternate_on(&self) -> bool {
        self.run(&["display-message", "-p", "#{alternate_on}"])
            .trim()
            == "1"
    }

    /// The pid of the pane's shell.
    pub fn pane_pid(&self) -> u32 {
        let text = self.run(&["display-message", "-p", "#{pane_pid}"]);
        text.trim().parse().expect("pane pid")
    }

    /// Polls the screen until `ok` holds; panics with the last screen after [`WAIT`].
    pub fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < WAIT,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}
