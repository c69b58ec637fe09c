//! What a frame is to a reader: its short file name, its kind of code, whether it belongs to
//! the import system. Used by the pictures (flamegraph, HTML) to label, colour and fold frames.

use crate::analysis::names::Location;
use std::borrow::Cow;

/// The kind of code a frame runs, for colours and the legend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The program's own files.
    Program,
    /// Python's standard library (frozen modules included).
    Stdlib,
    /// Installed packages (`site-packages`, `dist-packages`).
    ThirdParty,
    /// Python's import machinery (`importlib._bootstrap*`, `site.py`).
    Import,
    /// Native code (C extensions, the interpreter), once native stacks are recorded.
    Native,
    /// mprof's pseudo-frames: `<no Python frame>`, `<unknown>`, `<truncated stack>`.
    Pseudo,
}

impl Kind {
    /// Every kind, in legend order.
    pub const ALL: [Kind; 6] = [
        Kind::Program,
        Kind::Stdlib,
        Kind::ThirdParty,
        Kind::Import,
        Kind::Native,
        Kind::Pseudo,
    ];

    /// The legend's word for the kind.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Program => "program",
            Kind::Stdlib => "stdlib",
            Kind::ThirdParty => "third-party",
            Kind::Import => "import system",
            Kind::Native => "native",
            Kind::Pseudo => "no Python frame / unknown",
        }
    }

    /// The kind's base colour (r, g, b).
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            Kind::Program => (235, 130, 60),
            Kind::Stdlib => (90, 150, 215),
            Kind::ThirdParty => (95, 180, 95),
            Kind::Import => (175, 175, 175),
            Kind::Native => (165, 110, 200),
            Kind::Pseudo => (205, 205, 190),
        }
    }
}

const PACKAGE_DIRS: [&str; 2] = ["/site-packages/", "/dist-packages/"];

/// Where the standard library starts in a path (`…/lib/python3.12/`), and where its
/// module path begins.
fn stdlib_start(file: &str) -> Option<usize> {
    // Compared in place, at each slash, rather than with `str::find`, whose searcher costs more
    // to set up than a path takes to scan: views ask this of every frame of every stack.
    const MARK: &[u8] = b"/lib/python3";
    let bytes = file.as_bytes();
    let at = (0..(bytes.len() + 1).saturating_sub(MARK.len()))
        .find(|&i| bytes[i] == b'/' && &bytes[i..i + MARK.len()] == MARK)?;
    let rest = &file[at + MARK.len()..];
    let slash = rest.find('/')?;
    let version = &rest[..slash];
    (version.starts_with('.') && version[1..].chars().all(|c| c.is_ascii_digit()))
        .then_some(at + MARK.len() + slash + 1)
}

/// The kind of code in `file`.
pub fn kind(file: &str, function: &str) -> Kind {
    if file == function || file.is_empty() {
        return Kind::Pseudo;
    }
    if is_import_file(file) {
        return Kind::Import;
    }
    if file.starts_with("<native") || file.ends_with(".so") {
        return Kind::Native;
    }
    if PACKAGE_DIRS.iter().any(|d| file.contains(d)) {
        return Kind::ThirdParty;
    }
    if file.starts_with("<frozen ") || stdlib_start(file).is_some() {
        return Kind::Stdlib;
    }
    Kind::Program
}

/// The kind of code of a frame: [`Kind::Native`] for a native frame, else by its file
/// ([`kind`]).
pub fn kind_of(loc: &Location) -> Kind {
    match loc.module {
        Some(_) => Kind::Native,
        None => kind(loc.file, loc.function),
    }
}

/// Whether `file` is part of Python's import machinery: `importlib._bootstrap` and
/// `_bootstrap_external` (frozen or not), `zipimport`, and `site.py`, which runs `.pth` files.
pub fn is_import_file(file: &str) -> bool {
    const FROZEN: [&str; 4] = [
        "<frozen importlib._bootstrap>",
        "<frozen importlib._bootstrap_external>",
        "<frozen zipimport>",
        "<frozen site>",
    ];
    if FROZEN.contains(&file) {
        return true;
    }
    let Some(start) = stdlib_start(file) else {
        return false;
    };
    matches!(
        &file[start..],
        "importlib/_bootstrap.py" | "importlib/_bootstrap_external.py" | "zipimport.py" | "site.py"
    )
}

/// Whether `file` is `site.py`, which runs the `.pth` files at start-up.
pub fn is_site(file: &str) -> bool {
    file == "<frozen site>" || stdlib_start(file).is_some_and(|start| &file[start..] == "site.py")
}

/// Whether a frame belongs to the import system (see [`is_import_file`]).
pub fn is_import(loc: &Location) -> bool {
    is_import_file(loc.file)
}

/// `file` as a Python user thinks of it: `numpy/core/numeric.py` for an installed package,
/// `json/decoder.py` for the standard library, the last two components of another absolute
/// path (`myapp/models.py`); names in `<…>` and short relative paths as they are.
pub fn short_file(file: &str) -> Cow<'_, str> {
    if file.starts_with('<') {
        return Cow::Borrowed(file);
    }
    for dir in PACKAGE_DIRS {
        if let Some(at) = file.rfind(dir) {
            return Cow::Borrowed(&file[at + dir.len()..]);
        }
    }
    if let Some(start) = stdlib_start(file) {
        return Cow::Borrowed(&file[start..]);
    }
    let parts: Vec<&str> = file.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() > 2 && (file.starts_with('/') || parts.len() > 3) {
        return Cow::Owned(parts[parts.len() - 2..].join("/"));
    }
    Cow::Borrowed(file)
}

/// A frame's label in pictures: `function (short/file.py:line)`; pseudo-frames by name.
pub fn label(loc: &Location) -> String {
    let short = Location {
        file: &short_file(loc.file),
        ..*loc
    }
    .to_string();
    crate::base::text::printable(&short).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan finds the first `/lib/python3` as `str::find` does: at the start, at the end,
    /// twice, after multi-byte characters, and not at all.
    #[test]
    fn the_standard_library_is_found_where_find_finds_it() {
        let by_find = |file: &str| {
            let at = file.find("/lib/python3")?;
            let rest = &file[at + "/lib/python3".len()..];
            let slash = rest.find('/')?;
            let version = &rest[..slash];
            (version.starts_with('.') && version[1..].chars().all(|c| c.is_ascii_digit()))
                .then_some(at + "/lib/python3".len() + slash + 1)
        };
        for file in [
            "",
            "/",
            "/lib/python3",
            "/lib/python3.1/",
            "/lib/python3.11/x.py",
            "é/lib/python3.12/json/decoder.py",
            "/x/lib/python3/lib/python3.11/os.py",
            "/usr/lib/python3.11x/os.py",
            "/usr/lib/python3.11/lib/python3.12/os.py",
            "/usr/lib/python",
            "lib/python3.11/os.py",
        ] {
            assert_eq!(stdlib_start(file), by_find(file), "{file}");
        }
    }

    #[test]
    fn files_are_shortened_the_way_python_users_name_them() {
        let s = |f: &str| short_file(f).into_owned();
        assert_eq!(
            s("/venv/lib/python3.12/site-packages/pandas/core/frame.py"),
            "pandas/core/frame.py"
        );
        assert_eq!(
            s("/usr/lib/python3/dist-packages/yaml/__init__.py"),
            "yaml/__init__.py"
        );
        assert_eq!(
            s("/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py"),
            "json/decoder.py"
        );
        assert_eq!(s("/home/me/project/app/models.py"), "app/models.py");
        assert_eq!(s("examples/leaky_cache.py"), "examples/leaky_cache.py");
        assert_eq!(
            s("<frozen importlib._bootstrap>"),
            "<frozen importlib._bootstrap>"
        );
        assert_eq!(s("/lib/python3x/a/b.py"), "a/b.py");
    }

    #[test]
    fn kinds_and_import_frames() {
        assert_eq!(kind("app.py", "f"), Kind::Program);
        assert_eq!(
            kind("/usr/lib/python3.11/json/decoder.py", "f"),
            Kind::Stdlib
        );
        assert_eq!(
            kind("/usr/lib/python3.11/site-packages/a.py", "f"),
            Kind::ThirdParty
        );
        assert_eq!(
            kind("<frozen importlib._bootstrap>", "_find_and_load"),
            Kind::Import
        );
        assert_eq!(
            kind("/usr/lib/python3.11/importlib/_bootstrap_external.py", "f"),
            Kind::Import
        );
        assert_eq!(
            kind("/usr/lib/python3.11/site.py", "addpackage"),
            Kind::Import
        );
        assert_eq!(kind("<frozen os>", "f"), Kind::Stdlib);
        assert_eq!(kind("<unknown>", "<unknown>"), Kind::Pseudo);
        assert_eq!(kind("/home/me/site.py", "f"), Kind::Program);
    }

    #[test]
    fn labels_keep_the_function_and_the_short_file() {
        let loc = Location {
            file: "/venv/lib/python3.12/site-packages/pkg/mod.py",
            function: "load",
            line: 7,
            firstline: 1,
            module: None,
        };
        assert_eq!(label(&loc), "load (pkg/mod.py:7)");
        let native = Location {
            file: "/src/ext/chain.c",
            function: "level2",
            line: 12,
            firstline: 0,
            module: Some("/venv/lib/python3.12/site-packages/ext.so"),
        };
        assert_eq!(label(&native), "level2 (ext/chain.c:12)");
        assert_eq!(kind_of(&native), Kind::Native);
        let symbol_only = Location {
            file: "/usr/lib/libz.so.1",
            line: 0,
            ..native
        };
        assert_eq!(label(&symbol_only), "level2 (lib/libz.so.1)");
    }
}
