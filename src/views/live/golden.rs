//! Golden screens: a fixed record sequence with a fixed clock, drawn into ratatui's
//! `TestBackend` and compared with `tests/golden/live-*.txt`. `MPROF_BLESS=1` rewrites them
//! from the current drawing (review the diff before committing).

use super::keys::{Key, ViewState};
use super::model::{Column, Model, Snapshot};
use super::{ui, Mode, Target};
use crate::analysis::grouping::Grouping;
use mprof_common::record::Record;
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::path::{Path, PathBuf};

const SECOND: u64 = 1_000_000_000;
const T0: u64 = 50 * SECOND;
const MAIN: u32 = 4242;
const WORKER: u32 = 4250;
const KIB: u64 = 1024;

use crate::capture::testing::{alloc, code};

/// A small web shop's first ten seconds, sampled at 64 KiB: a catalogue loader that keeps
/// half of what it parses, a page renderer that frees everything (its bytes are allocated in
/// the standard library's JSON encoder), a cache filled by a worker thread, and start-up
/// allocations with no Python frame. One snapshot per second.
fn session() -> (Model, Snapshot) {
    let mut m = Model::new(64 * KIB, T0);
    let (module, main, load, parse, render, put, encode) = (1, 2, 3, 4, 5, 6, 7);
    for r in [
        Record::Meta {
            text: "rate=65536\n".into(),
        },
        code(module, "/srv/shop/app.py", "<module>", 1),
        code(main, "/srv/shop/app.py", "main", 40),
        code(load, "/srv/shop/catalog/loader.py", "load_catalog", 12),
        code(parse, "/srv/shop/catalog/loader.py", "parse_row", 30),
        code(render, "/srv/shop/web/templates.py", "render_page", 88),
        code(
            put,
            "/srv/shop/cache/lru_cache_with_statistics.py",
            "put",
            51,
        ),
        code(encode, "/usr/lib/python3.12/json/encoder.py", "encode", 183),
        alloc(MAIN, 1, 300 * KIB, T0, &[]),
        Record::Thread {
            tid: MAIN,
            name: "main (python3)".into(),
        },
    ] {
        m.apply(&r);
    }
    let mut addr = 0x1000;
    let mut snap = m.roll(T0);
    for i in 0..10u64 {
        let t = T0 + i * SECOND;
        for j in 0..(12 + 2 * i) {
            addr += 1;
            let stack = [(parse, 33), (load, 20), (main, 45), (module, 99)];
            m.apply(&alloc(MAIN, addr, 48 * KIB + j * 512, t, &stack));
            if j % 2 == 0 {
                m.apply(&Record::Free { addr });
            }
        }
        for j in 0..8 {
            addr += 1;
            let stack = [(encode, 200), (render, 97), (main, 47), (module, 99)];
            m.apply(&alloc(MAIN, addr, 100 * KIB + j * 100, t, &stack));
            m.apply(&Record::Free { addr });
        }
        if i >= 3 {
            if i == 3 {
                m.apply(&Record::Thread {
                    tid: WORKER,
                    name: "cache-filler".into(),
                });
            }
            for j in 0..4 {
                addr += 1;
                let stack = [(put, 60), (put, 58)];
                m.apply(&alloc(WORKER, addr, 256 * KIB + j, t, &stack));
            }
        }
        m.apply(&Record::Rss {
            time_ns: t,
            rss_bytes: (40 + 7 * i) << 20,
        });
        m.set_ring_status(
            if i > 6 { 3 } else { 0 },
            "3.12.1 (main, Jan 1 2024) [GCC 12]",
        );
        snap = m.roll(t + SECOND);
    }
    (m, snap)
}

fn target(mode: Mode) -> Target {
    Target {
        mode,
        pid: 4242,
        command: "python3 -m shop.app --port 8080 --workers 2".into(),
        rate: 64 * KIB,
        capture: PathBuf::from("/home/ana/profiles/shop.mprof"),
        program_output: (mode == Mode::Record)
            .then(|| PathBuf::from("/home/ana/profiles/shop.mprof.out")),
        python_only: false,
        focus: Default::default(),
    }
}

/// The screen as text, one line per row, trailing blanks trimmed.
fn render(target: &Target, m: &Model, snap: &Snapshot, view: &ViewState, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    let screen = ui::Screen {
        target,
        model: m,
        snap,
        view,
    };
    terminal.draw(|f| ui::draw(f, &screen)).unwrap();
    let buf = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..h {
        let line: String = (0..w).map(|x| buf[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn check(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if crate::capture::testing::bless() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (MPROF_BLESS=1 writes it)", path.display()));
    assert!(
        expected == actual,
        "{name} differs from {}:\n--- expected\n{expected}--- actual\n{actual}",
        path.display()
    );
}

fn view(keys: &[Key], snap: &Snapshot) -> ViewState {
    let mut v = ViewState::default();
    for &k in keys {
        v.apply(k, &snap.threads, &snap.processes, 15);
    }
    v
}

#[test]
fn default_screen_at_80_by_24() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    check(
        "live-80x24",
        &render(&t, &m, &snap, &view(&[], &snap), 80, 24),
    );
}

/// By your code (the default), wide enough to show the renderer's line beside the JSON
/// encoder's line where its bytes were allocated.
#[test]
fn your_code_with_the_innermost_frame_at_110_by_24() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    let v = view(&[], &snap);
    assert_eq!(v.settings.group, Grouping::YourCode);
    let screen = render(&t, &m, &snap, &v, 110, 24);
    assert!(
        screen.contains("render_page       web/templates.py:97 ← json/encoder.py:200"),
        "{screen}"
    );
    check("live-110x24", &screen);
}

#[test]
fn narrow_screen_at_60_by_24() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    check(
        "live-60x24",
        &render(&t, &m, &snap, &view(&[], &snap), 60, 24),
    );
}

#[test]
fn by_function_total_sorted_by_live() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    let keys = [
        Key::Group,
        Key::Group,
        Key::Inclusive,
        Key::Sort(Some(Column::Live)),
    ];
    let v = view(&keys, &snap);
    assert_eq!(v.settings.group, Grouping::Function);
    check(
        "live-80x24-function-total-live",
        &render(&t, &m, &snap, &v, 80, 24),
    );
}

#[test]
fn one_thread_by_file_paused() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    let keys = [
        Key::Thread,
        Key::Thread,
        Key::Group,
        Key::Group,
        Key::Group,
        Key::Pause,
    ];
    let v = view(&keys, &snap);
    assert_eq!(v.settings.thread, Some(WORKER));
    check(
        "live-80x24-thread-file-paused",
        &render(&t, &m, &snap, &v, 80, 24),
    );
}

#[test]
fn help_overlays_for_record_and_attach() {
    let (m, snap) = session();
    let v = view(&[Key::Help], &snap);
    for (mode, name) in [
        (Mode::Record, "live-80x24-help-record"),
        (Mode::Attach, "live-80x24-help-attach"),
    ] {
        check(name, &render(&target(mode), &m, &snap, &v, 80, 24));
    }
}

#[test]
fn very_small_terminals_do_not_panic() {
    let (m, snap) = session();
    let t = target(Mode::Record);
    for (w, h) in [(1, 1), (20, 5), (40, 10), (30, 40)] {
        for keys in [&[][..], &[Key::Help], &[Key::Group, Key::Group, Key::Group]] {
            render(&t, &m, &snap, &view(keys, &snap), w, h);
        }
    }
}

/// Names from the target are untrusted: a function, file, thread or command carrying
/// terminal escapes is drawn with them spelled out, never sent to the terminal.
#[test]
fn hostile_names_are_drawn_escaped() {
    let mut m = Model::new(1, T0);
    for r in [
        code(1, "evil\x1b[2J.py", "f\x1b]52;c;aGk=\x07", 1),
        alloc(7, 1, 4096, T0, &[(1, 2)]),
        Record::Thread {
            tid: 7,
            name: "w\x1b[31m".into(),
        },
    ] {
        m.apply(&r);
    }
    let snap = m.roll(T0 + SECOND);
    let mut t = target(Mode::Attach);
    t.command = "python3 \x1b[2Jevil.py".into();
    for keys in [
        &[][..],
        &[Key::Thread],
        &[Key::Group, Key::Group, Key::Group],
    ] {
        let screen = render(&t, &m, &snap, &view(keys, &snap), 100, 24);
        assert!(
            !screen.contains('\x1b') && !screen.contains('\x07'),
            "{screen}"
        );
        assert!(screen.contains("\\u{1b}"), "{screen}");
    }
}

/// The `RSS − heap` line splits the live heap by allocator (long names when they fit, short
/// ones otherwise), or says that native allocations are not sampled under `--python-only`.
#[test]
fn the_heap_is_split_by_allocator() {
    use mprof_common::record::Allocator;
    let mut m = Model::new(1, T0);
    for r in [
        code(1, "app.py", "load", 1),
        crate::capture::testing::alloc_from(Allocator::Python, MAIN, 1, 2 * KIB, T0, &[(1, 2)]),
        crate::capture::testing::alloc_from(
            Allocator::Native,
            MAIN,
            2,
            3 * KIB * KIB,
            T0,
            &[(1, 3)],
        ),
        crate::capture::testing::alloc_from(Allocator::Mmap, MAIN, 3, 4 * KIB * KIB, T0, &[(1, 4)]),
        crate::capture::testing::alloc_from(Allocator::Native, MAIN, 4, KIB * KIB, T0, &[]),
        Record::Free { addr: 4 },
    ] {
        m.apply(&r);
    }
    let snap = m.roll(T0 + SECOND);
    let line = |t: &Target, w: u16| {
        let screen = render(t, &m, &snap, &view(&[], &snap), w, 24);
        screen.lines().nth(4).unwrap().to_owned()
    };
    let t = target(Mode::Record);
    assert!(
        line(&t, 80).ends_with("python 2.00 KiB · native 3.00 MiB · mmap 4.00 MiB"),
        "{}",
        line(&t, 80)
    );
    assert!(line(&t, 66).ends_with("py 2.00 KiB nat 3.00 MiB mmap 4.00 MiB"));
    assert!(
        line(&t, 50).ends_with("RSS − heap           ?"),
        "neither fits"
    );
    let wide = line(&t, 140);
    assert!(wide.contains("gap: allocator-held"), "{wide}");
    let python_only = Target {
        python_only: true,
        ..t
    };
    assert!(line(&python_only, 100).contains("python only (--python-only"));
}

/// A followed child: its records come through [`Model::enter`] with its own code objects
/// (the same numbers as the program's mean other functions there). The table title counts
/// the processes, the footer offers `c`, and `c` narrows the table to one process; when the
/// child ends, its blocks leave the live heap.
#[test]
fn processes_are_shown_together_or_one_at_a_time() {
    const CHILD: u32 = 4300;
    let mut m = Model::new(1, T0);
    m.started(MAIN, "python3 pool.py");
    m.enter(MAIN);
    m.apply(&code(1, "/srv/pool.py", "main", 1));
    m.apply(&alloc(MAIN, 0x10, 3 * KIB, T0, &[(1, 2)]));
    m.started(CHILD, "python3 pool.py (worker)");
    m.enter(CHILD);
    m.apply(&code(1, "/srv/pool.py", "work", 9));
    m.apply(&alloc(CHILD, 0x10, 5 * KIB, T0, &[(1, 10)]));
    m.enter(MAIN);
    m.apply(&Record::Free { addr: 0x99 });
    let snap = m.roll(T0 + SECOND);
    let t = target(Mode::Record);
    let all = render(&t, &m, &snap, &view(&[], &snap), 100, 24);
    assert!(all.contains("all 2 processes (2 running)"), "{all}");
    assert!(all.contains("c process"), "{all}");
    assert!(all.contains("main") && all.contains("work"), "{all}");
    let child = view(&[Key::Process, Key::Process], &snap);
    assert_eq!(child.settings.process, Some(CHILD));
    let screen = render(&t, &m, &snap, &child, 100, 24);
    check("live-100x24-one-process", &screen);
    assert!(screen.contains("work") && !screen.contains("pool.py:2"));
    assert_eq!(snap.live_heap, 8.0 * KIB as f64);
    m.ended(CHILD);
    let snap = m.roll(T0 + 2 * SECOND);
    assert_eq!(snap.live_heap, 3.0 * KIB as f64, "the child's block left");
    let screen = render(&t, &m, &snap, &child, 100, 24);
    assert!(screen.contains("ended"), "{screen}");
}

/// A followed child that runs a new Python by exec ends and starts again with the same pid:
/// the new program is a process of its own (its code object 1 is not the old one's, its
/// blocks are counted afresh), and the old program stays listed as ended, its bytes
/// allocated and none live.
#[test]
fn a_program_run_by_exec_is_a_process_of_its_own() {
    const CHILD: u32 = 4300;
    let mut m = Model::new(1, T0);
    m.started(MAIN, "python3 launcher.py");
    m.started(CHILD, "python3 first.py");
    m.enter(CHILD);
    m.apply(&code(1, "/srv/first.py", "first", 1));
    m.apply(&alloc(CHILD, 0x10, 3 * KIB, T0, &[(1, 2)]));
    m.ended(CHILD);
    m.started(CHILD, "python3 second.py");
    m.enter(CHILD);
    m.apply(&code(1, "/srv/second.py", "second", 1));
    m.apply(&alloc(CHILD, 0x10, 5 * KIB, T0, &[(1, 4)]));
    let snap = m.roll(T0 + SECOND);
    assert_eq!(
        snap.live_heap,
        5.0 * KIB as f64,
        "only the second program's block"
    );
    let t = target(Mode::Record);
    let all = render(&t, &m, &snap, &view(&[], &snap), 100, 24);
    assert!(all.contains("all 3 processes (2 running)"), "{all}");
    let row = |file: &str| all.lines().find(|l| l.contains(file)).unwrap_or_default();
    assert!(row("second.py:4").contains("5.00 KiB 5.00 KiB"), "{all}");
    assert!(row("first.py:2").contains("3.00 KiB      0 B"), "{all}");
}
