//! A Kubernetes API server stand-in for tests: real HTTP/1.1 on 127.0.0.1, following the API conventions for
//! `weftplugins.weft.dev/v1alpha1` (kind `WeftPlugin`, namespaced, with a `status` subresource and a
//! `metadata.generation`), `coordination.k8s.io/v1` Leases, and core `v1` Pods (with a `status` subresource),
//! Secrets and ConfigMaps under `/api/v1` ([`Resource`]). Written from the Kubernetes API reference
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>), and checked with kube-rs as the client
//! (`tests/kube_client.rs`):
//!
//! - list, cluster-wide (`/api/v1/pods`, `/apis/weft.dev/v1alpha1/weftplugins`) and per namespace, with a global
//!   `metadata.resourceVersion` and `limit` / `continue` chunking served from a consistent snapshot; a continue
//!   token older than the history is 410 Gone (Expired);
//! - watch (`watch=1`, `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds`), cluster-wide or per namespace:
//!   chunked newline-delimited events; a resourceVersion older than the history gets one ERROR event carrying a 410
//!   Expired Status, as the API server's watch cache does; BOOKMARKs only when the test calls
//!   [`ApiServer::bookmark`];
//! - equality-based label selectors on list and watch (`labelSelector=a=b,c==d,e!=f,g,!h`, percent-decoded):
//!   only matching objects are listed, only events whose object matches are sent (an object modified so that it no
//!   longer matches is not turned into a DELETED event); a list with a selector has no `remainingItemCount`;
//! - create, get, update (resourceVersion precondition: 409 Conflict), JSON merge patch, delete (answered with the
//!   object for WeftPlugins and Pods, with a Success Status for the others), and the `status` subresource of
//!   WeftPlugins and Pods (writes to the main resource leave `status` alone; a new Pod is `Pending`);
//!   `metadata.generation` (WeftPlugins only) moves on spec changes only;
//! - Secrets as the API server stores them: `stringData` folded into `data` as base64, `data` checked to be
//!   base64, `type` defaulting to `Opaque`;
//! - errors as `metav1.Status` objects ([`ApiError`]), `details.group` omitted for the core group.
//!
//! Not served: field selectors (400) and set-based label selectors (`in`, `notin`: 400), a list's
//! `resourceVersion` / `resourceVersionMatch` (a first page is always of the latest version), `sendInitialEvents`,
//! server-side apply, JSON and strategic merge patch, finalizers and graceful deletion (a Pod is gone at once),
//! Pod spec immutability and every other validation beyond names, `generateName`, `dryRun`, namespaces as objects,
//! authentication. Test support: only `conformance/` and dev-dependencies use it.

mod client;
mod resource;
mod selector;
mod server;
mod status;
mod store;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use client::{Client, ClientError, Reply, WatchStream};
pub use resource::Resource;
pub use status::ApiError;

use server::lock;
use store::Store;

/// How many changes the history keeps by default (older resourceVersions get 410 Gone).
pub const DEFAULT_HISTORY: usize = 1000;

/// Starting the stand-in failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or reading the listening socket.
    #[error("binding the API server stand-in: {0}")]
    Bind(#[from] std::io::Error),
}

/// A running stand-in. Dropping it stops the server and ends every watch.
#[derive(Debug)]
pub struct ApiServer {
    addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    task: JoinHandle<()>,
}

impl ApiServer {
    /// Starts a stand-in on 127.0.0.1 (a free port) keeping [`DEFAULT_HISTORY`] changes.
    pub async fn start() -> Result<ApiServer, Error> {
        ApiServer::with_history(DEFAULT_HISTORY).await
    }

    /// Starts a stand-in whose history keeps the last `changes` changes.
    pub async fn with_history(changes: usize) -> Result<ApiServer, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Mutex::new(Store::new(changes.max(1))));
        let task = tokio::spawn(accept(listener, store.clone()));
        Ok(ApiServer { addr, store, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL (`http://127.0.0.1:port`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A plain HTTP client for it.
    pub fn client(&self) -> Client {
        Client::new(self.addr)
    }

    /// Creates the object, or replaces the stored one of that name unconditionally, as `kubectl apply` would (the
    /// object names its `apiVersion`, `kind` and `metadata.namespace`, default `default`). Status is left as it is.
    pub fn apply(&self, object: Value) -> Result<Value, ApiError> {
        lock(&self.store).apply(object)
    }

    /// Deletes an object; returns its last state.
    pub fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        lock(&self.store).delete(resource, namespace, name)
    }

    /// An object as stored.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.store).get(resource, namespace, name).ok()
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> String {
        lock(&self.store).resource_version().to_string()
    }

    /// Sends a BOOKMARK at the current resourceVersion to every watch that allowed bookmarks.
    pub fn bookmark(&self) {
        lock(&self.store).bookmark();
    }

    /// Forgets the history: watches and continue tokens from an earlier resourceVersion get 410 Gone.
    pub fn compact(&self) {
        lock(&self.store).compact();
    }

    /// How many requests of a verb it has served (`list`, `watch`, `get`, `create`, `update`, `patch`, `delete`).
    pub fn requests(&self, verb: &str) -> usize {
        lock(&self.store).requests(verb)
    }

    /// Ends every open watch (their streams close, as when the API server restarts).
    pub fn close_watches(&self) {
        lock(&self.store).close_watches();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
        lock(&self.store).close_watches();
    }
}

async fn accept(listener: TcpListener, store: Arc<Mutex<Store>>) {
    // Connections live in the set: aborting this task (dropping the server) ends them.
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let store = store.clone();
        conns.spawn(async move {
            let service = service_fn(move |req| {
                let store = store.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(store, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
