//! From a sample's native return addresses to frames of the stack trie: each address is looked
//! up in the module map of the moment, symbolized once per (module, address) and interned as
//! frames; then merged with the sample's Python frames ([`crate::analysis::symbols::merge`]).
//!
//! The memo of symbolized addresses grows with the distinct addresses of the capture (each
//! costs eight bytes in it), and is cleared beyond [`MAX_MEMO`] entries; a report over a
//! million samples symbolizes each distinct address once and streams.

use super::{FastMap, Names};
use crate::analysis::symbols::map::ModuleMap;
use crate::analysis::symbols::merge::{merge, Native};
use crate::analysis::symbols::symbolizer::{Class, Symbolizer};
use mprof_common::record::{Module, NativeStack};

/// Distinct (module, address) pairs remembered at most.
const MAX_MEMO: usize = 1 << 20;
/// The module of addresses that no MODULE record covers.
pub const UNKNOWN_MODULE: &str = "[unknown]";

/// Resolves native stacks against the capture's modules.
pub(crate) struct NativeResolver {
    map: ModuleMap,
    symbolizer: Symbolizer,
    /// (module index, or u32::MAX for none; address) → index in `addrs`.
    memo: FastMap<(u32, u64), u32>,
    /// Per resolved address: its frames (a range of `ids`) and class.
    addrs: Vec<(u32, u32, Class)>,
    ids: Vec<u32>,
    /// Whether interpreter frames (and the other hidden ones) are kept.
    pub show_internal: bool,
    /// Bumped whenever addresses may change meaning (a module record): memos of whole stacks
    /// built on the old meaning must be dropped.
    pub generation: u64,
}

impl NativeResolver {
    pub fn new(show_internal: bool) -> NativeResolver {
        NativeResolver {
            map: ModuleMap::default(),
            symbolizer: Symbolizer::default(),
            memo: FastMap::default(),
            addrs: Vec::new(),
            ids: Vec::new(),
            show_internal,
            generation: 0,
        }
    }

    /// A MODULE record: addresses in its ranges belong to it from now on.
    pub fn add_module(&mut self, module: Module) {
        if self.map.add(module) {
            self.generation += 1;
        }
    }

    /// Memory held for debug information, not counted against the capture's allowance.
    pub fn held(&self) -> isize {
        self.symbolizer.held()
    }

    /// Distinct addresses symbolized and remembered, and modules loaded.
    #[cfg(test)]
    pub fn cached(&self) -> (usize, usize) {
        (self.memo.len(), self.symbolizer.modules())
    }

    /// Warnings about modules that could not be symbolized.
    pub fn warnings(&self) -> &[String] {
        self.symbolizer.warnings()
    }

    /// The merged stack of a sample, innermost first, as frame ids of `names`.
    pub fn stack(&mut self, names: &mut Names, python: &[u32], native: &NativeStack) -> Vec<u32> {
        if self.memo.len() > MAX_MEMO {
            self.memo = FastMap::default();
            self.addrs = Vec::new();
            self.ids = Vec::new();
        }
        let resolved: Vec<u32> = native
            .addrs
            .iter()
            .map(|&addr| self.resolve(names, addr))
            .collect();
        let natives: Vec<Native> = resolved
            .iter()
            .map(|&i| {
                let (start, len, class) = self.addrs[i as usize];
                Native {
                    frames: &self.ids[start as usize..(start + len) as usize],
                    class,
                }
            })
            .collect();
        merge(python, native, &natives, self.show_internal)
    }

    /// The index in `addrs` of `addr`, symbolized and interned the first time.
    fn resolve(&mut self, names: &mut Names, addr: u64) -> u32 {
        let found = self.map.find(addr).map(|(i, _)| i);
        let key = (found.unwrap_or(u32::MAX), addr);
        if let Some(&i) = self.memo.get(&key) {
            return i;
        }
        let start = self.ids.len() as u32;
        let class = match found {
            Some(index) => {
                let module = self.map.get(index);
                let sym = self.symbolizer.symbolize(module, addr);
                for f in &sym.frames {
                    if f.interpreter && !self.show_internal {
                        continue;
                    }
                    let file = f.file.as_deref().unwrap_or(&module.path);
                    let id = names.native_frame(&f.function, file, f.line, &module.path);
                    self.ids.push(id);
                }
                sym.class
            }
            None => {
                let name = format!("{addr:#x}");
                let id = names.native_frame(&name, UNKNOWN_MODULE, 0, UNKNOWN_MODULE);
                self.ids.push(id);
                Class::Other
            }
        };
        let index = self.addrs.len() as u32;
        self.addrs
            .push((start, self.ids.len() as u32 - start, class));
        self.memo.insert(key, index);
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::symbols::tracker::ModuleTracker;
    use mprof_common::record::Record;

    #[inline(never)]
    fn one() -> u64 {
        one as *const () as u64 + 1
    }

    #[inline(never)]
    fn two() -> u64 {
        two as *const () as u64 + 1
    }

    /// This process's modules, as `record --native` describes them.
    fn modules(addrs: &[u64]) -> Vec<Module> {
        ModuleTracker::new(std::process::id())
            .before_sample(addrs)
            .into_iter()
            .filter_map(|r| match r {
                Record::Module(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn symbols_are_cached_per_build_id_and_address_not_per_sample() {
        let (a, b) = (one(), two());
        let mut names = Names::new();
        let mut r = NativeResolver::new(false);
        let all = modules(&[a, b]);
        let n = all.len();
        // Each module described twice (a rescan): the same build ids, loaded once.
        for m in all.iter().chain(&all) {
            r.add_module(m.clone());
        }
        let stack = |r: &mut NativeResolver, names: &mut Names, i: u64| {
            let native = NativeStack {
                addrs: vec![a, b, a + i % 8],
                entries: vec![],
            };
            r.stack(names, &[], &native)
        };
        let first = stack(&mut r, &mut names, 0);
        let loc = names.location(first[0]);
        assert!(loc.function.ends_with("one"), "{loc:?}");
        assert!(loc.module.is_some_and(|m| !m.is_empty()));
        let before = crate::base::memory::in_use();
        for i in 0..200_000 {
            stack(&mut r, &mut names, i);
        }
        let grown = crate::base::memory::in_use() - before;
        let (addresses, loaded) = r.cached();
        assert!(addresses <= 9, "{addresses} addresses remembered");
        assert!(loaded <= n, "{loaded} modules loaded for {n} build ids");
        assert!(grown < 64 << 10, "{grown} bytes for 200,000 samples");
    }
}
