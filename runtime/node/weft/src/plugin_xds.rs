//! The node's plugin source: a second Delta ADS stream (usually `weft-control`; istiod serves no plugins) for
//! extension configs (ECDS `TypedExtensionConfig`, one per plugin), handled by `weft-plugin-xds`: code fetched
//! and verified off the data path, specs put into the state as a source of their own, ACKed only once the plugin
//! host serves them, every automatic rollback reported back as an unsolicited NACK, and the shadow figures that
//! changed reported every `--plugin-shadow-report-interval`.

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use weft_plugin_host::PluginHost;
use weft_plugin_xds::{EcdsHandler, PluginSink};
use weft_proto::type_url::EXTENSION_CONFIG;
use weft_state::{Change, Collection, PluginSpec, Resource, StateStore};
use weft_xds::{AdsClient, Delta, Handler, Rejection, SourceConfig, XdsHandle};

use crate::config::PluginXdsConfig;

/// The plugin source's id in the state store.
pub const PLUGIN_SOURCE: &str = "xds:plugins";

/// What the fetcher needs from the other `weft run` flags.
#[derive(Debug, Clone)]
pub struct FetchPaths {
    /// `--plugin-fetch-cache`.
    pub cache_dir: Option<PathBuf>,
    /// `--plugin-pull-secret`.
    pub pull_secret: Option<PathBuf>,
}

/// Start the plugin source, if configured (must be called within the control runtime).
pub fn start(
    args: &PluginXdsConfig,
    fetch: FetchPaths,
    node: weft_xds::NodeInfo,
    cluster_id: String,
    state: &Arc<StateStore>,
    host: &Arc<PluginHost>,
) -> anyhow::Result<Option<XdsHandle>> {
    let Some(address) = &args.plugin_xds_address else {
        return Ok(None);
    };
    state.register_source(PLUGIN_SOURCE, weft_state::XDS_PRECEDENCE);
    let fetcher = weft_fetch::Fetcher::new(weft_fetch::FetchConfig {
        cache_dir: fetch.cache_dir,
        pull_secret: fetch.pull_secret,
        roots: match &args.plugin_fetch_roots {
            Some(p) => weft_fetch::Roots::File(p.clone()),
            None => weft_fetch::Roots::System,
        },
        ..Default::default()
    })?;
    let handler = Arc::new(EcdsHandler::new(
        fetcher,
        host.clone(),
        Arc::new(StateSink {
            store: state.clone(),
        }),
    ));
    let mut cfg = SourceConfig::new("plugins", address.clone());
    cfg.root_cert = args.plugin_xds_root_cert.clone();
    cfg.token_file = args.plugin_xds_token_file.clone();
    cfg.server_name = args.plugin_xds_server_name.clone();
    cfg.cluster_id = cluster_id;
    cfg.node = node;
    tracing::info!(address, node_id = %cfg.node.id(), "plugin source: Delta ADS (extension configs)");
    let handle = AdsClient::new(cfg)
        .subscribe(EXTENSION_CONFIG, Arc::new(Ecds(handler.clone())))
        .start()?;
    let nacker = handle.clone();
    weft_plugin_xds::spawn_rollback_reporter(
        host,
        handler,
        Arc::new(move |name: &str, reason: &str, details| {
            if let Err(e) = nacker.nack(EXTENSION_CONFIG, &Rejection::new(name, reason), details) {
                tracing::warn!(plugin = name, error = %e, "cannot report the rollback to the control plane");
            }
        }),
    );
    weft_plugin_xds::spawn_shadow_reporter(
        host,
        report_sender(&handle, "shadow report", "shadow figures"),
        args.plugin_shadow_report_interval,
    );
    weft_plugin_xds::spawn_counts_reporter(
        host,
        report_sender(&handle, "plugin counts", "plugin call counts"),
        args.plugin_shadow_report_interval,
    );
    Ok(Some(handle))
}

/// Sends report details on the plugin stream (`what` names the request in the xDS log; `figures` the warning when
/// it cannot go).
fn report_sender(
    handle: &XdsHandle,
    what: &'static str,
    figures: &'static str,
) -> Arc<weft_plugin_xds::SendReport> {
    let handle = handle.clone();
    Arc::new(move |details: &[prost_types::Any]| {
        match handle.report(EXTENSION_CONFIG, what, details.to_vec()) {
            Ok(sent) => sent,
            Err(e) => {
                tracing::warn!(error = %e, "cannot report the {figures} to the control plane");
                false
            }
        }
    })
}

/// The state as the plugin handler's sink: this source's plugin specs, changed resource by resource.
struct StateSink {
    store: Arc<StateStore>,
}

impl PluginSink for StateSink {
    fn put(
        &self,
        upserts: Vec<PluginSpec>,
        removals: Vec<String>,
    ) -> BoxFuture<'_, Result<u64, String>> {
        let mut changes: Vec<Change> = removals
            .into_iter()
            .map(|name| Change::Remove {
                collection: Collection::Plugin,
                name,
            })
            .collect();
        changes.extend(upserts.into_iter().map(|spec| Change::Upsert {
            name: spec.name.clone(),
            resource: Resource::Plugin(Arc::new(spec)),
        }));
        let applied = self.store.apply_changes(PLUGIN_SOURCE, changes);
        Box::pin(async move { Ok(applied.version) })
    }
}

/// weft-xds's handler trait over the ECDS handler.
struct Ecds(Arc<EcdsHandler>);

impl Handler for Ecds {
    fn apply(&self, delta: Delta) -> BoxFuture<'_, Vec<Rejection>> {
        Box::pin(async move {
            let upserts = delta
                .upserts
                .into_iter()
                .map(|u| weft_plugin_xds::Resource {
                    name: u.name,
                    any: u.resource,
                })
                .collect();
            self.0
                .apply(upserts, delta.removals)
                .await
                .into_iter()
                .map(|r| Rejection::new(r.name, r.reason))
                .collect()
        })
    }
}
