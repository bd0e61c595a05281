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

/// The first segment of a path (`transfer` of `transfer::message::X`).
fn head(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn deps_of(text: &str, own: &str, into: &mut BTreeSet<String>) {
    deps_under(text, "crate::", own, into);
}

/// The modules under `prefix` (`crate::`, `crate::router::`) that `text` names.
fn deps_under(text: &str, prefix: &str, own: &str, into: &mut BTreeSet<String>) {
    let code = code(text);
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        let mut names = vec![head(rest)];
        // A grouped import, `crate::{a::X, b}`: each item's first segment.
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.push(head(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(head(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        }
        for name in names {
            let module = name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
            if module && name != own && name != "self" {
                into.insert(name);
            }
        }
    }
}

#[test]
fn grouped_imports_count_as_dependencies() {
    let mut found = BTreeSet::new();
    deps_of(
        "use crate::{transfer::{Opcode, Pool}, config::ByteSize,\n  kube};\nuse crate::hash::fnv1a;",
        "master",
        &mut found,
    );
    let want: BTreeSet<String> = ["transfer", "config", "kube", "hash"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, want);
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
    assert_no_cycle(&g, "between the top-level modules");
}

/// Fails with the first cycle of `g`, if there is one.
fn assert_no_cycle(g: &BTreeMap<String, BTreeSet<String>>, where_: &str) {
    let mut done = BTreeSet::new();
    for node in g.keys() {
        if let Some(cycle) = cycle_from(g, node, &mut Vec::new(), &mut done) {
            panic!("a dependency cycle {where_}: {}", cycle.join(" -> "));
        }
    }
}

/// The router routes SIMULATED workers through the stand-in tokenizer beneath both, not
/// through the engine role.
/// The router's own modules → those of them each names (`crate::router::x`, or `super::x`
/// from a file one level down).
fn router_graph() -> BTreeMap<String, BTreeSet<String>> {
    let router = Path::new(SRC).join("router");
    let mut g = BTreeMap::new();
    for entry in std::fs::read_dir(&router).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if stem == "mod" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            let mut stack = vec![(path.clone(), 1usize)];
            while let Some((dir, depth)) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push((p, depth + 1));
                    } else if p.extension().is_some_and(|e| e == "rs") {
                        // `super` of a `mod.rs` is one level up; of any other file, two.
                        let up = if p.file_stem().is_some_and(|s| s == "mod") {
                            depth
                        } else {
                            depth + 1
                        };
                        files.push((p, up));
                    }
                }
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push((path.clone(), 1));
        }
        let mut deps = BTreeSet::new();
        for (file, up) in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let to_router = "super::".repeat(up);
            let text = text.replace(&to_router, "crate::router::");
            deps_under(&text, "crate::router::", stem, &mut deps);
        }
        g.insert(stem.to_string(), deps);
    }
    g
}

/// The router's modules depend on each other without a cycle either: each concern (its
/// handlers, the proxy, the upstream connections, the fast path) reads without the ones that
/// use it.
#[test]
fn the_routers_modules_depend_on_each_other_without_a_cycle() {
    let g = router_graph();
    assert!(g.len() > 15, "found the modules: {:?}", g.keys());
    assert!(g["front"].contains("handlers"), "the parser sees paths");
    assert_no_cycle(&g, "in the router");
}

#[test]
fn the_router_does_not_name_the_simulated_engine() {
    let g = graph();
    assert!(
        !g["router"].contains("engine"),
        "router -> {:?}",
        g["router"]
    );
    assert!(g["router"].contains("simulated_tokens"));
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

/// Each top-level module's floor, as `docs/architecture.md`'s "Floors" section lists them: the
/// first numbered item that names the module in backticks.
fn floors(modules: &BTreeSet<&str>) -> BTreeMap<String, usize> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
            .unwrap();
    let section = page
        .split("\n## ")
        .find(|s| s.starts_with("Floors"))
        .expect("docs/architecture.md has a \"Floors\" section");
    let mut floors = BTreeMap::new();
    let mut floor = 0;
    for line in section.lines() {
        let numbered = line
            .split_once(". ")
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if let Some(n) = numbered {
            floor = n;
        }
        if floor == 0 {
            continue;
        }
        for (i, quoted) in line.split('`').enumerate() {
            if i % 2 == 1 && modules.contains(quoted) {
                floors.entry(quoted.to_string()).or_insert(floor);
            }
        }
    }
    floors
}

/// Every top-level module is on a floor of the page, and names only modules on its own floor
/// or below.
#[test]
fn no_module_names_one_on_a_floor_above_it() {
    let g = graph();
    let modules: BTreeSet<&str> = g.keys().map(String::as_str).collect();
    let floors = floors(&modules);
    let missing: Vec<&&str> = modules
        .iter()
        .filter(|m| !floors.contains_key(**m))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's floors do not list {missing:?}"
    );
    let mut upward = Vec::new();
    for (module, deps) in &g {
        for dep in deps.iter().filter(|d| floors.contains_key(*d)) {
            if floors[dep] > floors[module] {
                upward.push(format!(
                    "{module} (floor {}) -> {dep} (floor {})",
                    floors[module], floors[dep]
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the floors:\n{}",
        upward.join("\n")
    );
}

fn rust_files(dir: &Path, into: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// Every `unsafe` block and `unsafe impl` says why it is sound in a `SAFETY:` comment just
/// above it (or on its line), and every `unsafe fn` its callers' duty in a `# Safety` doc
/// section (a trait's method implemented: in its body's `SAFETY:`). Function pointer types
/// (`unsafe extern "C" fn(...)`) are no `unsafe` site.
#[test]
fn every_unsafe_site_says_why_it_is_sound() {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut silent = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let Some(at) = code.find("unsafe") else {
                continue;
            };
            let after = code[at + "unsafe".len()..].trim_start();
            let before = &code[..at];
            let word = before
                .chars()
                .last()
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
            if !word || after.starts_with("extern") || after.starts_with('_') {
                continue;
            }
            let above = &lines[i.saturating_sub(8)..=i];
            let said = if after.starts_with("fn") {
                above
                    .iter()
                    .any(|l| l.contains("# Safety") || l.contains("SAFETY"))
                    || lines[i + 1..(i + 4).min(lines.len())]
                        .iter()
                        .any(|l| l.contains("SAFETY"))
            } else {
                above.iter().any(|l| l.contains("SAFETY"))
            };
            if !said {
                let rel = file
                    .strip_prefix(SRC)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                silent.push(format!("src/{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "unsafe without a SAFETY note:\n{}",
        silent.join("\n")
    );
}

/// The places in the library (outside test modules) of the items `is_item` picks out by
/// their line that have no doc line above them (attributes and plain comments between a doc
/// and its item are passed over).
fn undocumented(is_item: impl Fn(&str) -> bool) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut undocumented = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let text = match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => text.as_str(),
        };
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !is_item(line) {
                continue;
            }
            // Back over attributes, those spread over lines too (`#[error(\n "..." \n)]`,
            // back to their `#[`), and plain comments about them.
            let mut j = i;
            while j > 0 {
                let l = lines[j - 1].trim_start();
                if l.starts_with(")]") {
                    while j > 1 && !lines[j - 1].trim_start().starts_with("#[") {
                        j -= 1;
                    }
                    j -= 1;
                } else if l.starts_with("#[") || (l.starts_with("//") && !l.starts_with("///")) {
                    j -= 1;
                } else {
                    break;
                }
            }
            if j == 0 || !lines[j - 1].trim_start().starts_with("///") {
                let rel = file
                    .strip_prefix(SRC)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                undocumented.push(format!("src/{rel}:{}", i + 1));
            }
        }
    }
    undocumented
}

/// Every top-level `pub` item of the library (outside test modules; a `pub mod x;` is
/// documented by its file's `//!`) has a doc line.
#[test]
fn every_top_level_public_item_has_a_doc_line() {
    const KINDS: [&str; 9] = [
        "pub fn ",
        "pub async fn ",
        "pub unsafe fn ",
        "pub struct ",
        "pub enum ",
        "pub const ",
        "pub trait ",
        "pub type ",
        "pub static ",
    ];
    let undocumented =
        undocumented(|line| !line.starts_with(' ') && KINDS.iter().any(|k| line.starts_with(k)));
    assert!(
        undocumented.is_empty(),
        "public items without a doc line (say what each is):\n{}",
        undocumented.join("\n")
    );
}

/// Every public method of the library has a doc line too.
#[test]
fn every_public_method_has_a_doc_line() {
    const KINDS: [&str; 4] = [
        "pub fn ",
        "pub async fn ",
        "pub const fn ",
        "pub unsafe fn ",
    ];
    let undocumented = undocumented(|line| {
        line.strip_prefix("    ")
            .is_some_and(|rest| KINDS.iter().any(|k| rest.starts_with(k)))
    });
    assert!(
        undocumented.is_empty(),
        "public methods without a doc line (say what each does):\n{}",
        undocumented.join("\n")
    );
}

/// Every metric family `/metrics` shows is declared once (`Family::counter("name", help)` and
/// its kin), so its kind and help are the same wherever it is written.
#[test]
fn every_metric_family_is_declared_once() {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut declared: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files {
        let text = code(&std::fs::read_to_string(&file).unwrap());
        for kind in ["counter", "gauge", "histogram"] {
            let call = format!("Family::{kind}(");
            let mut rest = text.as_str();
            while let Some(at) = rest.find(&call) {
                rest = &rest[at + call.len()..];
                let Some(literal) = rest.trim_start().strip_prefix('"') else {
                    continue; // a name made at run time (`<prefix>_requests_total`)
                };
                let name = &literal[..literal.find('"').unwrap_or(0)];
                declared
                    .entry(name.to_string())
                    .or_default()
                    .push(file.display().to_string());
            }
        }
    }
    assert!(declared.len() > 150, "found {} families", declared.len());
    let twice: Vec<_> = declared.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "families declared more than once: {twice:#?}"
    );
}
