//! The workspace's modules import in one direction. Read from the code
//! itself (syn's parse of every file, `#[cfg(test)]` items left out):
//! - in no crate do modules import each other in a circle;
//! - the host's modules import only their own layer or the ones below it
//!   ([`HOST_LAYERS`], drawn in ARCHITECTURE.md).
//!
//! A module is a file. It imports another when its code names it: a path
//! through `crate::`, `super::` or `self::`, or one of its own child
//! modules by name, in a `use` or anywhere in its code. Naming one of its
//! own ancestors is not an import (a parent's items are its children's
//! context), naming a descendant is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit_mut::VisitMut;

/// A module: its path of names below the crate's root (`[]` for the root).
type Module = Vec<String>;

/// The host's layers, top first: a module may import its own layer and the
/// ones below. A module not listed takes its nearest listed ancestor's.
const HOST_LAYERS: &[&[&str]] = &[
    // The binary and what it assembles: config builds the fleet.
    &["", "start", "config"],
    // The HTTP adapters (routing, extraction, the Klavis shapes, the
    // OpenAPI document, the MCP proxy, `/metrics`) and the one mapping of
    // errors to statuses.
    &["api", "error"],
    // The lease service: the rules, with no HTTP in them.
    &["lease", "uploads"],
    // Where sandboxes come from, one interface over the backends.
    &["fleet"],
    // Below: the leases' store, the pool's slots, metrics' counters,
    // signing.
    &["store", "pool", "metrics", "signed"],
];

#[test]
fn no_crate_imports_in_a_circle() {
    let mut problems = Vec::new();
    for krate in crates() {
        let graph = imports(&krate);
        for circle in circles(&graph) {
            let names: Vec<String> = circle.iter().map(show).collect();
            let edges: Vec<String> = circle
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|t| circle.contains(*t))
                        .map(move |t| format!("{} → {}", show(m), show(t)))
                })
                .collect();
            problems.push(format!(
                "{}: {} modules import each other in a circle: {names:?} ({})",
                krate.display(),
                circle.len(),
                edges.join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The graph's circles (strongly connected components of more than one
/// module), each sorted (Tarjan's algorithm, iterative).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    #[derive(Default)]
    struct State<'a> {
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    let mut st = State::default();
    for start in graph.keys() {
        if st.index.contains_key(start) {
            continue;
        }
        // Each frame: a module and the targets left to visit.
        let mut frames: Vec<(&Module, Vec<&Module>)> = Vec::new();
        frames.push((start, Vec::new()));
        {
            let n = st.index.len();
            st.index.insert(start, n);
            st.low.insert(start, n);
            st.stack.push(start);
            st.on.insert(start);
            frames.last_mut().expect("a frame").1 = graph[start].iter().collect();
        }
        while let Some((m, todo)) = frames.last_mut() {
            let m: &Module = m;
            if let Some(t) = todo.pop() {
                if !st.index.contains_key(t) {
                    let n = st.index.len();
                    st.index.insert(t, n);
                    st.low.insert(t, n);
                    st.stack.push(t);
                    st.on.insert(t);
                    let next = graph.get(t).map(|s| s.iter().collect()).unwrap_or_default();
                    frames.push((t, next));
                } else if st.on.contains(t) {
                    let low = st.low[m].min(st.index[t]);
                    st.low.insert(m, low);
                }
                continue;
            }
            frames.pop();
            if let Some((parent, _)) = frames.last() {
                let low = st.low[parent].min(st.low[m]);
                st.low.insert(parent, low);
            }
            if st.low[m] == st.index[m] {
                let mut comp = Vec::new();
                while let Some(w) = st.stack.pop() {
                    st.on.remove(w);
                    comp.push(w.clone());
                    if w == m {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    st.out.push(comp);
                }
            }
        }
    }
    st.out
}

#[test]
fn the_hosts_layers_import_only_downward() {
    let graph = imports(&root().join("src/host/src"));
    let mut up = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if layer(to) < layer(from) {
                up.push(format!("{} → {}", show(from), show(to)));
            }
        }
    }
    assert!(up.is_empty(), "imports up a layer (HOST_LAYERS): {up:?}");
}

/// Every crate's source directory (`src/*/src`).
fn crates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("src"))
        .expect("src/")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn show(m: &Module) -> String {
    if m.is_empty() {
        "<root>".into()
    } else {
        m.join("/")
    }
}

/// A host module's layer: 0 at the top.
fn layer(m: &Module) -> usize {
    let name = m.first().map(String::as_str).unwrap_or("");
    HOST_LAYERS
        .iter()
        .position(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("host module {} is in no layer of HOST_LAYERS", show(m)))
}

/// Every module of the crate at `src` and the modules it imports.
fn imports(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let files = modules(src);
    let known: BTreeSet<Module> = files.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (m, file) in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let mut ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut paths = Paths::default();
        paths.visit_file_mut(&mut ast);
        let targets = paths
            .found
            .iter()
            .filter_map(|p| resolve(m, p, &known))
            .filter(|t| t != m && !m.starts_with(t))
            .collect();
        graph.insert(m.clone(), targets);
    }
    graph
}

/// The crate's files by module path (`a/mod.rs` and `a.rs` are `a`).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("a source dir").flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("below src");
            let mut m: Module = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                m.pop();
            }
            // Test modules in files of their own (`tests.rs`, `tests/…`).
            if m.iter().any(|s| s == "tests") {
                continue;
            }
            out.insert(m, path);
        }
    }
    out
}

/// The module a path names from `m`: its deepest module prefix.
fn resolve(m: &Module, path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    let (mut at, rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self" | "super") => {
            let mut at = m.clone();
            let mut i = 0;
            while let Some(s) = path.get(i).map(String::as_str) {
                match s {
                    "super" => {
                        at.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                i += 1;
            }
            (at, &path[i..])
        }
        // A child module by name (`child::item`; a lone name is a value).
        Some(first) if path.len() > 1 => {
            let mut child = m.clone();
            child.push(first.to_owned());
            if !known.contains(&child) {
                return None;
            }
            (m.clone(), path)
        }
        _ => return None,
    };
    let mut best = known.contains(&at).then(|| at.clone());
    for s in rest {
        at.push(s.clone());
        if known.contains(&at) {
            best = Some(at.clone());
        } else {
            break;
        }
    }
    best
}

/// Every path a file names outside its `#[cfg(test)]` items.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl VisitMut for Paths {
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        let attrs = match item {
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            _ => return syn::visit_mut::visit_item_mut(self, item),
        };
        if !is_test(attrs) {
            syn::visit_mut::visit_item_mut(self, item);
        }
    }

    fn visit_item_use_mut(&mut self, u: &mut syn::ItemUse) {
        let mut stack = vec![(Vec::new(), &u.tree)];
        while let Some((prefix, tree)) = stack.pop() {
            match tree {
                syn::UseTree::Path(p) => {
                    let mut next: Vec<String> = prefix.clone();
                    next.push(p.ident.to_string());
                    stack.push((next, &p.tree));
                }
                syn::UseTree::Name(n) => {
                    let mut full = prefix.clone();
                    if n.ident != "self" {
                        full.push(n.ident.to_string());
                    }
                    self.found.push(full);
                }
                syn::UseTree::Rename(r) => {
                    let mut full = prefix.clone();
                    if r.ident != "self" {
                        full.push(r.ident.to_string());
                    }
                    self.found.push(full);
                }
                syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
                syn::UseTree::Group(g) => {
                    stack.extend(g.items.iter().map(|t| (prefix.clone(), t)));
                }
            }
        }
    }

    fn visit_path_mut(&mut self, p: &mut syn::Path) {
        self.found
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit_mut::visit_path_mut(self, p);
    }
}
