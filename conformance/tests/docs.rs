//! The docs hold themselves: docs/operations.md's flag reference is the binaries' own `--help` (a section between
//! `<!-- BEGIN GENERATED: <command> -->` and `<!-- END GENERATED: <command> -->` is that command's output), and
//! every Markdown file in the repository links only to files that are in it.
//!
//! Needs the binaries built first (`cargo build --workspace --bins`, as CI does before the tests). After a change
//! to a flag, regenerate the sections with the command in [`REGENERATE`].
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The file with the generated sections.
const OPERATIONS: &str = "docs/operations.md";
/// Rewrites every generated section from the binaries built in the target directory.
const REGENERATE: &str = "cargo build --workspace --bins && WEFT_UPDATE_DOCS=1 cargo test -p weft-conformance --test docs";
/// The commands whose whole `--help` docs/operations.md carries: every flag of the node, the control plane and
/// the reference CA.
const REQUIRED: &[&str] = &[
    "weft run --help",
    "weft ca init --help",
    "weft-control --help",
    "weft-ca --help",
];
const BEGIN: &str = "<!-- BEGIN GENERATED: ";
const END: &str = "<!-- END GENERATED: ";

/// The repository's root (this crate is `conformance/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What a generated section holds: `command`'s stdout (run with an empty environment, so no `[env: X=value]`
/// shows a value of this machine's) as a text block, each line's trailing blanks trimmed.
fn help_block(command: &str) -> String {
    let mut words = command.split_whitespace();
    let program = words.next().unwrap();
    let weft = weft_devmesh::weft_binary().unwrap();
    let binary = if program == "weft" {
        weft.clone()
    } else {
        weft.with_file_name(program)
    };
    let out = Command::new(&binary)
        .args(words)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; build it first: {REGENERATE}", binary.display()));
    assert!(
        out.status.success(),
        "`{command}` ({}) failed: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let help = String::from_utf8(out.stdout).unwrap();
    let mut block = String::from("```text\n");
    for line in help.trim_end().lines() {
        block.push_str(line.trim_end());
        block.push('\n');
    }
    block.push_str("```\n");
    block
}

/// `text` with every generated section rewritten, and the commands of the sections.
fn regenerate(text: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut commands = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(BEGIN) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let marker_end = from
            .find("-->")
            .unwrap_or_else(|| panic!("{OPERATIONS}: an unclosed `{BEGIN}` marker"));
        let command = from[BEGIN.len()..marker_end].trim().to_owned();
        let end_marker = format!("{END}{command} -->");
        let end_at = from.find(&end_marker).unwrap_or_else(|| {
            panic!("{OPERATIONS}: `{BEGIN}{command} -->` has no `{end_marker}`")
        });
        out.push_str(&from[..marker_end + "-->".len()]);
        out.push('\n');
        out.push_str(&help_block(&command));
        out.push_str(&end_marker);
        rest = &from[end_at + end_marker.len()..];
        commands.push(command);
    }
    out.push_str(rest);
    (out, commands)
}

/// docs/operations.md carries every flag as `--help` prints it. `WEFT_UPDATE_DOCS=1` rewrites the sections
/// instead of comparing them.
#[test]
fn the_flag_reference_is_the_binaries_help() {
    let path = root().join(OPERATIONS);
    let text = std::fs::read_to_string(&path).unwrap();
    let (fresh, commands) = regenerate(&text);
    for required in REQUIRED {
        assert!(
            commands.iter().any(|c| c == required),
            "{OPERATIONS} has no generated section for `{required}`: add the two lines `{BEGIN}{required} -->` and \
             `{END}{required} -->` where it belongs, then run: {REGENERATE}"
        );
    }
    if std::env::var_os("WEFT_UPDATE_DOCS").is_some() {
        if fresh != text {
            std::fs::write(&path, &fresh).unwrap();
        }
        return;
    }
    if fresh != text {
        let ((line, old), new) = first_difference(&text, &fresh);
        panic!(
            "{OPERATIONS} is stale: its flag reference is not what the binaries' --help prints (first difference, \
             line {line}:\n  file:   {old}\n  --help: {new}\n). Regenerate it: {REGENERATE}"
        );
    }
}

/// The first line where `a` and `b` differ: its number and `a`'s text, and `b`'s text.
fn first_difference<'a>(a: &'a str, b: &'a str) -> ((usize, &'a str), &'a str) {
    let mut la = a.lines();
    let mut lb = b.lines();
    let mut n = 0;
    loop {
        n += 1;
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => return ((n, x.unwrap_or("<end>")), y.unwrap_or("<end>")),
        }
    }
}

/// The Markdown files of the repository: tracked or new (not ignored), by git; without git, every `*.md` outside
/// hidden and target directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let git = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            "*.md",
        ])
        .current_dir(root)
        .output();
    if let Ok(out) = git
        && out.status.success()
    {
        let mut files: Vec<PathBuf> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files.dedup();
        return files;
    }
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && !name.starts_with("target") {
                    dirs.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of a Markdown text outside fenced code blocks, numbered from 1, with inline code spans blanked out.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut prose = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                prose.push(' ');
            } else {
                prose.push(if in_code { ' ' } else { c });
            }
        }
        lines.push((i + 1, prose));
    }
    lines
}

/// The targets of a line's links: inline `[text](target "title")` and reference definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let t = line.trim_start();
    if t.starts_with('[')
        && let Some(close) = t.find("]:")
    {
        if let Some(target) = t[close + 2..].split_whitespace().next() {
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
        return targets;
    }
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(at) = line[from..].find("](") {
        let start = from + at + 2;
        let mut depth = 1;
        let mut end = start;
        while end < bytes.len() {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let inner = line[start..end].trim();
        let target = if let Some(stripped) = inner.strip_prefix('<') {
            stripped.split('>').next().unwrap_or("")
        } else {
            inner.split_whitespace().next().unwrap_or("")
        };
        targets.push(target.to_owned());
        from = end.min(bytes.len());
    }
    targets
}

/// GitHub's anchors for a Markdown text's headings: lower case, punctuation dropped, spaces as hyphens, `-1`,
/// `-2`, ... for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced || !t.starts_with('#') {
            continue;
        }
        let heading = t.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` with `.` and `..` resolved lexically, or `None` when it climbs out of its root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every relative link in every Markdown file names a file or directory of the repository (and a heading of it,
/// for `file.md#anchor`); no link leaves the repository by a relative path.
#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let root = root();
    let files = markdown_files(&root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no Markdown found under {}",
        root.display()
    );
    let mut dangling = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(&root).unwrap();
        let dir = rel.parent().unwrap_or(Path::new(""));
        for (n, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let joined = if path.is_empty() {
                    rel.to_path_buf()
                } else if let Some(from_root) = path.strip_prefix('/') {
                    PathBuf::from(from_root)
                } else {
                    dir.join(path.replace("%20", " "))
                };
                let Some(resolved) = normalize(&joined) else {
                    dangling.push(format!(
                        "{}:{n}: {target} (outside the repository)",
                        rel.display()
                    ));
                    continue;
                };
                let full = root.join(&resolved);
                if !full.exists() {
                    dangling.push(format!("{}:{n}: {target} (no such file)", rel.display()));
                    continue;
                }
                if let Some(anchor) = anchor
                    && full.extension().is_some_and(|e| e == "md")
                    && !anchors(&std::fs::read_to_string(&full).unwrap()).contains(anchor)
                {
                    dangling.push(format!(
                        "{}:{n}: {target} (no heading with that anchor in {})",
                        rel.display(),
                        resolved.display()
                    ));
                }
            }
        }
    }
    assert!(
        dangling.is_empty(),
        "links to what is not in the repository:\n  {}",
        dangling.join("\n  ")
    );
}

/// A Markdown file names no document by its file name (`DESIGN.md`, as in "see DESIGN.md") that is not in the
/// repository, linked or not: a reader cannot follow it.
#[test]
fn every_document_the_markdown_names_is_in_the_repository() {
    let root = root();
    let files = markdown_files(&root);
    let names: BTreeSet<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(&root).unwrap();
        for (i, line) in text.lines().enumerate() {
            for name in upper_case_md_names(line) {
                if !names.contains(name) {
                    missing.push(format!("{}:{}: {name}", rel.display(), i + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documents named that are not in the repository:\n  {}",
        missing.join("\n  ")
    );
}

/// The upper-case document names in a line (`README.md`, `DESIGN.md`): a capital, then capitals, digits, `_` or
/// `-`, then `.md`, not inside a longer word.
fn upper_case_md_names(line: &str) -> Vec<&str> {
    let bytes = line.as_bytes();
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = line[from..].find(".md") {
        let end = from + at;
        let after = end + 3;
        from = after;
        if bytes
            .get(after)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            continue;
        }
        let mut start = end;
        while start > 0
            && (bytes[start - 1].is_ascii_uppercase()
                || bytes[start - 1].is_ascii_digit()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b'-')
        {
            start -= 1;
        }
        if start == end
            || !bytes[start].is_ascii_uppercase()
            || (start > 0 && bytes[start - 1].is_ascii_alphanumeric())
        {
            continue;
        }
        names.push(&line[start..after]);
    }
    names
}

#[test]
fn the_link_parser_finds_what_a_reader_follows() {
    assert_eq!(
        link_targets("see [a](docs/x.md#y) and [b](<c d.md> \"t\") and [c](f(1).md)"),
        ["docs/x.md#y", "c d.md", "f(1).md"]
    );
    assert_eq!(link_targets("[ref]: ../y.md"), ["../y.md"]);
    let prose = prose_lines("`[a](nowhere)` [b](here)\n```\n[c](in-code)\n```\n");
    let found: Vec<String> = prose.iter().flat_map(|(_, l)| link_targets(l)).collect();
    assert_eq!(found, ["here"]);
    let a = anchors("# weft\n## The control plane: `weft-control`\n## Ports\n## Ports\n");
    assert!(a.contains("the-control-plane-weft-control"), "{a:?}");
    assert!(a.contains("ports") && a.contains("ports-1"), "{a:?}");
    assert_eq!(
        upper_case_md_names(
            "see DESIGN.md, `TEAM.md` and charts/weft/README.md; not x.md or FOO.mdx"
        ),
        ["DESIGN.md", "TEAM.md", "README.md"]
    );
}
