//! mprof's outputs read by their real consumers: `go tool pprof` (top site and bytes,
//! `-diff_base`), speedscope (its published schema, and its app in headless Chromium), the HTML
//! report in headless Chromium with no network, and the quick-start flamegraph's labels at
//! 1200 px (with screenshots of it and of the timeline). A missing tool prints `SKIPPED` (a
//! failure in CI); the fast tier runs only the import-folding test, which needs no consumer.

mod common;

use common::tools::{chromium, go, js_packages, run_chromium, Server};
use common::views::{fixture, ok};
use common::{mprof, pythons, run_with_timeout, script};
use mprof::capture::testing::CaptureBuilder;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Why these tests belong to the full tier (docs/testing.md).
const CONSUMER: &str = "a real consumer of mprof's output (Chromium, go tool pprof, npm packages)";

/// A real capture of tests/py/known_allocs.py at `--rate 1` (exact figures), made once per
/// test run with the first interpreter found, and the truth the script wrote.
fn known_capture() -> &'static (PathBuf, serde_json::Value) {
    static CAPTURE: OnceLock<(PathBuf, serde_json::Value)> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let py = pythons().into_iter().next().expect("an interpreter");
        let dir = tempfile::tempdir().unwrap().keep();
        let capture = dir.join("known.mprof");
        let truth = dir.join("truth.json");
        let out = run_with_timeout(
            mprof()
                .args(["record", "-q", "--rate", "1", "-o"])
                .arg(&capture)
                .arg("--")
                .arg(&py.path)
                .arg(script("known_allocs.py"))
                .arg(&truth),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("known_allocs recorded with {}", py.label);
        let truth = serde_json::from_slice(&std::fs::read(&truth).unwrap()).unwrap();
        (capture, truth)
    })
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `go tool pprof ARGS`, its stdout.
fn pprof(go: &Path, args: &[&str]) -> String {
    let out = run_with_timeout(
        Command::new(go).args(["tool", "pprof"]).args(args),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "pprof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rows of `pprof -top -unit=B`: (flat bytes, function).
fn top_rows(text: &str) -> Vec<(f64, String)> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let bytes = cols.first()?.strip_suffix('B')?.parse().ok()?;
            Some((bytes, cols[5..].join(" ")))
        })
        .collect()
}

#[test]
fn go_pprof_prints_the_known_top_site_with_its_bytes() {
    if common::tier::full_tier_only(
        "go_pprof_prints_the_known_top_site_with_its_bytes",
        CONSUMER,
    ) {
        return;
    }
    let Some(go) = go("go_pprof_prints_the_known_top_site_with_its_bytes") else {
        return;
    };
    let (capture, truth) = known_capture();
    let dir = tempfile::tempdir().unwrap();
    let pb = dir.path().join("known.pb.gz");
    ok(&["export", path_str(capture), "-o", path_str(&pb)]);
    let text = pprof(
        &go,
        &[
            "-top",
            "-sample_index=inuse_space",
            "-unit=B",
            path_str(&pb),
        ],
    );
    let rows = top_rows(&text);
    let want = truth["large_objects"].as_f64().unwrap();
    let (bytes, function) = &rows[0];
    assert_eq!(function, "large_objects", "{text}");
    assert!(
        (bytes - want).abs() / want < 0.01,
        "{bytes} vs {want}\n{text}"
    );
    for f in ["medium_objects", "small_objects"] {
        let want = truth[f].as_f64().unwrap();
        let got = rows
            .iter()
            .find(|r| r.1 == f)
            .unwrap_or_else(|| panic!("{f}: {text}"));
        assert!(
            (got.0 - want).abs() / want < 0.01,
            "{f}: {} vs {want}",
            got.0
        );
    }
    // The capture's meta and the threads are labels pprof can group by.
    let tags = pprof(&go, &["-tags", path_str(&pb)]);
    for needle in [
        "mode: Total",
        "record",
        "pid: Total",
        "thread_name: Total",
        "main (",
        "allocator: Total",
        "python",
    ] {
        assert!(tags.contains(needle), "{needle:?} not in:\n{tags}");
    }
    eprintln!("go tool pprof: large_objects {bytes} B (truth {want})");
}

/// An exact capture (`rate=1`): `f` keeps `f_bytes` live, `g` keeps `g_bytes`.
fn exact(f_bytes: u64, g_bytes: u64) -> CaptureBuilder {
    let mut c = CaptureBuilder::new();
    c.meta("mode=record\ncommand=python app.py\npid=7\nrate=1\n")
        .code(1, "app.py", "<module>", 1)
        .code(2, "app.py", "f", 10)
        .code(3, "app.py", "g", 20);
    if f_bytes > 0 {
        c.alloc(0x10, f_bytes, 1, &[(2, 11), (1, 30)]);
    }
    if g_bytes > 0 {
        c.alloc(0x20, g_bytes, 2, &[(3, 21), (1, 31)]);
    }
    c.push(mprof_common::record::Record::End {
        reason: 1,
        time_ns: 3,
    });
    c
}

#[test]
fn go_pprof_diff_base_shows_the_growth() {
    if common::tier::full_tier_only("go_pprof_diff_base_shows_the_growth", CONSUMER) {
        return;
    }
    let Some(go) = go("go_pprof_diff_base_shows_the_growth") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = exact(1_000_000, 0).write(d, "base.mprof");
    let new = exact(3_000_000, 500_000).write(d, "new.mprof");
    for (capture, pb) in [(&base, "base.pb.gz"), (&new, "new.pb.gz")] {
        ok(&[
            "export",
            path_str(capture),
            "--format",
            "pprof",
            "-o",
            path_str(&d.join(pb)),
        ]);
    }
    let text = pprof(
        &go,
        &[
            "-top",
            "-unit=B",
            "-sample_index=inuse_space",
            "-diff_base",
            path_str(&d.join("base.pb.gz")),
            path_str(&d.join("new.pb.gz")),
        ],
    );
    let rows = top_rows(&text);
    assert_eq!(rows[0], (2_000_000.0, "f".to_owned()), "{text}");
    assert_eq!(rows[1], (500_000.0, "g".to_owned()), "{text}");
    // mprof's own diff agrees, with no noise at rate 1.
    let diff = ok(&["diff", path_str(&base), path_str(&new)]);
    let diff = String::from_utf8(diff.stdout).unwrap();
    assert!(diff.contains("+1.91 MiB"), "{diff}");
    assert!(!diff.contains("[noise]  "), "{diff}");
}

#[test]
fn speedscope_file_validates_against_its_schema_and_loads_in_the_app() {
    if common::tier::full_tier_only(
        "speedscope_file_validates_against_its_schema_and_loads_in_the_app",
        CONSUMER,
    ) {
        return;
    }
    let test = "speedscope_file_validates_against_its_schema_and_loads_in_the_app";
    let Some(js) = js_packages(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fixture_capture = fixture().write(d, "app.mprof");
    let (known, _) = known_capture();
    let mut files = Vec::new();
    for (capture, name) in [(&fixture_capture, "app"), (known, "known")] {
        let out = d.join(format!("{name}.speedscope.json"));
        ok(&["export", path_str(capture), "-o", path_str(&out)]);
        files.push(out);
    }
    let validate = |files: &[PathBuf]| {
        run_with_timeout(
            Command::new("node")
                .arg(js.join("validate-speedscope.js"))
                .args(files),
            Duration::from_secs(60),
        )
    };
    let out = validate(&files);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The validator does reject a file that breaks the schema.
    let mut bad: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    bad["profiles"][0]["unit"] = "furlongs".into();
    let bad_path = d.join("bad.speedscope.json");
    std::fs::write(&bad_path, bad.to_string()).unwrap();
    assert!(!validate(&[bad_path]).status.success());

    let Some(browser) = chromium(test) else {
        return;
    };
    let site = d.join("site");
    std::fs::create_dir(&site).unwrap();
    let app = js.join("node_modules/speedscope/dist/release");
    for entry in std::fs::read_dir(&app).unwrap().flatten() {
        std::fs::copy(entry.path(), site.join(entry.file_name())).unwrap();
    }
    std::fs::copy(&files[0], site.join("profile.json")).unwrap();
    let server = Server::start(&site);
    let url = format!(
        "http://127.0.0.1:{}/index.html#profileURL=/profile.json",
        server.port
    );
    let out = run_chromium(
        &browser,
        &url,
        &["--virtual-time-budget=15000", "--dump-dom"],
        false,
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("<title>mprof: python app.py - speedscope</title>"),
        "{dom}"
    );
    assert!(
        dom.contains("allocated bytes"),
        "the first profile is not shown: {dom}"
    );
    assert!(dom.contains("(1/3)"), "three views expected: {dom}");
}

/// The `<tbody>` of the sites table in a DOM dump.
fn sites_body(dom: &str) -> &str {
    let start = dom.find("<table id=\"sites\"").expect("sites table");
    let body = &dom[start..];
    let from = body.find("<tbody>").expect("tbody");
    let to = body.find("</tbody>").expect("/tbody");
    &body[from..to]
}

#[test]
fn html_report_shows_the_top_site_with_the_network_off() {
    if common::tier::full_tier_only(
        "html_report_shows_the_top_site_with_the_network_off",
        CONSUMER,
    ) {
        return;
    }
    let test = "html_report_shows_the_top_site_with_the_network_off";
    let (capture, _) = known_capture();
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    ok(&["html", path_str(capture), "-o", path_str(&html)]);
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("default-src 'none'"), "no CSP");
    assert!(!text.contains("src=\"http"), "a remote resource");
    let Some(browser) = chromium(test) else {
        return;
    };
    let url = format!("file://{}", html.display());
    let out = run_chromium(
        &browser,
        &url,
        &["--virtual-time-budget=5000", "--dump-dom"],
        true,
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    // The table is built by the page's script: its rows exist only if the script ran offline.
    let body = sites_body(&dom);
    let first_row = &body[..body.find("</tr>").expect("a row")];
    assert!(first_row.contains("large_objects ("), "{first_row}");
    assert!(dom.contains("live bytes at the end"), "summary missing");
    assert!(dom.contains("id=\"fg-allocated\""), "flamegraph missing");
    let shot = dir.path().join("report.png");
    run_chromium(
        &browser,
        &url,
        &[
            "--window-size=1280,1600",
            &format!("--screenshot={}", shot.display()),
        ],
        true,
    );
    assert_png(&shot);
}

/// Issue 47, point 8: function names that hold `<!--`, `<script>` and `</script>` (names come
/// from the capture: anything) no longer empty the HTML report's top-sites table. The page's
/// JSON is in a script element, where `<!--` followed by `<script` changes how the browser
/// looks for the element's end: the table had no rows. Every row is there, shown as text.
#[test]
fn html_report_with_markup_in_names_still_shows_every_site() {
    let test = "html_report_with_markup_in_names_still_shows_every_site";
    let dir = tempfile::tempdir().unwrap();
    let names = [
        "<!--<script>alert(1)</script>",
        "a<!--b",
        "</script><b>bold</b>",
        "plain",
    ];
    let mut c = CaptureBuilder::new();
    c.meta("mode=record\ncommand=python app.py\npid=7\nrate=1\n");
    for (i, name) in names.iter().enumerate() {
        let code = i as u64 + 1;
        c.code(code, "app.py", name, 10 * code as u32);
        c.alloc(
            0x10 * code,
            1000 * code,
            code,
            &[(code, 10 * code as u32 + 1)],
        );
    }
    let capture = c.write(dir.path(), "markup.mprof");
    let html = dir.path().join("report.html");
    ok(&["html", path_str(&capture), "-o", path_str(&html)]);
    let text = std::fs::read_to_string(&html).unwrap();
    let data = &text[text.find("id=\"sites-data\">").unwrap()..];
    let data = &data[..data.find("</script>").unwrap()];
    assert!(
        !data[1..].contains('<'),
        "markup left in the page's JSON: {data}"
    );
    // The page's JSON is checked in both tiers; what the browser makes of it, in the full one.
    if common::tier::full_tier_only(test, CONSUMER) {
        return;
    }
    let Some(browser) = chromium(test) else {
        return;
    };
    let url = format!("file://{}", html.display());
    let out = run_chromium(
        &browser,
        &url,
        &["--virtual-time-budget=5000", "--dump-dom"],
        true,
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    let body = sites_body(&dom);
    assert_eq!(body.matches("<tr").count(), names.len(), "rows: {body}");
    assert!(
        body.contains("&lt;!--&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{body}"
    );
    assert!(!dom.contains("<b>bold</b>"), "a name became markup");
}

fn assert_png(path: &Path) {
    let png = std::fs::read(path).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "{} is no PNG", path.display());
    assert!(png.len() > 10_000, "{} is nearly empty", path.display());
}

/// The (rect width in %, title, text) of each box of an inferno SVG.
fn boxes(svg: &str) -> Vec<(f64, String, String)> {
    svg.split("<g><title>")
        .skip(1)
        .filter_map(|g| {
            let title = g[..g.find("</title>")?].to_owned();
            let w = g
                .split("width=\"")
                .nth(1)?
                .split('%')
                .next()?
                .parse()
                .ok()?;
            let text = g.split("<text").nth(1)?;
            let text = text[text.find('>')? + 1..text.find("</text>")?].to_owned();
            Some((w, title, text))
        })
        .collect()
}

#[test]
fn quick_start_flamegraph_labels_are_readable_at_1200_px() {
    if common::tier::full_tier_only(
        "quick_start_flamegraph_labels_are_readable_at_1200_px",
        CONSUMER,
    ) {
        return;
    }
    let py = pythons().into_iter().next().expect("an interpreter");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let capture = d.join("example.mprof");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/leaky_cache.py");
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "-o", path_str(&capture), "--"])
            .arg(&py.path)
            .arg(&example),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg_path = d.join("example.svg");
    ok(&[
        "flamegraph",
        path_str(&capture),
        "--view",
        "live",
        "-o",
        path_str(&svg_path),
    ]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.contains("width=\"1200\""));
    let wide: Vec<_> = boxes(&svg).into_iter().filter(|b| b.0 >= 20.0).collect();
    assert!(wide.len() >= 3, "few wide frames: {wide:?}");
    for (w, title, text) in &wide {
        let function = title.split(" (").next().unwrap();
        assert!(
            text.starts_with(function) && !text.ends_with(".."),
            "a {w}% frame shows {text:?} for {title:?}"
        );
    }
    assert!(
        wide.iter().any(|b| b.2.starts_with("render_profile (")),
        "the top site is not labelled: {wide:?}"
    );
    let timeline = d.join("timeline.svg");
    ok(&["timeline", path_str(&capture), "-o", path_str(&timeline)]);
    let Some(browser) = chromium("quick_start screenshots") else {
        return;
    };
    for (file, size) in [(&svg_path, "1200,420"), (&timeline, "1200,500")] {
        let shot = file.with_extension("png");
        run_chromium(
            &browser,
            &format!("file://{}", file.display()),
            &[
                &format!("--window-size={size}"),
                &format!("--screenshot={}", shot.display()),
            ],
            true,
        );
        assert_png(&shot);
    }
}

/// Drives the flamegraph's own script in the SVG document, once it has loaded: zooms into a
/// box, resets, searches (the prompt answered), points at a box, and writes what it saw into
/// the document as JSON, for `--dump-dom`.
const FLAMEGRAPH_DRIVER: &str = r#"<script type="text/ecmascript"><![CDATA[
window.addEventListener("load", function () { setTimeout(function () {
    var out = { init: !!frames };
    var find = function (label) {
        return Array.prototype.find.call(boxes(), function (b) { return labelOf(b) === label; });
    };
    var g = find("load_rows (app.py:33)"), rect = g.querySelector("rect");
    zoom(g);
    out.zoomed = [rect.getAttribute("x"), rect.getAttribute("width")];
    out.parents = frames.querySelectorAll(":scope > g.parent").length;
    out.hidden = frames.querySelectorAll(":scope > g.hide").length;
    out.unzoomShown = !unzoomButton.classList.contains("hide");
    var narrow = find("<module> (app.py:51)");
    unzoom();
    out.unzoomed = [rect.getAttribute("x"), rect.getAttribute("width")];
    out.narrowText = narrow.querySelector("text").textContent;
    window.prompt = function () { return "build_index"; };
    search();
    out.matched = matched.nodeValue;
    out.marked = frames.querySelectorAll("rect[data-fill]").length;
    clearSearch();
    out.cleared = frames.querySelectorAll("rect[data-fill]").length;
    rect.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    out.details = details.nodeValue;
    var t = document.createElementNS("http://www.w3.org/2000/svg", "text");
    t.setAttribute("id", "driven");
    t.textContent = JSON.stringify(out);
    document.documentElement.appendChild(t);
}, 0); });
]]></script>
"#;

#[test]
fn flamegraph_zooms_searches_and_shows_figures_in_chromium() {
    if common::tier::full_tier_only(
        "flamegraph_zooms_searches_and_shows_figures_in_chromium",
        CONSUMER,
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let capture = fixture().write(d, "app.mprof");
    let svg_path = d.join("app.svg");
    ok(&["flamegraph", path_str(&capture), "-o", path_str(&svg_path)]);
    let Some(browser) = chromium("flamegraph_zooms_searches_and_shows_figures_in_chromium") else {
        return;
    };
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let end = svg.rfind("</svg>").unwrap();
    let driven = d.join("driven.svg");
    std::fs::write(
        &driven,
        format!("{}{FLAMEGRAPH_DRIVER}{}", &svg[..end], &svg[end..]),
    )
    .unwrap();
    let out = run_chromium(
        &browser,
        &format!("file://{}", driven.display()),
        &["--virtual-time-budget=5000", "--dump-dom"],
        true,
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    let json = dom
        .split("<text id=\"driven\">")
        .nth(1)
        .and_then(|t| t.split("</text>").next())
        .unwrap_or_else(|| panic!("the script did not run: {dom}"));
    let v: serde_json::Value = serde_json::from_str(
        &json
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
    .unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(v["init"], true, "{v}");
    // load_rows fills the width; its three callers (build_index, <module>, all) stay, faded.
    assert_eq!(
        v["zoomed"],
        serde_json::json!(["0.0000%", "100.0000%"]),
        "{v}"
    );
    assert_eq!(v["parents"], 3, "{v}");
    assert_eq!(v["hidden"], 12, "{v}");
    assert_eq!(v["unzoomShown"], true, "{v}");
    assert_eq!(
        v["unzoomed"],
        serde_json::json!(["11.9153%", "72.7030%"]),
        "{v}"
    );
    // Labels are fitted again after the zoom, as mprof first drew them.
    assert_eq!(v["narrowText"], "<module>", "{v}");
    // build_index's three boxes hold 124,584 of 137,546 units of width.
    assert_eq!(v["matched"], "Matched: 90.6%", "{v}");
    assert_eq!(v["marked"], 3, "{v}");
    assert_eq!(v["cleared"], 0, "{v}");
    assert!(
        v["details"]
            .as_str()
            .is_some_and(|d| d.starts_with("load_rows (app.py:33) (app.py:33: 97.66 KiB")),
        "{v}"
    );
}

#[test]
fn import_frames_are_folded_from_a_real_capture_unless_kept() {
    let py = pythons().into_iter().next().expect("an interpreter");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let capture = d.join("imports.mprof");
    // Importing these allocates megabytes inside importlib's frames, then the program's own
    // function allocates some more.
    let program = "import json, decimal, email.message, http.client, argparse, xml.dom.minidom\n\
                   def own_work():\n    return [bytes(1000) for _ in range(2000)]\n\
                   kept = own_work()\n";
    let out = run_with_timeout(
        mprof()
            .args(["record", "-q", "--rate", "4096", "--seed", "1", "-o"])
            .arg(&capture)
            .arg("--")
            .arg(&py.path)
            .args(["-c", program]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let titles = |extra: &[&str]| {
        let svg = d.join("imports.svg");
        let mut args = vec!["flamegraph", path_str(&capture), "-o", path_str(&svg)];
        args.extend_from_slice(extra);
        ok(&args);
        let svg = std::fs::read_to_string(&svg).unwrap();
        boxes(&svg).into_iter().map(|b| b.1).collect::<Vec<_>>()
    };
    let importlib =
        |t: &String| t.contains("<frozen importlib") || t.contains("importlib/_bootstrap");
    let folded = titles(&[]);
    assert!(
        folded.iter().any(|t| t.starts_with("own_work (")),
        "the program's own function is missing: {folded:?}"
    );
    assert!(
        !folded.iter().any(importlib),
        "import machinery shown by default: {:?}",
        folded.iter().filter(|t| importlib(t)).collect::<Vec<_>>()
    );
    let kept = titles(&["--keep-imports"]);
    assert!(
        kept.iter().any(|t| t.starts_with("_find_and_load (")),
        "--keep-imports shows no importlib frame: {kept:?}"
    );
}
