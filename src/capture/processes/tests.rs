//! The names in a children's directory: which are captures, and where the directory may be.

use super::*;

#[test]
fn a_capture_cannot_name_a_directory_elsewhere() {
    assert_eq!(
        children_path(Path::new("/x/c.mprof"), "../../etc.d"),
        PathBuf::from("/x/c.mprof.d")
    );
    assert_eq!(
        children_path(Path::new("/x/c.mprof"), "/etc"),
        PathBuf::from("/x/c.mprof.d")
    );
    assert_eq!(
        children_path(Path::new("/x/b.mprof"), "a.mprof.d"),
        PathBuf::from("/x/a.mprof.d")
    );
    for bad in [
        "0123.mprof",
        "-1.mprof",
        "+5.mprof",
        "99999999999.mprof",
        "42-1.mprof",
        "42-0.mprof",
        "42-02.mprof",
        "42-.mprof",
        "-2.mprof",
        "42-2-3.mprof",
        "42.mprof.tmp",
    ] {
        assert_eq!(member_of_name(bad.as_bytes()), None, "{bad}");
    }
    assert_eq!(member_of_name(b"42.mprof"), Some((42, 1)));
    assert_eq!(member_of_name(b"42-2.mprof"), Some((42, 2)));
    assert_eq!(member_of_name(b"42-17.mprof"), Some((42, 17)));
    for (pid, image) in [(42, 1), (42, 2), (7, 30)] {
        let name = capture_name(pid, image);
        assert_eq!(member_of_name(name.as_bytes()), Some((pid, image)));
    }
}
