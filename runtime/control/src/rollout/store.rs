//! Where rollout records are kept between runs: a JSON file written atomically (a temporary file renamed over it,
//! mode 0600: it holds the served resources, pull credentials included), read once at start.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use crate::rollout::state::Record;

/// A store that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file cannot be read or written.
    #[error("rollout state {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a rollout state.
    #[error("rollout state {path}: not a rollout state file: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

/// The file the records are kept in.
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
}

/// The file's form.
#[derive(serde::Serialize, serde::Deserialize)]
struct File {
    version: u32,
    plugins: BTreeMap<String, Record>,
}

impl FileStore {
    /// The store at `path` (created on the first save).
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Every record (none when the file does not exist yet).
    pub fn load(&self) -> Result<BTreeMap<String, Record>, StoreError> {
        let io = |source| StoreError::Io {
            path: self.path.clone(),
            source,
        };
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(io(e)),
        };
        let f: File = serde_json::from_slice(&bytes).map_err(|source| StoreError::Parse {
            path: self.path.clone(),
            source,
        })?;
        Ok(f.plugins)
    }

    /// Replace every record.
    pub fn save(&self, plugins: &BTreeMap<String, Record>) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            path: self.path.clone(),
            source,
        };
        let body = serde_json::to_vec(&File {
            version: 1,
            plugins: plugins.clone(),
        })
        .map_err(|source| StoreError::Parse {
            path: self.path.clone(),
            source,
        })?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(io)?;
        f.write_all(&body).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_save_and_a_load_and_a_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path().join("state.json"));
        assert!(s.load().unwrap().is_empty());
        let mut m = BTreeMap::new();
        m.insert("p".to_owned(), Record::default());
        s.save(&m).unwrap();
        assert_eq!(s.load().unwrap(), m);
        std::fs::write(s.path(), b"{").unwrap();
        let e = s.load().unwrap_err().to_string();
        assert!(e.contains("not a rollout state file"), "{e}");
    }
}
