//! `weft run`: logging, the runtimes, the node started on them, a signal, the drain. The node's control side
//! runs on a single-threaded control runtime (config watch, certificates, admin, metrics), its data path on a
//! multi-threaded runtime of its own, so a slow scrape or a config storm never stalls traffic.

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config::NodeConfig;
use crate::node::runtimes::Runtimes;
use crate::node::{NodeHandle, Threads, start_on};

/// Run the node until SIGTERM/SIGINT or `/quitquitquit`, then drain.
pub fn run(config: NodeConfig) -> anyhow::Result<()> {
    // `_log_flush` is dropped last (locals drop in reverse): the lines of the whole drain are written.
    let (logs, _log_flush) =
        weft_logging::init(&config.log, config.log_format, config.tuning.log_linger)?;
    let runtimes = Runtimes::build(&config)?;
    let threads = Threads {
        data: runtimes.data.handle().clone(),
        shards: runtimes.shards.as_ref().map(|s| s.shards.clone()),
        logs: Some(logs),
    };
    runtimes.control.block_on(async {
        // Signal handlers first: a SIGTERM that arrives while weft starts (a supervisor that reads "ready" and
        // stops it at once) is then a drain once started, never the default action's kill.
        let signals = Signals::install()?;
        let node = start_on(config, threads).await?;
        signals.wait(&node).await;
        node.shutdown().await
    })?;
    runtimes.shutdown();
    Ok(())
}

/// SIGTERM and SIGINT, caught from the start.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for a signal or `/quitquitquit`.
    async fn wait(mut self, node: &NodeHandle) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
            () = node.quit_requested() => tracing::info!("/quitquitquit received"),
        }
    }
}
