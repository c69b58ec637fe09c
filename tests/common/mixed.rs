//! Mixed C + Python stacks (`--native`) as the tests read them: the stacks of a JSON report,
//! the workload `tests/py/native_chain_workload.py` under `record --native`, and checks of
//! its frames.

use super::native::{chain_line, chain_source};
use super::procs::LIMIT;
use super::{mprof, pythons, report_json, run_with_timeout, Python};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// The chain of `alloc_in_chain`, innermost first.
pub const CHAIN: [&str; 5] = [
    "chain_level2",
    "chain_level1",
    "chain_entry",
    "alloc_in_chain",
    "<module>",
];

/// One frame of a JSON stack: function, file, line, kind, module.
#[derive(Debug, Clone)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub kind: String,
    pub module: Option<String>,
}

/// The stacks of a `report --by stack --json --top 0`, innermost frame first.
pub fn stacks(report: &Value) -> Vec<Vec<Frame>> {
    report["locations"]
        .as_array()
        .expect("locations")
        .iter()
        .map(|l| {
            l["stack"]
                .as_array()
                .expect("stack")
                .iter()
                .map(|f| Frame {
                    function: f["function"].as_str().unwrap().to_owned(),
                    file: f["file"].as_str().unwrap().to_owned(),
                    line: f["line"].as_u64().unwrap() as u32,
                    kind: f["kind"].as_str().unwrap().to_owned(),
                    module: f["module"].as_str().map(str::to_owned),
                })
                .collect()
        })
        .collect()
}

/// Where `want` occurs in `names` in this order (other names between them), if it does.
pub fn in_order(names: &[&str], want: &[&str]) -> Option<Vec<usize>> {
    let mut at = Vec::new();
    let mut from = 0;
    for w in want {
        let i = from + names[from..].iter().position(|n| n == w)?;
        at.push(i);
        from = i + 1;
    }
    Some(at)
}

pub fn names(stack: &[Frame]) -> Vec<&str> {
    stack.iter().map(|f| f.function.as_str()).collect()
}

/// The stack whose functions are exactly `want`, innermost first; on failure the stacks that
/// start with `want[0]` are shown.
pub fn expect<'a>(label: &str, all: &'a [Vec<Frame>], want: &[&str]) -> &'a [Frame] {
    if let Some(s) = all.iter().find(|s| names(s) == want) {
        return s;
    }
    let near: Vec<Vec<&str>> = all
        .iter()
        .filter(|s| {
            s.iter()
                .any(|f| f.function == want[0] || f.function == want[want.len() - 2])
        })
        .map(|s| names(s))
        .take(5)
        .collect();
    panic!(
        "{label}: no stack {want:?}; stacks with {}: {near:#?}",
        want[0]
    );
}

/// A C frame of the extension: its DWARF source line, the module it came from.
pub fn assert_c_frame(label: &str, f: &Frame, marker: &str, so: &Path) {
    assert_eq!(f.kind, "native", "{label}: {f:?}");
    assert!(f.file.ends_with("native_chain.c"), "{label}: {f:?}");
    assert_eq!(f.line, chain_line(marker), "{label}: {f:?}");
    assert_eq!(f.module.as_deref(), so.to_str(), "{label}: {f:?}");
}

pub fn assert_python_frame(label: &str, f: &Frame) {
    assert_eq!(f.kind, "python", "{label}: {f:?}");
    assert!(f.module.is_none(), "{label}: {f:?}");
    assert!(
        f.file.ends_with("native_chain_workload.py"),
        "{label}: {f:?}"
    );
}

/// `mprof record -q --native --rate 1` of the workload with the extension in `dir`.
pub fn record(py: &Python, dir: &Path, capture: &Path) {
    let options = ["-q", "--native", "--rate", "1"];
    super::record_script(py, &options, &[], capture, "native_chain_workload.py", dir);
}

/// The stacks and warnings of `report --by stack --json` (every stack unless `extra` says
/// `--top`).
pub fn report_stacks(capture: &Path, extra: &[&str]) -> (Vec<Vec<Frame>>, Vec<String>) {
    let mut args = vec!["--by", "stack"];
    if !extra.contains(&"--top") {
        args.extend(["--top", "0"]);
    }
    args.extend_from_slice(extra);
    let report = report_json(capture, &args);
    let warnings = report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect();
    (stacks(&report), warnings)
}

/// The source file's path as DWARF names it (the test compiles it by its absolute path).
pub fn so_source_dir() -> String {
    chain_source().display().to_string()
}

pub fn text_report(capture: &Path, extra: &[&str]) -> String {
    let out = run_with_timeout(
        mprof()
            .arg("report")
            .arg(capture)
            .args(["--by", "stack", "--top", "0"])
            .args(extra),
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The newest interpreter present (the build variants need one, not all).
pub fn one_python() -> Python {
    let all = pythons();
    all.iter()
        .rev()
        .find(|p| p.label.starts_with("pyenv"))
        .unwrap_or(&all[0])
        .clone()
}
