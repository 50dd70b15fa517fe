//! The workspace's layout rules, checked on its sources: no source file
//! over 500 lines outside test code, and no circle of `use` between the
//! files of a crate (a file A using B while B uses A, directly or through
//! others). Test code (`tests/` folders and `#[cfg(test)]` modules) is
//! exempt from the size rule.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test of the tree

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 500;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the core crate sits in the workspace")
        .to_path_buf()
}

/// Every `src` folder of a crate in the workspace.
fn crate_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if !path.is_dir() || name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.join("Cargo.toml").is_file() && path.join("src").is_dir() {
            out.push(path.join("src"));
        }
        crate_sources(&path, out);
    }
}

/// Every crate's `src` folder with the Rust files under it.
fn crates() -> Vec<(PathBuf, Vec<PathBuf>)> {
    let mut srcs = Vec::new();
    crate_sources(&workspace(), &mut srcs);
    srcs.into_iter()
        .map(|src| {
            let mut files = Vec::new();
            rust_files(&src, &mut files);
            (src, files)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file without its unit tests.
fn without_tests(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// The code of a file without its comment lines and its unit tests.
fn code(path: &Path) -> String {
    without_tests(path)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_test_code(path: &Path, src: &Path) -> bool {
    let crate_dir = src.parent().unwrap_or(src);
    let in_tests_dir = path
        .strip_prefix(crate_dir)
        .map(|rel| rel.starts_with("tests"))
        .unwrap_or(false);
    // The suite and fixture crates under the top-level `tests/` are test code.
    let ws_tests = workspace().join("tests");
    in_tests_dir || path.starts_with(ws_tests)
}

#[test]
fn no_source_file_is_over_500_lines() {
    let mut long = Vec::new();
    for (src, files) in crates() {
        for f in files.iter().filter(|f| !is_test_code(f, &src)) {
            let n = without_tests(f).lines().count();
            if n > MAX_LINES {
                long.push(format!("{} ({n} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}

/// The top-level module a file belongs to (`a/b.rs` → `a`), or `None` for
/// the crate root and binaries.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs").to_owned();
    (!matches!(name.as_str(), "lib" | "main" | "bin")).then_some(name)
}

/// Items the crate root re-exports, and the module each comes from.
fn reexports(root: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in root.split(';') {
        let stmt = stmt.trim();
        let Some(rest) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        for item in items.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !item.is_empty() {
                out.insert(item.to_owned(), module.to_owned());
            }
        }
    }
    out
}

/// The modules `text` names through `crate::`.
fn uses(
    text: &str,
    modules: &BTreeSet<String>,
    items: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let names: Vec<&str> = if rest.starts_with('{') {
            let end = rest.find("};").unwrap_or(rest.len());
            rest[..end]
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![&rest[..end]]
        };
        for name in names {
            if modules.contains(name) {
                out.insert(name.to_owned());
            } else if let Some(m) = items.get(name) {
                out.insert(m.clone());
            }
        }
    }
    out
}

fn circle_from(start: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                let mut circle = path.clone();
                circle.push(start.to_owned());
                return Some(circle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_circle_between_the_files_of_a_crate() {
    let mut circles = Vec::new();
    for (src, files) in crates() {
        let root = ["lib.rs", "main.rs"]
            .iter()
            .map(|r| src.join(r))
            .find(|p| p.is_file());
        let Some(root) = root else { continue };
        let items = reexports(&code(&root));
        let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let Some(me) = top_module(&src, f) else {
                continue;
            };
            let mut deps = uses(&code(f), &modules, &items);
            deps.remove(&me);
            graph.entry(me).or_default().extend(deps);
        }
        for m in &modules {
            if let Some(c) = circle_from(m, &graph) {
                circles.push(format!("{}: {}", src.display(), c.join(" -> ")));
            }
        }
    }
    assert!(circles.is_empty(), "circles: {circles:#?}");
}

/// The checker itself finds a circle and the uses behind it.
#[test]
fn the_circle_check_can_fail() {
    let modules: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let items = reexports("pub use b::{Thing, Other};\npub use c::Third;");
    let a_uses = uses(
        "use crate::{Thing, c};\nfn f() { crate::Third::new() }",
        &modules,
        &items,
    );
    assert_eq!(a_uses, ["b", "c"].map(String::from).into());
    let mut graph = BTreeMap::new();
    graph.insert("a".to_owned(), a_uses);
    graph.insert("b".to_owned(), ["c".to_owned()].into());
    graph.insert("c".to_owned(), BTreeSet::new());
    assert_eq!(circle_from("a", &graph), None);
    graph.insert("c".to_owned(), ["a".to_owned()].into());
    assert!(circle_from("a", &graph).is_some_and(|c| c.first() == c.last()));
}
