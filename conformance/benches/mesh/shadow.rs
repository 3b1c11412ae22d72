//! The `weft-shadow` pair: `weft-pol` with a shadow version of istio-authz decided beside the serving one.
//!
//! A node reads a shadow only from a plugin resource served over its plugin source (Delta ADS, extension configs;
//! neither the mesh file nor the built-ins carry one), so node B gets a plugin source of its own: the scripted
//! Delta ADS server of `weft_xds::testing`, on node B's loopback (a thread of this bench in node B's namespace),
//! serving one resource named `istio-authz`, which replaces the built-in of that name: the same component (built
//! from `plugins/istio-authz`, as weft embeds it) with the built-in's settings (policy, fail-closed, inbound, `{}`)
//! and, as its shadow, that component again with the same configuration. Node A is `weft-pol`'s node A (istio-authz
//! decides on the destination side only). The shadow never changes a verdict; it costs node B a queued decision
//! per connection (skipped and counted when the queue is full) and a second instance.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use weft_conformance::netmesh::{Layout, NetMesh, Topology, start_nodes};
use weft_devmesh::NodeProcess;
use weft_devmesh::control::plugin_xds_flags;
use weft_plugin_host::testing::{build_plugin, pinned_code};
use weft_proto::type_url::EXTENSION_CONFIG;
use weft_state::xds::encode::plugin::extension_config;
use weft_state::xds::plugin::{Code, PluginResource, ShadowResource};
use weft_state::{FailurePolicy, PluginDirections, PluginKind, PluginSource, WorkloadSelector};
use weft_xds::server::{DeltaStream, Offered, Versioned};
use weft_xds::testing::{Pki, Server};

/// The plugin whose shadow the pair runs (the built-in it replaces).
pub(crate) const PLUGIN: &str = "istio-authz";

/// istio-authz's component as the plugin build leaves it (the one weft embeds), read under the build lock.
fn istio_authz() -> Arc<Vec<u8>> {
    let wasm = build_plugin("plugins/istio-authz")
        .unwrap_or_else(|e| panic!("building plugins/istio-authz: {e}"));
    match pinned_code(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display())) {
        PluginSource::Inline(bytes) => bytes,
        PluginSource::Path(_) => unreachable!("pinned_code reads the code inline"),
    }
}

/// The resource node B is served: the built-in istio-authz's spec, with a shadow of the same code and config.
fn resource(code: &Arc<Vec<u8>>) -> PluginResource {
    PluginResource {
        name: PLUGIN.into(),
        root_id: String::new(),
        code: Code::Inline(code.clone()),
        sha256: None,
        config: "{}".into(),
        failure_policy: FailurePolicy::FailClosed,
        kind: Some(PluginKind::Policy),
        priority: 0,
        selector: WorkloadSelector::default(),
        directions: PluginDirections {
            inbound: true,
            outbound: false,
        },
        recheck: true,
        rollout: None,
        shadow: Some(ShadowResource {
            code: Code::Inline(code.clone()),
            sha256: None,
            config: "{}".into(),
        }),
    }
}

/// Serves `offered` to every stream `server` accepts, for as long as the process runs: each request's subscription
/// change is answered, ACKs and the node's shadow reports need nothing, a NACK is printed.
async fn serve(mut server: Server, offered: BTreeMap<String, Offered<Versioned>>) {
    while let Some(mut conn) = server.conns.recv().await {
        let offered = offered.clone();
        tokio::spawn(async move {
            let mut stream = DeltaStream::new();
            while let Some(Ok(req)) = conn.requests.recv().await {
                // Code 0: a report on the node's own initiative (its shadow figures), not a NACK.
                if let Some(e) = &req.error_detail
                    && e.code != 0
                {
                    println!("weft-shadow: node B refused {PLUGIN}: {}", e.message);
                }
                let received = stream.receive(&req);
                if req.type_url != EXTENSION_CONFIG {
                    continue;
                }
                if let Some(push) =
                    stream.respond(EXTENSION_CONFIG, &offered, received.change.as_ref(), "1")
                {
                    // The node may have closed the stream meanwhile: it opens another.
                    let _ = conn.responses.send(Ok(push.response));
                }
            }
        });
    }
}

/// Starts the plugin source in node B's namespace (`ns_b`); returns node B's flags for it.
fn plugin_source(ns_b: &str, code: &Arc<Vec<u8>>) -> Result<Vec<String>, String> {
    let any = weft_proto::to_any(EXTENSION_CONFIG, &extension_config(&resource(code)));
    let offered: BTreeMap<String, Offered<Versioned>> =
        [(PLUGIN.to_owned(), Offered::Serve(Versioned::new("1", any)))].into();
    let pki = Pki::new();
    let tls = pki.server_tls(&["localhost"]);
    let (root, token) = (pki.root.clone(), pki.token.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    // Detached: the thread serves until the bench exits (it keeps the PKI's files too).
    drop(
        weft_devmesh::netns::Netns::existing(ns_b).run(move || async move {
            let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(format!("plugin source listener: {e}")));
                    return;
                }
            };
            let server = Server::start_on(tls, listener);
            let _ = tx.send(Ok(server.addr));
            let _pki = pki;
            serve(server, offered).await;
        }),
    );
    let addr: SocketAddr = rx
        .recv()
        .map_err(|_| "the plugin source thread ended".to_owned())??;
    Ok(plugin_xds_flags(addr, &root, &token))
}

/// Starts the pair on `layout` (its flags as `weft-pol`'s) with `mesh_yaml`; returns once node B serves
/// istio-authz from its plugin source with the shadow loaded.
pub(crate) async fn start(
    tag: &str,
    layout: &Layout,
    mesh_yaml: &str,
    log: &str,
) -> Result<NetMesh, String> {
    let code = istio_authz();
    let Topology {
        ns_a,
        ns_b,
        client_ip,
        server_ip,
    } = Topology::create(tag, layout)?;
    let mut flags_b = layout.flags_b.clone();
    flags_b.extend(plugin_source(&ns_b.name, &code)?);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (a, b) = start_nodes(
        (&ns_a, &ns_b),
        dir.path(),
        mesh_yaml,
        (&layout.flags_a, &flags_b),
        log,
        layout.weft_bin.as_deref(),
        layout.sync_logs,
    )
    .await?;
    let sha = weft_fetch::sha256_hex(&code);
    wait_shadow_loaded(&b, &sha).await?;
    Ok(NetMesh {
        ns_a,
        ns_b,
        client_ip,
        server_ip,
        a,
        b,
        dir,
    })
}

/// istio-authz's entry in a node's `/config_dump` plugins.
fn entry(dump: &Value) -> Option<&Value> {
    dump["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == PLUGIN)
}

/// Waits until `node` serves istio-authz at `sha` with its shadow loaded (the shadow's own sha256 is `sha` too).
async fn wait_shadow_loaded(node: &NodeProcess, sha: &str) -> Result<(), String> {
    let start = std::time::Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < std::time::Duration::from_secs(60) {
        if let Ok(d) = node.config_dump().await
            && let Some(p) = entry(&d)
        {
            if p["sha256"] == sha && p["state"] == "serving" && p["shadow"]["sha256"] == sha {
                return Ok(());
            }
            if let Some(e) = p["shadow"]["loadError"].as_str() {
                return Err(format!("the shadow of {PLUGIN} did not load: {e}"));
            }
            last = p.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(format!(
        "node B does not serve {PLUGIN} {sha} with its shadow after 60 s: {last}\n{}",
        node.log_tail(30)
    ))
}

/// What a node's shadow of istio-authz did so far (its `/config_dump`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Figures {
    /// Connections the shadow decided.
    pub(crate) decided: u64,
    /// Of those, decided otherwise than the serving version (or failed).
    pub(crate) divergences: u64,
    /// Decisions skipped for a full queue.
    pub(crate) skipped: u64,
}

/// Node B's shadow figures (panics when it has no shadow of istio-authz: the pair would measure nothing).
pub(crate) async fn figures(node: &NodeProcess) -> Figures {
    let d = node
        .config_dump()
        .await
        .unwrap_or_else(|e| panic!("weft-shadow: node B's /config_dump: {e}"));
    let s = entry(&d)
        .map(|p| &p["shadow"])
        .filter(|s| s.is_object())
        .unwrap_or_else(|| panic!("weft-shadow: node B has no shadow of {PLUGIN}: {d}"));
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Figures {
        decided: s["decisions"]
            .as_array()
            .map_or(0, |c| c.iter().map(|c| n(&c["count"])).sum()),
        divergences: n(&s["divergences"]),
        skipped: n(&s["skipped"]),
    }
}

/// The sha256 (hex) istio-authz runs with on `node`, as its `/config_dump` says.
pub(crate) async fn serving_sha(node: &NodeProcess) -> Option<String> {
    let d = node.config_dump().await.ok()?;
    entry(&d)?["sha256"].as_str().map(str::to_owned)
}
