//! The agent's modules, checked against the order `src/lib.rs` gives them ("Modules, bottom
//! up: …", in its doc): every path in src/ that names something of the crate (`use crate::…`,
//! a `crate::…`, `self::…` or `super::…` path in code, in a type or inside a macro's
//! arguments; a module's tests included) must
//! 1. name a module listed before its own file's, or its own (an item of the crate root,
//!    such as `crate::before_fork`, is above every module);
//! 2. leave the modules without an import circle.
//!
//! The list must name every module `src/lib.rs` declares, once. Comments and doc links are not
//! imports. The source is parsed with `syn`, so a path split over lines or grouped in braces
//! is still seen. (The CLI's `tests/layers.rs` checks src/ the same way.)

#[path = "../../../tests/support/imports.rs"]
mod imports;

use imports::resolve;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The crate root, above every module.
const ROOT: &str = "lib";
/// The sentence of `src/lib.rs`'s doc that lists the modules, bottom first, each in backticks.
const ORDER_START: &str = "Modules, bottom up:";

/// Where one import was seen.
#[derive(Clone, Debug)]
struct Site {
    file: String,
    line: usize,
    path: String,
}

/// The modules in their order, and every import between two of them.
#[derive(Default)]
struct Graph {
    /// The modules, bottom first (the root last).
    order: Vec<String>,
    edges: BTreeMap<String, BTreeMap<String, Site>>,
    problems: Vec<String>,
    files: usize,
    paths: usize,
}

impl Graph {
    fn with_order(modules: &[&str]) -> Graph {
        let mut order: Vec<String> = modules.iter().map(|m| m.to_string()).collect();
        order.push(ROOT.to_owned());
        Graph {
            order,
            ..Graph::default()
        }
    }

    fn rank(&self, module: &str) -> usize {
        self.order.iter().position(|m| m == module).unwrap()
    }

    /// The module a resolved path (segments after `crate`) names: the first segment if it is
    /// a module, else the root (the path names one of its items).
    fn node_of(&self, segments: &[String]) -> String {
        match segments.first() {
            Some(first) if first != ROOT && self.order.contains(first) => first.clone(),
            _ => ROOT.to_owned(),
        }
    }

    /// Records that module `from` (`module`: the module the path is written in, from the
    /// crate root) uses `path`.
    fn import(&mut self, from: &str, module: &[String], path: Vec<String>, site: Site) {
        let Some(resolved) = resolve(module, &path) else {
            return;
        };
        self.paths += 1;
        let to = self.node_of(&resolved);
        if to == from {
            return;
        }
        if self.rank(&to) > self.rank(from) {
            let what = if to == ROOT {
                "the crate root".to_owned()
            } else {
                format!("`{to}`, a module after it")
            };
            self.problems.push(format!(
                "{}:{}: `{}`: `{from}` imports {what}",
                site.file, site.line, site.path
            ));
        }
        self.edges
            .entry(from.to_owned())
            .or_default()
            .entry(to)
            .or_insert(site);
    }

    /// The import circles: for each module on one, the shortest circle through it (each once),
    /// with the place of each import.
    fn circles(&self) -> Vec<String> {
        let nodes: BTreeSet<&String> = self
            .edges
            .iter()
            .flat_map(|(from, to)| std::iter::once(from).chain(to.keys()))
            .collect();
        let mut out = Vec::new();
        let mut done: BTreeSet<&String> = BTreeSet::new();
        for start in nodes {
            // The shortest way back to `start`, if there is one (breadth first).
            let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
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
            done.insert(start);
            let Some(last) = found else { continue };
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
                    "\n  {from} -> {to} ({}:{}: `{}`)",
                    site.file, site.line, site.path
                ));
            }
            out.push(text);
        }
        out
    }
}

/// Collects the imports of one file.
struct Visitor<'g> {
    graph: &'g mut Graph,
    file: String,
    /// The file's module.
    node: String,
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

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The crate root's doc, its lines joined.
fn doc_of(root: &syn::File) -> String {
    let mut doc = String::new();
    for attr in &root.attrs {
        let syn::Meta::NameValue(nv) = &attr.meta else {
            continue;
        };
        if !nv.path.is_ident("doc") {
            continue;
        }
        if let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) = &nv.value
        {
            doc.push_str(&s.value());
            doc.push('\n');
        }
    }
    doc
}

/// The modules as the doc lists them, bottom first: the backticked names of its paragraph
/// that starts with [`ORDER_START`].
fn listed_order(doc: &str) -> Vec<String> {
    let Some(start) = doc.find(ORDER_START) else {
        return Vec::new();
    };
    let paragraph = doc[start..].split("\n \n").next().unwrap();
    let paragraph = paragraph.split("\n\n").next().unwrap();
    paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The modules the root declares (`mod x;`).
fn declared(root: &syn::File) -> BTreeSet<String> {
    root.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if m.content.is_none() => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// The import graph of src/, in the order src/lib.rs gives.
fn graph() -> Graph {
    let src = src();
    let root = parse(&src.join("lib.rs"));
    let order = listed_order(&doc_of(&root));
    let modules = declared(&root);
    let mut problems = Vec::new();
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    if listed.len() != order.len() {
        problems.push(format!("src/lib.rs lists a module twice: {order:?}"));
    }
    for missing in modules.difference(&listed) {
        problems.push(format!(
            "src/lib.rs declares `{missing}` but does not place it in its \"{ORDER_START}\" list"
        ));
    }
    for unknown in listed.difference(&modules) {
        problems.push(format!(
            "src/lib.rs lists `{unknown}` in its \"{ORDER_START}\" list, but declares no such module"
        ));
    }
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let mut graph = Graph::with_order(&order);
    graph.problems = problems;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let (node, module) = if stem == ROOT {
            (ROOT.to_owned(), Vec::new())
        } else if modules.contains(&stem) {
            (stem.clone(), vec![stem.clone()])
        } else {
            graph
                .problems
                .push(format!("src/{stem}.rs is no module src/lib.rs declares"));
            continue;
        };
        let parsed = parse(&file);
        graph.files += 1;
        let mut visitor = Visitor {
            graph: &mut graph,
            file: format!("src/{stem}.rs"),
            node,
            module,
        };
        imports::Walk(&mut visitor).visit_file(&parsed);
    }
    graph
}

#[test]
fn modules_import_only_downward_in_the_order_lib_rs_gives_and_nothing_in_a_circle() {
    let graph = graph();
    let mut problems = graph.problems.clone();
    problems.extend(graph.circles());
    let edges: usize = graph.edges.values().map(BTreeMap::len).sum();
    eprintln!(
        "{} files, {} paths into the crate, {} imports between {} modules; the order: {}",
        graph.files,
        graph.paths,
        edges,
        graph.edges.len(),
        graph.order.join(", ")
    );
    assert!(graph.order.len() > 20, "no order found in src/lib.rs");
    assert!(graph.files > 20, "src/ was not read: {} files", graph.files);
    assert!(
        problems.is_empty(),
        "the agent's modules break their order (bottom first, in src/lib.rs: {}):\n{}",
        graph.order.join(", "),
        problems.join("\n")
    );
}

fn visit(graph: &mut Graph, module: &str, code: &str) {
    let file = syn::parse_file(code).unwrap();
    let mut visitor = Visitor {
        graph,
        file: format!("src/{module}.rs"),
        node: module.to_owned(),
        module: vec![module.to_owned()],
    };
    imports::Walk(&mut visitor).visit_file(&file);
}

#[test]
fn the_check_sees_an_upward_import_a_root_item_a_circle_and_a_macro_argument() {
    let mut graph = Graph::with_order(&["sys", "lock", "chain"]);
    // Downward: a grouped `use`, a path in code, one inside a macro's arguments, a test
    // module's `super::super`.
    visit(
        &mut graph,
        "chain",
        r#"
        use crate::{lock::SpinLock, sys};
        fn f() { say!("{}", crate::sys::X); let _ = crate::lock::new(); }
        mod tests { use super::super::sys::Y; }
        "#,
    );
    assert!(graph.edges["chain"].contains_key("sys") && graph.edges["chain"].contains_key("lock"));
    assert!(graph.problems.is_empty(), "{:?}", graph.problems);
    assert!(graph.circles().is_empty());
    // Upward: `sys` names `chain` (inside a macro) and an item of the crate root.
    visit(
        &mut graph,
        "sys",
        "fn g() { h!(crate::chain::TABLE); crate::before_fork(); }",
    );
    assert_eq!(graph.problems.len(), 2, "{:?}", graph.problems);
    assert!(graph.problems[0].contains("`sys` imports `chain`, a module after it"));
    assert!(graph.problems[1].contains("`sys` imports the crate root"));
    // sys -> chain -> sys: a circle, told with its two imports.
    let circles = graph.circles();
    assert!(
        circles
            .iter()
            .any(|c| c.contains("chain -> sys (src/chain.rs")
                && c.contains("sys -> chain (src/sys.rs")),
        "{circles:?}"
    );
}

#[test]
fn the_order_is_read_from_its_paragraph_alone() {
    let doc = "The agent.\n\n Modules, bottom up: `sys` (libc), `lock`, and\n `chain`; here the \
               entry points.\n\n More, with `names` that are not modules.\n";
    assert_eq!(listed_order(doc), ["sys", "lock", "chain"]);
    assert!(listed_order("no list").is_empty());
}
