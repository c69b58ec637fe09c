//! The dynamic symbols of an ELF file: what the injector needs to find functions (`dlopen`,
//! `_PyEval_EvalFrameDefault`) and data (`_PyRuntime`) in the target without debug info.

use object::elf::PT_LOAD;
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Endianness, Object, ObjectSymbol};
use std::collections::HashMap;
use std::io;

/// A defined dynamic symbol: its address relative to the load bias, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sym {
    pub value: u64,
    pub size: u64,
}

/// The defined dynamic symbols of one ELF file and where its first segment lies.
pub struct Elf {
    symbols: HashMap<String, Sym>,
    /// `p_vaddr` of the lowest PT_LOAD, page-aligned down: the load bias is the address of the
    /// mapping at file offset 0 minus this.
    pub first_vaddr: u64,
    /// File offset and size of the first PT_LOAD (ELF header, symbol tables, read-only data).
    pub first_segment: (u64, u64),
}

impl Elf {
    /// Parses an ELF image: in memory, or a file read as needed (`mapped_file::Reader`).
    pub fn parse<'data, R: object::ReadRef<'data>>(data: R) -> io::Result<Elf> {
        let invalid = |e: object::Error| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        let file = ElfFile64::<Endianness, R>::parse(data).map_err(invalid)?;
        let endian = file.endian();
        let loads = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == PT_LOAD);
        let first = loads
            .min_by_key(|ph| ph.p_vaddr(endian))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no PT_LOAD segment"))?;
        let mut symbols = HashMap::new();
        for sym in file.dynamic_symbols() {
            if sym.is_undefined() {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            // Versioned duplicates (dlopen@GLIBC_2.2.5, dlopen@@GLIBC_2.34) share an address;
            // the first one seen is as good as any.
            symbols.entry(name.to_string()).or_insert(Sym {
                value: sym.address(),
                size: sym.size(),
            });
        }
        Ok(Elf {
            symbols,
            first_vaddr: first.p_vaddr(endian) & !0xfff,
            first_segment: (first.p_offset(endian), first.p_filesz(endian)),
        })
    }

    /// A defined dynamic symbol.
    pub fn symbol(&self, name: &str) -> Option<Sym> {
        self.symbols.get(name).copied()
    }

    /// Every defined dynamic symbol whose name starts with `prefix`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, Sym)> {
        self.symbols
            .iter()
            .filter(move |(name, _)| name.starts_with(prefix))
            .map(|(name, sym)| (name.as_str(), *sym))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_agent_entry_point_in_the_embedded_image() {
        let elf = Elf::parse(crate::agent::AGENT_SO).unwrap();
        let start = elf.symbol("mprof_agent_start").expect("exported");
        assert!(start.value > 0 && start.size > 0);
        assert!(
            elf.symbol("malloc").is_none(),
            "undefined symbols are not listed"
        );
        assert_eq!(elf.first_vaddr, 0);
        assert!(elf.first_segment.1 > 0);
    }
}
