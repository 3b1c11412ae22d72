//! The one wasmtime `Engine` (pooling allocator, epoch interruption), its epoch ticker thread, and the compile
//! cache: components compiled once per content hash, kept in memory and (optionally) on disk as `.cwasm`.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::HostConfig;
use crate::error::LoadError;

/// Core instances, tables and memories one plugin component may use (a Rust component has one core module with
/// one memory and one table; wit-component may add small shim modules).
const CORE_INSTANCES_PER_COMPONENT: u32 = 8;
const MEMORIES_PER_COMPONENT: u32 = 1;
const TABLES_PER_COMPONENT: u32 = 4;
const MEMORY_CACHE_ENTRIES: usize = 64;

/// Builds the engine from the host config.
pub(crate) fn build_engine(cfg: &HostConfig) -> Result<Engine, String> {
    let mut pool = PoolingAllocationConfig::default();
    let slots = cfg.max_instances.max(1);
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(slots.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(slots.saturating_mul(TABLES_PER_COMPONENT))
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(cfg.memory_limit);
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .wasm_component_model(true)
        .max_wasm_stack(cfg.max_wasm_stack)
        // Reserve only what the cap allows (slots × reservation is the address space the pool takes); bounds
        // checks stay cheap and a grow past the cap is refused by the limiter first.
        .memory_reservation(cfg.memory_limit as u64)
        .memory_reservation_for_growth(0)
        .memory_guard_size(64 << 10)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| format!("cannot create the wasm engine: {e:#}"))
}

/// Increments the engine's epoch every tick until stopped.
#[derive(Debug)]
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    pub fn start(engine: Engine, tick: std::time::Duration) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("weft-plugin-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })?;
        Ok(Self { stop })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Hex sha256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Compiled components by content hash.
pub(crate) struct CompileCache {
    engine: Engine,
    dir: Option<PathBuf>,
    engine_key: String,
    memory: Mutex<HashMap<String, (Component, Instant)>>,
}

impl CompileCache {
    pub fn new(engine: Engine, dir: Option<PathBuf>) -> Self {
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Self {
            engine,
            dir,
            engine_key: format!("{:016x}", h.finish()),
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled component for `bytes` (whose sha256 is `sha`): from memory, from disk, or compiled now.
    pub fn get(&self, sha: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        if let Ok(mut mem) = self.memory.lock()
            && let Some((c, used)) = mem.get_mut(sha)
        {
            *used = Instant::now();
            return Ok(c.clone());
        }
        let component = match self.load_from_disk(sha) {
            Some(c) => c,
            None => {
                let started = Instant::now();
                let c = Component::new(&self.engine, bytes)
                    .map_err(|e| LoadError::Compile(format!("{e:#}")))?;
                tracing::info!(
                    sha256 = sha,
                    ms = started.elapsed().as_millis() as u64,
                    "plugin compiled"
                );
                self.store_to_disk(sha, &c);
                c
            }
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

    fn path(&self, sha: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{sha}-{}.cwasm", self.engine_key)))
    }

    #[allow(unsafe_code)]
    fn load_from_disk(&self, sha: &str) -> Option<Component> {
        let path = self.path(sha)?;
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by `store_to_disk` from `Component::serialize` of this engine configuration
        // (the file name carries the engine's compatibility hash, and wasmtime checks its own header too). The
        // cache directory is the operator's, created private (0700); whoever can write it can run code in weft.
        match unsafe { Component::deserialize_file(&self.engine, &path) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unusable compile cache entry");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn store_to_disk(&self, sha: &str, component: &Component) {
        let (Some(dir), Some(path)) = (self.dir.as_ref(), self.path(sha)) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            create_private_dir(dir)?;
            let bytes = component
                .serialize()
                .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the compile cache");
        }
    }
}

fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
