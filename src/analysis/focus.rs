//! What counts as "your code": the frames the default grouping (`--by your-code`) stops at.
//!
//! A frame is yours unless its file is in the standard library (frozen modules included),
//! in `site-packages`/`dist-packages`, in the import machinery (`importlib`, `site.py`), native,
//! code compiled from a string (`<string>`: `.pth` lines, generated methods), or one of mprof's
//! pseudo-frames (see [`crate::analysis::frames::kind`]), or a launcher: a console script's
//! entry stub in a `bin/` directory, `runpy` ([`crate::analysis::launchers`]). Three things
//! widen that:
//! - a program run as `python -c COMMAND` is code compiled from a string: `<string>` is yours
//!   then (the capture's metadata names it as a focus name); a program read from standard
//!   input (`python -`, or `python` with nothing to run) is `<stdin>`, yours the same way;
//! - the program's own directory (`program_dir` in the capture's metadata: `sys.path[0]` as
//!   Python sets it, the script's directory or the working directory for `-m` and `-c`). A file
//!   below it is yours unless the part below it is itself a library path (a virtualenv inside
//!   the project stays third-party). This matters for a program that lives in a library path,
//!   e.g. a script run from inside `site-packages`;
//! - `--focus PATH`, named by the user: every file under PATH is yours, library or not. A
//!   relative PATH is taken from the current directory and also matched as a run of path
//!   components anywhere (`--focus mypkg` matches `…/site-packages/mypkg/…`).
//!
//! Relative file names in a capture (Python 3.8 keeps `examples/app.py` as typed) are taken
//! from the capture's `cwd`. Captures without these metadata keys read fine: the library rules
//! alone then decide.

use crate::analysis::frames::{kind, Kind};
use crate::analysis::names::{FastMap, Location, Named};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Whether a file (by name) is yours, remembered per file while a grouping walks its stacks.
pub type Memo<'a> = FastMap<Named<'a>, bool>;

/// The rules that say which files are yours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Focus {
    /// The program's own directory, absolute, without a trailing slash.
    program_dir: Option<String>,
    /// `--focus` paths, absolute, without a trailing slash.
    paths: Vec<String>,
    /// `--focus` paths given relative, matched as path components anywhere.
    names: Vec<String>,
    /// The working directory of the profiled program, for relative file names.
    cwd: Option<String>,
}

/// `path` without trailing slashes (but `/` stays `/`).
fn trimmed(path: &str) -> String {
    let t = path.trim_end_matches('/');
    if t.is_empty() && path.starts_with('/') {
        "/".to_owned()
    } else {
        t.to_owned()
    }
}

/// The part of `file` below the directory `dir`, if `file` is `dir` itself or under it.
fn below<'f>(file: &'f str, dir: &str) -> Option<&'f str> {
    if dir == "/" {
        return file.strip_prefix('/');
    }
    let rest = file.strip_prefix(dir)?;
    if rest.is_empty() {
        Some(rest)
    } else {
        rest.strip_prefix('/')
    }
}

impl Focus {
    /// The rules for a capture with metadata `meta` (its `cwd`, `program_dir` and the
    /// `focus_paths`/`focus_names` its session was given, when it has them) and the user's
    /// `--focus` paths (relative ones taken from mprof's current directory).
    pub fn new(meta: &BTreeMap<String, String>, focus: &[PathBuf]) -> Focus {
        let absolute = |key: &str| {
            meta.get(key)
                .filter(|v| v.starts_with('/'))
                .map(|v| trimmed(v))
        };
        let listed = |key: &str| -> Vec<String> {
            meta.get(key)
                .map(|v| {
                    v.split(':')
                        .filter(|p| !p.is_empty())
                        .map(trimmed)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (mut paths, mut names) = resolve(focus);
        paths.extend(
            listed("focus_paths")
                .into_iter()
                .filter(|p| p.starts_with('/')),
        );
        names.extend(listed("focus_names"));
        Focus {
            program_dir: absolute("program_dir"),
            cwd: absolute("cwd"),
            paths,
            names,
        }
    }

    /// [`Focus::new`] for metadata given as its `key=value` lines (as a session writes them).
    pub fn from_meta_lines(text: &str) -> Focus {
        let meta: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Focus::new(&meta, &[])
    }

    /// Whether `file` is under a `--focus` path.
    fn focused(&self, file: &str) -> bool {
        self.paths.iter().any(|p| below(file, p).is_some())
            || self.names.iter().any(|n| {
                let mut at = 0;
                while let Some(i) = file[at..].find(n.as_str()) {
                    let start = at + i;
                    let end = start + n.len();
                    let left = start == 0 || file.as_bytes()[start - 1] == b'/';
                    let right = end == file.len() || file.as_bytes()[end] == b'/';
                    if left && right {
                        return true;
                    }
                    at = start + n.chars().next().map_or(1, char::len_utf8);
                }
                false
            })
    }

    /// Whether code in `file` is yours (see the module doc). Pseudo-frames never are; check
    /// them with [`Focus::is_yours`], which sees the function too.
    pub fn is_your_file(&self, file: &str) -> bool {
        let resolved;
        let file = match &self.cwd {
            Some(cwd) if !file.starts_with('/') && !file.starts_with('<') && !file.is_empty() => {
                resolved = format!("{cwd}/{}", file.trim_start_matches("./"));
                resolved.as_str()
            }
            _ => file,
        };
        if self.focused(file) {
            return true;
        }
        if crate::analysis::launchers::is_launcher(file) {
            // A console script's entry stub or runpy: the grouping looks past it.
            return false;
        }
        if file.starts_with('<') {
            // Code compiled from a string: `.pth` lines run by site.py, methods generated by
            // namedtuple and dataclasses; `python -c`, whose session claims `<string>` as a
            // focus name (`meta_lines`), as `--focus '<string>'` does (and a program read
            // from standard input `<stdin>`).
            return false;
        }
        match kind(file, "") {
            Kind::Import | Kind::Native | Kind::Pseudo => return false,
            Kind::Program | Kind::Stdlib | Kind::ThirdParty => {}
        }
        if let Some(rest) = self.program_dir.as_deref().and_then(|d| below(file, d)) {
            return kind(&format!("/{rest}"), "") == Kind::Program;
        }
        kind(file, "") == Kind::Program
    }

    /// Whether the frame `loc` is in your code.
    pub fn is_yours<'a>(&self, loc: &Location<'a>, memo: &mut Memo<'a>) -> bool {
        if loc.file == loc.function || loc.file.is_empty() {
            return false;
        }
        if loc.is_native() {
            // Native frames are yours only under a `--focus` path.
            return self.focused(loc.file);
        }
        *memo
            .entry(Named(loc.file))
            .or_insert_with(|| self.is_your_file(loc.file))
    }

    /// The innermost of `frames` (innermost first) that is in your code, if any.
    pub fn first_yours<'a>(
        &self,
        frames: impl IntoIterator<Item = Location<'a>>,
        memo: &mut Memo<'a>,
    ) -> Option<Location<'a>> {
        frames.into_iter().find(|loc| self.is_yours(loc, memo))
    }
}

/// `--focus` paths as (absolute paths, names matched anywhere): an absolute path is a path; a
/// relative one is taken from the current directory and also kept as a name.
fn resolve(focus: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let here = std::env::current_dir().ok();
    let (mut paths, mut names) = (Vec::new(), Vec::new());
    for path in focus {
        let text = path.to_string_lossy();
        if text.is_empty() {
            continue;
        }
        if path.is_absolute() {
            paths.push(trimmed(&text));
            continue;
        }
        let name = trimmed(text.trim_start_matches("./"));
        if let Some(here) = &here {
            paths.push(trimmed(&normalized(&here.join(&name)).to_string_lossy()));
        }
        if !name.is_empty() && name != "." && !name.starts_with("..") {
            names.push(name);
        }
    }
    (paths, names)
}

/// What a Python command line runs, as far as `sys.path[0]` and "your code" care.
enum Runs<'a> {
    /// A script file (or a directory or zip file run as one), as typed.
    Script(&'a str),
    /// `-m MODULE`.
    Module,
    /// `-c COMMAND`: the program is the string, compiled as `<string>`.
    Command,
    /// `-`: the program is read from standard input, compiled as `<stdin>`.
    Stdin,
}

/// What the interpreter command `argv` (its options, then what it runs) runs; `None` when
/// nothing follows the options (an interactive interpreter, or a program piped in: Python
/// reads standard input then, as for `-`).
fn what_runs(argv: &[String]) -> Option<Runs<'_>> {
    let mut args = argv.get(1..)?.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == "-" {
            return Some(Runs::Stdin);
        }
        if let Some(long) = arg.strip_prefix("--") {
            if long == "check-hash-based-pycs" {
                args.next();
            }
            continue;
        }
        let Some(cluster) = arg.strip_prefix('-') else {
            return Some(Runs::Script(arg));
        };
        for (i, c) in cluster.char_indices() {
            match c {
                'c' => return Some(Runs::Command),
                'm' => return Some(Runs::Module),
                'W' | 'X' => {
                    if i + 1 == cluster.len() {
                        args.next();
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    args.next().map(|script| Runs::Script(script))
}

/// `sys.path[0]` as Python sets it for the command `argv` run in `cwd`: the directory of the
/// script (a directory or zip file run as a script is its own), or `cwd` for `-c`, `-m` and a
/// script read from stdin. A command that is not a Python interpreter is taken as the script
/// itself (a `#!` script), found like `execvp` does; `None` when it cannot be found.
pub fn program_dir(argv: &[String], cwd: &Path) -> Option<PathBuf> {
    let first = argv.first()?;
    if !is_python(first) {
        let script = if first.contains('/') {
            cwd.join(first)
        } else {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path)
                .map(|dir| cwd.join(dir).join(first))
                .find(|p| p.is_file())?
        };
        return script.is_file().then(|| parent(&script));
    }
    match what_runs(argv) {
        Some(Runs::Script(script)) => Some(script_dir(cwd, script)),
        Some(Runs::Module | Runs::Command | Runs::Stdin) | None => Some(cwd.to_path_buf()),
    }
}

/// The file name CPython gives the program of `python -c COMMAND`, and of a program it reads
/// from standard input.
const COMMAND_STRING: &str = "<string>";
const STDIN: &str = "<stdin>";

/// The file name of the program `argv` runs when it is not a file: `<string>` for `python -c
/// COMMAND`, `<stdin>` for a program read from standard input. That code is the user's own,
/// so the session claims the name as a `--focus` name would.
fn program_code_name(argv: &[String]) -> Option<&'static str> {
    if !argv.first().is_some_and(|p| is_python(p)) {
        return None;
    }
    match what_runs(argv) {
        Some(Runs::Command) => Some(COMMAND_STRING),
        Some(Runs::Stdin) | None => Some(STDIN),
        Some(Runs::Script(_) | Runs::Module) => None,
    }
}

/// Whether `program` names a CPython interpreter: `python`, `python3`, `python3.12`, …
fn is_python(program: &str) -> bool {
    let name = program.rsplit('/').next().unwrap_or(program);
    name.strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

fn script_dir(cwd: &Path, script: &str) -> PathBuf {
    let path = cwd.join(script);
    let is_archive = script.ends_with(".zip") || script.ends_with(".pyz");
    if path.is_dir() || is_archive {
        path
    } else {
        parent(&path)
    }
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The metadata lines that [`Focus::new`] reads back: `cwd=…` and `program_dir=…` for a
/// program run as `argv` in `cwd`, `focus_paths=…` and `focus_names=…` (separated by `:`) for
/// the session's `--focus` paths. Values that a line cannot carry (a newline; a `:` in a
/// focus path) are left out.
pub fn meta_lines(argv: &[String], cwd: Option<&Path>, focus: &[PathBuf]) -> String {
    let mut out = String::new();
    let mut add = |key: &str, value: &str| {
        if !value.is_empty() && !value.contains('\n') {
            out.push_str(&format!("{key}={value}\n"));
        }
    };
    if let Some(cwd) = cwd.filter(|c| c.is_absolute()) {
        add("cwd", &cwd.to_string_lossy());
        if let Some(dir) = program_dir(argv, cwd) {
            add("program_dir", &normalized(&dir).to_string_lossy());
        }
    }
    let (paths, mut names) = resolve(focus);
    if let Some(name) = program_code_name(argv) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    let joined = |list: Vec<String>| {
        list.into_iter()
            .filter(|p| !p.contains(':'))
            .collect::<Vec<_>>()
            .join(":")
    };
    add("focus_paths", &joined(paths));
    add("focus_names", &joined(names));
    out
}

/// `path` with `.` and `..` components folded away (without touching the file system).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const JSON: &str = "/root/.pyenv/versions/3.11.7/lib/python3.11/json/encoder.py";
    const FLASK: &str = "/srv/app/.venv/lib/python3.11/site-packages/flask/app.py";

    #[test]
    fn libraries_import_machinery_and_pseudo_frames_are_not_yours() {
        let f = Focus::new(
            &meta(&[("cwd", "/srv/app"), ("program_dir", "/srv/app")]),
            &[],
        );
        assert!(f.is_your_file("/srv/app/app.py"));
        assert!(f.is_your_file("app.py"));
        assert!(f.is_your_file("/home/me/tools/other.py"));
        assert!(!f.is_your_file(JSON));
        assert!(!f.is_your_file(FLASK), "a virtualenv inside the project");
        assert!(!f.is_your_file("<frozen importlib._bootstrap>"));
        assert!(!f.is_your_file("<frozen os>"));
        assert!(!f.is_your_file("/usr/lib/python3/dist-packages/yaml/a.py"));
        assert!(!f.is_your_file("<string>"));
        let dash_c = Focus::new(&BTreeMap::new(), &[PathBuf::from("<string>")]);
        assert!(dash_c.is_your_file("<string>"));
        let pseudo = Location {
            module: None,
            file: "<unknown>",
            function: "<unknown>",
            line: 0,
            firstline: 0,
        };
        assert!(!f.is_yours(&pseudo, &mut Memo::default()));
    }

    #[test]
    fn the_program_directory_and_focus_paths_are_yours_even_in_libraries() {
        let tool = "/venv/lib/python3.12/site-packages/mytool";
        let f = Focus::new(&meta(&[("program_dir", tool)]), &[]);
        assert!(f.is_your_file(&format!("{tool}/cli.py")));
        assert!(!f.is_your_file("/venv/lib/python3.12/site-packages/click/core.py"));
        let focused = Focus::new(
            &BTreeMap::new(),
            &[
                PathBuf::from("flask"),
                PathBuf::from("/usr/lib/python3.11/js/"),
            ],
        );
        assert!(focused.is_your_file(FLASK));
        assert!(focused.is_your_file("/usr/lib/python3.11/js/y.py"));
        assert!(!focused.is_your_file("/usr/lib/python3.11/json/y.py"));
        assert!(!focused.is_your_file("/venv/lib/python3.12/site-packages/flasky/a.py"));
        assert!(!focused.is_your_file(JSON));
        // Names come from captures too: any bytes, no panic.
        let odd = Focus::new(&BTreeMap::new(), &[PathBuf::from("é/é")]);
        assert!(odd.is_your_file("/usr/lib/python3.11/éé/é/é/a.py"));
        assert!(!odd.is_your_file("/usr/lib/python3.11/éé/é.py"));
    }

    #[test]
    fn relative_files_are_taken_from_the_capture_cwd() {
        let f = Focus::new(
            &meta(&[("cwd", "/srv/app")]),
            &[PathBuf::from("/srv/app/lib")],
        );
        assert!(f.is_your_file("lib/models.py"));
        let in_site = Focus::new(&meta(&[("cwd", "/venv/lib/python3.12/site-packages")]), &[]);
        assert!(!in_site.is_your_file("pkg/a.py"));
    }

    #[test]
    fn the_first_frame_in_your_code_is_found_from_the_innermost() {
        let f = Focus::default();
        let loc = |file, line| Location {
            module: None,
            file,
            function: "f",
            line,
            firstline: 1,
        };
        let stack = [
            loc(JSON, 258),
            loc("/srv/app/app.py", 9),
            loc("/srv/app/app.py", 30),
        ];
        let mut memo = Memo::default();
        assert_eq!(f.first_yours(stack.into_iter(), &mut memo), Some(stack[1]));
        assert_eq!(memo.get(&Named(stack[0].file)), Some(&false));
        assert_eq!(f.first_yours([loc(JSON, 1)].into_iter(), &mut memo), None);
    }

    #[test]
    fn program_dir_follows_python_rules() {
        let cwd = Path::new("/work");
        let dir = |s: &str| program_dir(&argv(s), cwd).map(|p| p.display().to_string());
        assert_eq!(dir("python3 app/main.py -v").as_deref(), Some("/work/app"));
        assert_eq!(dir("python3 /srv/x.py").as_deref(), Some("/srv"));
        assert_eq!(
            dir("/usr/bin/python3.11 -u -X dev -W ignore s.py").as_deref(),
            Some("/work")
        );
        assert_eq!(dir("python3 -Wignore -OO /a/b.py").as_deref(), Some("/a"));
        assert_eq!(dir("python3 -m http.server").as_deref(), Some("/work"));
        assert_eq!(dir("python -c pass").as_deref(), Some("/work"));
        assert_eq!(dir("python3 -").as_deref(), Some("/work"));
        assert_eq!(dir("python3 -- /a/b.py").as_deref(), Some("/a"));
        assert_eq!(dir("python3 app.pyz").as_deref(), Some("/work/app.pyz"));
        // Nothing to run: a program piped in, or an interactive interpreter (`sys.path[0]`
        // is empty: the working directory).
        assert_eq!(dir("python3").as_deref(), Some("/work"));
        assert_eq!(dir("/nonexistent/tool arg"), None);
        let sh = program_dir(&argv("/bin/sh -c x"), cwd);
        assert_eq!(sh.as_deref(), Some(Path::new("/bin")));
        assert_eq!(
            meta_lines(&argv("python3 ../srv/./x.py"), Some(cwd), &[]),
            "cwd=/work\nprogram_dir=/srv\n"
        );
        assert_eq!(meta_lines(&argv("python3 x.py"), None, &[]), "");
    }

    #[test]
    fn a_command_string_program_claims_string_code() {
        let cwd = Path::new("/work");
        for command in [
            "python3 -c pass",
            "python3 -u -c pass",
            "python3 -Wignore -Ic pass",
        ] {
            let text = meta_lines(&argv(command), Some(cwd), &[]);
            assert_eq!(
                text, "cwd=/work\nprogram_dir=/work\nfocus_names=<string>\n",
                "{command}"
            );
            assert!(Focus::from_meta_lines(&text).is_your_file("<string>"));
        }
        // A program read from standard input, with `-` or nothing to run.
        for command in ["python3 -", "python3 -u", "python3"] {
            let text = meta_lines(&argv(command), Some(cwd), &[]);
            assert_eq!(
                text, "cwd=/work\nprogram_dir=/work\nfocus_names=<stdin>\n",
                "{command}"
            );
            assert!(Focus::from_meta_lines(&text).is_your_file("<stdin>"));
        }
        // Not for a script, a module, a script whose arguments hold `-c`, or another program.
        for command in [
            "python3 x.py -c pass",
            "python3 -m http.server",
            "python3 -- -c",
            "/bin/sh -c x",
        ] {
            let text = meta_lines(&argv(command), Some(cwd), &[]);
            assert!(!text.contains("focus_names"), "{command}: {text}");
            assert!(!Focus::from_meta_lines(&text).is_your_file("<string>"));
        }
        // Claimed once, with the user's own focus names.
        let both = meta_lines(
            &argv("python3 -c pass"),
            None,
            &[PathBuf::from("<string>"), PathBuf::from("mypkg")],
        );
        assert!(both.ends_with("focus_names=<string>:mypkg\n"), "{both}");
    }

    #[test]
    fn focus_paths_travel_in_the_capture_metadata() {
        let here = std::env::current_dir().unwrap();
        let args = [
            PathBuf::from("/opt/a/"),
            PathBuf::from("mypkg"),
            PathBuf::from("/x:y"),
        ];
        let text = meta_lines(&[], None, &args);
        assert_eq!(
            text,
            format!(
                "focus_paths=/opt/a:{}\nfocus_names=mypkg\n",
                here.join("mypkg").display()
            )
        );
        let read = Focus::from_meta_lines(&text);
        assert_eq!(read, Focus::new(&BTreeMap::new(), &args[..2]));
        assert!(read.is_your_file("/venv/lib/python3.12/site-packages/mypkg/m.py"));
    }
}
