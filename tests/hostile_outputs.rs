//! Hostile outputs (issue 7, points 3 and 5): symlinks planted by `nobody` at every name mprof
//! writes, the modes of what it writes, and a failed attach that must not touch the capture of
//! the session that won.

mod common;

use common::hostile::*;
use common::{mprof, pythons, run_with_timeout, ChildGuard};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A directory owned by `nobody`, as a user's own directory would be.
fn nobodys_dir() -> tempfile::TempDir {
    let dir = common::tempdir();
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A symlink at `link` to `target`, owned by `nobody` as if nobody had planted it.
fn plant(link: &Path, target: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
    std::os::unix::fs::lchown(link, Some(NOBODY), Some(NOBODY)).unwrap();
}

/// What is in `dir`, by name, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn refused(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!clean_exit(out, what), "{what}: not refused: {err}");
    assert!(
        err.contains("refusing to write") && err.contains("owned by uid 65534"),
        "{what}: {err}"
    );
}

/// Symlinks planted by `nobody` at every kind of output name (the capture, `CAPTURE.out`, the
/// children's capture directory `CAPTURE.d`, flamegraph, timeline, HTML report, exports) are
/// refused (root's files are not written through them), nothing is left behind, and a
/// symlink of the user's own is followed with a note. Captures, `CAPTURE.out` and the
/// children's captures are private (0600, `CAPTURE.d` 0700) even under umask 0.
#[test]
fn planted_symlinks_at_output_names_are_refused() {
    if !common::tier::root("planted symlinks", "files planted by nobody") {
        return;
    }
    let sentinel = Sentinel::new();
    let py = main_python(&pythons());
    let dir = nobodys_dir();
    let d = dir.path();
    let program = [
        "--",
        py.path.to_str().unwrap(),
        "-c",
        "x = bytearray(10**6)",
    ];

    plant(&d.join("c.mprof"), &sentinel.path);
    let out = run_with_timeout(
        mprof()
            .args(["record", "-o"])
            .arg(d.join("c.mprof"))
            .args(program),
        LIMIT,
    );
    refused(&out, "record -o symlink");
    assert_eq!(names(d), ["c.mprof"]);

    // A real capture to draw from.
    let capture = d.join("real.mprof");
    let out = run_with_timeout(
        mprof()
            .args(["record", "--rate", "1", "-o"])
            .arg(&capture)
            .args(program),
        LIMIT,
    );
    assert!(clean_exit(&out, "record"));
    assert_eq!(std::fs::metadata(&capture).unwrap().mode() & 0o777, 0o600);

    plant(&d.join("f.svg"), &sentinel.path);
    let out = run_with_timeout(
        mprof()
            .arg("flamegraph")
            .arg(&capture)
            .arg("-o")
            .arg(d.join("f.svg")),
        LIMIT,
    );
    refused(&out, "flamegraph -o symlink");

    // Every other kind of file mprof writes from a capture.
    for (name, view) in [
        ("t.svg", &["timeline"][..]),
        ("r.html", &["html"][..]),
        ("e.pb.gz", &["export"][..]),
        ("e.json", &["export", "-f", "json"][..]),
        ("e.speedscope.json", &["export", "-f", "speedscope"][..]),
    ] {
        plant(&d.join(name), &sentinel.path);
        let out = run_with_timeout(
            mprof().args(view).arg(&capture).arg("-o").arg(d.join(name)),
            LIMIT,
        );
        refused(&out, &format!("{} -o symlink", view.join(" ")));
    }

    // The children's capture directory (record --follow-children): nobody's symlink there, to
    // a directory of root's holding a capture (which a reused directory loses), and nobody's
    // own directory there, are refused before the program starts.
    let roots = common::tempdir();
    std::fs::write(roots.path().join("precious.mprof"), b"root's capture").unwrap();
    let witness = common::tempdir();
    let ran = witness.path().join("ran");
    let touch = format!("import pathlib; pathlib.Path({:?}).touch()", ran);
    plant(&d.join("k.mprof.d"), roots.path());
    std::fs::create_dir(d.join("n.mprof.d")).unwrap();
    std::os::unix::fs::chown(d.join("n.mprof.d"), Some(NOBODY), Some(NOBODY)).unwrap();
    for (name, says) in [
        ("k.mprof", "owned by uid 65534"),
        ("n.mprof", "it belongs to uid 65534"),
    ] {
        let out = run_with_timeout(
            mprof()
                .args(["record", "--follow-children", "-o"])
                .arg(d.join(name))
                .args(["--", py.path.to_str().unwrap(), "-c", &touch]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!clean_exit(&out, name), "{name}: not refused: {err}");
        assert!(
            err.contains("children's capture directory") && err.contains(says),
            "{name}: {err}"
        );
        assert!(
            !ran.exists(),
            "{name}: the program ran though mprof refused"
        );
    }
    assert_eq!(names(roots.path()), ["precious.mprof"]);
    assert_eq!(
        std::fs::read(roots.path().join("precious.mprof")).unwrap(),
        b"root's capture"
    );
    assert_eq!(
        std::fs::metadata(d.join("n.mprof.d")).unwrap().uid(),
        NOBODY
    );

    // record --live needs a terminal: `script` gives it one. The program's output file is
    // the planted one; the capture is free.
    plant(&d.join("l.mprof.out"), &sentinel.path);
    let live = format!(
        "{} record --live -o {} {}",
        env!("CARGO_BIN_EXE_mprof"),
        d.join("l.mprof").display(),
        program
            .join(" ")
            .replace("x = bytearray(10**6)", "'x = bytearray(10**6)'")
    );
    let out = run_with_timeout(
        Command::new("script").args(["-qec", &live, "/dev/null"]),
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refusing to write") && text.contains("l.mprof.out"),
        "record --live with a planted CAPTURE.out: {text}"
    );
    assert!(
        !d.join("l.mprof").exists(),
        "the failed run left its capture"
    );
    assert_eq!(
        names(d),
        [
            "c.mprof",
            "e.json",
            "e.pb.gz",
            "e.speedscope.json",
            "f.svg",
            "k.mprof.d",
            "l.mprof.out",
            "n.mprof.d",
            "r.html",
            "real.mprof",
            "t.svg"
        ]
    );
    sentinel.check();

    // What mprof does write is private whatever the umask: the capture, `CAPTURE.out` (the
    // live view answered through `script`: a cursor-position reply typed ahead), and with
    // --follow-children, `CAPTURE.d` and the children's captures in it.
    let umask0 = |cmd: &mut Command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls umask,
        // which allocates nothing, takes no lock and is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            })
        };
    };
    let live = format!(
        "{} record --live -o {} -- {} -c 'print(\"to CAPTURE.out\")'",
        env!("CARGO_BIN_EXE_mprof"),
        d.join("lv.mprof").display(),
        py.path.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "printf '\\033[1;1R' | script -qec \"$0\" /dev/null",
        &live,
    ]);
    umask0(&mut cmd);
    let out = run_with_timeout(&mut cmd, LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("capture written"), "record --live: {text}");
    assert_eq!(
        std::fs::read_to_string(d.join("lv.mprof.out")).unwrap(),
        "to CAPTURE.out\n"
    );
    let spawn = "import subprocess, sys; \
                 subprocess.run([sys.executable, '-c', 'x = bytearray(10**6)'], check=True)";
    let mut cmd = mprof();
    cmd.args(["record", "-q", "--follow-children", "-o"])
        .arg(d.join("f.mprof"))
        .args(["--", py.path.to_str().unwrap(), "-c", spawn]);
    umask0(&mut cmd);
    assert!(clean_exit(
        &run_with_timeout(&mut cmd, LIMIT),
        "--follow-children"
    ));
    let children: Vec<PathBuf> = std::fs::read_dir(d.join("f.mprof.d"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!children.is_empty(), "no child capture");
    for (path, mode) in [
        (d.join("lv.mprof"), 0o600),
        (d.join("lv.mprof.out"), 0o600),
        (d.join("f.mprof"), 0o600),
        (d.join("f.mprof.d"), 0o700),
    ]
    .into_iter()
    .chain(children.into_iter().map(|c| (c, 0o600)))
    {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            (meta.mode() & 0o777, meta.uid()),
            (mode, 0),
            "{} under umask 0",
            path.display()
        );
    }

    // The user's own symlink (root's, here) is followed, and said so.
    let mine = common::tempdir();
    std::os::unix::fs::symlink(mine.path().join("real.svg"), d.join("mine.svg")).unwrap();
    std::os::unix::fs::lchown(d.join("mine.svg"), Some(0), Some(0)).unwrap();
    let out = run_with_timeout(
        mprof()
            .arg("flamegraph")
            .arg(&capture)
            .arg("-o")
            .arg(d.join("mine.svg")),
        LIMIT,
    );
    assert!(clean_exit(&out, "own symlink"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is your symlink"));
    assert!(std::fs::read_to_string(mine.path().join("real.svg"))
        .unwrap()
        .starts_with("<?xml"));
}

/// Two attaches to one process with the same `-o`: the second cannot attach, and it leaves
/// the first one's capture alone (it used to delete it).
#[test]
fn a_failed_attach_keeps_the_other_sessions_capture() {
    let py = main_python(&pythons());
    let dir = common::tempdir();
    let capture = dir.path().join("c.mprof");
    let loop_ = "import os, time\nprint('ready', os.getpid(), flush=True)\n\
                 while True:\n    x = [bytearray(1000) for _ in range(1000)]\n    time.sleep(0.01)";
    let mut target = Command::new(&py.path)
        .args(["-c", loop_])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let _target = ChildGuard(target);
    let pid: u32 = lines.next().unwrap().unwrap()["ready ".len()..]
        .parse()
        .unwrap();
    let mut winner = mprof()
        .args(["attach", "--pid", &pid.to_string(), "--duration", "5", "-o"])
        .arg(&capture)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(winner.stderr.take().unwrap()).lines();
    let mut winner = ChildGuard(winner);
    let attached = err
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("attached"));
    assert!(attached.is_some(), "the first attach did not attach");
    let loser = run_with_timeout(
        mprof()
            .args(["attach", "--pid", &pid.to_string(), "--duration", "1", "-o"])
            .arg(&capture),
        LIMIT,
    );
    assert!(
        !clean_exit(&loser, "second attach"),
        "the second attach attached"
    );
    let status = winner.0.wait().unwrap();
    let rest: Vec<String> = err.map_while(Result::ok).collect();
    assert!(status.success(), "{rest:?}");
    assert_eq!(names(dir.path()), ["c.mprof"]);
    let json = common::report_json(&capture, &[]);
    assert!(json["samples"].as_u64().unwrap() > 0, "{json}");
}

/// Issue 47, point 11: a symlinked *directory* on the way to an output (with
/// `fs.protected_symlinks` off, a shared directory's symlinks are followed by anyone) was
/// followed by root for every output (9 of 9). Each directory is now opened relative to the
/// one before with `O_NOFOLLOW`, and a symlink on the way is followed only when it is root's
/// or the invoking user's: nobody's is refused, root's own still works, and nothing is
/// written in the directory it points to.
#[test]
fn a_symlinked_directory_on_the_way_is_followed_only_when_it_is_trusted() {
    if !common::tier::root(
        "symlinked directories on the way",
        "symlinks planted by nobody",
    ) {
        return;
    }
    let py = main_python(&pythons());
    let dir = nobodys_dir();
    let d = dir.path();
    let roots = common::tempdir(); // root's directory, which nobody wants root to write into
    let capture = d.join("real.mprof");
    let out = run_with_timeout(
        mprof()
            .args(["record", "--rate", "1", "-o"])
            .arg(&capture)
            .args([
                "--",
                py.path.to_str().unwrap(),
                "-c",
                "x = bytearray(10**6)",
            ]),
        LIMIT,
    );
    assert!(clean_exit(&out, "record"));
    plant(&d.join("sub"), roots.path());
    let views: [(&[&str], &str); 8] = [
        (&["flamegraph"], "f.svg"),
        (&["timeline"], "t.svg"),
        (&["html"], "r.html"),
        (&["export"], "e.pb.gz"),
        (&["export", "-f", "json"], "e.json"),
        (&["export", "-f", "speedscope"], "e.speedscope.json"),
        (&["export", "-f", "folded"], "e.folded"),
        (&["report"], "c.mprof"),
    ];
    for (view, name) in views {
        let target = d.join("sub").join(name);
        let mut cmd = mprof();
        cmd.args(view).arg(&capture);
        if view[0] == "report" {
            // A report goes to stdout: the capture of a record is the last kind of output.
            cmd = mprof();
            cmd.args(["record", "-o"]).arg(&target).args([
                "--",
                py.path.to_str().unwrap(),
                "-c",
                "pass",
            ]);
        } else {
            cmd.arg("-o").arg(&target);
        }
        let out = run_with_timeout(&mut cmd, LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !clean_exit(&out, view[0]),
            "{view:?}: written through: {err}"
        );
        assert!(
            err.contains("symlink of uid 65534") && err.lines().count() == 1,
            "{view:?}: {err}"
        );
    }
    assert!(names(roots.path()).is_empty(), "{:?}", names(roots.path()));
    // A symlinked directory of root's own (as /var/run is) is followed.
    let own = common::tempdir();
    std::os::unix::fs::symlink(roots.path(), own.path().join("link")).unwrap();
    let out = run_with_timeout(
        mprof()
            .arg("flamegraph")
            .arg(&capture)
            .arg("-o")
            .arg(own.path().join("link").join("f.svg")),
        LIMIT,
    );
    assert!(clean_exit(&out, "flamegraph through root's own link"));
    assert_eq!(names(roots.path()), ["f.svg"]);
}

/// Issue 47, point 9: the disk fills under `record` (a 1 MiB tmpfs, in a mount namespace of
/// the test's own). mprof used to exit with status 2 after about a second, leaving the program
/// to run on unsupervised and its exit status lost (4 of 4, `--follow-children` too). Now the
/// capture stops where the disk is full, mprof says so and goes on supervising: the program
/// runs to its end, its exit status (7) is mprof's, and the capture reads up to where it
/// stopped.
#[test]
fn a_full_disk_stops_the_capture_not_the_supervision() {
    if !common::tier::root("full disk under record", "a tmpfs in a mount namespace") {
        return;
    }
    let py = main_python(&pythons());
    let program = "import sys, time\nkept = [str(i) * 4 for i in range(300000)]\n\
                   time.sleep(0.3)\nprint('done', flush=True)\nsys.exit(7)\n";
    for follow in [false, true] {
        let dir = common::tempdir();
        let small = dir.path().join("small");
        std::fs::create_dir(&small).unwrap();
        let capture = small.join("c.mprof");
        let mut line = format!(
            "mount -t tmpfs -o size=1m tmpfs '{}' && exec '{}' record --rate 1 -o '{}'",
            small.display(),
            env!("CARGO_BIN_EXE_mprof"),
            capture.display()
        );
        if follow {
            line.push_str(" --follow-children");
        }
        line.push_str(&format!(" -- '{}' -c \"$0\"", py.path.display()));
        let out = run_with_timeout(
            Command::new("unshare").args(["-m", "sh", "-c", &line, program]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        let what = if follow {
            "--follow-children"
        } else {
            "record"
        };
        assert_eq!(out.status.code(), Some(7), "{what}: {err}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("done"),
            "{what}: the program did not run to its end: {err}"
        );
        assert!(
            err.contains("the capture cannot be written any more")
                && err.contains("the capture stopped at"),
            "{what}: {err}"
        );
        eprintln!("{what}: {}", err.lines().last().unwrap_or(""));
    }
}
