//! The real consumers the view tests hand mprof's outputs to: headless Chromium, `go tool
//! pprof`, and the npm packages of `tests/js` (installed from its lockfile with `npm ci`).
//! A missing tool makes the test print `SKIPPED … (why)`; `.ci/run` installs them all, so in
//! CI (`MPROF_CI=1`) a missing one fails the test ([`super::tier::skip`]).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::run_with_timeout;
use super::tier::skip;

/// The first of `names` found on PATH (or at one of `also`).
fn find(names: &[&str], also: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .chain(also.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// Headless Chromium, or `None` after printing why the test is skipped.
pub fn chromium(test: &str) -> Option<PathBuf> {
    let found = find(&["chromium", "chromium-browser", "google-chrome"], &[]);
    if found.is_none() {
        skip(
            test,
            "no chromium on PATH (apt-get install -y chromium; .ci/run does)",
        );
    }
    found
}

/// Whether this process may make a network namespace of its own (root, or unprivileged
/// namespaces allowed): Chromium then runs with no network at all.
fn can_unshare_net() -> bool {
    Command::new("unshare")
        .args(["--net", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=…`), as root
/// needs it, with a fresh profile. `offline` runs it in a network namespace of its own (and
/// points every host name and proxy nowhere, in case namespaces are not allowed).
pub fn run_chromium(browser: &Path, url: &str, args: &[&str], offline: bool) -> Output {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = if offline && can_unshare_net() {
        let mut c = Command::new("unshare");
        c.arg("--net").arg(browser);
        c
    } else {
        Command::new(browser)
    };
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    if offline {
        cmd.args([
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ]);
    }
    cmd.args(args).arg(url);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `gdb`, or `None` after printing why the test is skipped.
pub fn gdb(test: &str) -> Option<PathBuf> {
    let found = find(&["gdb"], &[]);
    if found.is_none() {
        skip(
            test,
            "no gdb on PATH (apt-get install -y gdb; .ci/run does)",
        );
    }
    found
}

/// `go`, or `None` after printing why the test is skipped.
pub fn go(test: &str) -> Option<PathBuf> {
    let found = find(&["go"], &["/usr/local/go/bin/go"]);
    if found.is_none() {
        skip(
            test,
            "no go toolchain for `go tool pprof` (apt-get install -y golang-go; .ci/run does)",
        );
    }
    found
}

/// `tests/js`, its packages installed from the committed lockfile, or `None` after printing
/// why the test is skipped.
pub fn js_packages(test: &str) -> Option<PathBuf> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    let Some(npm) = find(&["npm"], &[]) else {
        skip(test, "no npm (apt-get install -y npm; .ci/run does)");
        return None;
    };
    if find(&["node", "nodejs"], &[]).is_none() {
        skip(test, "no node (apt-get install -y nodejs; .ci/run does)");
        return None;
    }
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let installed = dir.join("node_modules/.package-lock.json");
    let lock = dir.join("package-lock.json");
    let fresh = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if fresh(&installed).is_none() || fresh(&installed) < fresh(&lock) {
        let out = run_with_timeout(
            Command::new(npm)
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "npm ci in tests/js failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(dir)
}

/// A static file server on 127.0.0.1 for the duration of a test (speedscope fetches its
/// profile, which `file://` pages may not do). Stops when dropped, or after two minutes.
pub struct Server {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves the files under `root`.
    pub fn start(root: &Path) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (root, flag) = (root.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while !flag.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        serve_one(&root, &mut conn);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one GET request with a file under `root` (or 404), then closes the connection.
fn serve_one(root: &Path, conn: &mut std::net::TcpStream) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("/");
    let path = path.split(['?', '#']).next().unwrap_or("/");
    let rel = path.trim_start_matches('/');
    let file = root.join(if rel.is_empty() { "index.html" } else { rel });
    let inside = !rel.split('/').any(|c| c == "..");
    let response = match std::fs::read(&file) {
        Ok(body) if inside => {
            let kind = match file.extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html",
                Some("js") => "application/javascript",
                Some("css") => "text/css",
                Some("json") => "application/json",
                Some("wasm") => "application/wasm",
                Some("png") => "image/png",
                Some("woff2") => "font/woff2",
                _ => "application/octet-stream",
            };
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            r.extend_from_slice(&body);
            r
        }
        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
    };
    let _ = conn.write_all(&response);
}
