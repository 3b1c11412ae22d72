//! The watched directory of `WeftPlugin` files (`*.yaml`, `*.yml`; not recursive). It is polled: a change (of a
//! file, or of the size or modification time of `file://` code it references) is acted on once two polls in a
//! row saw the same thing, so a half-written file is not reported. A set that does not load (a bad file, two
//! plugins with one name, unreadable code, a sha256 mismatch) is refused whole, with the file, field and line, and
//! the last good set keeps being served.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use weft_state::ConfigError;

use crate::ads::plugin_file::{ParsedPlugin, parse_file};
use crate::ads::publish::{Publisher, SourceKind};
use crate::ads::resources::PluginEntry;

/// What one look at the directory found.
struct Observation {
    digest: [u8; 32],
    files: Vec<(PathBuf, String)>,
    parsed: Result<Vec<ParsedPlugin>, ConfigError>,
}

fn is_plugin_file(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) && p.is_file()
}

fn read_dir_error(dir: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::Read {
        file: dir.to_path_buf(),
        source: std::io::Error::new(e.kind(), e.to_string()),
    }
}

fn observe(dir: &Path) -> Observation {
    let mut h = Sha256::new();
    let mut names: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_plugin_file(p))
            .collect(),
        Err(e) => {
            h.update(format!("dir error {e}").as_bytes());
            return Observation {
                digest: h.finalize().into(),
                files: Vec::new(),
                parsed: Err(read_dir_error(dir, &e)),
            };
        }
    };
    names.sort();
    let mut files = Vec::new();
    let mut parsed = Ok(Vec::new());
    for path in names {
        h.update(path.as_os_str().as_encoded_bytes());
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                h.update((text.len() as u64).to_be_bytes());
                h.update(text.as_bytes());
                if let Ok(all) = &mut parsed {
                    match parse_file(&text, &path) {
                        Ok(mut p) => all.append(&mut p),
                        Err(e) => parsed = Err(e),
                    }
                }
                files.push((path, text));
            }
            Err(e) => {
                h.update(format!("read error {e}").as_bytes());
                if parsed.is_ok() {
                    parsed = Err(ConfigError::Read {
                        file: path,
                        source: e,
                    });
                }
            }
        }
    }
    // Code files referenced by file:// URLs: a rebuilt plugin is a change too.
    if let Ok(all) = &parsed {
        for p in all {
            if let Some(code) = p.local_code(dir) {
                h.update(code.as_os_str().as_encoded_bytes());
                match std::fs::metadata(&code) {
                    Ok(m) => {
                        h.update(m.len().to_be_bytes());
                        let mtime = m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .unwrap_or_default();
                        h.update(mtime.as_nanos().to_be_bytes());
                    }
                    Err(e) => h.update(format!("stat error {e}").as_bytes()),
                }
            }
        }
    }
    Observation {
        digest: h.finalize().into(),
        files,
        parsed,
    }
}

/// Load the directory once: every plugin, by name.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, PluginEntry>, ConfigError> {
    build(dir, observe(dir))
}

fn build(dir: &Path, obs: Observation) -> Result<BTreeMap<String, PluginEntry>, ConfigError> {
    let parsed = obs.parsed?;
    let mut out: BTreeMap<String, PluginEntry> = BTreeMap::new();
    let mut first_file: BTreeMap<String, PathBuf> = BTreeMap::new();
    for p in parsed {
        let text = obs
            .files
            .iter()
            .find(|(f, _)| *f == p.file)
            .map(|(_, t)| t.as_str())
            .unwrap_or_default();
        if let Some(prev) = first_file.get(&p.name) {
            return Err(ConfigError::Invalid {
                file: p.file.clone(),
                line: None,
                column: None,
                message: format!(
                    "metadata.name: plugin {:?} is already defined in {}",
                    p.name,
                    prev.display()
                ),
            });
        }
        first_file.insert(p.name.clone(), p.file.clone());
        let name = p.name.clone();
        out.insert(name, p.into_entry(text, dir)?);
    }
    Ok(out)
}

/// Load `dir` now (an error is returned for the caller to report at startup, and recorded), then poll it every
/// `interval` and publish each good change. Runs until aborted.
pub fn watch_dir(
    dir: PathBuf,
    publisher: Arc<Publisher>,
    interval: Duration,
) -> Result<tokio::task::JoinHandle<()>, ConfigError> {
    let first = observe(&dir);
    let applied = first.digest;
    match build(&dir, first) {
        Ok(set) => publisher.publish_plugins(set),
        Err(e) => {
            publisher.record_refused(SourceKind::Plugins, &e.to_string());
            return Err(e);
        }
    }
    Ok(tokio::spawn(async move {
        let mut applied = applied;
        let mut candidate: Option<[u8; 32]> = None;
        loop {
            tokio::time::sleep(interval).await;
            let d = dir.clone();
            let Ok(obs) = tokio::task::spawn_blocking(move || observe(&d)).await else {
                continue;
            };
            publisher.count_check(SourceKind::Plugins);
            if obs.digest == applied {
                candidate = None;
                continue;
            }
            if candidate != Some(obs.digest) {
                candidate = Some(obs.digest);
                continue;
            }
            // Seen twice in a row: act on it (once).
            applied = obs.digest;
            candidate = None;
            let d = dir.clone();
            match tokio::task::spawn_blocking(move || build(&d, obs)).await {
                Ok(Ok(set)) => publisher.publish_plugins(set),
                Ok(Err(e)) => {
                    // Recorded first, so whoever reads the log line finds it in the status too.
                    publisher.record_refused(SourceKind::Plugins, &e.to_string());
                    tracing::error!(dir = %dir.display(), error = %e, "plugin directory change refused; the last good plugins keep being served");
                }
                Err(e) => tracing::error!(error = %e, "plugin directory load panicked"),
            }
        }
    }))
}
