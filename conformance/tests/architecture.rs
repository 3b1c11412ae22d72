//! ARCHITECTURE.md's rules, held by the workspace: every crate's dependencies point the way its tier table allows
//! (known exceptions listed there, and only while they exist), every workspace member is in its code map, every
//! path the code map names exists, and only the plugin host links wasmtime.
//!
//! Reads `cargo metadata --no-deps` (the workspace's own manifests; no registry, no build) and ARCHITECTURE.md.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The tier every crate may use in its dev-dependencies (tests, benches) besides what the table allows.
const DEV_ALSO: &str = "test support";
/// The one crate that may depend on wasmtime.
const WASMTIME_HOME: &str = "runtime/plugins/host";

/// The repository's root (this crate is `conformance/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A workspace member: its name and its directory relative to the root (`runtime/node/proxy`).
#[derive(Debug, Clone)]
struct Member {
    name: String,
    path: String,
}

/// A dependency of one member on another.
#[derive(Debug)]
struct Edge {
    from: String,
    to: String,
    dev: bool,
}

/// The workspace's members, their dependencies on each other, and the members that name wasmtime.
fn workspace(root: &Path) -> (Vec<Member>, Vec<Edge>, Vec<String>) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ws_root = PathBuf::from(meta["workspace_root"].as_str().unwrap());
    let rel = |p: &Path| -> String {
        p.strip_prefix(&ws_root)
            .map(|r| r.to_string_lossy().replace('\\', "/"))
            .unwrap_or_else(|_| p.to_string_lossy().into_owned())
    };
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let mut out_members = Vec::new();
    let mut edges = Vec::new();
    let mut wasmtime = Vec::new();
    for pkg in meta["packages"].as_array().unwrap() {
        if !members.contains(pkg["id"].as_str().unwrap()) {
            continue;
        }
        let manifest = PathBuf::from(pkg["manifest_path"].as_str().unwrap());
        let path = rel(manifest.parent().unwrap());
        for dep in pkg["dependencies"].as_array().unwrap() {
            let name = dep["name"].as_str().unwrap();
            if name.starts_with("wasmtime") {
                wasmtime.push(path.clone());
            }
            let Some(dep_path) = dep["path"].as_str() else {
                continue;
            };
            let to = rel(Path::new(dep_path));
            if to == path {
                continue; // a crate's own features in its tests
            }
            edges.push(Edge {
                from: path.clone(),
                to,
                dev: dep["kind"].as_str() == Some("dev"),
            });
        }
        out_members.push(Member {
            name: pkg["name"].as_str().unwrap().to_owned(),
            path,
        });
    }
    (out_members, edges, wasmtime)
}

/// The text of the section of `doc` under the `## ` heading that starts with `title`, up to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {title}"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no `## {title}` section"));
    let body = &doc[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

/// The backticked words of a text.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The cells of a Markdown table row, or `None` for a line that is not a row or is the header's rule.
fn cells(line: &str) -> Option<Vec<&str>> {
    let t = line.trim();
    if !t.starts_with('|') || t.starts_with("|---") || t.starts_with("| ---") {
        return None;
    }
    Some(t.trim_matches('|').split('|').map(str::trim).collect())
}

/// A tier of the table: its name, the crate paths it holds (`runtime/node/*`: every crate under it), and what
/// its crates may depend on (tier names and crate paths; `everything`).
#[derive(Debug)]
struct Tier {
    name: String,
    patterns: Vec<String>,
    may: Vec<String>,
}

impl Tier {
    /// How specifically this tier names `path`: exactly (highest), by a prefix (its length), or not.
    fn claim(&self, path: &str) -> Option<usize> {
        self.patterns
            .iter()
            .filter_map(|p| match p.strip_suffix("/*") {
                Some(prefix) => path
                    .strip_prefix(prefix)
                    .filter(|r| r.starts_with('/'))
                    .map(|_| prefix.len()),
                None => (p == path).then_some(usize::MAX),
            })
            .max()
    }
}

/// The tier table and the known exceptions (`- \`from\` → \`to\`: why`) of ARCHITECTURE.md's tier section.
fn rules(doc: &str) -> (Vec<Tier>, Vec<(String, String)>) {
    let text = section(doc, "Tiers");
    let mut tiers = Vec::new();
    let mut header = true;
    for line in text.lines() {
        let Some(row) = cells(line) else {
            continue;
        };
        if header {
            header = false;
            assert_eq!(
                row.first().copied(),
                Some("tier"),
                "the tier table's header: `| tier | crates | may depend on |`"
            );
            continue;
        }
        assert!(row.len() >= 3, "a tier row with fewer than 3 cells: {line}");
        let may = row[2]
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_owned())
            .filter(|s| !s.is_empty() && s != "nothing")
            .collect();
        tiers.push(Tier {
            name: row[0].to_owned(),
            patterns: ticked(row[1]).into_iter().map(str::to_owned).collect(),
            may,
        });
    }
    assert!(
        tiers.len() >= 3,
        "ARCHITECTURE.md's tier table has {} rows",
        tiers.len()
    );
    let names: BTreeSet<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
    for t in &tiers {
        for m in &t.may {
            assert!(
                m == "everything" || m.contains('/') || names.contains(m.as_str()),
                "tier `{}` may depend on `{m}`, which is neither a tier nor a crate path",
                t.name
            );
        }
    }
    assert!(names.contains(DEV_ALSO), "no tier named `{DEV_ALSO}`");
    let exceptions = text
        .lines()
        .filter(|l| l.trim_start().starts_with("- `") && l.contains('→'))
        .map(|l| {
            let t = ticked(l);
            assert!(t.len() >= 2, "an exception without two crate paths: {l}");
            (t[0].to_owned(), t[1].to_owned())
        })
        .collect();
    (tiers, exceptions)
}

/// The tier of `path`: the one that names it most specifically.
fn tier_of<'a>(tiers: &'a [Tier], path: &str) -> Option<&'a Tier> {
    tiers
        .iter()
        .filter_map(|t| t.claim(path).map(|c| (c, t)))
        .max_by_key(|(c, _)| *c)
        .map(|(_, t)| t)
}

/// Whether a crate of tier `from` may depend on the crate at `to` (in tier `to_tier`).
fn allowed(from: &Tier, to: &str, to_tier: &Tier, dev: bool) -> bool {
    from.may
        .iter()
        .any(|m| m == "everything" || *m == to_tier.name || m == to)
        || (dev && to_tier.name == DEV_ALSO)
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap()
}

/// Every dependency between workspace crates points the way ARCHITECTURE.md's tier table allows, or is one of
/// its known exceptions; every listed exception still exists (remove it from the list once it is gone).
#[test]
fn dependencies_point_the_way_the_tiers_allow() {
    let doc = architecture();
    let (tiers, exceptions) = rules(&doc);
    let (members, edges, _) = workspace(&root());
    let mut problems = Vec::new();
    for m in &members {
        if tier_of(&tiers, &m.path).is_none() {
            problems.push(format!(
                "`{}` ({}) is in no tier of ARCHITECTURE.md's table",
                m.path, m.name
            ));
        }
    }
    let mut used = BTreeSet::new();
    for e in &edges {
        let (Some(from), Some(to)) = (tier_of(&tiers, &e.from), tier_of(&tiers, &e.to)) else {
            continue;
        };
        if allowed(from, &e.to, to, e.dev) {
            continue;
        }
        let key = (e.from.clone(), e.to.clone());
        if exceptions.contains(&key) {
            used.insert(key);
            continue;
        }
        problems.push(format!(
            "`{}` ({}) depends on `{}` ({}){}: ARCHITECTURE.md's tiers forbid it",
            e.from,
            from.name,
            e.to,
            to.name,
            if e.dev {
                " in its dev-dependencies"
            } else {
                ""
            }
        ));
    }
    for ex in &exceptions {
        if !used.contains(ex) {
            problems.push(format!(
                "the known exception `{}` → `{}` no longer exists (or is allowed): remove it from ARCHITECTURE.md",
                ex.0, ex.1
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every workspace member is in ARCHITECTURE.md's code map, by its path, and every path the code map's tables
/// name exists.
#[test]
fn the_code_map_names_every_crate_and_only_what_exists() {
    let doc = architecture();
    let map = section(&doc, "Code map");
    let (members, _, _) = workspace(&root());
    let mut problems = Vec::new();
    for m in &members {
        if !map.contains(&format!("`{}`", m.path)) {
            problems.push(format!(
                "`{}` ({}) is not in ARCHITECTURE.md's code map",
                m.path, m.name
            ));
        }
    }
    for line in map.lines() {
        let Some(row) = cells(line) else {
            continue;
        };
        for path in ticked(row[0]) {
            if !root().join(path.trim_end_matches("/*")).exists() {
                problems.push(format!("the code map names `{path}`, which does not exist"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Only the plugin host links wasmtime: the data path sees plugins through `weft-hooks` alone.
#[test]
fn only_the_plugin_host_links_wasmtime() {
    let (_, _, wasmtime) = workspace(&root());
    let others: Vec<&String> = wasmtime.iter().filter(|p| *p != WASMTIME_HOME).collect();
    assert!(
        others.is_empty(),
        "wasmtime is a dependency of {others:?}; only `{WASMTIME_HOME}` may link it (ARCHITECTURE.md)"
    );
    assert!(
        wasmtime.iter().any(|p| p == WASMTIME_HOME),
        "`{WASMTIME_HOME}` does not depend on wasmtime: is the plugin host elsewhere? Update this test and \
         ARCHITECTURE.md"
    );
}
