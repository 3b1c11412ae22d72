//! `weft run`'s threads: a single-threaded control runtime (config watch, certificates, admin, metrics), the
//! multi-threaded data-path runtime, so a slow scrape or a config storm never stalls traffic, and the shards
//! (`--shards`), each a current-thread runtime on a thread of its own.

use std::sync::Arc;
use std::time::Duration;

use crate::config::NodeConfig;

/// CPUs this process may use: cores, less what its affinity mask and cgroup CPU limit leave out.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The control and data-path runtimes and the shards of `weft run`.
pub struct Runtimes {
    /// Config, certificates, admin, metrics.
    pub control: tokio::runtime::Runtime,
    /// The data path.
    pub data: tokio::runtime::Runtime,
    /// The shards carrying connections, if any.
    pub shards: Option<ShardThreads>,
}

impl Runtimes {
    /// The runtimes `config` asks for, sized for [`available_cpus`].
    pub fn build(config: &NodeConfig) -> anyhow::Result<Self> {
        let mut control = tokio::runtime::Builder::new_current_thread();
        control.enable_all().thread_name("weft-control");
        // The control thread works in bursts (a config push, a certificate, a scrape) and waits in between: what
        // it freed goes back to the allocator when it parks, at most once a second (it parks for every timer).
        if let Some(release) = super::memory::release_thread_memory() {
            let last = std::sync::Mutex::new(None::<std::time::Instant>);
            control.on_thread_park(move || {
                let now = std::time::Instant::now();
                let Ok(mut last) = last.lock() else { return };
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                    *last = Some(now);
                    release();
                }
            });
        }
        let control = control.build()?;
        let data = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads(available_cpus()))
            .enable_all()
            .thread_name("weft-data")
            .build()?;
        let shards = ShardThreads::start(config.shard_count(available_cpus()))?;
        Ok(Self {
            control,
            data,
            shards,
        })
    }

    /// Stops the data path's runtime (what still runs there is dropped after a second), then the shards.
    pub fn shutdown(self) {
        self.data.shutdown_timeout(Duration::from_secs(1));
        if let Some(s) = self.shards {
            s.stop();
        }
    }
}

/// The shards' threads (`--shards`): each drives a current-thread runtime until it is told to stop.
pub struct ShardThreads {
    /// The shards, for the data path.
    pub shards: Arc<weft_proxy::shards::Shards>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ShardThreads {
    /// Starts `n` shards (none for 0).
    pub fn start(n: usize) -> anyhow::Result<Option<Self>> {
        if n == 0 {
            return Ok(None);
        }
        let (mut handles, mut stop, mut threads) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stop.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("weft-shard-{i}"))
                    .spawn(move || {
                        weft_proxy::shards::enter(i);
                        rt.block_on(async {
                            let _ = rx.await;
                        });
                        rt.shutdown_timeout(Duration::from_secs(1));
                    })?,
            );
        }
        let shards = weft_proxy::shards::Shards::new(handles)
            .ok_or_else(|| anyhow::anyhow!("--shards needs at least one shard"))?;
        Ok(Some(Self {
            shards: Arc::new(shards),
            stop,
            threads,
        }))
    }

    /// Stops every shard (what still runs on it is dropped) and waits for its thread.
    pub fn stop(self) {
        drop(self.stop);
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a shard thread panicked");
            }
        }
    }
}
