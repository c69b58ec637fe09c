//! What mprof reads from an ELF file: its build id, its `.gnu_debuglink`, its function symbols
//! (`.symtab`, and `.dynsym`, which even a stripped library keeps for its exported names), the
//! load bias of a mapping, and its DWARF sections for `addr2line`.
//!
//! Every file is untrusted: a parse error is an answer ("no symbols"), never a panic.

use object::read::elf::{ElfFile, FileHeader, ProgramHeader};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

/// Most function symbols kept per file (libxul has ~700,000).
const MAX_SYMBOLS: usize = 4 << 20;

/// A function symbol: where it starts, how long it is, its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sym {
    pub addr: u64,
    pub size: u64,
    pub name: &'static str,
    global: bool,
}

/// The function symbols of a file, sorted by address, for lookups.
#[derive(Default)]
pub struct Symbols {
    sorted: Vec<Sym>,
    /// Whether a `.symtab` was read (a stripped file has only `.dynsym`'s exported names).
    full: bool,
}

impl Symbols {
    /// The symbols of `data` (`.symtab` and `.dynsym`), or none if it is not an ELF file.
    pub fn of(data: &'static [u8]) -> Symbols {
        let mut out = Symbols::default();
        out.add(data);
        out
    }

    /// Adds the symbols of another file of the same object (a separate debug file).
    pub fn add(&mut self, data: &'static [u8]) {
        let Ok(file) = object::File::parse(data) else {
            return;
        };
        self.full |= file.symbols().next().is_some();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if self.sorted.len() >= MAX_SYMBOLS {
                break;
            }
            if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            if name.is_empty() {
                continue;
            }
            self.sorted.push(Sym {
                addr: sym.address(),
                size: sym.size(),
                name,
                global: sym.is_global(),
            });
        }
        // At one address: sized before unsized, global before local, then the name with the
        // fewest leading underscores (`malloc` before `__libc_malloc`).
        self.sorted.sort_by_key(|s| {
            let underscores = s.name.len() - s.name.trim_start_matches('_').len();
            (s.addr, s.size == 0, !s.global, underscores, s.name)
        });
        self.sorted.dedup_by_key(|s| s.addr);
    }

    /// The function that holds `addr`: a sized symbol that covers it, or an unsized one just
    /// before it (assembly without sizes).
    pub fn find(&self, addr: u64) -> Option<&Sym> {
        let at = self
            .sorted
            .partition_point(|s| s.addr <= addr)
            .checked_sub(1)?;
        let sym = &self.sorted[at];
        let within = match sym.size {
            0 => addr - sym.addr < 4096,
            size => addr - sym.addr < size,
        };
        within.then_some(sym)
    }

    /// For a stripped file (no `.symtab`): the nearest exported function symbol at or before
    /// `addr` and the offset from it, to name an address in a static function as
    /// `exported+0x1a`. None when the file has a `.symtab` (whose symbols cover its
    /// functions) or no function starts before `addr`.
    pub fn nearest_exported(&self, addr: u64) -> Option<(&Sym, u64)> {
        if self.full {
            return None;
        }
        let at = self
            .sorted
            .partition_point(|s| s.addr <= addr)
            .checked_sub(1)?;
        let sym = &self.sorted[at];
        Some((sym, addr - sym.addr))
    }

    /// Whether there is no symbol at all.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Whether a function of this name is defined.
    pub fn defines(&self, name: &str) -> bool {
        self.sorted.iter().any(|s| s.name == name)
    }
}

/// The GNU build id of an ELF image (in memory, or a file read as needed).
pub fn build_id<'a, R: object::ReadRef<'a>>(data: R) -> Option<Vec<u8>> {
    let file = object::File::parse(data).ok()?;
    let id = file.build_id().ok()??;
    (!id.is_empty() && id.len() <= 64).then(|| id.to_vec())
}

/// The `.gnu_debuglink` of an ELF image: the debug file's name and its CRC-32.
pub fn debuglink(data: &[u8]) -> Option<(String, u32)> {
    let file = object::File::parse(data).ok()?;
    let (name, crc) = file.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    // A bare file name: never a path that climbs out of the directories searched.
    (!name.is_empty() && !name.contains('/') && name != "..").then(|| (name.to_owned(), crc))
}

/// Whether the image carries DWARF line information.
pub fn has_dwarf(data: &[u8]) -> bool {
    object::File::parse(data).is_ok_and(|f| {
        f.section_by_name(".debug_info").is_some() && f.section_by_name(".debug_line").is_some()
    })
}

/// The load bias of a mapping of the ELF image `data`: `start` is where the mapping begins
/// and `offset` the file offset mapped there. Found from the PT_LOAD segment mapped there: the
/// loader maps a segment from the page that holds its first byte, so the segment whose page
/// is `offset` (an executable one first: linkers such as lld start the code in the page where
/// the read-only data ends), else one that holds `offset`. An address of the file plus the
/// bias is the address in the process.
pub fn bias<'a, R: object::ReadRef<'a>>(data: R, start: u64, offset: u64) -> Option<u64> {
    let loads = loads(data)?;
    let page = |s: &Load| s.offset & !0xfff;
    let exact = |exec: bool| loads.iter().find(|s| page(s) == offset && s.exec == exec);
    let holds = || {
        loads
            .iter()
            .find(|s| page(s) <= offset && offset < s.offset.saturating_add(s.filesz.max(1)))
    };
    let s = exact(true).or_else(|| exact(false)).or_else(holds)?;
    Some(start.wrapping_sub(s.vaddr.wrapping_sub(s.offset).wrapping_add(offset)))
}

/// A PT_LOAD segment.
struct Load {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    exec: bool,
}

/// The PT_LOAD segments of an ELF image (at most 256 kept).
fn loads<'a, R: object::ReadRef<'a>>(data: R) -> Option<Vec<Load>> {
    fn of<'a, H: FileHeader<Endian = object::Endianness>, R: object::ReadRef<'a>>(
        data: R,
    ) -> Option<Vec<Load>> {
        let f = ElfFile::<H, R>::parse(data).ok()?;
        let e = f.endian();
        let headers = f.elf_header().program_headers(e, data).ok()?;
        Some(
            headers
                .iter()
                .filter(|p| p.p_type(e) == object::elf::PT_LOAD)
                .take(256)
                .map(|p| Load {
                    offset: p.p_offset(e).into(),
                    vaddr: p.p_vaddr(e).into(),
                    filesz: p.p_filesz(e).into(),
                    exec: p.p_flags(e).contains(object::elf::PF_X),
                })
                .collect(),
        )
    }
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf64 => of::<object::elf::FileHeader64<object::Endianness>, R>(data),
        object::FileKind::Elf32 => of::<object::elf::FileHeader32<object::Endianness>, R>(data),
        _ => None,
    }
}

/// The gimli reader of mprof's DWARF: slices of files kept for the life of the process.
pub type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// Decompressed sections, kept for the life of the process once per file and section.
static SECTIONS: Mutex<Option<Sections>> = Mutex::new(None);

/// (file's address, section name) → the decompressed section.
type Sections = HashMap<(usize, &'static str), &'static [u8]>;

/// The DWARF sections of the ELF image `data` (compressed ones decompressed once per
/// process), or None if it has none.
pub fn dwarf(data: &'static [u8]) -> Option<gimli::Dwarf<Slice>> {
    let file = object::File::parse(data).ok()?;
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Slice, gimli::Error> {
        let bytes = section(&file, data, id.name()).unwrap_or(&[]);
        Ok(gimli::EndianSlice::new(bytes, endian))
    };
    gimli::Dwarf::load(load).ok()
}

fn section(
    file: &object::File<'static>,
    data: &'static [u8],
    name: &'static str,
) -> Option<&'static [u8]> {
    let section = file.section_by_name(name)?;
    match section.uncompressed_data().ok()? {
        Cow::Borrowed(bytes) => Some(bytes),
        Cow::Owned(bytes) => {
            let mut cache = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
            let cache = cache.get_or_insert_with(HashMap::new);
            let key = (data.as_ptr() as usize, name);
            Some(*cache.entry(key).or_insert_with(|| outside_the_heap(&bytes)))
        }
    }
}

/// A copy of `bytes` in anonymous memory of its own, kept for the life of the process: held
/// for every capture read later, it is not counted against one capture's memory allowance.
fn outside_the_heap(bytes: &[u8]) -> &'static [u8] {
    if bytes.is_empty() {
        return &[];
    }
    // SAFETY: an anonymous private mapping; failure is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes.len(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return &[];
    }
    // SAFETY: the fresh mapping holds `bytes.len()` writable bytes and is never unmapped.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len());
        std::slice::from_raw_parts(ptr as *const u8, bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_binary() -> &'static [u8] {
        crate::analysis::symbols::file::read(&std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn reads_this_test_binary() {
        let data = own_binary();
        assert!(build_id(data).is_some_and(|id| id.len() >= 8));
        assert!(has_dwarf(data), "release builds keep line tables");
        let syms = Symbols::of(data);
        let me = reads_this_test_binary as *const () as u64;
        // A position-independent test binary: find the bias from our own mapping.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let (start, offset) = maps
            .lines()
            .filter(|l| l.ends_with(exe.to_str().unwrap()))
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (lo, hi) = f.next()?.split_once('-')?;
                let (lo, hi) = (
                    u64::from_str_radix(lo, 16).ok()?,
                    u64::from_str_radix(hi, 16).ok()?,
                );
                let off = u64::from_str_radix(f.nth(1)?, 16).ok()?;
                (lo <= me && me < hi).then_some((lo, off))
            })
            .unwrap();
        let bias = bias(data, start, offset).unwrap();
        let sym = syms.find(me - bias).expect("this function has a symbol");
        assert!(sym.name.contains("reads_this_test_binary"), "{}", sym.name);
        assert!(dwarf(data).is_some());
    }

    #[test]
    fn garbage_has_no_facts() {
        let junk: &'static [u8] = b"\x7fELF this is not really an ELF file at all";
        assert!(build_id(junk).is_none());
        assert!(debuglink(junk).is_none());
        assert!(!has_dwarf(junk));
        assert!(bias(junk, 0x1000, 0).is_none());
        assert!(Symbols::of(junk).find(0x10).is_none());
        assert!(dwarf(junk).is_none());
    }
}
