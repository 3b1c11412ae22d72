//! The compile cache: components compiled once per content hash, kept in memory and (optionally) on disk.
//!
//! Loading a compiled artifact runs its machine code, so nothing on disk is trusted for what its name says:
//! - the directory must be weft's own (created 0700; one owned by another user, group- or world-writable, or a
//!   symlink is refused with a WARN, and the cache stays in memory only);
//! - an entry is named by the component's sha256 and a hash of wasmtime's compatibility inputs (wasmtime
//!   version, compiler target and flags, tunables, wasm features: the engine settings);
//! - an entry carries an HMAC-SHA256 of (component sha256, engine key, compiled bytes) under a random key kept in
//!   the directory (`cache.key`, 0600, created once); it is verified, in memory, before `Component::deserialize`
//!   sees a byte, so a flipped byte or a valid artifact of another component placed under the name is not
//!   loaded: the component is compiled again and the entry rewritten (temp file + rename).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hmac::{Hmac, Mac};
use rand::TryRngCore;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::base::compiler::{Compiled, Compiler, EngineSettings};
use crate::base::error::LoadError;

const MEMORY_CACHE_ENTRIES: usize = 64;
/// First bytes of a disk cache entry (format version included).
const ENTRY_MAGIC: &[u8; 16] = b"weft-cwasm-v1\0\0\0";
const TAG_LEN: usize = 32;
const KEY_FILE: &str = "cache.key";
const KEY_LEN: usize = 32;
/// Largest entry read back (a compiled plugin is a few MiB).
const MAX_ENTRY_BYTES: u64 = crate::base::compiler::MAX_ARTIFACT_BYTES;

/// Hex sha256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Feeds a `Hash` into sha256 (wasmtime's compatibility hash is a `Hash`, not bytes).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// Hex key of the engine settings a compiled artifact depends on (wasmtime version, target, flags, tunables,
/// features).
fn engine_key(engine: &Engine) -> String {
    let mut h = Sha256Hasher(Sha256::new());
    h.write(ENTRY_MAGIC);
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..16])
}

/// Why the cache directory is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheDirError {
    /// It could not be created or inspected.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Someone other than weft's user could write it (or swap it).
    #[error("{0}")]
    Unsafe(String),
}

/// The on-disk part of the cache: a directory only weft's user can write, and the entries' MAC key.
struct DiskCache {
    dir: PathBuf,
    key: [u8; KEY_LEN],
}

/// Lets the allocator give back what the calling thread freed: `hook` (the host's
/// [`crate::HostConfig::release_memory`]) when there is one, else glibc's `malloc_trim` (glibc keeps what a thread
/// freed in that thread's arena, so after a compile the process would stay at the compiler's peak; elsewhere a
/// no-op).
pub(crate) fn release_freed_memory(hook: Option<fn()>) {
    if let Some(hook) = hook {
        hook();
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes the allocator's locks itself and has
    // no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

/// Whether a directory or file is safe to trust: ours, not a symlink, nobody else may write it (and, for a
/// file, read it).
fn check_private(path: &Path, meta: &std::fs::Metadata, file: bool) -> Result<(), CacheDirError> {
    let what = if file { "file" } else { "directory" };
    if meta.file_type().is_symlink() {
        return Err(CacheDirError::Unsafe(format!(
            "{} is a symlink; the compile cache {what} must be a real {what}",
            path.display()
        )));
    }
    if (file && !meta.is_file()) || (!file && !meta.is_dir()) {
        return Err(CacheDirError::Unsafe(format!(
            "{} is not a {what}",
            path.display()
        )));
    }
    if meta.uid() != euid() {
        return Err(CacheDirError::Unsafe(format!(
            "{} is owned by uid {}, not weft's uid {}",
            path.display(),
            meta.uid(),
            euid()
        )));
    }
    let forbidden = if file { 0o077 } else { 0o022 };
    if meta.mode() & forbidden != 0 {
        return Err(CacheDirError::Unsafe(format!(
            "{} has mode {:04o}; others may {}",
            path.display(),
            meta.mode() & 0o7777,
            if file { "read or write it" } else { "write it" }
        )));
    }
    Ok(())
}

impl DiskCache {
    /// Opens (creating it 0700 if missing) the cache directory and its key, refusing anything others could write.
    fn open(dir: &Path) -> Result<Self, CacheDirError> {
        match std::fs::symlink_metadata(dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::DirBuilder::new().mode(0o700).create(dir)?;
            }
            Err(e) => return Err(e.into()),
        }
        check_private(dir, &std::fs::symlink_metadata(dir)?, false)?;
        let key = Self::key(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            key,
        })
    }

    /// The MAC key: read from `cache.key` if it is ours, private and whole; else a new random key, written 0600
    /// (every entry made under another key then fails verification and is recompiled).
    fn key(dir: &Path) -> Result<[u8; KEY_LEN], CacheDirError> {
        let path = dir.join(KEY_FILE);
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            match check_private(&path, &meta, true) {
                Ok(()) if meta.len() == KEY_LEN as u64 => {
                    let mut key = [0u8; KEY_LEN];
                    std::fs::File::open(&path)?.read_exact(&mut key)?;
                    return Ok(key);
                }
                Ok(()) => {
                    tracing::warn!(path = %path.display(), "compile cache key has the wrong size; replacing it")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "compile cache key is not private; replacing it")
                }
            }
        }
        let mut key = [0u8; KEY_LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut key)
            .map_err(|e| std::io::Error::other(format!("OS random number generator: {e}")))?;
        write_atomically(dir, KEY_FILE, &[&key])?;
        Ok(key)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The MAC of an entry's content.
    fn tag(&self, sha: &str, engine_key: &str, artifact: &[u8]) -> std::io::Result<Hmac<Sha256>> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key)
            .map_err(|e| std::io::Error::other(format!("HMAC key: {e}")))?;
        for part in [sha.as_bytes(), engine_key.as_bytes()] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.update(artifact);
        Ok(mac)
    }

    /// The verified compiled bytes of an entry; `Err` says why an existing entry is not usable.
    fn read(&self, name: &str, sha: &str, engine_key: &str) -> Result<Option<Vec<u8>>, String> {
        let path = self.path(name);
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot open: {e}")),
        };
        let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
        if !meta.is_file() || meta.uid() != euid() || meta.mode() & 0o022 != 0 {
            return Err("not a private regular file of weft's user".to_string());
        }
        if meta.len() > MAX_ENTRY_BYTES {
            return Err(format!("{} bytes, more than an entry may be", meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        (&mut file)
            .take(MAX_ENTRY_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read: {e}"))?;
        let header = ENTRY_MAGIC.len() + TAG_LEN;
        if bytes.len() < header || &bytes[..ENTRY_MAGIC.len()] != ENTRY_MAGIC {
            return Err("not a weft compile cache entry".to_string());
        }
        let artifact = bytes.split_off(header);
        self.tag(sha, engine_key, &artifact)
            .map_err(|e| e.to_string())?
            .verify_slice(&bytes[ENTRY_MAGIC.len()..])
            .map_err(|_| "integrity check failed (MAC mismatch)".to_string())?;
        Ok(Some(artifact))
    }

    fn write(
        &self,
        name: &str,
        sha: &str,
        engine_key: &str,
        artifact: &[u8],
    ) -> std::io::Result<()> {
        let tag = self.tag(sha, engine_key, artifact)?.finalize().into_bytes();
        write_atomically(&self.dir, name, &[ENTRY_MAGIC, &tag, artifact])
    }
}

/// Writes `parts` to `dir/name` through a fresh 0600 temp file and a rename, so a reader sees the old file or
/// the whole new one.
fn write_atomically(dir: &Path, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{name}.tmp{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        for p in parts {
            f.write_all(p)?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Compiled components by content hash.
pub(crate) struct CompileCache {
    engine: Engine,
    compiler: Compiler,
    settings: EngineSettings,
    disk: Option<DiskCache>,
    engine_key: String,
    memory: Mutex<HashMap<String, (Component, Instant)>>,
}

impl CompileCache {
    /// A cache for `engine` (built from `settings`) whose misses `compiler` compiles, on disk in `dir` if that
    /// directory is (or can be made) weft's own; otherwise, with a WARN, in memory only.
    pub fn new(
        engine: Engine,
        settings: EngineSettings,
        compiler: Compiler,
        dir: Option<PathBuf>,
    ) -> Self {
        let disk = dir.and_then(|dir| match DiskCache::open(&dir) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "not using the plugin compile cache directory; compiled plugins are kept in memory only"
                );
                None
            }
        });
        Self {
            engine_key: engine_key(&engine),
            engine,
            compiler,
            settings,
            disk,
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled component for `bytes` (whose sha256 is `sha`): from memory, from disk (verified), or compiled
    /// now.
    pub fn get(&self, sha: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        if let Ok(mut mem) = self.memory.lock()
            && let Some((c, used)) = mem.get_mut(sha)
        {
            *used = Instant::now();
            return Ok(c.clone());
        }
        let component = match self.load_from_disk(sha) {
            Some(c) => c,
            None => self.compile(sha, bytes)?,
        };
        if let Ok(mut mem) = self.memory.lock() {
            if mem.len() >= MEMORY_CACHE_ENTRIES
                && let Some(oldest) = mem
                    .iter()
                    .min_by_key(|(_, (_, t))| *t)
                    .map(|(k, _)| k.clone())
            {
                mem.remove(&oldest);
            }
            mem.insert(sha.to_string(), (component.clone(), Instant::now()));
        }
        Ok(component)
    }

    /// Compiles `bytes` with the configured compiler, loads the result and writes it to the disk cache.
    fn compile(&self, sha: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        let started = Instant::now();
        let component = match self.compiler.compile(&self.engine, self.settings, bytes)? {
            Compiled::Loaded(c) => {
                self.store_to_disk(sha, || c.serialize().map_err(|e| format!("{e:#}")));
                c
            }
            Compiled::Artifact(artifact) => {
                // SAFETY: `artifact` was just produced, for these bytes, by a compiler child: this very
                // executable (`/proc/self/exe` in `weft run`), run with the settings this engine was built from,
                // writing `Engine::precompile_component`'s output into a pipe only this process reads. wasmtime
                // checks its header (version, target, flags, tunables) against this engine before loading.
                #[allow(unsafe_code)]
                let loaded = unsafe { Component::deserialize(&self.engine, &artifact) };
                let c = loaded.map_err(|e| {
                    LoadError::Compiler(format!(
                        "the compiled artifact does not load into this engine: {e:#}"
                    ))
                })?;
                self.store_to_disk(sha, || Ok(artifact));
                c
            }
        };
        tracing::info!(
            sha256 = sha,
            compiler = self.compiler.name(),
            ms = started.elapsed().as_millis() as u64,
            "plugin compiled"
        );
        Ok(component)
    }

    fn name(&self, sha: &str) -> String {
        format!("{sha}-{}.cwasm", self.engine_key)
    }

    #[allow(unsafe_code)]
    fn load_from_disk(&self, sha: &str) -> Option<Component> {
        let disk = self.disk.as_ref()?;
        let name = self.name(sha);
        let artifact = match disk.read(&name, sha, &self.engine_key) {
            Ok(Some(a)) => a,
            Ok(None) => return None,
            Err(why) => {
                tracing::warn!(path = %disk.path(&name).display(), reason = %why,
                    "compile cache entry not loaded; compiling the plugin again");
                return None;
            }
        };
        // SAFETY: `artifact` is exactly what `store_to_disk` wrote from `Component::serialize` for this component
        // (`sha`) and this engine configuration (`engine_key`): the HMAC under the cache's private key, checked
        // above on these very bytes (read into memory once, so no later swap of the file matters), binds both.
        // Only weft's user can write the directory and the key. wasmtime also checks its own header.
        match unsafe { Component::deserialize(&self.engine, &artifact) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %disk.path(&name).display(), error = %format!("{e:#}"),
                    "compile cache entry not loaded; compiling the plugin again");
                None
            }
        }
    }

    fn store_to_disk(&self, sha: &str, artifact: impl FnOnce() -> Result<Vec<u8>, String>) {
        let Some(disk) = self.disk.as_ref() else {
            return;
        };
        let name = self.name(sha);
        let written = artifact()
            .map_err(std::io::Error::other)
            .and_then(|bytes| disk.write(&name, sha, &self.engine_key, &bytes));
        if let Err(e) = written {
            tracing::warn!(path = %disk.path(&name).display(), error = %e, "cannot write the compile cache");
        }
    }
}
