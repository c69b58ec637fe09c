//! Loading a module's symbols: the file the capture names (if it is still the file that was
//! mapped: same build id, or same size when it has none), and its debug information, from the
//! file itself, from `/usr/lib/debug/.build-id/xx/yyyy.debug`, or through its
//! `.gnu_debuglink` (beside it, in `.debug/` beside it, or under `/usr/lib/debug`).
//!
//! A debug file found by build id is used even when the library itself is gone. The
//! directories searched instead of `/usr/lib/debug` can be given in `MPROF_DEBUG_DIRS`
//! (colon-separated, as GDB's `debug-file-directory`).

use super::elf::{self, Slice, Symbols};
use super::file;
use mprof_common::record::Module;
use std::path::{Path, PathBuf};

/// Where separate debug files live, unless `MPROF_DEBUG_DIRS` says otherwise.
const DEBUG_ROOT: &str = "/usr/lib/debug";
/// Most debug directories searched.
const MAX_DEBUG_DIRS: usize = 8;

/// The directories of separate debug files: `MPROF_DEBUG_DIRS`, or `/usr/lib/debug`.
fn debug_roots() -> Vec<PathBuf> {
    match std::env::var_os("MPROF_DEBUG_DIRS") {
        Some(dirs) => std::env::split_paths(&dirs)
            .filter(|d| d.is_absolute())
            .take(MAX_DEBUG_DIRS)
            .collect(),
        None => vec![PathBuf::from(DEBUG_ROOT)],
    }
}

/// A module's symbols, ready for lookups.
pub struct Loaded {
    /// Function, file and line, inlined frames included, when there is DWARF.
    pub dwarf: Option<addr2line::Context<Slice>>,
    /// `.symtab` and `.dynsym` of the file and of its debug file.
    pub symbols: Symbols,
    /// Whether the module defines CPython's bytecode loop (libpython, or a python executable
    /// that links it statically).
    pub interpreter: bool,
}

/// Why a module has no symbols: a warning for the reader.
pub type Missing = String;

/// The file name of a path, for messages and `name+0x…` frames.
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Loads the symbols of `module`; an error says why there are none.
pub fn load(module: &Module) -> Result<Loaded, Missing> {
    let name = base_name(&module.path);
    if !module.path.starts_with('/') || module.path.starts_with("/memfd:") {
        return Err(format!(
            "{name}: not a file on disk; its frames show as {name}+0x…"
        ));
    }
    let (main, why) = match file::read(Path::new(&module.path)) {
        Ok(data) => match identity(module, data) {
            Ok(()) => (Some(data), None),
            Err(why) => (None, Some(why)),
        },
        Err(e) if !Path::new(&module.path).exists() => (
            None,
            Some(format!(
                "{}: deleted or moved since the capture ({e})",
                module.path
            )),
        ),
        Err(e) => (None, Some(format!("{}: cannot be read ({e})", module.path))),
    };
    let debug = debug_data(module, main);
    if main.is_none() && debug.is_none() {
        let why = why.unwrap_or_default();
        return Err(format!("{why}; its frames show as {name}+0x…"));
    }
    let mut symbols = Symbols::default();
    for data in [main, debug].into_iter().flatten() {
        symbols.add(data);
    }
    let interpreter = symbols.defines("_PyEval_EvalFrameDefault");
    let dwarf = debug
        .and_then(elf::dwarf)
        .and_then(|d| addr2line::Context::from_dwarf(d).ok());
    if dwarf.is_none() && symbols.is_empty() {
        return Err(format!(
            "{}: no symbols (not an ELF file, or one without a symbol table); its frames show \
             as {name}+0x…",
            module.path
        ));
    }
    Ok(Loaded {
        dwarf,
        symbols,
        interpreter,
    })
}

/// Whether `data` is still the file that was mapped.
fn identity(module: &Module, data: &[u8]) -> Result<(), String> {
    let found = elf::build_id(data).unwrap_or_default();
    if !module.build_id.is_empty() {
        if found != module.build_id {
            let now = found.iter().map(|b| format!("{b:02x}")).collect::<String>();
            return Err(format!(
                "{}: changed since the capture (build id {}, the capture's is {})",
                module.path,
                if now.is_empty() { "none".into() } else { now },
                module.build_id_hex()
            ));
        }
        return Ok(());
    }
    if module.file_size != 0 && module.file_size != data.len() as u64 {
        return Err(format!(
            "{}: changed since the capture ({} bytes, {} then)",
            module.path,
            data.len(),
            module.file_size
        ));
    }
    Ok(())
}

/// The data that holds the module's DWARF: the file itself, or its separate debug file.
fn debug_data(module: &Module, main: Option<&'static [u8]>) -> Option<&'static [u8]> {
    if let Some(data) = main.filter(|d| elf::has_dwarf(d)) {
        return Some(data);
    }
    if let Some(data) = by_build_id(&module.build_id) {
        return Some(data);
    }
    let main = main?;
    let (name, crc) = elf::debuglink(main)?;
    debuglink_paths(&module.path, &name)
        .into_iter()
        .filter_map(|p| file::read(&p).ok())
        .find(|d| elf::has_dwarf(d) && same_object(module, d, crc))
}

/// `/usr/lib/debug/.build-id/xx/yyyy.debug`, if it holds DWARF for this build id.
fn by_build_id(id: &[u8]) -> Option<&'static [u8]> {
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    debug_roots().into_iter().find_map(|root| {
        let path = root
            .join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        let data = file::read(&path).ok()?;
        (elf::has_dwarf(data) && elf::build_id(data).as_deref() == Some(id)).then_some(data)
    })
}

/// Whether a debug file found through `.gnu_debuglink` belongs to the module: the same build
/// id, or (without one) the CRC-32 the link gives.
fn same_object(module: &Module, debug: &[u8], crc: u32) -> bool {
    if !module.build_id.is_empty() {
        return elf::build_id(debug).as_deref() == Some(&module.build_id[..]);
    }
    crc32fast::hash(debug) == crc
}

/// Where GDB looks for a `.gnu_debuglink` target.
fn debuglink_paths(module_path: &str, name: &str) -> Vec<PathBuf> {
    let dir = Path::new(module_path).parent().unwrap_or(Path::new("/"));
    let mut paths = vec![dir.join(name), dir.join(".debug").join(name)];
    for root in debug_roots() {
        paths.push(root.join(dir.strip_prefix("/").unwrap_or(dir)).join(name));
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str) -> Module {
        Module {
            path: path.into(),
            ..Module::default()
        }
    }

    #[test]
    fn missing_replaced_and_pseudo_files_say_why() {
        let gone = load(&module("/nonexistent/libgone.so")).err().unwrap();
        assert!(
            gone.contains("libgone.so") && gone.contains("libgone.so+0x"),
            "{gone}"
        );
        let memfd = load(&module("/memfd:mprof-agent.so")).err().unwrap();
        assert!(memfd.contains("not a file"), "{memfd}");
        let exe = std::env::current_exe().unwrap();
        let mut changed = module(exe.to_str().unwrap());
        changed.build_id = vec![1; 20];
        let why = load(&changed).err().unwrap();
        assert!(why.contains("changed since the capture"), "{why}");
        let mut resized = module(exe.to_str().unwrap());
        resized.file_size = 3;
        assert!(load(&resized).is_err());
    }

    #[test]
    fn this_binary_loads_with_its_dwarf() {
        let exe = std::env::current_exe().unwrap();
        let data = file::read(&exe).unwrap();
        let mut m = module(exe.to_str().unwrap());
        m.build_id = elf::build_id(data).unwrap();
        let loaded = load(&m).unwrap();
        assert!(loaded.dwarf.is_some());
        assert!(!loaded.interpreter);
    }

    #[test]
    fn debuglink_names_stay_in_their_directories() {
        let paths = debuglink_paths("/usr/lib/x/libz.so.1", "libz.so.1.debug");
        assert_eq!(
            paths,
            [
                PathBuf::from("/usr/lib/x/libz.so.1.debug"),
                PathBuf::from("/usr/lib/x/.debug/libz.so.1.debug"),
                PathBuf::from("/usr/lib/debug/usr/lib/x/libz.so.1.debug"),
            ]
        );
    }
}
