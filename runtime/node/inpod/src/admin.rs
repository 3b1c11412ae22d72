//! `/config_dump`'s `workloadState`, in ztunnel's shape (ztunnel's `inpod/admin.rs`, decoded by
//! `istioctl ztunnel-config connections`): for each local workload, keyed by its uid, its state (`Up`, `Pending`),
//! who it is (`info`) and its live connections, inbound and outbound, each with its source, the destination the
//! client asked for (`originalDst`), where it went (`actualDst`) and its protocol (`HBONE`, `TCP`).
//!
//! In-pod mode lists the pods the CNI node agent handed over (each with its own listeners and connections); node
//! mode lists the workloads of this node, with the node proxy's connections grouped by local workload.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use weft_hooks::Direction;
use weft_proxy::LiveConnection;
use weft_state::{LocalPod, MeshState, Workload};

use crate::status::{PodState, Status};

/// One connection, as ztunnel dumps it.
fn connection(c: &LiveConnection) -> Value {
    let r = &c.record;
    let protocol = if r.hbone { "HBONE" } else { "TCP" };
    match r.direction {
        // The service the client targeted (its hostname, as ztunnel's `dest_service`), else the address.
        Direction::Inbound => json!({
            "src": r.src.to_string(),
            "originalDst": r.dst_service.as_deref()
                .map(|s| s.split_once('/').map_or(s, |(_, host)| host).to_owned())
                .unwrap_or_else(|| r.dst.to_string()),
            "actualDst": r.dst.to_string(),
            "protocol": protocol,
        }),
        Direction::Outbound => json!({
            "src": r.src.to_string(),
            "originalDst": r.dst.to_string(),
            "actualDst": c.actual_dst.unwrap_or(r.dst).to_string(),
            "protocol": protocol,
        }),
    }
}

fn entry(
    state: &str,
    name: &str,
    namespace: &str,
    service_account: &str,
    trust_domain: &str,
    conns: &[LiveConnection],
) -> Value {
    let of = |d: Direction| -> Vec<Value> {
        conns
            .iter()
            .filter(|c| c.record.direction == d)
            .map(connection)
            .collect()
    };
    json!({
        "state": state,
        "info": {
            "name": name,
            "namespace": namespace,
            "serviceAccount": service_account,
            "trustDomain": trust_domain,
        },
        "connections": {
            "inbound": of(Direction::Inbound),
            "outbound": of(Direction::Outbound),
        },
    })
}

/// In-pod mode: the pods weft serves, by pod uid.
pub fn workload_state(status: &Status, mesh: &MeshState, node: &str) -> Value {
    let mut out = serde_json::Map::new();
    for (info, state, conns) in status.pods() {
        let state = match state {
            PodState::Serving => "Up",
            PodState::Pending => "Pending",
            PodState::Draining => "Draining",
        };
        let pod = LocalPod {
            uid: info.uid.clone(),
            name: info.name.clone(),
            namespace: info.namespace.clone(),
            service_account: info.service_account.clone(),
        };
        let td = mesh
            .local_pod(node, &pod, None)
            .map(|w| w.trust_domain.clone())
            .unwrap_or_default();
        out.insert(
            info.uid.clone(),
            entry(
                state,
                &info.name,
                &info.namespace,
                &info.service_account,
                &td,
                &conns,
            ),
        );
    }
    Value::Object(out)
}

/// Node mode: every workload on `node`, by workload uid, with the node proxy's live connections `live` that
/// belong to it (outbound from it, inbound to it); `up`: the node's listeners are open.
pub fn node_workload_state(
    mesh: &MeshState,
    node: &str,
    live: &[LiveConnection],
    up: bool,
) -> Value {
    let mut by_uid: BTreeMap<&str, Vec<LiveConnection>> = BTreeMap::new();
    for c in live {
        let local = match c.record.direction {
            Direction::Outbound => c.record.src_workload.as_ref(),
            Direction::Inbound => c.record.dst_workload.as_ref(),
        };
        if let Some(w) = local {
            by_uid.entry(w.uid.as_str()).or_default().push(c.clone());
        }
    }
    let state = if up { "Up" } else { "Pending" };
    let out: serde_json::Map<String, Value> = mesh
        .local_workloads(node)
        .map(|w: &std::sync::Arc<Workload>| {
            let conns = by_uid
                .get(w.uid.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            (
                w.uid.clone(),
                entry(
                    state,
                    &w.name,
                    &w.namespace,
                    &w.service_account,
                    &w.trust_domain,
                    conns,
                ),
            )
        })
        .collect();
    Value::Object(out)
}
