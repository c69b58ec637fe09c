//! The CLI crate's layout, checked (see `src/lib.rs`): src/ is one folder per stage of the
//! pipeline, and every path in src/ that names a module of the crate (`use crate::…`, a
//! `crate::…` or `super::…` path in code, in a type or inside a macro's arguments) must
//! 1. name a stage at or under its own: sessions → views → analysis → capture → base (and
//!    `fuzzing`, the harness over every view, above them all);
//! 2. leave the modules of src/ without an import circle, between stages or inside one.
//!
//! A module is a stage's direct child (`views::report`, with its own submodules); what its
//! files import of each other is theirs. Comments and doc links are not imports. The source is
//! parsed with `syn`, so a path split over lines or grouped in braces is still seen.

#[path = "support/imports.rs"]
mod imports;

use imports::resolve;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The stages, bottom first: each may import the ones before it.
const STAGES: [&str; 5] = ["base", "capture", "analysis", "views", "sessions"];
/// Modules at the crate root outside the stages, above every stage: nothing in a stage may
/// import them.
const ABOVE: [&str; 1] = ["fuzzing"];
/// Items of the crate root itself that anything may use (`crate::say!`).
const ROOT_ITEMS: [&str; 1] = ["say"];

/// A module of the check: a stage and its direct child (`None`: the stage's own `mod.rs`), or
/// one of [`ABOVE`] (then the stage is its name and the child `None`).
type Node = (String, Option<String>);

/// Where one import was seen.
#[derive(Clone, Debug)]
struct Site {
    file: PathBuf,
    line: usize,
    path: String,
}

/// Every import between two modules of src/, with the first place it was seen.
#[derive(Default)]
struct Graph {
    edges: BTreeMap<Node, BTreeMap<Node, Site>>,
    /// The direct children of each stage (files and folders under its folder).
    modules: BTreeMap<String, BTreeSet<String>>,
    problems: Vec<String>,
    files: usize,
    paths: usize,
}

fn rank(stage: &str) -> Option<usize> {
    STAGES.iter().chain(ABOVE.iter()).position(|s| *s == stage)
}

impl Graph {
    /// The module a resolved path (segments after `crate`) names.
    fn node_of(&self, segments: &[String]) -> Option<Node> {
        let first = segments.first()?;
        if ABOVE.contains(&first.as_str()) {
            return Some((first.clone(), None));
        }
        let children = self.modules.get(first)?;
        let child = segments.get(1).filter(|c| children.contains(*c)).cloned();
        Some((first.clone(), child))
    }

    /// Records that `from` (a file's module, `module` its full path) uses `path`.
    fn import(&mut self, from: &Node, module: &[String], path: Vec<String>, site: Site) {
        let Some(resolved) = resolve(module, &path) else {
            return;
        };
        self.paths += 1;
        let Some(to) = self.node_of(&resolved) else {
            match resolved.first() {
                Some(item) if ROOT_ITEMS.contains(&item.as_str()) => {}
                _ => self.problems.push(format!(
                    "{}:{}: `{}` names no stage of src/ ({})",
                    site.file.display(),
                    site.line,
                    site.path,
                    STAGES.join(", ")
                )),
            }
            return;
        };
        // The crate root (its `say!` macro uses `base`) sits above every stage.
        if to == *from || from.0 == "lib" {
            return;
        }
        let (own, theirs) = (rank(&from.0).unwrap(), rank(&to.0).unwrap());
        if theirs > own {
            self.problems.push(format!(
                "{}:{}: `{}`: the {} stage imports {}, a stage above it (the order, bottom \
                 first: {}, then {})",
                site.file.display(),
                site.line,
                site.path,
                from.0,
                to.0,
                STAGES.join(", "),
                ABOVE.join(", ")
            ));
        }
        self.edges
            .entry(from.clone())
            .or_default()
            .entry(to)
            .or_insert(site);
    }

    /// The import circles: each strongly connected set of modules of more than one, as one
    /// circle through it with the place of each import.
    fn circles(&self) -> Vec<String> {
        let nodes: BTreeSet<&Node> = self
            .edges
            .iter()
            .flat_map(|(from, to)| std::iter::once(from).chain(to.keys()))
            .collect();
        let mut out = Vec::new();
        let mut done: BTreeSet<&Node> = BTreeSet::new();
        for start in nodes {
            if done.contains(start) {
                continue;
            }
            // The shortest way back to `start`, if there is one (breadth first).
            let mut came_from: BTreeMap<&Node, &Node> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut found = None;
            while let Some(at) = queue.pop_front() {
                for next in self.edges.get(at).into_iter().flat_map(|e| e.keys()) {
                    if next == start {
                        found = Some(at);
                        break;
                    }
                    if !came_from.contains_key(next) && !done.contains(next) {
                        came_from.insert(next, at);
                        queue.push_back(next);
                    }
                }
                if found.is_some() {
                    break;
                }
            }
            if let Some(last) = found {
                let mut ring = vec![last];
                while let Some(prev) = came_from.get(ring.last().unwrap()) {
                    ring.push(prev);
                }
                ring.reverse();
                let mut text = String::from("import circle:");
                for (i, from) in ring.iter().enumerate() {
                    let to = ring.get(i + 1).copied().unwrap_or(start);
                    let site = &self.edges[*from][to];
                    text.push_str(&format!(
                        "\n  {} -> {} ({}:{}: `{}`)",
                        name(from),
                        name(to),
                        site.file.display(),
                        site.line,
                        site.path
                    ));
                }
                out.push(text);
            }
            done.insert(start);
        }
        out
    }
}

fn name(node: &Node) -> String {
    match &node.1 {
        Some(child) => format!("{}::{child}", node.0),
        None => node.0.clone(),
    }
}

/// Collects the imports of one file.
struct Visitor<'g> {
    graph: &'g mut Graph,
    file: PathBuf,
    node: Node,
    /// The module being visited: the file's, then inline modules within it.
    module: Vec<String>,
}

impl imports::Importer for Visitor<'_> {
    fn module(&mut self) -> &mut Vec<String> {
        &mut self.module
    }

    fn import(&mut self, path: Vec<String>, line: usize) {
        let site = Site {
            file: self.file.clone(),
            line,
            path: path.join("::"),
        };
        let (node, module) = (self.node.clone(), self.module.clone());
        self.graph.import(&node, &module, path, site);
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path: `src/views/export/json.rs` is `views::export::json`,
/// `src/views/export/mod.rs` is `views::export`, `src/lib.rs` the root.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The import graph of src/ (without main.rs, the binary, which uses the library by name).
fn graph() -> Graph {
    let src = src();
    let mut graph = Graph::default();
    for stage in STAGES {
        let dir = src.join(stage);
        assert!(dir.is_dir(), "{} is missing", dir.display());
        let children = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter_map(|p| match p.extension() {
                Some(e) if e == "rs" => Some(p.file_stem()?.to_string_lossy().into_owned()),
                None if p.is_dir() => Some(p.file_name()?.to_string_lossy().into_owned()),
                _ => None,
            })
            .filter(|m| m != "mod")
            .collect();
        graph.modules.insert(stage.to_owned(), children);
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap().to_path_buf();
        if relative == Path::new("main.rs") {
            continue;
        }
        let module = module_of(&relative);
        let node = match graph.node_of(&module) {
            Some(node) => node,
            None if module.is_empty() => ("lib".to_owned(), None),
            None => {
                graph.problems.push(format!(
                    "src/{} is in no stage ({}) and not one of {:?}",
                    relative.display(),
                    STAGES.join(", "),
                    ABOVE
                ));
                continue;
            }
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        graph.files += 1;
        let mut visitor = Visitor {
            graph: &mut graph,
            file: Path::new("src").join(&relative),
            node,
            module,
        };
        imports::Walk(&mut visitor).visit_file(&parsed);
    }
    graph
}

#[test]
fn stages_import_only_downward_and_nothing_in_a_circle() {
    let graph = graph();
    let mut problems = graph.problems.clone();
    problems.extend(graph.circles());
    let edges: usize = graph.edges.values().map(BTreeMap::len).sum();
    eprintln!(
        "{} files, {} paths into the crate, {} imports between {} modules",
        graph.files,
        graph.paths,
        edges,
        graph.edges.len()
    );
    assert!(graph.files > 50, "src/ was not read: {} files", graph.files);
    assert!(
        problems.is_empty(),
        "src/ breaks its layering (src/lib.rs):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import_a_circle_and_a_macro_argument() {
    let mut graph = Graph::default();
    for (stage, modules) in [
        ("capture", ["file", "meta"]),
        ("views", ["report", "about"]),
    ] {
        graph.modules.insert(
            stage.to_owned(),
            modules.iter().map(|m| m.to_string()).collect(),
        );
    }
    let code = r#"
        use crate::capture::{meta::meta_rate, file};
        fn f() { crate::say!("{}", super::meta::X); }
        mod tests { use super::super::meta; }
    "#;
    let file = syn::parse_file(code).unwrap();
    let mut visitor = Visitor {
        graph: &mut graph,
        file: PathBuf::from("src/capture/file.rs"),
        node: ("capture".to_owned(), Some("file".to_owned())),
        module: vec!["capture".to_owned(), "file".to_owned()],
    };
    imports::Walk(&mut visitor).visit_file(&file);
    let meta = ("capture".to_owned(), Some("meta".to_owned()));
    let file_node = ("capture".to_owned(), Some("file".to_owned()));
    assert!(graph.edges[&file_node].contains_key(&meta));
    assert!(graph.problems.is_empty(), "{:?}", graph.problems);
    assert!(graph.circles().is_empty());
    // meta -> views::report: upward; report -> about -> meta -> file: then a circle.
    let upward = syn::parse_file("fn g() { let _ = crate::views::report::render; }").unwrap();
    let mut visitor = Visitor {
        graph: &mut graph,
        file: PathBuf::from("src/capture/meta.rs"),
        node: meta.clone(),
        module: vec!["capture".to_owned(), "meta".to_owned()],
    };
    imports::Walk(&mut visitor).visit_file(&upward);
    assert_eq!(graph.problems.len(), 1, "{:?}", graph.problems);
    assert!(graph.problems[0].contains("the capture stage imports views"));
    let back = syn::parse_file("use crate::capture::file::CaptureFile;").unwrap();
    let mut visitor = Visitor {
        graph: &mut graph,
        file: PathBuf::from("src/capture/meta.rs"),
        node: meta,
        module: vec!["capture".to_owned(), "meta".to_owned()],
    };
    imports::Walk(&mut visitor).visit_file(&back);
    let circles = graph.circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].contains("capture::file -> capture::meta")
            && circles[0].contains("capture::meta -> capture::file"),
        "{}",
        circles[0]
    );
}
