//! `mprof record --live` in a real terminal: tmux runs it on a real workload, the tests type
//! with `send-keys` and read the screen with `capture-pane`.
//!
//! Each test has its own tmux server (`tmux -L mprof-test-PID-N`), killed when the test ends.
//! The pane runs `mprof ...; echo $? > status; stty -a > stty; sleep`, so a test can read
//! mprof's exit status and the terminal modes it left behind. Killing the server is a
//! terminal hang-up, which one test does on purpose.

mod common;

use common::tmux::{Tmux, WAIT};
use common::{by_function, mprof, pyenv_python, report_json, script};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// hot_function's bytes in tests/py/live_workload.py: 2000 blocks of 100,000 bytes.
const HOT_BYTES: f64 = 200e6;
const MIB: f64 = 1024.0 * 1024.0;

/// The files of one run: capture, stop file for the workload, exit status, `stty -a` output.
struct Run {
    _dir: tempfile::TempDir,
    capture: PathBuf,
    stop: PathBuf,
    status: PathBuf,
    stty: PathBuf,
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        Run {
            capture: path("c.mprof"),
            stop: path("stop"),
            status: path("status"),
            stty: path("stty"),
            _dir: dir,
        }
    }

    /// The pane's command: mprof on the workload, then the checks of what it left behind.
    fn command(&self, python: &Path) -> String {
        self.command_with(python, "")
    }

    /// [`Run::command`] with `redirect` after mprof's arguments (e.g. `2> FILE`).
    fn command_with(&self, python: &Path, redirect: &str) -> String {
        let q = |p: &Path| format!("'{}'", p.display());
        format!(
            "{} record --live -o {} -- {} {} {} 60 {redirect}; echo $? > {}; stty -a > {}; \
             sleep 600",
            q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
            q(&self.capture),
            q(python),
            q(&script("live_workload.py")),
            q(&self.stop),
            q(&self.status),
            q(&self.stty),
        )
    }

    fn program_output(&self) -> String {
        let mut name = self.capture.clone().into_os_string();
        name.push(".out");
        std::fs::read_to_string(name).unwrap_or_default()
    }

    /// mprof's exit status, once the pane's shell has written it.
    fn wait_status(&self, tmux: &Tmux) -> i32 {
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.status) {
                if text.ends_with('\n') {
                    return text.trim().parse().expect("a status");
                }
            }
            assert!(
                start.elapsed() < WAIT,
                "mprof did not exit; the screen:\n{}",
                tmux.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The terminal is back to normal: cooked mode with echo, main screen.
    fn assert_terminal_restored(&self, tmux: &Tmux) {
        let start = Instant::now();
        while !self.stty.exists() && start.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        let stty = std::fs::read_to_string(&self.stty).expect("stty -a ran");
        let modes: Vec<&str> = stty.split([' ', '\n', ';']).collect();
        for mode in ["icanon", "echo", "isig", "icrnl"] {
            assert!(modes.contains(&mode), "{mode} is off after mprof:\n{stty}");
        }
        assert!(!tmux.alternate_on(), "the alternate screen is still on");
    }
}

/// The pid of the mprof that the pane's shell runs.
fn mprof_pid(tmux: &Tmux) -> u32 {
    let shell = tmux.pane_pid();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
        .expect("the pane's shell has children");
    let pid: u32 = children
        .split_whitespace()
        .next()
        .expect("mprof runs under the pane's shell")
        .parse()
        .unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(cmdline.contains("--live"), "{cmdline}");
    pid
}

/// An interpreter to run the workload with (3.11 preferred), or `None` with a SKIPPED line.
fn python() -> Option<PathBuf> {
    let found = [11, 12, 10, 13, 9, 8].into_iter().find_map(pyenv_python);
    if found.is_none() {
        common::tier::skip_here("live view tests", "no pyenv CPython 3.8-3.13 installed");
    }
    found
}

/// What a tmux test needs: an interpreter and tmux; `None` (with a SKIPPED line) without them.
fn prerequisites() -> Option<PathBuf> {
    let py = python()?;
    have_tmux().then_some(py)
}

/// tmux, or a SKIPPED line.
fn have_tmux() -> bool {
    let ok = Command::new("tmux").arg("-V").output().is_ok();
    if !ok {
        common::tier::skip(
            "live view tests",
            "tmux is not installed (apt-get install -y tmux; .ci/run does)",
        );
    }
    ok
}

/// The table row whose FUNCTION is `function`, split in words.
fn row<'a>(screen: &'a str, function: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|words| words.len() >= 9 && words[7] == function)
}

/// The first table row (after the heading) split in words.
fn first_row(screen: &str) -> Vec<&str> {
    let mut lines = screen.lines().skip_while(|l| !l.contains("ALLOC/s"));
    lines.next();
    lines.next().unwrap_or("").split_whitespace().collect()
}

/// The `up H:MM:SS` of the header.
fn uptime(screen: &str) -> String {
    let at = screen.find(" up ").expect("the header shows the time up");
    screen[at..].split_whitespace().nth(1).unwrap().to_owned()
}

/// `194 MiB` → bytes.
fn bytes(value: &str, unit: &str) -> f64 {
    let v: f64 = value.parse().unwrap_or(f64::NAN);
    v * match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB,
        "GiB" => MIB * 1024.0,
        _ => f64::NAN,
    }
}

/// (allocated, live) bytes of a table row: `RATE UNIT ALLOCATED UNIT LIVE UNIT SAMPLES ...`.
fn figures(words: &[&str]) -> (f64, f64) {
    (bytes(words[2], words[3]), bytes(words[4], words[5]))
}

/// The line in the workload whose text contains `needle`, 1-based.
fn workload_line(needle: &str) -> usize {
    let text = std::fs::read_to_string(script("live_workload.py")).unwrap();
    1 + text.lines().position(|l| l.contains(needle)).expect(needle)
}

/// Waits until the view shows hot_function with all its bytes (the workload has allocated
/// them and a refresh has shown them) and returns that screen.
fn wait_for_the_workload(tmux: &Tmux) -> String {
    tmux.wait_for("hot_function with ~200 MB allocated", |s| {
        row(s, "hot_function").is_some_and(|w| figures(&w).0 > 0.9 * HOT_BYTES)
    })
}

#[test]
fn view_shows_the_workload_keys_reorder_it_and_q_leaves_it_recording() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let tmux = Tmux::start(&run.command(&py), 100, 30);
    let screen = wait_for_the_workload(&tmux);
    let hot = figures(&row(&screen, "hot_function").unwrap());
    assert!(
        hot.0 < 1.1 * HOT_BYTES,
        "hot_function shows {} bytes; it allocated {HOT_BYTES}:\n{screen}",
        hot.0
    );
    assert!(screen.contains("Python 3."), "{screen}");
    assert!(
        screen.contains("rate 128.00 KiB"),
        "the default rate: {screen}"
    );
    assert!(screen.contains("by your code (← innermost)"), "{screen}");

    // Sorting: by allocated bytes hot_function leads, by live bytes keeper_function does.
    tmux.keys(&["2"]);
    let by_allocated = tmux.wait_for("hot_function first by ALLOCATED", |s| {
        s.contains("▼ALLOCATED") && first_row(s).get(7) == Some(&"hot_function")
    });
    tmux.keys(&["3"]);
    let screen = tmux.wait_for("keeper_function first by LIVE", |s| {
        s.contains("▼LIVE") && first_row(s).get(7) == Some(&"keeper_function")
    });
    let keeper = figures(&row(&screen, "keeper_function").unwrap());
    assert!(
        (keeper.1 - 30e6).abs() < 0.15 * 30e6,
        "keeper_function keeps 30 MB live, the view says {}:\n{screen}",
        keeper.1
    );

    // Grouping: by your code (the default: the workload's own frames allocate) and by line
    // hot_function sits at its allocation, by function at its `def`, by file the workload is
    // one row.
    let alloc_line = format!("live_workload.py:{}", workload_line("block = bytearray"));
    let def_line = format!("live_workload.py:{}", workload_line("def hot_function"));
    assert!(first_row(&by_allocated)[8].ends_with(&alloc_line));
    tmux.keys(&["2", "g"]);
    tmux.wait_for("hot_function at its allocation, by line", |s| {
        s.contains("by line") && row(s, "hot_function").is_some_and(|w| w[8].ends_with(&alloc_line))
    });
    tmux.keys(&["g"]);
    tmux.wait_for("hot_function at its def, by function", |s| {
        s.contains("by function")
            && row(s, "hot_function").is_some_and(|w| w[8].ends_with(&def_line))
    });
    tmux.keys(&["g"]);
    tmux.wait_for("the workload file as a row, by file", |s| {
        s.contains("by file")
            && s.lines()
                .any(|l| l.ends_with("live_workload.py") && l.split_whitespace().count() == 8)
    });
    tmux.keys(&["g", "g", "t", "2"]);
    let screen = tmux.wait_for("<module> first with total bytes", |s| {
        s.contains("by line · total bytes") && first_row(s).get(7) == Some(&"<module>")
    });
    let module = figures(&first_row(&screen));
    assert!(
        module.0 >= hot.0,
        "<module> includes hot_function:\n{screen}"
    );

    // p freezes the display (the clock too) and unfreezes it.
    tmux.keys(&["p"]);
    let frozen = tmux.wait_for("PAUSED", |s| s.contains("PAUSED"));
    std::thread::sleep(Duration::from_millis(2200));
    assert_eq!(
        uptime(&tmux.screen()),
        uptime(&frozen),
        "the paused clock moved"
    );
    tmux.keys(&["p"]);
    tmux.wait_for("the clock to move again", |s| {
        !s.contains("PAUSED") && uptime(s) != uptime(&frozen)
    });

    // q: the view closes, the program runs on and mprof records until it ends.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("the main screen back", |s| {
        s.contains("live view closed; recording")
    });
    assert!(!tmux.alternate_on(), "{screen}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!run.status.exists(), "mprof ended with the view:\n{screen}");
    assert!(!run.program_output().contains("workload done"));
    std::fs::write(&run.stop, b"").unwrap();
    assert_eq!(run.wait_status(&tmux), 0, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
    let out = run.program_output();
    assert!(
        out.contains("workload allocated") && out.contains("workload done"),
        "{out}"
    );
    let screen = tmux.screen();
    assert!(screen.contains("the program's output is in"), "{screen}");
    let functions = by_function(&report_json(&run.capture, &["--by", "function"]));
    let recorded = functions["hot_function"]["alloc_bytes"].as_f64().unwrap();
    assert!(
        (recorded - HOT_BYTES).abs() < 0.1 * HOT_BYTES,
        "the capture has {recorded} bytes for hot_function"
    );
}

/// Esc on the help overlay closes the overlay alone: the view stays up and the recording goes
/// on; Esc on the view closes the view, as `q` does.
#[test]
fn esc_on_the_help_closes_only_the_help() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let tmux = Tmux::start(&run.command(&py), 80, 24);
    tmux.wait_for("the view", |s| s.contains("ALLOC/s"));
    tmux.keys(&["?"]);
    tmux.wait_for("the help", |s| s.contains("mprof live view: keys"));
    tmux.keys(&["Escape"]);
    let screen = tmux.wait_for("the help closed", |s| {
        !s.contains("mprof live view: keys") && s.contains("ALLOC/s")
    });
    assert!(tmux.alternate_on(), "{screen}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!run.status.exists(), "mprof ended:\n{}", tmux.screen());
    assert!(tmux.screen().contains("ALLOC/s"), "{}", tmux.screen());
    tmux.keys(&["Escape"]);
    let screen = tmux.wait_for("the main screen back", |s| {
        s.contains("live view closed; recording")
    });
    assert!(!tmux.alternate_on(), "{screen}");
    std::fs::write(&run.stop, b"").unwrap();
    assert_eq!(run.wait_status(&tmux), 0, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
}

#[test]
fn ctrl_c_closes_the_view_interrupts_the_program_and_restores_the_terminal() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let tmux = Tmux::start(&run.command(&py), 80, 24);
    wait_for_the_workload(&tmux);
    assert!(tmux.alternate_on());
    tmux.keys(&["C-c"]);
    // Python dies of the SIGINT it re-raises after an unhandled KeyboardInterrupt: 128 + 2.
    assert_eq!(run.wait_status(&tmux), 130, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
    assert!(tmux.screen().contains("interrupting"), "{}", tmux.screen());
    assert!(run.program_output().contains("KeyboardInterrupt"));
}

#[test]
fn sigterm_to_mprof_restores_the_terminal() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let tmux = Tmux::start(&run.command(&py), 80, 24);
    wait_for_the_workload(&tmux);
    common::procs::signal(mprof_pid(&tmux), 15);
    // mprof passes SIGTERM on to the program and returns its status: 128 + 15.
    assert_eq!(run.wait_status(&tmux), 143, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
    assert!(
        tmux.screen().contains("closed by signal 15"),
        "{}",
        tmux.screen()
    );
}

#[test]
fn a_terminal_hang_up_closes_the_view_and_the_recording_goes_on() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let stderr = run.capture.with_extension("err");
    let redirect = format!("2> '{}'", stderr.display());
    let tmux = Tmux::start(&run.command_with(&py, &redirect), 80, 24);
    wait_for_the_workload(&tmux);
    let pid = mprof_pid(&tmux);
    // Killing the server closes the pane's terminal: a hang-up for everything in it (the
    // program dies of its SIGHUP; mprof must notice, not spin, and finish the capture).
    drop(tmux);
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.contains(") Z "))
    {
        assert!(start.elapsed() < WAIT, "mprof still runs after the hang-up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        err.contains("the live view stopped (the terminal hung up)"),
        "{err}"
    );
    assert!(err.contains("capture written to"), "{err}");
    let functions = by_function(&report_json(&run.capture, &["--by", "function"]));
    let recorded = functions["hot_function"]["alloc_bytes"].as_f64().unwrap();
    assert!((recorded - HOT_BYTES).abs() < 0.1 * HOT_BYTES, "{recorded}");
}

/// `record --live --native`: the C functions of the test's extension (`tests/c/native_chain.c`,
/// built `-g -O1`) are rows of their own when the view groups by function, with their source
/// file; the program ends normally and the capture has them too.
#[test]
fn live_view_groups_native_frames_by_function() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let dir = run._dir.path();
    let python = common::Python {
        label: "live".into(),
        path: py.clone(),
    };
    let Some(_so) = common::native::build_chain(&python, dir, &["-g", "-O1"]) else {
        return;
    };
    std::fs::write(dir.join("go"), b"").unwrap();
    let q = |p: &Path| format!("'{}'", p.display());
    let command = format!(
        "{} record --live --native --rate 1 -o {} -- {} {} {} wait; echo $? > {}; \
         stty -a > {}; sleep 600",
        q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
        q(&run.capture),
        q(&py),
        q(&script("native_chain_workload.py")),
        q(dir),
        q(&run.status),
        q(&run.stty),
    );
    let tmux = Tmux::start(&command, 110, 30);
    tmux.wait_for("the view", |s| s.contains("ALLOC/s"));
    tmux.keys(&["g", "g"]);
    let screen = tmux.wait_for("chain_level2 as a row by function", |s| {
        s.contains("by function") && row(s, "chain_level2").is_some()
    });
    let level2 = row(&screen, "chain_level2").unwrap();
    assert!(
        level2[8].ends_with("native_chain.c"),
        "a C function's row shows its source file:\n{screen}"
    );
    assert!(figures(&level2).0 > 0.0, "{screen}");
    std::fs::write(dir.join("finish"), b"").unwrap();
    assert_eq!(run.wait_status(&tmux), 0, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
    let functions = by_function(&report_json(&run.capture, &["--by", "function"]));
    assert!(functions.contains_key("chain_level2"), "{functions:?}");
}

#[test]
fn live_without_a_terminal_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = mprof()
        .args(["record", "--live", "-o"])
        .arg(dir.path().join("c.mprof"))
        .args(["--", "python3", "-c", "pass"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--live needs a terminal"), "{stderr}");
    assert!(!dir.path().join("c.mprof").exists());
}

/// `attach --live`: the view shows the running target's allocation site, `q` detaches cleanly
/// (exit 0, no ring left in the target, terminal restored), and the target carries on to a
/// normal exit.
#[test]
fn attach_live_shows_the_target_and_q_detaches() {
    let Some(py) = prerequisites() else { return };
    let run = Run::new();
    let mut target = common::ChildGuard(
        Command::new(&py)
            .arg(script("live_attach_target.py"))
            .arg(&run.stop)
            .arg("60")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(target.0.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "target ready");
    let pid = target.0.id();
    let q = |p: &Path| format!("'{}'", p.display());
    let command = format!(
        "{} attach --live --pid {pid} -o {}; echo $? > {}; stty -a > {}; sleep 600",
        q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
        q(&run.capture),
        q(&run.status),
        q(&run.stty),
    );
    let tmux = Tmux::start(&command, 100, 30);
    let screen = tmux.wait_for("attached_loop on screen", |s| {
        row(s, "attached_loop").is_some_and(|w| figures(&w).0 > 0.0)
    });
    assert!(screen.contains("mprof attach"), "{screen}");
    assert!(screen.contains("q detach"), "{screen}");
    tmux.keys(&["q"]);
    assert_eq!(run.wait_status(&tmux), 0, "{}", tmux.screen());
    run.assert_terminal_restored(&tmux);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("mprof-ring"), "the ring is still mapped");
    std::fs::write(&run.stop, b"").unwrap();
    let status = target.0.wait().unwrap();
    assert!(status.success(), "the target ended with {status}");
}

/// A terminal that never answers the view's questions (`script` with its output thrown away
/// answers no cursor-position query): the view cannot start, and the program, running already,
/// is recorded on without it rather than killed. Its output is in CAPTURE.out, mprof says why
/// there is no view, and mprof exits with the program's status.
#[test]
fn a_live_view_that_cannot_start_leaves_the_program_recorded() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("c.mprof");
    let program = "import sys; print('hello from the program'); \
                   kept = [bytes(1000) for _ in range(10000)]; sys.exit(3)";
    let cmd = format!(
        "{} record --live -o {} -- {} -c \"{program}\"",
        env!("CARGO_BIN_EXE_mprof"),
        capture.display(),
        py.display()
    );
    let out = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            common::tier::skip(
                "a terminal that cannot host the view",
                &format!("no `script` ({e}; apt-get install -y bsdutils; .ci/run does)"),
            );
            return;
        }
    };
    let all = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(
        all.contains("no live view") && all.contains("recording goes on"),
        "{all}"
    );
    let output = std::fs::read_to_string(dir.path().join("c.mprof.out")).unwrap();
    assert!(output.contains("hello from the program"), "{output}");
    let report = report_json(&capture, &[]);
    assert!(report["samples"].as_u64().unwrap() > 100, "{report}");
}

/// (function, line) of a location's text: `dump_a (…/views_agree.py:21)`, with anything after.
fn function_line(location: &str) -> (String, u32) {
    let function = location
        .split(" (")
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let line = location
        .split(')')
        .next()
        .and_then(|l| l.rsplit(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (function, line)
}

/// The first three rows of a `report --json` (by your code) in `view`.
fn report_top3(capture: &Path, view: &str) -> Vec<(String, u32)> {
    let report = report_json(capture, &["--view", view, "--top", "3"]);
    report["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let function = l["function"].as_str().unwrap().to_owned();
            (function, l["line"].as_u64().unwrap() as u32)
        })
        .collect()
}

/// What `mprof COMMAND CAPTURE -o OUT` wrote.
fn written_by(command: &str, capture: &Path, out: &Path) -> String {
    let done = mprof()
        .arg(command)
        .arg(capture)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{command}: {err}");
    std::fs::read_to_string(out).unwrap()
}

/// The timeline's legend entries for sites (after `other sites`), first three.
fn timeline_top3(capture: &Path, dir: &Path) -> Vec<(String, u32)> {
    let text = written_by("timeline", capture, &dir.join("t.svg"));
    text.lines()
        .map(str::trim)
        .skip_while(|l| *l != "other sites")
        .skip(1)
        .filter(|l| !l.starts_with('<') && !l.is_empty())
        .take(3)
        .map(function_line)
        .collect()
}

/// The HTML report's top-sites table: its first three rows (they come in the order of the
/// allocated view).
fn html_top3(capture: &Path, dir: &Path) -> Vec<(String, u32)> {
    let text = written_by("html", capture, &dir.join("r.html"));
    let start = text.find("id=\"sites-data\">").expect("the sites' data") + 16;
    let end = start + text[start..].find("</script>").unwrap();
    let rows: serde_json::Value = serde_json::from_str(&text[start..end]).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .take(3)
        .map(|r| function_line(r["location"].as_str().unwrap()))
        .collect()
}

/// One capture, four views grouped the same way by default (by your code): the live view
/// while it records (sorted by live bytes), the timeline's legend (by bytes at the peak), the
/// HTML report's top-sites table (by allocated bytes) name the same top rows as `report`
/// does in that view: the three lines of the workload that reach one line of json's encoder
/// (which grouping by line would name instead). On every interpreter present.
#[test]
fn every_view_names_the_same_top_rows_as_report() {
    if !have_tmux() {
        return;
    }
    let source = std::fs::read_to_string(script("views_agree.py")).unwrap();
    let line = |f: &str| {
        1 + source
            .lines()
            .position(|l| l.contains(&format!("# LINE {f}")))
            .unwrap() as u32
    };
    let want: Vec<(String, u32)> = ["dump_a", "dump_b", "dump_c"]
        .iter()
        .map(|f| (f.to_string(), line(f)))
        .collect();
    for py in common::pythons() {
        let run = Run::new();
        let q = |p: &Path| format!("'{}'", p.display());
        let command = format!(
            "{} record --live -o {} -- {} {} {}; echo $? > {}; sleep 600",
            q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
            q(&run.capture),
            q(&py.path),
            q(&script("views_agree.py")),
            q(&run.stop),
            q(&run.status),
        );
        let tmux = Tmux::start(&command, 140, 30);
        let live_top3 = |s: &str| -> Vec<(String, u32)> {
            let mut lines = s.lines().skip_while(|l| !l.contains("ALLOC/s"));
            lines.next();
            lines
                .take(3)
                .map(|l| {
                    // RATE UNIT ALLOCATED UNIT LIVE UNIT SAMPLES FUNCTION FILE:LINE [← …]
                    let words: Vec<&str> = l.split_whitespace().collect();
                    let at = |i: usize| words.get(i).copied().unwrap_or_default();
                    let line = at(8).rsplit(':').next().and_then(|n| n.parse().ok());
                    (at(7).to_owned(), line.unwrap_or(0))
                })
                .collect()
        };
        tmux.wait_for("the live view", |s| s.contains("ALLOC/s"));
        tmux.keys(&["3"]);
        let screen = tmux.wait_for("the workload's three lines by live bytes", |s| {
            s.contains("▼LIVE") && live_top3(s) == want
        });
        assert!(screen.contains("by your code"), "{}: {screen}", py.label);
        std::fs::write(&run.stop, "").unwrap();
        assert_eq!(run.wait_status(&tmux), 0, "{}", py.label);
        let dir = run.capture.parent().unwrap();
        for view in ["allocated", "live", "peak"] {
            assert_eq!(
                report_top3(&run.capture, view),
                want,
                "{}: report --view {view}",
                py.label
            );
        }
        assert_eq!(
            timeline_top3(&run.capture, dir),
            want,
            "{}: timeline",
            py.label
        );
        assert_eq!(html_top3(&run.capture, dir), want, "{}: html", py.label);
    }
}

/// The `RSS − heap` line of the live view on rss_kept.py's MODE (`serve`: it runs on), once
/// it contains `needle`.
fn rss_line(py: &Path, mode: &str, options: &str, needle: &str) -> String {
    let run = Run::new();
    let q = |p: &Path| format!("'{}'", p.display());
    let command = format!(
        "{} record --live {options} -o {} -- {} {} {} {mode} serve; sleep 600",
        q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
        q(&run.capture),
        q(py),
        q(&script("rss_kept.py")),
        q(run.capture.parent().unwrap()),
    );
    let tmux = Tmux::start(&command, 140, 30);
    let screen = tmux.wait_for(&format!("the RSS − heap line says {needle:?}"), |s| {
        s.lines()
            .any(|l| l.contains("RSS − heap") && l.contains(needle))
    });
    screen
        .lines()
        .find(|l| l.contains(needle))
        .unwrap()
        .to_owned()
}

/// The bytes printed after `needle` on `line` (`190 MiB`).
fn bytes_after(line: &str, needle: &str) -> f64 {
    let after = line.split(needle).nth(1).unwrap();
    let mut words = after.split_whitespace();
    bytes(words.next().unwrap(), words.next().unwrap())
}

/// Where the RSS is, in the live view: after a burst of 5 KB strings freed under one live
/// string (tests/py/rss_kept.py), the `RSS − heap` line names glibc's free memory as what
/// keeps the RSS, as `mprof report` does.
#[test]
fn the_live_view_says_what_keeps_the_rss() {
    let Some(py) = prerequisites() else {
        return;
    };
    let line = rss_line(&py, "malloc", "", "kept: malloc free ");
    assert!(
        bytes_after(&line, "kept: malloc free ") > 150.0 * MIB,
        "{line}"
    );
}

/// A reservation in the live view: 1 GiB mapped, 16 MiB touched (rss_kept.py's `reserve`,
/// sampled with `--native`): the live heap is above the RSS, and the `RSS − heap` line says
/// the sampled mappings' reserved bytes, so that it never shows a heap above RSS unexplained.
#[test]
fn the_live_view_says_a_reservation() {
    let Some(py) = prerequisites() else {
        return;
    };
    let line = rss_line(&py, "reserve", "--native", "reserved ");
    assert!(bytes_after(&line, "reserved ") > 900.0 * MIB, "{line}");
}
