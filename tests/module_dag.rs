//! The top-level modules of every crate form a DAG, as the crates do: a lower module never names
//! a higher one through `crate::`, `super::` or `self::` paths (unit tests included; doc comments
//! and the insides of macro calls are not read). The test parses every source file with `syn`,
//! resolves each path to the top-level module it names (items defined in the crate root count as
//! the node `lib`, the root's `pub use` re-exports are followed to their module), and fails on any
//! cycle, naming the modules of each cycle and one place where each of its edges is taken.
//!
//! `cargo test --test module_dag -- --nocapture` prints each crate's modules bottom up. The same
//! file keeps every source file under 1200 lines (`tests.rs` files aside).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// One crate: its name and the file that is its library's root.
struct CrateRoot {
    name: &'static str,
    root: &'static str,
}

const CRATES: &[CrateRoot] = &[
    CrateRoot {
        name: "flotilla-config",
        root: "crates/flotilla-config/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-contract",
        root: "crates/flotilla-contract/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-study",
        root: "crates/flotilla-study/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-comm",
        root: "crates/flotilla-comm/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-launch",
        root: "crates/flotilla-launch/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-results",
        root: "crates/flotilla-results/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla-train",
        root: "crates/flotilla-train/src/lib.rs",
    },
    CrateRoot {
        name: "flotilla",
        root: "src/main.rs",
    },
];

/// The node for items defined in the crate root file itself.
const ROOT_ITEMS: &str = "lib";

/// Where an edge was seen: a file and a line.
type Site = (PathBuf, usize);

/// The graph of one crate's top-level modules.
#[derive(Default)]
struct ModuleGraph {
    modules: BTreeSet<String>,
    /// from -> to -> first place the edge is taken
    edges: BTreeMap<String, BTreeMap<String, Site>>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The module path of a source file relative to its crate's `src/`
/// (`a.rs` and `a/mod.rs` are `[a]`, `a/b.rs` is `[a, b]`, the root is `[]`).
fn module_path_of(src: &Path, file: &Path, root_file: &Path) -> Vec<String> {
    if file == root_file {
        return Vec::new();
    }
    let rel = file.strip_prefix(src).expect("file under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The root file's `mod` declarations, its `pub use module::Item` re-exports (name -> module)
/// and the names of the items it defines itself.
struct RootFacts {
    modules: BTreeSet<String>,
    reexports: BTreeMap<String, String>,
    own_items: BTreeSet<String>,
}

fn root_facts(file: &syn::File) -> RootFacts {
    let mut facts = RootFacts {
        modules: BTreeSet::new(),
        reexports: BTreeMap::new(),
        own_items: BTreeSet::new(),
    };
    for item in &file.items {
        match item {
            syn::Item::Mod(m) => {
                facts.modules.insert(m.ident.to_string());
            }
            syn::Item::Use(u) => collect_reexports(&u.tree, None, &mut facts.reexports),
            other => {
                if let Some(name) = item_name(other) {
                    facts.own_items.insert(name);
                }
            }
        }
    }
    facts
}

fn item_name(item: &syn::Item) -> Option<String> {
    Some(
        match item {
            syn::Item::Const(i) => &i.ident,
            syn::Item::Enum(i) => &i.ident,
            syn::Item::Fn(i) => &i.sig.ident,
            syn::Item::Static(i) => &i.ident,
            syn::Item::Struct(i) => &i.ident,
            syn::Item::Trait(i) => &i.ident,
            syn::Item::Type(i) => &i.ident,
            syn::Item::Union(i) => &i.ident,
            syn::Item::Macro(i) => i.ident.as_ref()?,
            _ => return None,
        }
        .to_string(),
    )
}

/// `use a::{B, c::D as E}` at the root: B -> a, E -> a.
fn collect_reexports(tree: &syn::UseTree, first: Option<&str>, out: &mut BTreeMap<String, String>) {
    match tree {
        syn::UseTree::Path(p) => {
            let head = p.ident.to_string();
            let first = first.map(str::to_string).unwrap_or(head);
            collect_reexports(&p.tree, Some(&first), out);
        }
        syn::UseTree::Name(n) => {
            if let Some(first) = first {
                out.insert(n.ident.to_string(), first.to_string());
            }
        }
        syn::UseTree::Rename(r) => {
            if let Some(first) = first {
                out.insert(r.rename.to_string(), first.to_string());
            }
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                collect_reexports(t, first, out);
            }
        }
        syn::UseTree::Glob(_) => {}
    }
}

/// Walks one file, resolving every path to the top-level module it names.
struct PathCollector<'a> {
    file: &'a Path,
    /// the file's module path followed by the inline modules the walk is inside
    module: Vec<String>,
    facts: &'a RootFacts,
    /// `#[macro_export]` macros (at the crate root) -> the module defining them
    exported_macros: &'a BTreeMap<String, String>,
    found: Vec<(String, usize)>,
}

impl PathCollector<'_> {
    /// The top-level module an absolute path (from the crate root) names, if any.
    fn top_level(&self, absolute: &[String]) -> Option<String> {
        let first = absolute.first()?;
        if self.facts.modules.contains(first) {
            return Some(first.clone());
        }
        if let Some(module) = self.facts.reexports.get(first) {
            if self.facts.modules.contains(module) {
                return Some(module.clone());
            }
        }
        if let Some(module) = self.exported_macros.get(first) {
            return Some(module.clone());
        }
        if self.facts.own_items.contains(first) {
            return Some(ROOT_ITEMS.to_string());
        }
        None
    }

    /// Resolves a path's leading `crate`/`super`/`self` segments to an absolute one; bare paths
    /// are resolved only in the root file (where `module::Item` names a top-level module).
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut current = self.module.clone();
        let mut rest = segments;
        match segments.first().map(String::as_str) {
            Some("crate") => {
                current.clear();
                rest = &segments[1..];
            }
            Some("super") | Some("self") => {
                while let Some(head) = rest.first() {
                    match head.as_str() {
                        "super" => {
                            current.pop()?;
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            _ if self.module.is_empty() => {}
            _ => return None,
        }
        current.extend(rest.iter().cloned());
        Some(current)
    }

    fn record(&mut self, segments: Vec<String>, line: usize) {
        if let Some(absolute) = self.absolute(&segments) {
            if let Some(target) = self.top_level(&absolute) {
                self.found.push((target, line));
            }
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree, mut prefix: Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
            }
            syn::UseTree::Name(n) => {
                let line = n.ident.span().start().line;
                if n.ident != "self" {
                    prefix.push(n.ident.to_string());
                }
                self.record(prefix, line);
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                if r.ident != "self" {
                    prefix.push(r.ident.to_string());
                }
                self.record(prefix, line);
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.span.start().line;
                self.record(prefix, line);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix.clone());
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for PathCollector<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // the root's re-exports are its facade, not a dependency of the root's own items
        if self.module.is_empty() {
            return;
        }
        self.use_tree(&u.tree, Vec::new());
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        // a single bare segment at the root is a local item or a module only through `use`
        if segments.len() > 1 || matches!(segments[0].as_str(), "crate" | "super" | "self") {
            self.record(segments, line);
        }
        syn::visit::visit_path(self, path);
    }
}

fn exported_macros(files: &[(PathBuf, Vec<String>, syn::File)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, module, file) in files {
        let Some(top) = module.first() else { continue };
        for item in &file.items {
            if let syn::Item::Macro(m) = item {
                let exported = m.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                if let (true, Some(ident)) = (exported, &m.ident) {
                    out.insert(ident.to_string(), top.clone());
                }
            }
        }
    }
    out
}

fn crate_graph(krate: &CrateRoot) -> ModuleGraph {
    let root_file = repo().join(krate.root);
    let src = root_file.parent().expect("src/").to_path_buf();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let lib_and_main = root_file.ends_with("lib.rs") && src.join("main.rs").exists();
    let files: Vec<(PathBuf, Vec<String>, syn::File)> = paths
        .into_iter()
        // a library's main.rs is another crate (the binary), above the whole library
        .filter(|p| !(lib_and_main && p == &src.join("main.rs")))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("source file");
            let parsed =
                syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()));
            let module = module_path_of(&src, &p, &root_file);
            (p, module, parsed)
        })
        .collect();
    let root = files
        .iter()
        .find(|(p, _, _)| p == &root_file)
        .expect("the crate root");
    let facts = root_facts(&root.2);
    let macros = exported_macros(&files);
    let mut graph = ModuleGraph {
        modules: facts.modules.clone(),
        ..Default::default()
    };
    if !facts.own_items.is_empty() {
        graph.modules.insert(ROOT_ITEMS.to_string());
    }
    for (path, module, file) in &files {
        let from = module
            .first()
            .cloned()
            .unwrap_or_else(|| ROOT_ITEMS.to_string());
        let mut collector = PathCollector {
            file: path,
            module: module.clone(),
            facts: &facts,
            exported_macros: &macros,
            found: Vec::new(),
        };
        collector.visit_file(file);
        for (to, line) in collector.found {
            if to != from {
                graph
                    .edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| (collector.file.to_path_buf(), line));
            }
        }
    }
    graph
}

/// Tarjan's strongly connected components, each sorted; only those of more than one module.
fn cycles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g ModuleGraph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn connect<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(targets) = s.graph.edges.get(v) {
            for w in targets.keys() {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    connect(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for m in &graph.modules {
        if !state.index.contains_key(m.as_str()) {
            connect(&mut state, m);
        }
    }
    state.out
}

/// The modules bottom up, in layers: each module's dependencies are in earlier layers.
fn layers(graph: &ModuleGraph) -> Vec<Vec<String>> {
    let mut placed: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    while placed.len() < graph.modules.len() {
        let layer: Vec<String> = graph
            .modules
            .iter()
            .filter(|m| !placed.contains(*m))
            .filter(|m| {
                graph
                    .edges
                    .get(*m)
                    .is_none_or(|ts| ts.keys().all(|t| placed.contains(t)))
            })
            .cloned()
            .collect();
        if layer.is_empty() {
            break;
        }
        placed.extend(layer.iter().cloned());
        out.push(layer);
    }
    out
}

#[test]
fn every_crate_s_top_level_modules_form_a_dag() {
    let mut failures = Vec::new();
    for krate in CRATES {
        let graph = crate_graph(krate);
        let found = cycles(&graph);
        if found.is_empty() {
            let order: Vec<String> = layers(&graph).iter().map(|l| l.join(" ")).collect();
            println!("{}: {}", krate.name, order.join("  <  "));
            continue;
        }
        for component in found {
            let mut lines = vec![format!(
                "{}: an import cycle of {} modules: {}",
                krate.name,
                component.len(),
                component.join(" ")
            )];
            for from in &component {
                for (to, (file, line)) in graph.edges.get(from).into_iter().flatten() {
                    if component.contains(to) {
                        let rel = file.strip_prefix(repo()).unwrap_or(file);
                        lines.push(format!("  {from} -> {to}  ({}:{line})", rel.display()));
                    }
                }
            }
            failures.push(lines.join("\n"));
        }
    }
    assert!(
        failures.is_empty(),
        "a lower module names a higher one; move the shared piece down (a type into the module \
         both use, a trait the lower one defines and the higher one implements):\n{}",
        failures.join("\n")
    );
}

/// The check itself can fail: a graph with a cycle is found, and one without is ordered.
#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let mut graph = ModuleGraph::default();
    for m in ["a", "b", "c", "d"] {
        graph.modules.insert(m.to_string());
    }
    let site = (PathBuf::from("x.rs"), 1);
    let mut edge = |from: &str, to: &str| {
        graph
            .edges
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string(), site.clone());
    };
    edge("a", "b");
    edge("b", "c");
    edge("d", "a");
    assert!(cycles(&graph).is_empty());
    assert_eq!(
        layers(&graph),
        vec![
            vec!["c".to_string()],
            vec!["b".into()],
            vec!["a".into()],
            vec!["d".into()]
        ]
    );
    graph
        .edges
        .entry("c".to_string())
        .or_default()
        .insert("a".to_string(), site);
    assert_eq!(
        cycles(&graph),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
}

/// `super::` from a file two levels down stays in its top-level module; from a top-level
/// module's file it reaches the root; inline modules add a level.
#[test]
fn paths_resolve_as_rustc_resolves_them() {
    let facts = RootFacts {
        modules: ["model", "data"].iter().map(|s| s.to_string()).collect(),
        reexports: [("Trainer".to_string(), "data".to_string())].into(),
        own_items: ["TrainError".to_string()].into(),
    };
    let macros = BTreeMap::new();
    let src = "use super::Foo; use super::super::data::X; fn f() { let _ = crate::Trainer::new(); \
               let _: crate::TrainError; } mod tests { use super::super::Y; }";
    let file = syn::parse_file(src).unwrap();
    let mut collector = PathCollector {
        file: Path::new("model/llama.rs"),
        module: vec!["model".into(), "llama".into()],
        facts: &facts,
        exported_macros: &macros,
        found: Vec::new(),
    };
    collector.visit_file(&file);
    let targets: Vec<&str> = collector.found.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(targets, ["model", "data", "data", "lib", "model"]);
}

/// No source file of a crate grows past 1200 lines (tests aside): a file that would is split
/// along its topics.
#[test]
fn no_source_file_is_over_1200_lines() {
    let mut long = vec![];
    for krate in CRATES {
        let root_file = repo().join(krate.root);
        let src = root_file.parent().expect("src/");
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        for path in paths {
            let lines = std::fs::read_to_string(&path)
                .expect("source")
                .lines()
                .count();
            let is_tests = path.file_name().is_some_and(|n| n == "tests.rs");
            if lines > 1200 && !is_tests {
                let rel = path
                    .strip_prefix(repo())
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                long.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these along their topics:\n{}",
        long.join("\n")
    );
}
