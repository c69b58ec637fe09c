//! What the two layering tests share (`tests/layers.rs` for the CLI's src/, and
//! `injector/agent/tests/layers.rs` for the agent's): every path a Rust file names that may be
//! an import of its own crate (`use` trees, paths in code and types, `crate::`/`super::`
//! sequences inside a macro's tokens), walked with `syn`, and how such a path resolves from the
//! module it is written in. Each test decides what an import means for its crate.

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// What a test does with the paths of one file.
pub trait Importer {
    /// The module being walked: the file's, then inline modules within it.
    fn module(&mut self) -> &mut Vec<String>;
    /// A path as written, seen at `line`.
    fn import(&mut self, path: Vec<String>, line: usize);
}

/// Walks a parsed file for an [`Importer`]: `Walk(&mut importer).visit_file(&file)`.
pub struct Walk<'a, I: Importer>(pub &'a mut I);

impl<I: Importer> Walk<'_, I> {
    /// Every path of a use tree, from its root.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.use_leaf(prefix, &r.ident),
            syn::UseTree::Glob(g) => {
                let line = g.star_token.span.start().line;
                self.0.import(prefix.clone(), line);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident.to_string());
        }
        self.0.import(path, ident.span().start().line);
    }

    /// `crate::a::b` and `super::a` sequences inside a macro's tokens (its arguments are not
    /// parsed as code).
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let line = id.span().start().line;
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (trees.get(j), trees.get(j + 1))
                    {
                        let (Some(TokenTree::Ident(next)), ':', ':') =
                            (trees.get(j + 2), a.as_char(), b.as_char())
                        else {
                            break;
                        };
                        path.push(next.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.0.import(path, line);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast, I: Importer> Visit<'ast> for Walk<'_, I> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.0.module().push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.0.module().pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && segments.len() > 1 {
            let line = p.segments[0].ident.span().start().line;
            self.0.import(segments, line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}

/// `path` (as written, from `crate`, `super` or `self`) as segments after `crate`, seen from
/// `module`; `None` for a path that does not start in this crate.
pub fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = module.to_vec();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}
