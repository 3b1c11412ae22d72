//! Loading the local config file into a [`StateStore`] at startup, and watching it for edits afterwards.
//!
//! The watcher polls the file's content (a sha256 of the bytes): editors often replace a file rather than write it
//! in place, which file-change notifications follow badly. A change is acted on once the same content (or the same
//! read error) has been seen on two polls in a row, so a half-written file is not reported as broken. A good edit
//! replaces the state; a bad edit (or a removed or emptied file) is logged and recorded on the store, and the last
//! good state keeps being served. An empty file is accepted at startup (an empty config) but refused on reload,
//! where it is far more likely an editor's in-place rewrite than a wish to drop every workload.
//!
//! Most polls find nothing new, so a poll first looks at the file's metadata (one `stat`) and reads it only when
//! that changed, when a change is waiting for its second look, or when the last read may have raced a write (the
//! file was modified within `SETTLE` of that read: timestamps are coarse, so a same-size rewrite in the same tick
//! would leave the metadata as it was). An idle node then reads its config once, not four times a second.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

/// How long after a file's last modification a read of it is taken as final: longer than any timestamp
/// granularity, so a write after that read must move the modification or change time.
const SETTLE: Duration = Duration::from_secs(1);

/// What a `stat` tells about the file: anything that a write, a replace (rename over it) or a truncation changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    /// Last content change: what a racing write would have to move.
    mtime: SystemTime,
    /// Last inode change (seconds, nanoseconds), compared only: it also moves on renames and `chmod`.
    ctime: (i64, i64),
}

impl Stamp {
    /// The file's stamp, or `None` when it cannot be looked at (then it is read, and the read reports why).
    ///
    /// A plain `stat` on the runtime's thread: a few microseconds on a local file, cheaper than handing the call
    /// to the blocking pool.
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.modified().ok()?,
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The stamp the file had just before its last read, and when that read happened.
#[derive(Debug, Clone, Copy)]
struct LastRead {
    stamp: Stamp,
    at: SystemTime,
}

/// Whether this poll must read the file, given its stamp now and the last read. It may skip the read only when
/// nothing is waiting for a second look, the stamp is the one the last read saw, and that read came well after the
/// file's last change (else a same-size write in the same timestamp tick could be hiding behind an unchanged stamp).
fn must_read(now: Option<Stamp>, last: Option<LastRead>, pending: bool) -> bool {
    let (Some(now), Some(last)) = (now, last) else {
        return true;
    };
    if pending || now != last.stamp {
        return true;
    }
    match last.at.duration_since(now.mtime) {
        Ok(settled) => settled < SETTLE,
        // Changed after the read (a clock step): look again.
        Err(_) => true,
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
    let mut last_read: Option<LastRead> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    debug!(path = %path.display(), ?interval, "watching config file");
    loop {
        ticker.tick().await;
        if Arc::strong_count(&store) == 1 {
            debug!(path = %path.display(), "state store dropped; config watcher stops");
            return;
        }
        let stamp = Stamp::of(&path);
        if must_read(stamp, last_read, pending.is_some()) {
            let at = SystemTime::now();
            poll_once(&path, &store, &mut handled, &mut pending, &mut applied).await;
            last_read = stamp.map(|stamp| LastRead { stamp, at });
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    fn stamp(len: u64, mtime_s: u64) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            len,
            mtime: SystemTime::UNIX_EPOCH + Duration::new(mtime_s, 500),
            ctime: (i64::try_from(mtime_s).unwrap(), 500),
        }
    }

    fn read_at(stamp: Stamp, secs_after_epoch: u64) -> Option<LastRead> {
        Some(LastRead {
            stamp,
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs_after_epoch),
        })
    }

    #[test]
    fn a_poll_skips_the_read_only_for_a_settled_unchanged_file() {
        let s = stamp(10, 1_000);
        // Never read, or the file cannot be looked at: read.
        assert!(must_read(Some(s), None, false));
        assert!(must_read(None, read_at(s, 2_000), false));
        // Unchanged and read long after its last change: skip.
        assert!(!must_read(Some(s), read_at(s, 2_000), false));
        assert!(!must_read(Some(s), read_at(s, 1_002), false));
        // A change waits for its second look: read even though the stamp did not move.
        assert!(must_read(Some(s), read_at(s, 2_000), true));
        // Any field of the stamp moved: read.
        assert!(must_read(Some(stamp(11, 1_000)), read_at(s, 2_000), false));
        assert!(must_read(Some(stamp(10, 1_001)), read_at(s, 2_000), false));
        let renamed = Stamp { ino: 3, ..s };
        assert!(must_read(Some(renamed), read_at(s, 2_000), false));
        let chmod = Stamp {
            ctime: (1_500, 0),
            ..s
        };
        assert!(must_read(Some(chmod), read_at(s, 2_000), false));
    }

    #[test]
    fn a_read_close_to_the_last_change_is_not_trusted() {
        let s = stamp(10, 1_000);
        // Read in the same second as the change (mtime 1000.0000005 s, read at 1000 s: even before it): a write in
        // the same timestamp tick would not move the stamp, so keep reading until the change has settled.
        assert!(must_read(Some(s), read_at(s, 1_000), false));
        assert!(must_read(Some(s), read_at(s, 1_001), false));
        assert!(!must_read(Some(s), read_at(s, 1_002), false));
    }

    #[test]
    fn the_stamp_of_a_real_file_follows_in_place_writes_and_replacements() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "a: 1\n").unwrap();
        let first = Stamp::of(&path).unwrap();
        assert_eq!(Stamp::of(&path), Some(first), "nothing changed");
        std::fs::write(&path, "a: 22\n").unwrap();
        let second = Stamp::of(&path).unwrap();
        assert_ne!(second, first, "a longer in-place write");
        let tmp = dir.path().join("c.swp");
        std::fs::write(&tmp, "a: 33\n").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_ne!(
            Stamp::of(&path),
            Some(second),
            "a same-size replacement (new inode)"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(Stamp::of(&path), None, "gone");
        assert!(first.mtime > SystemTime::UNIX_EPOCH);
    }
}
