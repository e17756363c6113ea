//! The crate's import graph, checked: the layering of `docs/architecture.md`
//! kept by a test rather than by review.
//!
//! Every file under `src/` is a node; an arrow runs from a file to each
//! module its code names through `crate::`, `super::` or `self::` (in `use`
//! lines and in paths written inline; a `pub use` re-export is an arrow
//! too, since whoever imports the re-export depends on both). Test-only
//! code (from a `#[cfg(test)]` module on) does not count: tests may reach
//! anywhere. Three rules:
//!
//! 1. No room imports through the crate root: `use crate::Name` must name
//!    the module that defines `Name`, so `lib.rs` stays the facade for
//!    users and nothing inside the crate depends on it.
//! 2. Inside each layered folder (`controller/`, `queue/`, `python/`) the
//!    file graph has no circle, so its files stack in floors with every
//!    arrow pointing down (a folder's `mod.rs` that re-exports a sibling
//!    sits above it; a sibling that takes an item from `mod.rs` would sit
//!    both above and below).
//! 3. Across the whole crate, the folders (rooms) have no circle.
//! 4. Where a folder's `mod.rs` documents its floors (a numbered list of
//!    its files in backticks: `controller/` from the top, `python/` from
//!    the bottom), every arrow between two of its files points to the same
//!    floor or one further from the top, so the written order stays true.
//!
//! The parser is deliberately small: it reads Rust as text (rustfmt'd
//! source, so `use` trees and paths have a regular shape) and needs no
//! dependency. A false arrow can only make the test stricter.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path below the crate root, e.g. `["controller", "worker"]`.
type ModPath = Vec<String>;

/// The folders whose files must stack in floors (rule 2).
const LAYERED: [&str; 3] = ["controller", "queue", "python"];

#[test]
fn no_module_imports_through_the_crate_root() {
    let crate_graph = Graph::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let through_root: Vec<String> =
        crate_graph.root_imports.iter().map(|(file, name)| format!("{}: crate::{name}", file.join("/"))).collect();
    assert!(
        through_root.is_empty(),
        "imports through lib.rs's re-exports (name the defining module):\n{}",
        through_root.join("\n")
    );
}

#[test]
fn layered_folders_have_no_import_circle() {
    let crate_graph = Graph::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut circles = Vec::new();
    for folder in LAYERED {
        let inside = |m: &ModPath| m.first().is_some_and(|f| f == folder);
        let edges: BTreeMap<ModPath, BTreeSet<ModPath>> = crate_graph
            .edges
            .iter()
            .filter(|(from, _)| inside(from))
            .map(|(from, to)| (from.clone(), to.iter().filter(|m| inside(m)).cloned().collect()))
            .collect();
        circles.extend(circles_of(&edges).into_iter().map(|c| describe(&c)));
    }
    assert!(circles.is_empty(), "import circles inside a layered folder:\n{}", circles.join("\n"));
}

#[test]
fn rooms_have_no_import_circle() {
    let crate_graph = Graph::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let room = |m: &ModPath| m.iter().take(1).cloned().collect::<ModPath>();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, to) in &crate_graph.edges {
        let from_room = room(from);
        if from_room.is_empty() {
            continue; // lib.rs: the facade re-exports every room
        }
        let entry = edges.entry(from_room.clone()).or_default();
        entry.extend(to.iter().map(room).filter(|r| *r != from_room && !r.is_empty()));
    }
    let circles: Vec<String> = circles_of(&edges).iter().map(|c| describe(c)).collect();
    assert!(circles.is_empty(), "import circles between rooms:\n{}", circles.join("\n"));
}

#[test]
fn documented_floors_hold() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let crate_graph = Graph::read(src.clone());
    let mut upward = Vec::new();
    for (folder, top_first) in [("controller", true), ("python", false)] {
        let doc = fs::read_to_string(src.join(folder).join("mod.rs")).expect("read a folder's mod.rs");
        let floors = documented_floors(&doc, top_first);
        assert!(floors.len() > 5, "{folder}/mod.rs documents no floors");
        // `folder::a::b` sits on the floor of `a`; `folder` itself is `mod`.
        let floor_of = |m: &ModPath| -> Option<usize> {
            let name = m.get(1).map_or("mod", String::as_str);
            (m.first().is_some_and(|f| f == folder)).then(|| floors.get(name).copied()).flatten()
        };
        for (from, targets) in &crate_graph.edges {
            let Some(from_floor) = floor_of(from) else { continue };
            for to in targets {
                let Some(to_floor) = floor_of(to) else { continue };
                if to_floor < from_floor && from.get(1) != to.get(1) {
                    let (from, to) = (from.join("::"), to.join("::"));
                    upward.push(format!("  {from} (floor {from_floor}) -> {to} (floor {to_floor})"));
                }
            }
        }
        let files = crate_graph.edges.keys().filter(|m| m.len() == 2 && m[0] == folder);
        let missing: Vec<&String> = files.map(|m| &m[1]).filter(|name| !floors.contains_key(name.as_str())).collect();
        assert!(missing.is_empty(), "{folder}/mod.rs's floors do not name {missing:?}");
    }
    assert!(upward.is_empty(), "imports that climb against the documented floors:\n{}", upward.join("\n"));
}

/// The floors a module doc lists: `N. `a`, `b` ...` items, numbered from
/// the top (`top_first`) or from the bottom; floor 0 is the top.
fn documented_floors(doc: &str, top_first: bool) -> BTreeMap<String, usize> {
    let mut numbered: Vec<(usize, Vec<String>)> = Vec::new();
    for line in doc.lines().take_while(|l| l.starts_with("//!")) {
        let text = line.trim_start_matches("//!").trim_start();
        let number = text.split_once(". ").and_then(|(n, _)| n.parse::<usize>().ok());
        if let Some(n) = number {
            numbered.push((n, Vec::new()));
        }
        if let Some((_, names)) = numbered.last_mut() {
            // Only the leading name of each backticked item (`watch` of `watch/`).
            for item in text.split('`').skip(1).step_by(2) {
                let name = item.trim_end_matches('/');
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    names.push(name.to_owned());
                }
            }
        }
    }
    let last = numbered.iter().map(|(n, _)| *n).max().unwrap_or(0);
    let mut floors = BTreeMap::new();
    for (n, names) in numbered {
        let floor = if top_first { n - 1 } else { last - n };
        for name in names {
            floors.entry(name).or_insert(floor);
        }
    }
    floors
}

/// The file-level import graph of a source tree.
struct Graph {
    /// Every module's imports of other modules.
    edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
    /// `(importing module, name)` for each `crate::name` that names no module.
    root_imports: Vec<(ModPath, String)>,
}

impl Graph {
    fn read(src: PathBuf) -> Self {
        let mut files = Vec::new();
        collect_rs(&src, &mut files);
        let modules: BTreeMap<ModPath, PathBuf> = files.into_iter().map(|f| (module_of(&src, &f), f)).collect();
        let known: BTreeSet<ModPath> = modules.keys().cloned().collect();
        let mut graph = Graph { edges: BTreeMap::new(), root_imports: Vec::new() };
        for (module, file) in &modules {
            let text = non_test_code(&fs::read_to_string(file).expect("read a source file"));
            let targets = graph.edges.entry(module.clone()).or_default();
            for path in referenced_paths(&text) {
                let Some(absolute) = resolve(module, &path, &known) else { continue };
                let target = longest_module_prefix(&known, &absolute);
                if target.is_empty() {
                    if !module.is_empty() && absolute.first().is_some_and(|n| !is_macro_or_keyword(n)) {
                        graph.root_imports.push((module.clone(), absolute[0].clone()));
                    }
                } else if target != *module {
                    targets.insert(target);
                }
            }
        }
        graph.root_imports.sort();
        graph.root_imports.dedup();
        graph
    }
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read a source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut parts: ModPath = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code before the file's first `#[cfg(test)]` item, without comments.
fn non_test_code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every `crate::`/`super::`/`self::` path the code names: each leaf of a
/// `use` tree, and each path written inline.
fn referenced_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(start) = find_use(rest) {
        let (before, after) = rest.split_at(start);
        paths.extend(inline_paths(before));
        let end = after.find(';').unwrap_or(after.len());
        let tree = &after[after.find("use ").expect("found above") + 4..end];
        expand_use_tree(&[], tree, &mut paths);
        rest = &after[end..];
    }
    paths.extend(inline_paths(rest));
    paths
}

/// The offset of the next `use` statement (at a line start, maybe `pub`).
fn find_use(code: &str) -> Option<usize> {
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let statement =
            trimmed.strip_prefix("pub").map_or(trimmed, |r| r.trim_start_matches(|c: char| c != ' ').trim_start());
        if statement.starts_with("use ") {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// Appends the leaves of a use tree such as `super::{a::B, c}` to `out`.
fn expand_use_tree(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = segments(&tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base: Vec<String> = prefix.iter().cloned().chain(head).collect();
        for item in split_top_level(inner) {
            expand_use_tree(&base, item, out);
        }
    } else {
        let leaf = tree.split(" as ").next().unwrap_or(tree);
        let mut path: Vec<String> = prefix.to_vec();
        path.extend(segments(leaf).into_iter().filter(|s| s != "*"));
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        out.push(path);
    }
}

fn segments(path: &str) -> Vec<String> {
    path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// Splits `a, b::{c, d}, e` at the commas outside braces.
fn split_top_level(list: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0usize, 0usize, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// Paths such as `crate::logs::started(` or `worker::Slot` written in
/// code: a lowercase word followed by `::`, with what follows it.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    let mut previous = ' ';
    let mut i = 0;
    while let Some(c) = code[i..].chars().next() {
        let starts_word = !(is_ident(previous) || previous == ':');
        if starts_word && c.is_ascii_lowercase() {
            let word_end = code[i..].find(|c: char| !is_ident(c)).map_or(code.len(), |e| i + e);
            if code[word_end..].starts_with("::") {
                let end = code[i..].find(|c: char| !(is_ident(c) || c == ':')).map_or(code.len(), |e| i + e);
                paths.push(segments(&code[i..end]));
                previous = ':';
                i = end;
                continue;
            }
        }
        previous = c;
        i += c.len_utf8();
    }
    paths
}

/// `path` made absolute from `module`: one that starts with `crate`,
/// `super`, `self` or the name of one of `module`'s own modules. Other
/// paths (other crates, `Type::method`) are `None`.
fn resolve(module: &ModPath, path: &[String], known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut base: ModPath = module.clone();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some(child) if !matches!(child, "crate" | "self" | "super") => {
            let mut child_module = module.clone();
            child_module.push(child.to_owned());
            if !known.contains(&child_module) {
                return None;
            }
        }
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
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

fn longest_module_prefix(known: &BTreeSet<ModPath>, path: &ModPath) -> ModPath {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| known.contains(p)).unwrap_or_default()
}

/// Exported macros and the like live at the root by necessity.
fn is_macro_or_keyword(name: &str) -> bool {
    name.ends_with('!') || name == "self"
}

/// The strongly connected components with more than one node (Tarjan).
fn circles_of(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a ModPath) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.clone());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}

fn describe(circle: &[ModPath]) -> String {
    let names: Vec<String> =
        circle.iter().map(|m| if m.is_empty() { "lib".to_owned() } else { m.join("::") }).collect();
    format!("  {{{}}}", names.join(", "))
}
