//! The crate's layers hold: every file under `src/` sits in a layer (its top-level directory), a layer refers only
//! to itself and the layers below it, and the files of one layer refer to each other without a cycle. So the crate
//! has no import cycle at all, and a reader can learn it bottom-up.
//!
//! A reference is a path through `crate::` (in a `use` or inline, grouped `crate::{a, b::{c, d}}` too) or through
//! `super::` that climbs to the crate root or to the file's layer. A path to a root item that is not a layer
//! (`crate::PluginHost`: the root's re-exports, which gather every layer) counts as the top layer. `lib.rs` (the
//! root: it declares the layers and re-exports the public API) is not checked, nor are comments, string literals,
//! or a file's trailing `#[cfg(test)] mod tests` (unit tests may use anything, as the integration tests do).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first: each may refer to the ones above it in this table, never to one below.
const LAYERS: &[(&str, &str)] = &[
    (
        "base",
        "leaves: the host's config, the clock, the errors, where code is compiled",
    ),
    (
        "wit",
        "the WIT bindings and the conversions of records and policies into WIT values",
    ),
    (
        "metrics",
        "the host's own metric families and the plugin-defined metrics: a sink every layer above writes to",
    ),
    (
        "sandbox",
        "the engine, a store and its limits, the time budget, the epoch ticker, the locked-down WASI",
    ),
    (
        "guest",
        "linking a component and the typed calls into one instance",
    ),
    (
        "versions",
        "the compile cache, plugin versions, their instance pools, scope and probation counters",
    ),
    (
        "lifecycle",
        "apply, the chain, rollout and rollback, the unenforced-policy guard, status",
    ),
    (
        "host",
        "`PluginHost`: owns the threads and wires the layers behind `ConnectionHooks`",
    ),
    ("testing", "test support over the public API"),
];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|(name, _)| *name == layer)
}

/// `src` with comments, string and char literals blanked (newlines kept, so lines still count).
fn code_only(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(s[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !ident_char(s.get(i.wrapping_sub(1)))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while s.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if s.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= s.len() {
                    break;
                }
                if s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &s[i..j.min(s.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < s.len() && s[i] != '"' {
                if s[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < s.len() {
                    out.push(blank(s[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (s.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote two chars on.
            let mut j = i + 1;
            if s.get(j) == Some(&'\\') {
                j += 2;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
            } else {
                j += 1;
            }
            for _ in i..=j.min(s.len() - 1) {
                out.push(' ');
            }
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
}

/// The code before a trailing `#[cfg(test)] mod …` (unit tests are not part of the library's graph).
fn without_unit_tests(code: &str) -> &str {
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod ")
            || rest.starts_with("pub mod ")
            || rest.starts_with("pub(crate) mod ")
        {
            return &code[..at];
        }
        from = at + 1;
    }
    code
}

/// The module path of a file under `src/` (`versions/pool.rs` → `[versions, pool]`, `versions/mod.rs` →
/// `[versions]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

fn ident_at(code: &[char], mut i: usize) -> (String, usize) {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let start = i;
    while ident_char(code.get(i)) {
        i += 1;
    }
    (code[start..i].iter().collect(), i)
}

/// Where each path in a `{…}` group starting at `i` (just after the `{`) begins.
fn group_items(code: &[char], mut i: usize) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut depth = 0;
    let mut expect = true;
    while i < code.len() {
        match code[i] {
            '}' if depth == 0 => break,
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => expect = true,
            c if c.is_whitespace() => {}
            _ if expect => {
                starts.push(i);
                expect = false;
            }
            _ => {}
        }
        i += 1;
    }
    starts
}

/// The first `need` segments of every path that starts at `i` (groups `a::{b, c::d}` expanded).
fn paths_at(code: &[char], mut i: usize, need: usize) -> Vec<Vec<String>> {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if code.get(i) == Some(&'{') {
        return group_items(code, i + 1)
            .into_iter()
            .flat_map(|start| paths_at(code, start, need))
            .collect();
    }
    let (id, j) = ident_at(code, i);
    if id.is_empty() {
        return Vec::new();
    }
    if need > 1 && code.get(j) == Some(&':') && code.get(j + 1) == Some(&':') {
        let rest = paths_at(code, j + 2, need - 1);
        if !rest.is_empty() {
            return rest
                .into_iter()
                .map(|r| std::iter::once(id.clone()).chain(r).collect())
                .collect();
        }
    }
    vec![vec![id]]
}

/// How many inline `mod name { … }` blocks enclose each position of `code` (their `super::` climbs one less).
fn inline_mod_depths(code: &[char]) -> Vec<usize> {
    let mut depths = Vec::with_capacity(code.len());
    let mut braces = 0usize;
    let mut open_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if code[i] == '{' {
            let before: String = code[i.saturating_sub(80)..i].iter().collect();
            let words: Vec<&str> = before.split_whitespace().rev().take(2).collect();
            if words.len() == 2 && words[1] == "mod" {
                open_mods.push(braces);
            }
            braces += 1;
        } else if code[i] == '}' {
            braces = braces.saturating_sub(1);
            if open_mods.last() == Some(&braces) {
                open_mods.pop();
            }
        }
        depths.push(open_mods.len());
        i += 1;
    }
    depths
}

/// A path in a file, resolved from the crate root to at most two segments: the top-level module (a layer, or a
/// root item) and, below it, the module of that layer it names.
#[derive(Debug)]
struct Reference {
    line: usize,
    written: String,
    to: Vec<String>,
}

/// Every path in `code` (of a file whose module path is `module`) that reaches the crate root or the file's layer.
fn references(code: &str, module: &[String]) -> Vec<Reference> {
    let chars: Vec<char> = code.chars().collect();
    let depths = inline_mod_depths(&chars);
    let line_of = |i: usize| chars[..i].iter().filter(|c| **c == '\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = |word: &str| {
            chars[i..].iter().take(word.len()).copied().eq(word.chars())
                && !ident_char(chars.get(i.wrapping_sub(1)))
        };
        let (prefix, from_root, after) = if starts("crate::") {
            ("crate::".to_string(), Some(Vec::new()), i + "crate::".len())
        } else if starts("super::") {
            let mut ups = 0;
            let mut j = i;
            while chars[j..].iter().take(7).copied().eq("super::".chars()) {
                ups += 1;
                j += 7;
            }
            // Where the climb ends, counted in modules below the root: the file's own module path plus the inline
            // modules around the path, less one per `super`.
            let level = (module.len() + depths[i]).saturating_sub(ups);
            let base = match level {
                0 => Some(Vec::new()),
                1 => Some(vec![module[0].clone()]),
                _ => None, // inside the file
            };
            ("super::".repeat(ups), base, j)
        } else {
            i += 1;
            continue;
        };
        if let Some(base) = from_root {
            for tail in paths_at(&chars, after, 2 - base.len()) {
                let to: Vec<String> = base.iter().cloned().chain(tail).take(2).collect();
                let written = format!("{prefix}{}", to[base.len()..].join("::"));
                out.push(Reference {
                    line: line_of(i),
                    written,
                    to,
                });
            }
        }
        i = after;
    }
    out
}

/// What is wrong with a set of files (path under `src/`, text): files in no layer, references up the table, and
/// cycles between the files of one layer.
fn problems(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    // Per layer: file → the files of the same layer it refers to.
    let mut edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (rel, src) in files {
        if rel == Path::new("lib.rs") {
            continue;
        }
        let module = module_path(rel);
        let own = &module[0];
        let Some(own_rank) = rank(own) else {
            found.push(format!(
                "src/{} is in no layer: put it in a layer's directory, or add its directory to LAYERS",
                rel.display()
            ));
            continue;
        };
        let own_file = module.get(1).cloned().unwrap_or_default();
        let layer_edges = edges.entry(own.clone()).or_default();
        layer_edges.entry(own_file.clone()).or_default();
        let code = code_only(src);
        for r in references(without_unit_tests(&code), &module) {
            let head = &r.to[0];
            // A root item that is no layer is one of the root's re-exports: the top.
            let (to, to_rank) = match rank(head) {
                Some(rank) => (format!("`{head}`"), rank),
                None => (format!("the crate root's `{head}`"), LAYERS.len() - 1),
            };
            if to_rank > own_rank {
                found.push(format!(
                    "src/{}:{}: `{}` — layer `{own}` refers to {to}, which is above it",
                    rel.display(),
                    r.line,
                    r.written
                ));
            } else if head == own
                && let Some(sibling) = r.to.get(1)
                && *sibling != own_file
            {
                layer_edges
                    .entry(own_file.clone())
                    .or_default()
                    .insert(sibling.clone());
            }
        }
    }
    for (layer, graph) in &edges {
        if let Some(cycle) = find_cycle(graph) {
            found.push(format!(
                "layer `{layer}` has an import cycle between its files: {}",
                cycle.join(" → ")
            ));
        }
    }
    found
}

/// A cycle in `graph`, as the files along it (first repeated at the end), if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
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

/// No layer refers to one above it, every file is in a layer, the files of a layer have no cycle, and every layer
/// of the table exists.
#[test]
fn each_layer_refers_only_to_itself_and_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let files: Vec<(PathBuf, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().to_path_buf();
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    let found = problems(&files);
    assert!(
        found.is_empty(),
        "the layers (bottom first: {}) do not hold:\n{}",
        LAYERS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" < "),
        found.join("\n")
    );
    // lib.rs declares the layers in the table's order (its comment says they go bottom first).
    let (_, lib) = files
        .iter()
        .find(|(rel, _)| rel == Path::new("lib.rs"))
        .unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let table: Vec<&str> = LAYERS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        declared, table,
        "lib.rs declares the layers in another order than LAYERS"
    );
    // A stale row would quietly allow a name nobody uses.
    for (name, _) in LAYERS {
        assert!(
            files.iter().any(|(rel, _)| module_path(rel)[0] == *name),
            "layer `{name}` has no file under src/"
        );
    }
}

/// The checker itself: it catches a reference up the table in every form it reads and a cycle inside a layer, and
/// lets the allowed references by.
#[test]
fn the_checker_catches_references_up_the_table_and_cycles_in_a_layer() {
    let found = |files: &[(&str, &str)]| {
        let files: Vec<(PathBuf, String)> = files
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect();
        problems(&files)
    };
    let up = |rel: &str, src: &str| found(&[(rel, src)]).len();
    assert_eq!(
        up("base/config.rs", "use crate::lifecycle::rollout::Clock;"),
        1
    );
    assert_eq!(
        up(
            "base/config.rs",
            "use crate::{base::error::LoadError, versions::cache::X};"
        ),
        1
    );
    assert_eq!(
        up(
            "base/config.rs",
            "fn f() { crate::sandbox::engine::build(); }"
        ),
        1
    );
    assert_eq!(up("base/mod.rs", "use super::host::PluginHost;"), 1);
    assert_eq!(
        up("sandbox/store.rs", "use super::super::guest::Instance;"),
        1
    );
    assert_eq!(
        up("sandbox/store.rs", "let e = crate::LoadError::Internal(x);"),
        1
    );
    assert_eq!(
        up("wit.rs", "pub mod policy {\n}\nuse super::host::X;\n"),
        1
    );
    // Allowed: itself, below, comments, strings, unit tests, inline modules, the root's own file.
    assert_eq!(
        up(
            "guest/instance.rs",
            "use crate::sandbox::store::StoreData;\nuse super::link::Pre;"
        ),
        0
    );
    assert_eq!(
        up(
            "base/error.rs",
            "// see crate::host::PluginHost\n/// [`crate::host`]\nlet s = \"crate::host\";"
        ),
        0
    );
    assert_eq!(
        up("base/error.rs", "let c = '\"'; let s = r#\"crate::host\"#;"),
        0
    );
    assert_eq!(
        up(
            "wit/batch.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::testing::conn;\n}\n"
        ),
        0
    );
    assert_eq!(up("testing.rs", "use crate::{HostConfig, PluginHost};"), 0);
    assert_eq!(
        up(
            "wit.rs",
            "pub mod policy {\n    bindgen!({ with: { \"x\": super::WorkloadRes } });\n}\n"
        ),
        0
    );
    assert_eq!(up("lib.rs", "use crate::host::PluginHost;"), 0);
    assert_eq!(up("plugin.rs", ""), 1, "a file in no layer");
    // Cycles between the files of a layer, however the paths are written.
    let cycle = found(&[
        ("sandbox/store.rs", "use super::wasi::WasiState;"),
        (
            "sandbox/wasi.rs",
            "use crate::sandbox::{budget::B, store::StoreData};",
        ),
        ("sandbox/budget.rs", ""),
    ]);
    assert_eq!(cycle.len(), 1, "{cycle:?}");
    assert!(cycle[0].contains("store → wasi → store"), "{cycle:?}");
    let chain = found(&[
        ("sandbox/store.rs", "use super::wasi::WasiState;"),
        ("sandbox/wasi.rs", "use crate::sandbox::budget::B;"),
        ("sandbox/budget.rs", ""),
    ]);
    assert!(chain.is_empty(), "{chain:?}");
}
