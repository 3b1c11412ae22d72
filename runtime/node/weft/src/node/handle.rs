//! A started node: where its admin server listens, whether `/quitquitquit` asked it to stop, and its drain.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::data_path::DataPath;
use super::runtimes::ShardThreads;
use crate::admin::Node;

/// A running node ([`super::start`]); [`NodeHandle::shutdown`] drains it.
pub struct NodeHandle {
    pub(super) node: Arc<Node>,
    pub(super) data_path: DataPath,
    pub(super) data: tokio::runtime::Handle,
    pub(super) stop_admin: CancellationToken,
    /// Each admin server's "listener closed".
    pub(super) admin_stopped: Vec<CancellationToken>,
    pub(super) admin_addr: Option<SocketAddr>,
    /// The config watch, the certificate refresher, the identity and plugin loops.
    pub(super) tasks: Vec<JoinHandle<()>>,
    /// Shards started for this node alone (in-process), stopped with it.
    pub(super) shards: Option<ShardThreads>,
}

impl NodeHandle {
    /// Where the admin server listens (the bound address: port 0 in the config picks one).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// What `/config_dump` shows.
    pub fn config_dump(&self) -> serde_json::Value {
        weft_admin::AdminHandler::config_dump(self.node.as_ref())
    }

    /// Resolves when `/quitquitquit` asks the node to stop.
    pub async fn quit_requested(&self) {
        self.node.quit.cancelled().await
    }

    /// Drains the node: the DNS proxy stops, connections drain (with the SIGTERM drain rules), the admin servers
    /// and the node's tasks stop, and shards of its own stop.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.data_path.drain(&self.data).await?;
        self.stop_admin.cancel();
        for s in &self.admin_stopped {
            s.cancelled().await;
        }
        for t in self.tasks {
            t.abort();
            // Aborted (or already done): once awaited, nothing of the task runs any more.
            let _ = t.await;
        }
        if let Some(s) = self.shards {
            tokio::task::spawn_blocking(move || s.stop()).await?;
        }
        Ok(())
    }
}
