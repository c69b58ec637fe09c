//! Tests of the aggregation, on records built in memory.

use super::*;
use crate::analysis::aggregate::Aggregator;
use crate::capture::testing::{code, meta};
use mprof_common::record::ALLOC_TRUNCATED;

/// A sample by thread 1, timed by its address (so later samples are later).
fn alloc(addr: u64, size: u64, frames: &[(u64, u32)]) -> Record {
    crate::capture::testing::alloc(1, addr, size, addr, frames)
}

/// (function, line of the innermost frame) → figures, for easy assertions.
fn by_innermost(p: &Profile) -> BTreeMap<(String, u32), Figures> {
    let mut out: BTreeMap<(String, u32), Figures> = BTreeMap::new();
    for (id, f) in p.stacks() {
        let loc = p.innermost(id);
        out.entry((loc.function.to_owned(), loc.line))
            .or_default()
            .merge(f);
    }
    out
}

#[test]
fn rate_one_is_exact() {
    let p = Profile::from_records(&[
        meta("rate=1\n"),
        code(0x10, "a.py", "f", 1),
        alloc(100, 1000, &[(0x10, 2)]),
        alloc(200, 24, &[(0x10, 3)]),
        Record::Free { addr: 100 },
    ]);
    let t = p.totals();
    assert_eq!(t.allocated.bytes, 1024.0);
    assert_eq!(t.allocated.count, 2.0);
    assert_eq!(t.allocated.stderr(), 0.0);
    assert_eq!(t.live.bytes, 24.0);
    assert_eq!(t.peak.bytes, 1024.0);
    assert_eq!(p.samples, 2);
    assert!(p.rate_known);
}

#[test]
fn sampled_weights_follow_the_inclusion_probability() {
    let rate = 1000u64;
    let p = Profile::from_records(&[
        meta(&format!("rate={rate}")),
        code(0x10, "a.py", "f", 1),
        alloc(100, 500, &[(0x10, 2)]),
    ]);
    let prob = 1.0 - (-0.5f64).exp();
    let w = 500.0 / prob;
    let t = p.totals();
    assert!((t.allocated.bytes - w).abs() < 1e-9);
    assert!((t.allocated.count - 1.0 / prob).abs() < 1e-12);
    assert!((t.allocated.variance - (1.0 - prob) * w * w).abs() < 1e-6);
    // A block far larger than the rate is certain to be sampled: it stands for itself.
    let big = Sample::new(1 << 30, rate);
    assert_eq!(big.bytes, (1u64 << 30) as f64);
    assert_eq!(big.variance, 0.0);
}

#[test]
fn estimator_is_unbiased_over_many_simulated_samplings() {
    // Simulate Poisson sampling of a known heap with a small deterministic RNG and check
    // the estimate lands within a few standard errors of the truth.
    let rate = 4096u64;
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut records = vec![meta(&format!("rate={rate}")), code(1, "a.py", "f", 1)];
    let mut truth = 0u64;
    for i in 0..200_000u64 {
        let size = 16 + (i * 37) % 2000;
        truth += size;
        if uniform() < 1.0 - (-(size as f64) / rate as f64).exp() {
            records.push(alloc(i + 1, size, &[(1, 1)]));
        }
    }
    let t = Profile::from_records(&records).totals().allocated;
    let err = (t.bytes - truth as f64).abs();
    assert!(err < 4.0 * t.stderr(), "err {err} stderr {}", t.stderr());
    assert!(t.stderr() / t.bytes < 0.01);
}

#[test]
fn realloc_moves_the_block_and_unknown_frees_are_ignored() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(0x10, "a.py", "f", 1),
        alloc(100, 100, &[(0x10, 2)]),
        Record::Free { addr: 999 },
        Record::Free { addr: 100 },
        alloc(300, 400, &[(0x10, 5)]),
    ]);
    let rows = by_innermost(&p);
    assert_eq!(rows[&("f".into(), 2)].allocated.bytes, 100.0);
    assert_eq!(rows[&("f".into(), 2)].live.bytes, 0.0);
    assert_eq!(rows[&("f".into(), 5)].live.bytes, 400.0);
    assert_eq!(p.totals().allocated.bytes, 500.0);
    assert_eq!(p.totals().live.bytes, 400.0);
    assert_eq!(p.totals().peak.bytes, 400.0);
}

#[test]
fn an_alloc_at_a_live_address_replaces_the_old_block() {
    let p = Profile::from_records(&[meta("rate=1"), alloc(100, 100, &[]), alloc(100, 30, &[])]);
    assert_eq!(p.totals().allocated.bytes, 130.0);
    assert_eq!(p.totals().live.bytes, 30.0);
    assert_eq!(p.totals().peak.bytes, 100.0);
}

#[test]
fn code_address_reuse_applies_to_later_allocations_only() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(0x10, "a.py", "old", 1),
        alloc(1, 10, &[(0x10, 2)]),
        code(0x10, "b.py", "new", 7),
        alloc(2, 20, &[(0x10, 2)]),
    ]);
    let rows = by_innermost(&p);
    assert_eq!(rows[&("old".into(), 2)].allocated.bytes, 10.0);
    assert_eq!(rows[&("new".into(), 2)].allocated.bytes, 20.0);
    let new = p
        .stacks()
        .map(|(id, _)| p.innermost(id))
        .find(|l| l.function == "new")
        .unwrap();
    assert_eq!((new.file, new.firstline), ("b.py", 7));
}

#[test]
fn unannounced_code_is_unknown_until_announced() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        alloc(1, 10, &[(0x20, 3)]),
        code(0x20, "a.py", "g", 1),
        alloc(2, 20, &[(0x20, 3)]),
    ]);
    let rows = by_innermost(&p);
    assert_eq!(rows[&(UNKNOWN.into(), 3)].allocated.bytes, 10.0);
    assert_eq!(rows[&("g".into(), 3)].allocated.bytes, 20.0);
}

#[test]
fn empty_stacks_get_the_pseudo_frame() {
    let p = Profile::from_records(&[meta("rate=1"), alloc(1, 64, &[])]);
    let (id, f) = p.stacks().next().unwrap();
    assert_eq!(p.innermost(id).file, NO_PYTHON_FRAME);
    assert_eq!(p.frames(id).count(), 1);
    assert_eq!(f.allocated.bytes, 64.0);
}

#[test]
fn truncated_stacks_start_at_a_pseudo_frame() {
    let mut cut = alloc(2, 8, &[(1, 5)]);
    if let Record::Alloc { flags, .. } = &mut cut {
        *flags = ALLOC_TRUNCATED;
    }
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a.py", "f", 1),
        alloc(1, 8, &[(1, 5)]),
        cut,
    ]);
    let stacks: Vec<Vec<_>> = p
        .stacks()
        .map(|(id, _)| p.frames(id).map(|l| l.to_string()).collect())
        .collect();
    assert_eq!(stacks, [vec!["f (a.py:5)"], vec!["f (a.py:5)", TRUNCATED]]);
}

#[test]
fn stacks_are_interned_and_listed_innermost_first() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "m.py", "<module>", 1),
        code(2, "m.py", "main", 10),
        code(3, "m.py", "leaf", 20),
        alloc(1, 8, &[(3, 21), (2, 11), (1, 30)]),
        alloc(2, 8, &[(3, 21), (2, 11), (1, 30)]),
        alloc(3, 8, &[(2, 12), (1, 30)]),
    ]);
    assert_eq!(p.stacks().count(), 2);
    let (id, f) = p.stacks().next().unwrap();
    assert_eq!(f.allocated.samples, 2);
    let names: Vec<_> = p.frames(id).map(|l| (l.function, l.line)).collect();
    assert_eq!(names, [("leaf", 21), ("main", 11), ("<module>", 30)]);
}

#[test]
fn peak_is_the_per_stack_live_heap_at_the_highest_total() {
    // a: 100 live, then b: 300 live (total 400 = peak), free b, c: 250 (total 350).
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a.py", "f", 1),
        alloc(1, 100, &[(1, 2)]),
        alloc(2, 300, &[(1, 3)]),
        Record::Free { addr: 2 },
        alloc(3, 250, &[(1, 4)]),
    ]);
    let rows = by_innermost(&p);
    assert_eq!(rows[&("f".into(), 2)].peak.bytes, 100.0);
    assert_eq!(rows[&("f".into(), 3)].peak.bytes, 300.0);
    assert_eq!(rows[&("f".into(), 4)].peak.bytes, 0.0);
    assert_eq!(rows[&("f".into(), 4)].live.bytes, 250.0);
    assert_eq!(p.totals().peak.bytes, 400.0);
    assert_eq!(p.totals().peak.samples, 2);
    assert_eq!(p.totals().live.bytes, 350.0);
    assert_eq!(p.peak_seconds, Some(1e-9)); // time_ns = addr in these records
}

#[test]
fn the_first_peak_wins_a_tie() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a.py", "f", 1),
        alloc(1, 100, &[(1, 2)]),
        Record::Free { addr: 1 },
        alloc(2, 100, &[(1, 3)]),
    ]);
    let rows = by_innermost(&p);
    assert_eq!(rows[&("f".into(), 2)].peak.bytes, 100.0);
    assert_eq!(rows[&("f".into(), 3)].peak.bytes, 0.0);
}

#[test]
fn meta_is_merged_and_rate_changes_apply_forward() {
    let p = Profile::from_records(&[
        meta("mode=record\nrate=1\npid=42"),
        alloc(1, 100, &[]),
        meta("rate=1000\npython=3.12.1"),
        alloc(2, 100, &[]),
        Record::Stats {
            samples: 2,
            dropped: 3,
        },
        Record::Stats {
            samples: 2,
            dropped: 5,
        },
    ]);
    assert_eq!(p.rate, 1000);
    assert_eq!(p.meta["pid"], "42");
    assert_eq!(p.meta["python"], "3.12.1");
    assert_eq!(p.dropped, 5);
    let sampled = Sample::new(100, 1000).bytes;
    assert!((p.totals().allocated.bytes - (100.0 + sampled)).abs() < 1e-9);
    assert!((p.totals().peak.bytes - (100.0 + sampled)).abs() < 1e-9);
}

/// The peak RSS is the highest reading, or the kernel's high-water mark from the metadata
/// (`max_rss`, written by `record`) when that is higher; a value that is not a number is
/// ignored.
#[test]
fn peak_rss_takes_the_high_water_mark_when_it_is_higher() {
    let rss = |rss_bytes| Record::Rss {
        time_ns: 1,
        rss_bytes,
    };
    let p = Profile::from_records(&[meta("rate=1"), rss(10 << 20), rss(30 << 20)]);
    assert_eq!(p.max_rss, Some(30 << 20));
    let p = Profile::from_records(&[rss(30 << 20), meta("max_rss=52428800")]);
    assert_eq!(p.max_rss, Some(50 << 20));
    assert_eq!(p.processes[0].figures.max_rss, Some(50 << 20));
    let p = Profile::from_records(&[rss(30 << 20), meta("max_rss=1048576")]);
    assert_eq!(p.max_rss, Some(30 << 20));
    let p = Profile::from_records(&[rss(30 << 20), meta("max_rss=lots")]);
    assert_eq!(p.max_rss, Some(30 << 20));
    let p = Profile::from_records(&[meta("max_rss=1048576")]);
    assert_eq!(p.max_rss, Some(1 << 20));
}

#[test]
fn a_capture_without_rate_or_records_is_fine() {
    let p = Profile::from_records(&[alloc(1, 10, &[])]);
    assert!(!p.rate_known);
    assert_eq!(p.rate, 1);
    assert_eq!(p.totals().allocated.bytes, 10.0);
    let empty = Profile::from_records(&[]);
    assert_eq!(empty.samples, 0);
    assert_eq!(empty.stacks().count(), 0);
    assert_eq!(empty.totals().peak.bytes, 0.0);
    assert_eq!(empty.peak_seconds, None);
}

#[test]
fn random_record_streams_keep_the_invariants() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for round in 0..50 {
        let mut records = vec![meta(&format!("rate={}", [1, 64, 4096][round % 3]))];
        for _ in 0..2000 {
            let r = match next(10) {
                0 => code(next(8), &format!("f{}.py", next(3)), "g", next(5) as u32),
                1..=5 => {
                    let depth = next(4) as usize;
                    let frames: Vec<(u64, u32)> =
                        (0..depth).map(|_| (next(10), next(4) as u32)).collect();
                    alloc(next(64), next(10_000), &frames)
                }
                6 if round % 5 == 0 => meta(&format!("rate={}", 1 + next(9000))),
                _ => Record::Free { addr: next(80) },
            };
            records.push(r);
        }
        let p = Profile::from_records(&records);
        let mut sum = Figures::default();
        for (_, f) in p.stacks() {
            sum.merge(f);
            assert!(f.live.bytes <= f.allocated.bytes + 1e-6);
            assert!(f.peak.samples <= f.allocated.samples);
        }
        let t = p.totals();
        for v in View::ALL {
            assert!((sum.get(v).bytes - t.get(v).bytes).abs() < 1e-6);
            assert_eq!(sum.get(v).samples, t.get(v).samples);
            assert!(t.get(v).stderr().is_finite());
        }
        assert!(t.peak.bytes >= t.live.bytes * (1.0 - 1e-12));
        assert!(t.allocated.bytes >= t.peak.bytes * (1.0 - 1e-12));
    }
}

#[test]
fn zero_byte_blocks_stand_for_nothing() {
    let p = Profile::from_records(&[meta("rate=4096"), alloc(1, 0, &[])]);
    assert_eq!(p.totals().allocated.bytes, 0.0);
    assert_eq!(p.totals().allocated.samples, 1);
    assert!(p.totals().allocated.bytes.is_finite());
}

/// A sample by thread 1 of a block from `a`, timed by its address.
fn alloc_from(a: Allocator, addr: u64, size: u64, frames: &[(u64, u32)]) -> Record {
    crate::capture::testing::alloc_from(a, 1, addr, size, addr, frames)
}

/// The same Python line makes a Python object, mallocs and maps memory; a thread with no
/// Python frame mallocs; an address freed by one allocator is reused by another.
fn mixed(rate: u64) -> Vec<Record> {
    use Allocator::{Mmap, Native, Python};
    vec![
        meta(&format!("rate={rate}\nnative=on\n")),
        code(0x10, "a.py", "f", 1),
        alloc_from(Python, 1, 100, &[(0x10, 2)]),
        alloc_from(Native, 2, 1000, &[(0x10, 2)]),
        alloc_from(Mmap, 3, 8192, &[(0x10, 2)]),
        alloc_from(Native, 4, 50, &[]),
        Record::Free { addr: 2 },
        alloc_from(Python, 2, 30, &[(0x10, 3)]),
        Record::Free { addr: 3 },
        alloc_from(Native, 5, 7, &[(0x10, 3)]),
    ]
}

#[test]
fn figures_are_split_by_allocator_and_add_up() {
    let p = Profile::from_records(&mixed(1));
    let by = p.by_allocator();
    let bytes = |a: Allocator, v: View| by.get(a).get(v).bytes;
    assert_eq!(bytes(Allocator::Python, View::Allocated), 130.0);
    assert_eq!(bytes(Allocator::Native, View::Allocated), 1057.0);
    assert_eq!(bytes(Allocator::Mmap, View::Allocated), 8192.0);
    assert_eq!(bytes(Allocator::Python, View::Live), 130.0);
    assert_eq!(bytes(Allocator::Native, View::Live), 57.0);
    assert_eq!(bytes(Allocator::Mmap, View::Live), 0.0);
    // The peak is after the mapping and the no-frame malloc: 100 + 1000 + 8192 + 50.
    assert_eq!(p.totals().peak.bytes, 9342.0);
    assert_eq!(bytes(Allocator::Native, View::Peak), 1050.0);
    assert_eq!(bytes(Allocator::Mmap, View::Peak), 8192.0);
    for v in View::ALL {
        let sum: f64 = Allocator::ALL.iter().map(|&a| bytes(a, v)).sum();
        assert_eq!(sum, p.totals().get(v).bytes, "{v:?}");
    }
    // One Python line, three stacks: one per allocator, with the same frames.
    let line2: Vec<_> = p
        .stacks()
        .filter(|(id, _)| p.innermost(*id).line == 2)
        .map(|(id, f)| (p.allocator(id), f.allocated.bytes, p.frames(id).count()))
        .collect();
    assert_eq!(
        line2,
        [
            (Allocator::Python, 100.0, 1),
            (Allocator::Native, 1000.0, 1),
            (Allocator::Mmap, 8192.0, 1)
        ]
    );
    let no_frame: Vec<_> = p
        .stacks()
        .filter(|(id, _)| p.innermost(*id).file == NO_PYTHON_FRAME)
        .map(|(id, _)| p.allocator(id))
        .collect();
    assert_eq!(no_frame, [Allocator::Native]);
    assert_eq!(p.native_recorded(), Some(true));
}

#[test]
fn sampled_split_keeps_each_allocators_estimate_and_error() {
    let (all, python) = (Profile::from_records(&mixed(4096)), {
        let records: Vec<Record> = mixed(4096)
            .into_iter()
            .filter(|r| match r {
                Record::Alloc { flags, .. } => Allocator::of_flags(*flags) == Allocator::Python,
                _ => true,
            })
            .collect();
        Profile::from_records(&records)
    });
    let split = all.by_allocator().get(Allocator::Python).allocated;
    assert_eq!(split, python.totals().allocated);
    assert!(split.stderr() > 0.0);
    let sum: f64 = Allocator::ALL
        .iter()
        .map(|&a| all.by_allocator().get(a).allocated.variance)
        .sum();
    assert!((sum - all.totals().allocated.variance).abs() < 1e-6 * sum);
}

#[test]
fn selecting_allocators_leaves_the_others_out() {
    let mut p = Profile::from_records(&mixed(1));
    let peak = p.totals().peak.bytes;
    p.select(Allocators::of(&[Allocator::Native]));
    assert_eq!(p.totals().allocated.bytes, 1057.0);
    assert_eq!(p.totals().live.bytes, 57.0);
    assert_eq!(
        p.totals().peak.bytes,
        1050.0,
        "the native share of the peak"
    );
    assert!(p.totals().peak.bytes < peak);
    assert!(p
        .stacks()
        .all(|(id, _)| p.allocator(id) == Allocator::Native));
    assert!(p
        .sites()
        .iter()
        .all(|((id, _), _)| p.allocator(*id) == Allocator::Native));
    assert_eq!(p.by_allocator().get(Allocator::Python).allocated.samples, 0);
    assert_eq!(p.selection().names(), "native");
}

#[test]
fn old_captures_are_all_python_and_do_not_say_about_native() {
    let p = Profile::from_records(&[
        meta("rate=1\n"),
        code(0x10, "a.py", "f", 1),
        alloc(1, 10, &[(0x10, 2)]),
    ]);
    assert_eq!(
        p.by_allocator().get(Allocator::Python).allocated.bytes,
        10.0
    );
    assert_eq!(p.native_recorded(), None);
    let off = Profile::from_records(&[meta("native=off\n")]);
    assert_eq!(off.native_recorded(), Some(false));
}

#[test]
fn the_live_split_follows_frees_and_replaced_blocks() {
    let mut records = mixed(1);
    records.extend([
        alloc_from(Allocator::Native, 9, 64, &[]),
        // Its free was lost: the mapping at the same address replaces it.
        alloc_from(Allocator::Mmap, 9, 4096, &[]),
    ]);
    let mut agg = Aggregator::new(1);
    records.iter().for_each(|r| {
        agg.apply(r);
    });
    let p = Profile::from_records(&records);
    for a in Allocator::ALL {
        let live = p.by_allocator().get(a).live.bytes;
        assert_eq!(agg.live_split[a as usize], live, "{a:?}");
    }
    assert_eq!(agg.live_split, [130.0, 57.0, 4096.0]);
}
