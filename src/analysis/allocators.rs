//! Which allocator the bytes came from: CPython's allocators (`python`, the PEP 445 domains),
//! the C allocator family (`native`: `malloc`, `calloc`, `realloc`, `posix_memalign`…) or
//! anonymous memory mappings (`mmap`, `mremap`).
//!
//! The agent names the allocator in each ALLOC record's flags
//! ([`Allocator::of_flags`]); the aggregation keeps it as part of the stack (each allocator has
//! its own root in the trie, see [`crate::analysis::names`]), so every estimate can be split by
//! allocator ([`ByAllocator`]) and a view can keep only some of them ([`Allocators`], the
//! `--allocator` option).

pub use mprof_common::record::Allocator;

use crate::analysis::estimate::{Estimate, Figures, View};
use crate::base::units::human_bytes;

/// The meta key that says whether the agent hooked the C allocator family (`on`, or `off`
/// under `--python-only`).
pub const NATIVE_META: &str = "native";

/// The index of an allocator in per-allocator arrays (its wire value: 0, 1, 2).
pub fn index(a: Allocator) -> usize {
    a as usize
}

/// A set of allocators: which ones a view keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allocators(u8);

impl Default for Allocators {
    fn default() -> Allocators {
        Allocators::ALL
    }
}

impl Allocators {
    /// Every allocator (no filter).
    pub const ALL: Allocators = Allocators(0b111);

    /// The set of the allocators in `list`; an empty list means all of them.
    pub fn of(list: &[Allocator]) -> Allocators {
        match list {
            [] => Allocators::ALL,
            _ => Allocators(list.iter().fold(0, |m, &a| m | 1 << index(a))),
        }
    }

    /// Whether `a` is in the set.
    pub fn contains(self, a: Allocator) -> bool {
        self.0 & (1 << index(a)) != 0
    }

    /// Whether the set holds every allocator.
    pub fn is_all(self) -> bool {
        self == Allocators::ALL
    }

    /// The allocators in the set, in the order views list them.
    pub fn iter(self) -> impl Iterator<Item = Allocator> {
        Allocator::ALL
            .into_iter()
            .filter(move |&a| self.contains(a))
    }

    /// `native and mmap`, as titles say which allocators a view keeps.
    pub fn names(self) -> String {
        let names: Vec<&str> = self.iter().map(Allocator::name).collect();
        match names.as_slice() {
            [] => "none".to_owned(),
            [one] => (*one).to_owned(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        }
    }

    /// `""` for every allocator, else `", native only"` (for titles).
    pub fn suffix(self) -> String {
        if self.is_all() {
            String::new()
        } else {
            format!(", {} only", self.names())
        }
    }
}

/// The allocator named `text` (`python`, `native` or `mmap`), for the `--allocator` option.
pub fn parse(text: &str) -> Result<Allocator, String> {
    Allocator::ALL
        .into_iter()
        .find(|a| a.name() == text.trim())
        .ok_or_else(|| format!("`{text}` is not an allocator: python, native or mmap"))
}

/// Figures split by allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ByAllocator(pub [Figures; 3]);

impl ByAllocator {
    /// The figures of one allocator.
    pub fn get(&self, a: Allocator) -> &Figures {
        &self.0[index(a)]
    }

    /// Adds figures of allocator `a`.
    pub fn add(&mut self, a: Allocator, f: &Figures) {
        self.0[index(a)].merge(f);
    }

    /// Adds another split (of disjoint samples).
    pub fn merge(&mut self, other: &ByAllocator) {
        for a in Allocator::ALL {
            self.add(a, other.get(a));
        }
    }

    /// The allocators with at least one sample, with their figures.
    pub fn present(&self) -> impl Iterator<Item = (Allocator, &Figures)> + '_ {
        Allocator::ALL
            .into_iter()
            .map(|a| (a, self.get(a)))
            .filter(|(_, f)| f.sampled())
    }

    /// The estimates of one view, per allocator.
    pub fn view(&self, view: View) -> [(Allocator, Estimate); 3] {
        Allocator::ALL.map(|a| (a, *self.get(a).get(view)))
    }

    /// What marks a row in text views: nothing when all of the view's bytes are Python's,
    /// `[native]` (or `[mmap]`) when they all come from one other allocator, and the shares,
    /// largest first, when they come from several (`[native 80%, python 20%]`).
    pub fn tag(&self, view: View) -> String {
        let parts = self.view(view).map(|(a, e)| (a, e.bytes));
        match shares(&parts).as_str() {
            "" => String::new(),
            shares => format!("[{shares}]"),
        }
    }
}

/// How allocators share some bytes, largest first: `native 80%, python 20%` (a share under
/// 1% is `<1%`), `native` alone when one allocator has them all, and nothing when that is
/// Python (views mark only what is not Python's).
pub fn shares(bytes: &[(Allocator, f64); 3]) -> String {
    let mut with_bytes: Vec<(Allocator, f64)> = bytes
        .iter()
        .filter(|(_, b)| b.round() > 0.0)
        .copied()
        .collect();
    let total: f64 = with_bytes.iter().map(|(_, b)| b).sum();
    with_bytes.sort_by(|a, b| b.1.total_cmp(&a.1));
    match with_bytes.as_slice() {
        [] | [(Allocator::Python, _)] => String::new(),
        [(a, _)] => a.name().to_owned(),
        several => several
            .iter()
            .map(|(a, b)| match 100.0 * b / total {
                p if p < 0.5 => format!("{} <1%", a.name()),
                p => format!("{} {p:.0}%", a.name()),
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// `python 20.00 MiB, native 95.00 MiB, mmap 5.00 MiB`: one view's bytes per allocator in
/// `keep`.
pub fn split_text(split: &ByAllocator, view: View, keep: Allocators) -> String {
    keep.iter()
        .map(|a| format!("{} {}", a.name(), human_bytes(split.get(a).get(view).bytes)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::estimate::Sample;

    fn figures(bytes: u64) -> Figures {
        let mut f = Figures::default();
        f.allocated.add(&Sample::new(bytes, 1));
        f.live.add(&Sample::new(bytes, 1));
        f
    }

    #[test]
    fn sets_parse_and_name_themselves() {
        assert_eq!(parse("native"), Ok(Allocator::Native));
        assert!(parse("malloc")
            .unwrap_err()
            .contains("python, native or mmap"));
        let set = Allocators::of(&[Allocator::Mmap, Allocator::Native]);
        assert!(set.contains(Allocator::Native) && !set.contains(Allocator::Python));
        assert_eq!(set.names(), "native and mmap");
        assert_eq!(set.suffix(), ", native and mmap only");
        assert_eq!(Allocators::of(&[]), Allocators::ALL);
        assert_eq!(Allocators::ALL.suffix(), "");
        assert_eq!(Allocators::ALL.names(), "python, native and mmap");
    }

    #[test]
    fn tags_name_what_is_not_python() {
        let mut split = ByAllocator::default();
        split.add(Allocator::Python, &figures(100));
        assert_eq!(split.tag(View::Live), "");
        split.add(Allocator::Native, &figures(300));
        assert_eq!(split.tag(View::Live), "[native 75%, python 25%]");
        assert_eq!(split.tag(View::Peak), "", "no bytes at the peak");
        let mut native = ByAllocator::default();
        native.add(Allocator::Mmap, &figures(10));
        assert_eq!(native.tag(View::Allocated), "[mmap]");
        assert_eq!(
            split_text(&split, View::Live, Allocators::ALL),
            "python 100 B, native 300 B, mmap 0 B"
        );
        assert_eq!(split.present().count(), 2);
        let tiny = [
            (Allocator::Python, 4.0),
            (Allocator::Native, 996.0),
            (Allocator::Mmap, 0.0),
        ];
        assert_eq!(shares(&tiny), "native 100%, python <1%");
    }
}
