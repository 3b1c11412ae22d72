//! The crate's layers hold: every file under `src/` sits in a layer (its top-level directory), and a layer refers
//! only to itself and the layers below it, so the crate has no import cycle between layers and a reader can learn
//! it bottom-up.
//!
//! A reference is a path through `crate::` (in a `use` or inline, grouped `crate::{a, b}` too) or through
//! `super::` that climbs to the crate root. A path to a root item that is not a layer (`crate::PluginHost`: the
//! root's re-exports, which gather every layer) counts as the top layer. `lib.rs` (the root: it declares the layers
//! and re-exports the public API) is not checked, nor are comments, string literals, or a file's trailing
//! `#[cfg(test)] mod tests` (unit tests may use anything, as the integration tests do).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeMap;
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

/// A reference from one file to a layer that is above the file's own.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    path: String,
    from: String,
    to: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}` — layer `{}` refers to `{}`, which is above it",
            self.file, self.line, self.path, self.from, self.to
        )
    }
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

/// The first segments of the paths in a `{…}` group starting at `i` (just after the `{`).
fn group_heads(code: &[char], mut i: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    while i < code.len() {
        match code[i] {
            '{' => {
                depth += 1;
                i += 1;
            }
            '}' if depth == 0 => break,
            '}' => {
                depth -= 1;
                i += 1;
            }
            ',' if depth == 0 => {
                expect_head = true;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            _ if expect_head && depth == 0 => {
                let (id, j) = ident_at(code, i);
                if !id.is_empty() {
                    heads.push(id);
                }
                expect_head = false;
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    heads
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

/// Every (line, path as written, top-level module it reaches) in `code` of a file whose module path is `module`.
fn references(code: &str, module: &[String]) -> Vec<(usize, String, String)> {
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
        if starts("crate::") {
            let after = i + "crate::".len();
            if chars.get(after) == Some(&'{') {
                for head in group_heads(&chars, after + 1) {
                    out.push((line_of(i), format!("crate::{{{head}, …}}"), head));
                }
            } else {
                let (head, _) = ident_at(&chars, after);
                out.push((line_of(i), format!("crate::{head}"), head));
            }
            i = after;
        } else if starts("super::") {
            let mut ups = 0;
            let mut j = i;
            while chars[j..].iter().take(7).copied().eq("super::".chars()) {
                ups += 1;
                j += 7;
            }
            if ups >= module.len() + depths[i] {
                // Climbs to the crate root: the next segment is a top-level module.
                let (head, _) = ident_at(&chars, j);
                out.push((line_of(i), format!("{}{head}", "super::".repeat(ups)), head));
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The violations in one file (`rel`: its path under `src/`).
fn check_file(rel: &Path, src: &str) -> Result<Vec<Violation>, String> {
    if rel == Path::new("lib.rs") {
        return Ok(Vec::new());
    }
    let module = module_path(rel);
    let Some(own) = module.first() else {
        return Ok(Vec::new());
    };
    let Some(own_rank) = rank(own) else {
        return Err(format!(
            "src/{} is in no layer: put it in a layer's directory, or add its directory to LAYERS",
            rel.display()
        ));
    };
    let code = code_only(src);
    let mut found = Vec::new();
    for (line, path, head) in references(without_unit_tests(&code), &module) {
        // A root item that is no layer is one of the root's re-exports: the top.
        let (to, to_rank) = match rank(&head) {
            Some(r) => (head, r),
            None => (format!("the crate root's `{head}`"), LAYERS.len() - 1),
        };
        if to_rank > own_rank {
            found.push(Violation {
                file: format!("src/{}", rel.display()),
                line,
                path,
                from: own.clone(),
                to,
            });
        }
    }
    Ok(found)
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

/// No layer refers to one above it, and every file is in a layer.
#[test]
fn each_layer_refers_only_to_itself_and_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut per_layer: BTreeMap<usize, usize> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(file).unwrap();
        match check_file(rel, &text) {
            Ok(v) => problems.extend(v.iter().map(ToString::to_string)),
            Err(e) => problems.push(e),
        }
        if let Some(r) = module_path(rel).first().and_then(|l| rank(l)) {
            *per_layer.entry(r).or_default() += 1;
        }
    }
    assert!(
        problems.is_empty(),
        "the layers (bottom first: {}) do not hold:\n{}",
        LAYERS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" < "),
        problems.join("\n")
    );
    // Every layer in the table exists (a renamed directory would otherwise leave its files unchecked... and fail
    // above; a stale row would quietly allow a name nobody uses).
    for (r, (name, _)) in LAYERS.iter().enumerate() {
        assert!(
            per_layer.contains_key(&r),
            "layer `{name}` has no file under src/"
        );
    }
}

/// The checker itself: it catches a reference up the table in every form it reads, and lets the allowed ones by.
#[test]
fn the_checker_catches_references_up_the_table() {
    let up = |rel: &str, src: &str| check_file(Path::new(rel), src).unwrap().len();
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
    // Allowed: itself, below, comments, strings, unit tests, doc links.
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
    assert_eq!(
        up("testing/mod.rs", "use crate::{HostConfig, PluginHost};"),
        0
    );
    assert_eq!(
        up(
            "wit.rs",
            "pub mod policy {\n    bindgen!({ with: { \"x\": super::WorkloadRes } });\n}\n"
        ),
        0
    );
    assert_eq!(
        up("wit.rs", "pub mod policy {\n}\nuse super::host::X;\n"),
        1
    );
    assert_eq!(up("lib.rs", "use crate::host::PluginHost;"), 0);
    assert!(
        check_file(Path::new("plugin.rs"), "").is_err(),
        "a file in no layer"
    );
}
