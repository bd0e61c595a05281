//! The layout's promise, checked: the top-level modules of `src/` depend on each other without
//! a cycle, so each floor can be read (and changed) knowing only the floors below it. A
//! dependency is a `crate::module` path in a module's code (comments and `#[cfg(test)]` modules
//! left out); `docs/architecture.md` draws the floors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// The code of a source file without comments and without its trailing test module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string (a URL) is rare in paths that name `crate::`; cutting
            // there only ever drops dependencies from a line's tail, never invents one.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn deps_of(text: &str, own: &str, into: &mut BTreeSet<String>) {
    let code = code(text);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name != own && name.chars().next().unwrap().is_ascii_lowercase() {
            into.insert(name);
        }
    }
}

fn walk(dir: &Path, own: &str, into: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, own, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            deps_of(&std::fs::read_to_string(&path).unwrap(), own, into);
        }
    }
}

/// Top-level module → the top-level modules its code names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g = BTreeMap::new();
    for entry in std::fs::read_dir(SRC).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if stem == "main" || stem == "lib" {
            continue;
        }
        let mut deps = BTreeSet::new();
        if path.is_dir() {
            walk(&path, stem, &mut deps);
        } else if path.extension().is_some_and(|e| e == "rs") {
            deps_of(&std::fs::read_to_string(&path).unwrap(), stem, &mut deps);
        } else {
            continue;
        }
        g.entry(stem.to_string())
            .or_insert_with(BTreeSet::new)
            .extend(deps);
    }
    g
}

/// A cycle through `node`, if there is one reachable from it.
fn cycle_from(
    g: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| n == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.to_string());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_string());
    for next in g.get(node).into_iter().flatten() {
        if let Some(c) = cycle_from(g, next, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(node.to_string());
    None
}

#[test]
fn the_top_level_modules_depend_on_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 20, "found the modules: {:?}", g.keys());
    assert!(g["transfer"].contains("config"), "the parser sees paths");
    let mut done = BTreeSet::new();
    for node in g.keys() {
        if let Some(cycle) = cycle_from(&g, node, &mut Vec::new(), &mut done) {
            panic!("a dependency cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_lowest_floors_name_no_role() {
    let g = graph();
    let roles = [
        "master", "store", "client", "router", "operator", "engine", "bench", "ha",
    ];
    for floor in ["transfer", "config", "telemetry", "auth"] {
        let named: Vec<&String> = g[floor]
            .iter()
            .filter(|d| roles.contains(&d.as_str()))
            .collect();
        assert!(named.is_empty(), "{floor} depends on {named:?}");
    }
}
