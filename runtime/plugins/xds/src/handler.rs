//! The node's handler for extension configs: decode each resource, fetch and verify its code (concurrently, off
//! the data path), learn its kind from the component when the resource does not say, hand the specs to the state,
//! then wait for the plugin host's outcome for the state version that carries them. A resource that fails any step
//! is refused with its reason (and its previous version, if any, is put back into the state, so the state says
//! what serves); the rest of the batch applies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use weft_fetch::Fetcher;
use weft_plugin_host::{Outcome, PluginHost};
use weft_state::PluginSpec;

use crate::convert::{decode_resource, fetch_request, shadow_fetch_request};
use weft_state::xds::plugin::{Code, PluginResource};

/// Where accepted plugin specs go: the node's state (as a source of its own). `put` applies the removals and the
/// upserts and returns the state version that carries them.
pub trait PluginSink: Send + Sync + 'static {
    /// Replace this source's plugins named in `upserts`, drop those in `removals`.
    fn put(
        &self,
        upserts: Vec<PluginSpec>,
        removals: Vec<String>,
    ) -> BoxFuture<'_, Result<u64, String>>;
}

/// One resource of an xDS response.
#[derive(Debug, Clone)]
pub struct Resource {
    /// The resource (plugin) name.
    pub name: String,
    /// The `TypedExtensionConfig`.
    pub any: prost_types::Any,
}

/// A refused resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The resource name.
    pub name: String,
    /// Why (the step and its reason).
    pub reason: String,
}

/// What the handler accepted per name: the spec serving now and the one before it (put back after a rollback).
#[derive(Default)]
struct Accepted {
    current: Option<PluginSpec>,
    previous: Option<PluginSpec>,
}

/// The extension-config handler (see the module docs).
pub struct EcdsHandler {
    fetcher: Fetcher,
    host: Arc<PluginHost>,
    sink: Arc<dyn PluginSink>,
    accepted: Mutex<BTreeMap<String, Accepted>>,
}

impl std::fmt::Debug for EcdsHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EcdsHandler").finish_non_exhaustive()
    }
}

fn refused(name: &str, reason: impl std::fmt::Display) -> Refused {
    Refused {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

impl EcdsHandler {
    /// A handler fetching with `fetcher`, loading into `host`, recording into `sink`.
    pub fn new(fetcher: Fetcher, host: Arc<PluginHost>, sink: Arc<dyn PluginSink>) -> Self {
        Self {
            fetcher,
            host,
            sink,
            accepted: Mutex::new(BTreeMap::new()),
        }
    }

    fn accepted(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Accepted>> {
        self.accepted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The spec for one resource: decoded, code fetched and verified, kind known.
    async fn prepare(&self, r: &Resource) -> Result<PluginSpec, Refused> {
        let res: PluginResource =
            decode_resource(&r.name, &r.any).map_err(|e| refused(&r.name, e))?;
        let (bytes, sha) = match &res.code {
            Code::Inline(b) => {
                let sha = weft_fetch::sha256_hex(b);
                (b.clone(), sha)
            }
            Code::Remote(_) => {
                let req =
                    fetch_request(&res).ok_or_else(|| refused(&r.name, "no fetch request"))?;
                let f = self
                    .fetcher
                    .fetch(&req)
                    .await
                    .map_err(|e| refused(&r.name, format!("fetching code: {e}")))?;
                (f.bytes, f.sha256)
            }
        };
        // The shadow's code, fetched and verified exactly as the serving code (inline: as is, its sha256 checked
        // against a pin if the resource has one).
        let shadow = match &res.shadow {
            None => None,
            Some(s) => match &s.code {
                Code::Inline(b) => {
                    let sha = weft_fetch::sha256_hex(b);
                    if let Some(want) = &s.sha256
                        && *want != sha
                    {
                        return Err(refused(
                            &r.name,
                            format!("shadow code: sha256 {sha} is not the pinned {want}"),
                        ));
                    }
                    Some((b.clone(), sha))
                }
                Code::Remote(_) => {
                    let req = shadow_fetch_request(&res)
                        .ok_or_else(|| refused(&r.name, "no fetch request for the shadow"))?;
                    let f = self
                        .fetcher
                        .fetch(&req)
                        .await
                        .map_err(|e| refused(&r.name, format!("fetching shadow code: {e}")))?;
                    Some((f.bytes, f.sha256))
                }
            },
        };
        // Compiled, world and imports checked before the state sees it: a broken resource is NACKed and never
        // takes effect.
        let kind = {
            let host = self.host.clone();
            let code = bytes.clone();
            let declared = res.kind;
            tokio::task::spawn_blocking(move || host.check_component(&code, declared))
                .await
                .map_err(|e| refused(&r.name, format!("inspecting the component: {e}")))?
                .map_err(|e| refused(&r.name, format!("code: {e}")))?
        };
        let shadow_code = shadow.as_ref().map(|(b, _)| b.clone());
        let spec = res
            .into_spec(bytes, sha, kind, shadow)
            .map_err(|e| refused(&r.name, e))?;
        // The shadow is compiled and checked the same way, as the serving version's kind.
        if let Some(code) = shadow_code {
            let host = self.host.clone();
            tokio::task::spawn_blocking(move || host.check_component(&code, Some(kind)))
                .await
                .map_err(|e| refused(&r.name, format!("inspecting the shadow component: {e}")))?
                .map_err(|e| refused(&r.name, format!("shadow code: {e}")))?;
        }
        Ok(spec)
    }

    /// Applies one response (upserts and removals); returns the refused resources (empty: ACK). Returns only once
    /// the plugin host has loaded (or refused) every accepted spec.
    pub async fn apply(&self, upserts: Vec<Resource>, removals: Vec<String>) -> Vec<Refused> {
        let prepared =
            futures_util::future::join_all(upserts.iter().map(|r| self.prepare(r))).await;
        let mut refusals = Vec::new();
        let mut specs = Vec::new();
        for p in prepared {
            match p {
                Ok(spec) => specs.push(spec),
                Err(r) => refusals.push(r),
            }
        }
        if specs.is_empty() && removals.is_empty() {
            return log(refusals);
        }
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let version = match self.sink.put(specs.clone(), removals.clone()).await {
            Ok(v) => v,
            Err(e) => {
                refusals.extend(
                    names
                        .iter()
                        .map(|n| refused(n, format!("state refused it: {e}"))),
                );
                return log(refusals);
            }
        };
        let outcome = self.host.wait_applied(version).await;
        let mut restore = Vec::new();
        let mut drop_names = Vec::new();
        {
            let mut accepted = self.accepted();
            for name in &removals {
                accepted.remove(name);
            }
            for spec in specs {
                match outcome.report.get(&spec.name) {
                    Some(Outcome::Rejected { reason, .. }) => {
                        refusals.push(refused(&spec.name, reason));
                        match accepted.get(&spec.name).and_then(|a| a.current.clone()) {
                            Some(prev) => restore.push(prev),
                            None => drop_names.push(spec.name.clone()),
                        }
                    }
                    _ => {
                        let a = accepted.entry(spec.name.clone()).or_default();
                        if a.current.as_ref() != Some(&spec) {
                            a.previous = a.current.replace(spec);
                        }
                    }
                }
            }
        }
        // The state says what serves: a refused version gives way to the one before it (or to nothing).
        // And the host runs that before the answer goes out, so a refused new plugin (fail-closed with nothing
        // serving) is gone from the chain when the NACK is sent.
        if !restore.is_empty() || !drop_names.is_empty() {
            match self.sink.put(restore, drop_names).await {
                Ok(v) => {
                    self.host.wait_applied(v).await;
                }
                Err(e) => tracing::warn!(error = %e,
                    "cannot put the previous plugin versions back into the state"),
            }
        }
        log(refusals)
    }

    /// After the host rolled `plugin` back: the state gets the restored version's spec again (so later applies
    /// see it unchanged).
    pub async fn rolled_back(&self, plugin: &str) {
        let restore = {
            let mut accepted = self.accepted();
            match accepted.get_mut(plugin) {
                Some(a) => {
                    let prev = a.previous.take();
                    if prev.is_some() {
                        a.current = prev.clone();
                    }
                    prev
                }
                None => None,
            }
        };
        if let Some(spec) = restore
            && let Err(e) = self.sink.put(vec![spec], vec![]).await
        {
            tracing::warn!(plugin, error = %e, "cannot put the restored plugin version back into the state");
        }
    }
}

fn log(refusals: Vec<Refused>) -> Vec<Refused> {
    for r in &refusals {
        tracing::warn!(plugin = %r.name, reason = %r.reason, "plugin resource refused (NACK)");
    }
    refusals
}
