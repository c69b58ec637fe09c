//! The target's modules as the capture describes them so far: which module holds an address.
//! A MODULE record applies to the samples after it; one whose ranges overlap an earlier
//! module's takes their place (the old object was unloaded, another one loaded there).

use mprof_common::record::Module;
use std::collections::BTreeMap;

/// Most modules a capture may describe; later ones are ignored (each costs capture bytes, so
/// a real capture stays far below).
pub const MAX_MODULES: usize = 1 << 16;

/// Modules and their executable ranges.
#[derive(Default)]
pub struct ModuleMap {
    modules: Vec<Module>,
    /// start → (end, module index); the ranges never overlap.
    ranges: BTreeMap<u64, (u64, u32)>,
}

impl ModuleMap {
    /// Adds a module, replacing whatever its ranges overlap. Returns false if it was ignored
    /// (too many modules, or no usable range).
    pub fn add(&mut self, module: Module) -> bool {
        let usable: Vec<_> = module.ranges.iter().filter(|r| r.start < r.end).collect();
        if self.modules.len() >= MAX_MODULES || usable.is_empty() {
            return false;
        }
        let index = self.modules.len() as u32;
        for r in usable {
            let overlapping: Vec<u64> = self
                .ranges
                .range(..r.end)
                .rev()
                .take_while(|(_, (end, _))| *end > r.start)
                .map(|(start, _)| *start)
                .collect();
            for start in overlapping {
                self.ranges.remove(&start);
            }
            self.ranges.insert(r.start, (r.end, index));
        }
        self.modules.push(module);
        true
    }

    /// The module holding `addr`, with its index (indices are never reused).
    pub fn find(&self, addr: u64) -> Option<(u32, &Module)> {
        let (_, &(end, index)) = self.ranges.range(..=addr).next_back()?;
        (addr < end).then(|| (index, &self.modules[index as usize]))
    }

    /// The module with index `index`.
    pub fn get(&self, index: u32) -> &Module {
        &self.modules[index as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mprof_common::record::ModuleRange;

    fn module(path: &str, ranges: &[(u64, u64)]) -> Module {
        Module {
            path: path.into(),
            ranges: ranges
                .iter()
                .map(|&(start, end)| ModuleRange {
                    start,
                    end,
                    offset: 0,
                })
                .collect(),
            ..Module::default()
        }
    }

    #[test]
    fn later_modules_replace_what_they_overlap() {
        let mut map = ModuleMap::default();
        assert!(map.add(module("a", &[(0x1000, 0x2000), (0x5000, 0x6000)])));
        assert!(map.add(module("b", &[(0x3000, 0x4000)])));
        assert_eq!(map.find(0x1800).unwrap().1.path, "a");
        assert_eq!(map.find(0x5fff).unwrap().1.path, "a");
        assert!(map.find(0x2000).is_none() && map.find(0x0fff).is_none());
        assert!(map.add(module("c", &[(0x1800, 0x3800)])));
        assert!(map.find(0x1000).is_none(), "a's first range is gone");
        assert_eq!(map.find(0x3700).unwrap().1.path, "c");
        assert!(map.find(0x3900).is_none(), "b overlapped c: gone too");
        assert_eq!(map.find(0x5000).unwrap().1.path, "a");
        assert!(!map.add(module("empty", &[(0x9000, 0x9000), (0xa000, 0x1)])));
    }
}
