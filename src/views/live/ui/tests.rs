//! Tests of the live view's text helpers.

use super::*;

#[test]
fn compact_bytes_fit_in_eight_columns() {
    let cases = [
        (0.0, "0 B"),
        (999.0, "999 B"),
        (1000.0, "0.98 KiB"),
        (1536.0, "1.50 KiB"),
        (50.0 * 1024.0, "50.0 KiB"),
        (999.0 * 1024.0, "999 KiB"),
        (1023.7 * 1024.0, "1.00 MiB"),
        (3.0 * 1024.0 * 1024.0 * 1024.0, "3.00 GiB"),
    ];
    for (b, text) in cases {
        assert_eq!(compact_bytes(b), text, "{b}");
        assert!(compact_bytes(b).chars().count() <= 8);
    }
}

#[test]
fn cutting_and_fitting() {
    assert_eq!(cut_left("/srv/app/models/user.py:12", 12), "…/user.py:12");
    assert_eq!(cut_right("build_index", 6), "build…");
    assert_eq!(cut_left("ok", 5), "ok");
    let parts = ["aaaa".to_owned(), "bbbbbbbb".to_owned(), "cc".to_owned()];
    assert_eq!(fit(&parts, " · ", 11), "aaaa · cc");
    assert_eq!(clock(3725.0), "1:02:05");
    // A C function by function (no line known) shows its file alone, as the reports do.
    assert_eq!(file_line("ext/chain.c", 0), "ext/chain.c");
    assert_eq!(file_line("app.py", 7), "app.py:7");
}

#[test]
fn sparkline_scales_to_the_largest_value_shown() {
    assert_eq!(sparkline(&[0.0, 1.0, 2.0, 4.0, 8.0], 5), " ▂▃▅█");
    assert_eq!(sparkline(&[9.0, 1.0, 1.0], 2), "██");
    assert_eq!(sparkline(&[3.0], 3), "█  ");
}
