//! Tests of the flamegraph on profiles built in memory.

use super::*;
use crate::capture::testing::{alloc, code, meta};
use crate::views::export::folded;
use mprof_common::record::Record;

fn profile() -> Profile {
    Profile::from_records(&[
        meta("rate=1"),
        code(1, "a;b.py", "<module>", 1),
        code(2, "a;b.py", "f", 3),
        alloc(1, 1, 10, 0, &[(2, 4), (1, 9)]),
        alloc(1, 2, 5, 0, &[(1, 9)]),
        alloc(1, 3, 7, 0, &[]),
        Record::Free { addr: 2 },
    ])
}

fn settings(view: View) -> Settings {
    Settings::of(view)
}

#[test]
fn folded_lines_go_outermost_first_and_are_safe() {
    let p = profile();
    assert_eq!(
        folded::lines(&p, View::Allocated),
        [
            "<module> (a,b.py:9) 5",
            "<module> (a,b.py:9);f (a,b.py:4) 10",
            "<no Python frame> 7",
        ]
    );
    assert_eq!(folded::lines(&p, View::Live).len(), 2);
}

#[test]
fn svg_has_title_frames_and_tooltips_with_errors() {
    let p = profile();
    let svg = svg(&p, &settings(View::Allocated), None).unwrap();
    assert!(svg.starts_with("<?xml"));
    assert!(svg.contains("mprof: allocated bytes"));
    assert!(svg.contains("f (a,b.py:4)"));
    // Every box has mprof's tooltip: place, bytes ± error, allocations, samples, share.
    assert!(
        svg.contains(
            "<title>f (a,b.py:4) (a;b.py:4: 10 B ± 0 B, 1 allocations, 1 samples, 45.45%)</title>"
        ),
        "{svg}"
    );
    assert!(svg.contains("<title>all (all: 22 B ± 0 B, 3 allocations, 3 samples, 100.00%)</title>"));
    assert!(
        !svg.contains(" bytes, "),
        "a tooltip without mprof's figures: {svg}"
    );
    assert!(svg.contains("id=\"legend\""));
    // The script zooms and refits labels from each box's place in units of width.
    assert!(svg.contains("function zoom(") && svg.contains("function fit("));
    assert!(svg.contains("data-total=\"22\""), "{svg}");
    assert!(svg.contains(
        "width=\"100.0000%\" height=\"15\" fill=\"rgb(200,200,190)\" data-x=\"0\" data-w=\"22\""
    ));
}

#[test]
fn narrow_boxes_keep_the_function_name() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "/srv/app/pkg/module.py", "small_function", 1),
        code(2, "big.py", "big", 1),
        alloc(1, 1, 1000, 0, &[(2, 2)]),
        alloc(1, 2, 120, 0, &[(1, 7)]),
    ]);
    let svg = svg(&p, &settings(View::Allocated), None).unwrap();
    // 120 of 1120 bytes: 126 of 1180 pixels, 17 characters: the function fits, its place not.
    assert!(svg.contains(">small_function</text>"), "{svg}");
    assert!(svg.contains(">big (big.py:2)</text>"), "{svg}");
    assert_eq!(
        fitted_label("small_function (pkg/module.py:7)", 126.0),
        "small_function"
    );
    assert_eq!(
        fitted_label("small_function (pkg/module.py:7)", 220.0),
        "small_function (module.py:7)"
    );
    assert_eq!(
        fitted_label("small_function (pkg/module.py:7)", 60.0),
        "small_.."
    );
}

#[test]
fn callees_lie_within_their_callers() {
    let p = profile();
    for inverted in [false, true] {
        let s = Settings {
            inverted,
            ..settings(View::Allocated)
        };
        let stacks = drawn(&p, &s);
        let layout = boxes::layout(&stacks, 1.0);
        assert_eq!(layout.total, 22);
        assert_eq!(&*layout.boxes[0].label, "all");
        for b in &layout.boxes[1..] {
            let caller = layout.boxes.iter().find(|c| {
                c.depth + 1 == b.depth
                    && c.start <= b.start
                    && b.start + b.width <= c.start + c.width
            });
            assert!(caller.is_some(), "{} has no caller", b.label);
        }
        let widths: u64 = layout
            .boxes
            .iter()
            .filter(|b| b.depth == 1)
            .map(|b| b.width)
            .sum();
        assert_eq!(widths, 22);
    }
}

#[test]
fn import_frames_are_folded_unless_kept() {
    let boot = "<frozen importlib._bootstrap>";
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "app.py", "<module>", 1),
        code(2, boot, "_find_and_load", 1),
        code(
            3,
            "/usr/lib/python3.11/importlib/_bootstrap_external.py",
            "exec_module",
            1,
        ),
        code(4, "lib.py", "<module>", 1),
        code(5, boot, "_call_with_frames_removed", 1),
        alloc(1, 1, 100, 0, &[(4, 3), (5, 1), (3, 2), (2, 5), (1, 1)]),
        alloc(1, 2, 50, 0, &[(2, 9)]),
    ]);
    let folded = svg(&p, &settings(View::Allocated), None).unwrap();
    assert!(folded.contains("&lt;module&gt; (lib.py:3)"));
    assert!(
        !folded.contains("_find_and_load"),
        "import frames were drawn"
    );
    assert!(folded.contains("&lt;import system&gt;"));
    let kept = svg(
        &p,
        &Settings {
            keep_imports: true,
            ..settings(View::Allocated)
        },
        None,
    )
    .unwrap();
    assert!(kept.contains("_find_and_load"));
}

#[test]
fn inverted_puts_the_allocation_site_at_the_root() {
    let p = profile();
    let s = Settings {
        inverted: true,
        ..settings(View::Allocated)
    };
    let stacks = drawn(&p, &s);
    let first: Vec<_> = stacks.keys().map(|k| k.0[0].label.clone()).collect();
    assert!(first.contains(&"f (a,b.py:4)".into()), "{first:?}");
}

#[test]
fn a_diff_shows_the_change_with_its_combined_error() {
    let base = profile();
    let new = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a;b.py", "<module>", 1),
        code(2, "a;b.py", "f", 3),
        alloc(1, 1, 40, 0, &[(2, 4), (1, 9)]),
    ]);
    let svg = svg(&new, &settings(View::Allocated), Some(&base)).unwrap();
    assert!(svg.contains("growth of allocated bytes"), "{svg}");
    assert!(
        svg.contains("10 B → 40 B, change +30 B ± 0 B, samples 1 → 1"),
        "{svg}"
    );
}

#[test]
fn an_empty_view_is_a_valid_svg() {
    let p = Profile::from_records(&[]);
    let svg = empty_svg(&p, View::Peak);
    assert!(svg.starts_with("<?xml"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("mprof: live bytes at the peak"));
    assert!(!svg.contains("<no"));
}

#[test]
fn hostile_names_are_escaped_in_every_picture() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "evil.py", "f\x1b]52;c;aGk=\x07\x1b[2J", 1),
        alloc(1, 1, 10, 0, &[(1, 2)]),
    ]);
    let svg = svg(&p, &settings(View::Allocated), None).unwrap();
    assert!(!svg.contains('\x1b') && !svg.contains('\x07'));
    assert!(svg.contains("f\\u{1b}]52"));
}

#[test]
fn stacks_that_sort_otherwise_as_lines_still_draw() {
    // By frames `<unknown>:3` comes before `<unknown>:30`; as lines `<unknown>:3;…` comes
    // after `<unknown>:30 …` (the order inferno needed; mprof lays out by frames).
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a.py", "f", 1),
        alloc(1, 1, 10, 0, &[(1, 2), (0x99, 3)]),
        alloc(1, 2, 20, 0, &[(0x99, 30)]),
    ]);
    for inverted in [false, true] {
        let mut s = settings(View::Allocated);
        s.inverted = inverted;
        let svg = svg(&p, &s, Some(&p)).unwrap();
        assert!(svg.contains("&lt;unknown&gt;:30"), "{svg}");
        assert!(svg.contains("f (a.py:2)"));
    }
}

#[test]
fn widths_that_would_overflow_are_scaled_alike() {
    let p = Profile::from_records(&[
        meta("rate=1"),
        code(1, "a.py", "f", 1),
        code(2, "a.py", "g", 1),
        alloc(1, 1, u64::MAX, 0, &[(1, 2)]),
        alloc(1, 2, u64::MAX / 2, 0, &[(2, 3)]),
        alloc(1, 3, u64::MAX, 0, &[(2, 4)]),
    ]);
    let svg = svg(&p, &settings(View::Allocated), None).unwrap();
    for label in ["f (a.py:2)", "g (a.py:3)", "g (a.py:4)"] {
        assert!(svg.contains(label), "{label} missing");
    }
    // The tooltips keep the real figures.
    assert!(svg.contains("16384.00 PiB ± 0 B, 1 allocations, 1 samples, 40.00%"));
}
