//! `mprof record --live --follow-children` in a real terminal (tmux): the view counts the
//! processes of the tree, shows the sites of all of them, and `c` shows one at a time.

mod common;

use common::pyenv_python;
use common::tmux::{Tmux, WAIT};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The line of the table title (`by your code ... · all 2 processes ...`).
fn title(screen: &str) -> &str {
    screen
        .lines()
        .find(|l| l.contains("own bytes"))
        .unwrap_or("")
}

/// Whether the table has a row for `function`.
fn has_row(screen: &str, function: &str) -> bool {
    screen
        .lines()
        .any(|l| l.split_whitespace().any(|w| w == function))
}

#[test]
fn live_view_shows_every_process_and_one_at_a_time() {
    const TEST: &str = "live view of every process";
    let Some(py) = [11, 12, 13, 10].into_iter().find_map(pyenv_python) else {
        common::tier::skip_here(TEST, "no pyenv CPython 3.10-3.13 installed");
        return;
    };
    if Command::new("tmux").arg("-V").output().is_err() {
        common::tier::skip(
            TEST,
            "tmux is not installed (apt-get install -y tmux; .ci/run does)",
        );
        return;
    }
    let dir = common::tempdir();
    let path = |name: &str| dir.path().join(name);
    let q = |p: &Path| format!("'{}'", p.display());
    let (stop, status) = (path("stop"), path("status"));
    let command = format!(
        "{} record --live --follow-children --rate 16KiB -o {} -- {} {} {}; echo $? > {}; \
         sleep 600",
        q(Path::new(env!("CARGO_BIN_EXE_mprof"))),
        q(&path("c.mprof")),
        q(&py),
        q(&common::script("live_tree.py")),
        q(&stop),
        q(&status),
    );
    let tmux = Tmux::start(&command, 110, 30);
    // The key's hint is on the last line, drawn after the table's rows: a screen caught
    // while the view redraws can have the rows and not yet the hint.
    tmux.wait_for("both processes' sites, and the key's hint", |s| {
        title(s).contains("all 2 processes")
            && has_row(s, "in_program")
            && has_row(s, "in_worker")
            && s.contains("c process")
    });
    tmux.keys(&["c"]);
    let program = tmux.wait_for("the program alone", |s| {
        title(s).contains("PID ") && has_row(s, "in_program")
    });
    assert!(!has_row(&program, "in_worker"), "{program}");
    tmux.keys(&["c"]);
    let worker = tmux.wait_for("the worker alone", |s| {
        title(s).contains("PID ") && has_row(s, "in_worker") && !has_row(s, "in_program")
    });
    assert_ne!(title(&program), title(&worker));
    tmux.keys(&["c"]);
    tmux.wait_for("all processes again", |s| {
        title(s).contains("all 2 processes")
    });
    std::fs::write(&stop, "").unwrap();
    let start = Instant::now();
    let code = loop {
        if let Ok(text) = std::fs::read_to_string(&status) {
            if text.ends_with('\n') {
                break text.trim().to_owned();
            }
        }
        assert!(
            start.elapsed() < WAIT,
            "mprof did not exit:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, "0", "{}", tmux.screen());
    assert!(!tmux.alternate_on(), "the terminal is restored");
}
