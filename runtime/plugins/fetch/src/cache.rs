//! The on-disk cache of fetched modules, keyed by digest: `sha256/<hex>` holds a module (re-hashed on every read;
//! a file that does not hash to its name is deleted), `oci/<hex>` the module sha256 an OCI manifest digest
//! resolved to (digests are immutable; tags are never cached). The directory is created 0700 and refused if it is
//! a symlink, not ours, or writable by others; files are written to a temporary name, synced, then renamed.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{FetchError, sha256_hex};

#[derive(Debug)]
pub(crate) struct DiskCache {
    dir: PathBuf,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

fn private_dir(path: &Path) -> Result<(), FetchError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| FetchError::Cache(format!("cannot create {}: {e}", path.display())))?;
        }
        Err(e) => return Err(FetchError::Cache(format!("{}: {e}", path.display()))),
    }
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| FetchError::Cache(format!("{}: {e}", path.display())))?;
    let problem = if meta.file_type().is_symlink() {
        Some("is a symlink".to_string())
    } else if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != euid() {
        Some(format!(
            "is owned by uid {}, not weft's uid {}",
            meta.uid(),
            euid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "has mode {:04o}: others may write it",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        Some(p) => Err(FetchError::Cache(format!("{} {p}", path.display()))),
        None => Ok(()),
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl DiskCache {
    pub fn open(dir: &Path) -> Result<Self, FetchError> {
        private_dir(dir)?;
        private_dir(&dir.join("sha256"))?;
        private_dir(&dir.join("oci"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn write(&self, sub: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir = self.dir.join(sub);
        let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(&dir)?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(dir.join(name)).map_err(|e| e.error)?;
        Ok(())
    }

    fn read(&self, sub: &str, name: &str, max: u64) -> Option<Vec<u8>> {
        let path = self.dir.join(sub).join(name);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() || meta.uid() != euid() || meta.mode() & 0o022 != 0 || meta.len() > max {
            tracing::warn!(path = %path.display(), "ignoring a plugin code cache entry that is not a private file");
            return None;
        }
        std::fs::read(&path).ok()
    }

    /// Stores a module under its sha256.
    pub fn put_module(&self, sha: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.write("sha256", sha, bytes)
    }

    /// The module cached under `sha`, if present and whole (re-hashed; a bad entry is removed).
    pub fn module(&self, sha: &str) -> Option<Vec<u8>> {
        if !is_hex64(sha) {
            return None;
        }
        let bytes = self.read("sha256", sha, u64::MAX)?;
        if sha256_hex(&bytes) != sha {
            tracing::warn!(
                sha256 = sha,
                "plugin code cache entry does not match its digest; removing it"
            );
            let _ = std::fs::remove_file(self.dir.join("sha256").join(sha));
            return None;
        }
        Some(bytes)
    }

    /// Records that OCI manifest `digest` (`sha256:...`) resolved to module `sha`.
    pub fn put_manifest_link(&self, digest: &str, sha: &str) -> std::io::Result<()> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if !is_hex64(hex) {
            return Err(std::io::Error::other(format!("bad digest {digest}")));
        }
        self.write("oci", hex, sha.as_bytes())
    }

    /// The module sha256 manifest `digest` resolved to.
    pub fn manifest_link(&self, digest: &str) -> Option<String> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if !is_hex64(hex) {
            return None;
        }
        let sha = String::from_utf8(self.read("oci", hex, 64)?).ok()?;
        is_hex64(&sha).then_some(sha)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn modules_round_trip_and_corruption_is_caught() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("cache");
        let c = DiskCache::open(&dir).expect("open");
        let mode = std::fs::metadata(&dir).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let sha = sha256_hex(b"module");
        c.put_module(&sha, b"module").expect("put");
        assert_eq!(c.module(&sha).as_deref(), Some(&b"module"[..]));
        let fmode = std::fs::metadata(dir.join("sha256").join(&sha))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(fmode & 0o077, 0, "{fmode:o}");
        std::fs::write(dir.join("sha256").join(&sha), b"tampered").expect("write");
        assert_eq!(c.module(&sha), None);
        assert!(
            !dir.join("sha256").join(&sha).exists(),
            "a bad entry is removed"
        );
        let digest = format!("sha256:{}", "1".repeat(64));
        c.put_manifest_link(&digest, &sha).expect("link");
        assert_eq!(c.manifest_link(&digest), Some(sha));
        assert_eq!(c.module("../etc/passwd"), None);
    }

    #[test]
    fn unsafe_directories_are_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(DiskCache::open(&open).is_err_and(|e| e.to_string().contains("others may write")));
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).expect("symlink");
        assert!(DiskCache::open(&link).is_err_and(|e| e.to_string().contains("symlink")));
    }
}
