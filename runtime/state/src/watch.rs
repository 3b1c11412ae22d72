//! Loading the local config file into a [`StateStore`] at startup, and watching it for edits afterwards.
//!
//! The watcher polls the file's content (a sha256 of the bytes): editors often replace a file rather than write it
//! in place, which file-change notifications follow badly. A change is acted on once the same content (or the same
//! read error) has been seen on two polls in a row, so a half-written file is not reported as broken. A good edit
//! replaces the state; a bad edit (or a removed or emptied file) is logged and recorded on the store, and the last
//! good state keeps being served. An empty file is accepted at startup (an empty config) but refused on reload,
//! where it is far more likely an editor's in-place rewrite than a wish to drop every workload.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tracing::{debug, error, info};

use crate::local::{self, ConfigError, LocalConfig};
use crate::store::StateStore;

/// The default polling interval.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Load the file at `path` into `store` (blocking). Used at startup, where a bad file is an error for the caller
/// to report; the error is also recorded on the store.
pub fn load_into(path: &Path, store: &StateStore) -> Result<u64, ConfigError> {
    match local::load(path) {
        Ok(config) => Ok(apply(path, store, config)),
        Err(e) => {
            store.record_error(e.to_string());
            Err(e)
        }
    }
}

/// Watch `path` every `interval` and apply its edits to `store`. If the store is already loaded (by
/// [`load_into`]), the file's content at this call is taken as applied. The task runs until aborted, or until it
/// holds the last reference to the store. Must be called within a tokio runtime.
pub fn watch_file(path: PathBuf, store: Arc<StateStore>, interval: Duration) -> JoinHandle<()> {
    let applied = if store.is_loaded() {
        std::fs::read(&path).ok().map(|bytes| digest(&bytes))
    } else {
        None
    };
    tokio::spawn(run(path, store, interval, applied))
}

type Digest32 = [u8; 32];

fn digest(bytes: &[u8]) -> Digest32 {
    Sha256::digest(bytes).into()
}

/// What one poll saw.
enum Observation {
    Content { digest: Digest32, bytes: Vec<u8> },
    Unreadable(std::io::Error),
}

/// What is compared between polls.
#[derive(Clone, PartialEq, Eq)]
enum Seen {
    Content(Digest32),
    Unreadable(String),
}

impl Observation {
    fn seen(&self) -> Seen {
        match self {
            Observation::Content { digest, .. } => Seen::Content(*digest),
            Observation::Unreadable(e) => Seen::Unreadable(e.to_string()),
        }
    }
}

async fn observe(path: &Path) -> Observation {
    match tokio::fs::read(path).await {
        Ok(bytes) => Observation::Content {
            digest: digest(&bytes),
            bytes,
        },
        Err(e) => Observation::Unreadable(e),
    }
}

async fn run(
    path: PathBuf,
    store: Arc<StateStore>,
    interval: Duration,
    mut applied: Option<Digest32>,
) {
    let mut handled: Option<Seen> = applied.map(Seen::Content);
    let mut pending: Option<Seen> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    debug!(path = %path.display(), ?interval, "watching config file");
    loop {
        ticker.tick().await;
        if Arc::strong_count(&store) == 1 {
            debug!(path = %path.display(), "state store dropped; config watcher stops");
            return;
        }
        poll_once(&path, &store, &mut handled, &mut pending, &mut applied).await;
        store.count_source_check();
    }
}

/// One look at the file: apply or refuse what changed since the last look (once seen twice in a row).
async fn poll_once(
    path: &Path,
    store: &StateStore,
    handled: &mut Option<Seen>,
    pending: &mut Option<Seen>,
    applied: &mut Option<Digest32>,
) {
    let observation = observe(path).await;
    let seen = observation.seen();
    if handled.as_ref() == Some(&seen) {
        *pending = None;
        return;
    }
    // Act only once the same thing was seen twice in a row (the file may be mid-write).
    if pending.as_ref() != Some(&seen) {
        *pending = Some(seen);
        return;
    }
    *pending = None;
    *handled = Some(seen);
    match observation {
        Observation::Content { digest, bytes } => {
            if *applied == Some(digest) {
                info!(path = %path.display(), version = store.version(), "config file is back to the applied content");
                store.clear_error();
                return;
            }
            if bytes.is_empty() {
                // Most likely an editor truncated the file to rewrite it in place and is slow about it.
                refuse(
                    store,
                    &ConfigError::Invalid {
                        file: path.to_path_buf(),
                        line: None,
                        column: None,
                        message: "the file is empty (0 bytes); to clear the state on reload, write `{}` or a \
                                  comment"
                            .to_owned(),
                    },
                );
                return;
            }
            match parse_bytes(path, bytes) {
                Ok(config) => {
                    apply(path, store, config);
                    *applied = Some(digest);
                }
                Err(e) => refuse(store, &e),
            }
        }
        Observation::Unreadable(source) => refuse(
            store,
            &ConfigError::Read {
                file: path.to_path_buf(),
                source,
            },
        ),
    }
}

fn parse_bytes(path: &Path, bytes: Vec<u8>) -> Result<LocalConfig, ConfigError> {
    let text = String::from_utf8(bytes).map_err(|e| ConfigError::Read {
        file: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    local::parse_named(&text, path)
}

fn apply(path: &Path, store: &StateStore, config: LocalConfig) -> u64 {
    let (workloads, services, policies, plugins) = (
        config.workloads.len(),
        config.services.len(),
        config.policies.len(),
        config.plugins.len(),
    );
    let version = store.replace(config);
    info!(
        path = %path.display(),
        version,
        workloads,
        services,
        policies,
        plugins,
        "config applied"
    );
    version
}

fn refuse(store: &StateStore, e: &ConfigError) {
    let message = e.to_string();
    error!(
        error = %message,
        serving_version = store.version(),
        "config edit refused; still serving the last good config"
    );
    store.record_error(message);
}
