//! Launchers: code that only starts the program, which "your code" looks past.
//!
//! - **Console-script entry scripts**: what `pip`, `uv` and setuptools write into a
//!   virtualenv's or the system's `bin/` for each console script (`…/venv/bin/uvicorn`,
//!   `/usr/bin/pytest-3`): a few lines that import the package's entry point and call it. Not
//!   in a library directory, they read as the program's own file, and every allocation of a
//!   server attached to (`<module> (…/venv/bin/uvicorn:8) ← _SelectorSocketTransport…`) was
//!   charged to the stub. A file is one when its directory is a `bin/` and its text is the
//!   standard stub ([`is_stub`]), read from disk when the capture is read (a capture read
//!   where the file is missing keeps the stub as a frame of the program).
//! - **`runpy`** (`python -m`), standard library and so never yours already; named here so
//!   that the rule is in one place.
//!
//! A `--focus` path still makes any of them yours.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::sync::Mutex;

/// The longest entry script read: the standard stubs take a few hundred bytes (setuptools'
/// older ones about 1 KiB).
const MAX_STUB: usize = 4096;
/// Files remembered at most (each was opened once).
const MAX_REMEMBERED: usize = 4096;

static SEEN: Mutex<Option<HashMap<String, bool>>> = Mutex::new(None);

/// Whether code in `file` is a launcher: `runpy`, or a console-script entry script.
pub fn is_launcher(file: &str) -> bool {
    is_runpy(file) || is_console_script(file)
}

/// `runpy` (frozen from 3.11 on in some builds, a file of the standard library otherwise).
fn is_runpy(file: &str) -> bool {
    file == "<frozen runpy>"
        || (file.ends_with("/runpy.py")
            && crate::analysis::frames::kind(file, "") == crate::analysis::frames::Kind::Stdlib)
}

/// Whether `file`, an absolute path, is a file in a `bin/` directory whose text is the
/// standard console-script stub. Each file is read once per process.
pub fn is_console_script(file: &str) -> bool {
    let Some((dir, name)) = file.rsplit_once('/') else {
        return false;
    };
    if !dir.ends_with("/bin") || name.is_empty() || name.ends_with(".py") {
        return false;
    }
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(HashMap::new);
    if let Some(&known) = seen.get(file) {
        return known;
    }
    let stub = read_small(file).is_some_and(|text| is_stub(&text));
    if seen.len() < MAX_REMEMBERED {
        seen.insert(file.to_owned(), stub);
    }
    stub
}

/// The text of a regular file of at most [`MAX_STUB`] bytes; never blocks on a FIFO or a
/// device (the name comes from an untrusted capture).
fn read_small(path: &str) -> Option<String> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_STUB as u64 {
        return None;
    }
    let mut text = String::new();
    file.by_ref()
        .take(MAX_STUB as u64)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Whether `text` is a console-script stub: a `#!` line, then only imports, the call of the
/// entry point under `if __name__ == "__main__":` with the `sys.argv[0]` fix-up (pip, uv,
/// distlib), or setuptools' `EASY-INSTALL`/`load_entry_point` scripts.
pub fn is_stub(text: &str) -> bool {
    if !text.starts_with("#!") {
        return false;
    }
    if text.contains("EASY-INSTALL-ENTRY-SCRIPT") || text.contains("load_entry_point(") {
        return true;
    }
    const ALLOWED: [&str; 6] = [
        "import ",
        "from ",
        "if __name__ ==",
        "sys.argv[0] = ",
        "sys.exit(",
        "__requires__ = ",
    ];
    let code = text
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let mut calls = false;
    for line in code {
        if !ALLOWED.iter().any(|a| line.starts_with(a)) {
            return false;
        }
        calls |= line.starts_with("sys.exit(");
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIP: &str = "#!/srv/app/.venv/bin/python3\n# -*- coding: utf-8 -*-\nimport re\n\
                       import sys\nfrom uvicorn.main import main\nif __name__ == \"__main__\":\n\
                       \x20   sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n\
                       \x20   sys.exit(main())\n";

    #[test]
    fn console_script_stubs_are_told_from_programs() {
        assert!(is_stub(PIP));
        assert!(is_stub(
            "#!/usr/bin/python3\n# EASY-INSTALL-ENTRY-SCRIPT: 'x==1','console_scripts','x'\n"
        ));
        // A program of its own in bin/: not a stub.
        assert!(!is_stub(
            "#!/usr/bin/env python3\nimport sys\ndata = [0] * 10\nsys.exit(0)\n"
        ));
        assert!(!is_stub("import sys\nsys.exit(main())\n"));
        assert!(!is_stub("#!/bin/sh\nexec python3 -m app \"$@\"\n"));
        assert!(is_runpy("<frozen runpy>"));
        assert!(is_runpy("/usr/lib/python3.11/runpy.py"));
        assert!(!is_runpy("/srv/app/runpy.py"));
    }

    #[test]
    fn only_small_regular_files_in_a_bin_directory_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let stub = bin.join("tool");
        std::fs::write(&stub, PIP).unwrap();
        assert!(is_console_script(stub.to_str().unwrap()));
        let elsewhere = dir.path().join("tool");
        std::fs::write(&elsewhere, PIP).unwrap();
        assert!(!is_console_script(elsewhere.to_str().unwrap()));
        let fifo = bin.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(!is_console_script(fifo.to_str().unwrap()), "never blocks");
        assert!(!is_console_script(bin.join("missing").to_str().unwrap()));
    }
}
