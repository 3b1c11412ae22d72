//! The istio-authz case table (`plugins/istio-authz/tests/cases.yaml`, which `runtime/plugins/host/tests/istio_authz.rs`
//! runs against the compiled plugin in the host harness) end to end through two real weft nodes in two network
//! namespaces (see `weft_conformance::netmesh`), with the default istio-authz plugin weft embeds. For each case the
//! mesh file gets the case's policies, a server workload on node B with the case's `workload` fields, and a client
//! workload on node A with the case's identity; once both nodes serve that version (and node B's plugin holds the
//! policies), a client in node A's namespace connects to the case's destination: captured and tunnelled over HBONE
//! when the case has an identity, plaintext past node A's capture when it has none. Allow: the echo comes back.
//! Deny: the connection is closed without data (over HBONE node A got a 401), and node B's access log names the
//! case's reason.
//!
//! IPv4 and IPv6 cases run on two meshes: weft's capture listener is one address (`--outbound`), 0.0.0.0:15001
//! takes no IPv6, and a dual-stack [::]:15001 loses the IPv4 connections (they arrive IPv4-mapped and weft finds
//! no original destination for them). Needs root.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use weft_conformance::netmesh::{Layout, NetMesh, connect};
use weft_devmesh::{NodeProcess, workload};

/// The client workload's addresses (node A's end of the link).
const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7);
/// The server workload's addresses (node B's end).
const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
/// The only port node B's capture sends to its plaintext listener (netmesh's rule).
const PLAINTEXT_PORT: u16 = 8080;
/// Trust domain of the dev CA and of workloads that name none.
const TRUST_DOMAIN: &str = "cluster.local";

fn cases_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/istio-authz/tests/cases.yaml")
}

// ---- the case table (same format and merge rules as the host-harness test) ------------------------------------

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WorkloadSpec {
    name: String,
    namespace: String,
    service_account: String,
    #[serde(default)]
    authorization_policies: Vec<String>,
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Expect {
    Allow,
    Deny,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    #[allow(dead_code, reason = "documentation in the table")]
    description: Option<String>,
    policies: Value,
    workload: Option<WorkloadSpec>,
    identity: Option<String>,
    src: IpAddr,
    dst: SocketAddr,
    expect: Expect,
    #[serde(default)]
    reason: Option<String>,
}

/// Each case is `defaults` overlaid with its own keys (`workload` merged key by key).
fn load_cases() -> Vec<Case> {
    let text = std::fs::read_to_string(cases_path()).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let defaults = doc
        .get("defaults")
        .and_then(Value::as_mapping)
        .cloned()
        .unwrap_or_default();
    let mut out: Vec<Case> = Vec::new();
    for raw in doc.get("cases").and_then(Value::as_sequence).unwrap() {
        let mut merged = defaults.clone();
        for (k, v) in raw.as_mapping().unwrap() {
            let value = match (k.as_str(), merged.get(k), v) {
                (Some("workload"), Some(Value::Mapping(base)), Value::Mapping(over)) => {
                    let mut base = base.clone();
                    for (wk, wv) in over {
                        base.insert(wk.clone(), wv.clone());
                    }
                    Value::Mapping(base)
                }
                _ => v.clone(),
            };
            merged.insert(k.clone(), value);
        }
        let case: Case = serde_yaml::from_value(Value::Mapping(merged))
            .unwrap_or_else(|e| panic!("bad case {raw:?}: {e}"));
        assert!(
            out.iter().all(|c| c.name != case.name),
            "duplicate case {}",
            case.name
        );
        out.push(case);
    }
    out
}

// ---- how a case runs end to end --------------------------------------------------------------------------------

/// How the client reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// An unmodified client; node A's capture sends it over HBONE.
    Capture,
    /// A non-mesh client: its socket is marked so node A's capture skips it; node B's capture takes it to 15006.
    Plaintext,
}

impl Route {
    fn as_str(self) -> &'static str {
        match self {
            Route::Capture => "hbone",
            Route::Plaintext => "plaintext",
        }
    }
}

/// A SPIFFE id's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spiffe {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

fn parse_spiffe(id: &str) -> Option<Spiffe> {
    let rest = id.strip_prefix("spiffe://")?;
    match rest.split('/').collect::<Vec<_>>()[..] {
        [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
            Some(Spiffe {
                trust_domain: td.to_owned(),
                namespace: ns.to_owned(),
                service_account: sa.to_owned(),
            })
        }
        _ => None,
    }
}

/// The route of a case, or why it cannot run end to end.
fn plan(case: &Case) -> Result<Route, &'static str> {
    if case.workload.is_none() {
        return Err(
            "destination workload unknown: weft refuses inbound connections to anything but a workload of its own \
             node before policy runs (HBONE CONNECT: 400, plaintext: closed), so the plugin never sees one; host \
             harness only",
        );
    }
    let src_ok = case.src == IpAddr::V4(CLIENT_V4) || case.src == IpAddr::V6(CLIENT_V6);
    let dst_ok = case.dst.ip() == IpAddr::V4(SERVER_V4) || case.dst.ip() == IpAddr::V6(SERVER_V6);
    if !src_ok || !dst_ok || case.src.is_ipv4() != case.dst.is_ipv4() {
        return Err("source or destination outside the mesh's addresses");
    }
    match &case.identity {
        Some(id) if parse_spiffe(id).is_none() => Err("identity is not a Kubernetes SPIFFE id"),
        Some(_) => Ok(Route::Capture),
        None if case.dst.port() != PLAINTEXT_PORT => {
            Err("plaintext to a port node B's capture does not redirect")
        }
        None => Ok(Route::Plaintext),
    }
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Mapping(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect::<Mapping>(),
    )
}

fn ips(v4: Ipv4Addr, v6: Ipv6Addr) -> Value {
    Value::Sequence(vec![
        Value::from(v4.to_string()),
        Value::from(v6.to_string()),
    ])
}

/// The mesh file for a case. The client workload carries the case's identity (plaintext cases: any identity, the
/// client is not in the mesh then). mTLS needs both ends in one trust domain (weft's inbound verifier, like
/// ztunnel's, refuses a client of another one), so a client identity in another trust domain moves the server
/// there too: istio-authz never reads the destination's trust domain.
fn mesh_file(case: &Case, label: &str) -> String {
    let client = case
        .identity
        .as_deref()
        .and_then(parse_spiffe)
        .unwrap_or(Spiffe {
            trust_domain: TRUST_DOMAIN.into(),
            namespace: "plaintext".into(),
            service_account: "client".into(),
        });
    let w = case.workload.clone().unwrap_or(WorkloadSpec {
        name: "server".into(),
        namespace: "default".into(),
        service_account: "default".into(),
        authorization_policies: Vec::new(),
    });
    let workloads = vec![
        map(vec![
            (
                "uid",
                format!("Kubernetes//Pod/{}/authz-client", client.namespace).into(),
            ),
            ("name", "authz-client".into()),
            ("namespace", client.namespace.clone().into()),
            ("serviceAccount", client.service_account.clone().into()),
            ("trustDomain", client.trust_domain.clone().into()),
            ("workloadIps", ips(CLIENT_V4, CLIENT_V6)),
            ("protocol", "HBONE".into()),
            ("node", "node-a".into()),
        ]),
        map(vec![
            (
                "uid",
                format!("Kubernetes//Pod/{}/{}", w.namespace, w.name).into(),
            ),
            ("name", w.name.clone().into()),
            ("namespace", w.namespace.clone().into()),
            ("serviceAccount", w.service_account.clone().into()),
            ("trustDomain", client.trust_domain.clone().into()),
            ("workloadIps", ips(SERVER_V4, SERVER_V6)),
            ("protocol", "HBONE".into()),
            ("node", "node-b".into()),
            (
                "authorizationPolicies",
                Value::Sequence(
                    w.authorization_policies
                        .iter()
                        .map(|p| p.clone().into())
                        .collect(),
                ),
            ),
        ]),
    ];
    let doc = map(vec![
        ("workloads", Value::Sequence(workloads)),
        ("policies", case.policies.clone()),
    ]);
    format!(
        "# istio-authz case table, {label}\n{}",
        serde_yaml::to_string(&doc).unwrap()
    )
}

// ---- waiting on the nodes --------------------------------------------------------------------------------------

/// Poll `f` until it returns `Some`, or `Err(what)` after `timeout` (at least the suite's floor).
async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let timeout = timeout.max(weft_conformance::EVENT_TIMEOUT_FLOOR);
    weft_testkit::eventually_within(timeout, what, f)
        .await
        .map_err(|e| e.to_string())
}

async fn version(node: &NodeProcess) -> u64 {
    node.config_dump().await.unwrap()["version"]
        .as_u64()
        .unwrap()
}

/// Wait until `node` serves a version after `before`; returns (version, its config dump).
async fn wait_version(node: &NodeProcess, before: u64) -> (u64, serde_json::Value) {
    let got = wait_for(
        Duration::from_secs(10),
        "the new config version",
        || async {
            let d = node.config_dump().await.ok()?;
            let v = d["version"].as_u64()?;
            (v > before).then_some((v, d))
        },
    )
    .await;
    match got {
        Ok(v) => v,
        Err(e) => {
            let d = node.config_dump().await.unwrap_or_default();
            panic!(
                "{}: {e}; config: {}\n{}",
                node.name,
                d["config"],
                node.log_tail(20)
            )
        }
    }
}

/// Wait until node B's istio-authz holds the policies of `version` (weft logs each hand-over with the state
/// version; an unchanged policy set is not handed over again).
async fn wait_plugin_applied(node: &NodeProcess, version: u64) {
    let got = wait_for(
        Duration::from_secs(20),
        "istio-authz to take the new policies",
        || async {
            node.log_lines().into_iter().find_map(|l| {
                if l["plugin"] != "istio-authz" {
                    return None;
                }
                match l["message"].as_str()? {
                    "plugin state updated" | "plugin loaded"
                        if l["version"].as_u64()? >= version =>
                    {
                        Some(Ok(()))
                    }
                    "plugin rejected" => Some(Err(l.to_string())),
                    _ => None,
                }
            })
        },
    )
    .await;
    match got {
        Ok(Ok(())) => {}
        Ok(Err(line)) => panic!("istio-authz rejected the policies: {line}"),
        Err(e) => panic!("{}: {e}\n{}", node.name, node.log_tail(20)),
    }
}

/// Inbound access-log lines of `node` after the first `skip` access-log lines.
fn access_after(node: &NodeProcess, skip: usize) -> Vec<serde_json::Value> {
    node.access_logs().into_iter().skip(skip).collect()
}

// ---- one connection --------------------------------------------------------------------------------------------

/// What the client saw.
#[derive(Debug)]
enum Seen {
    /// The payload came back.
    Echoed,
    /// Closed without data (EOF, reset, or SOCKS5 "not allowed").
    Closed(String),
    /// Anything else (partial data, no answer, a connect error).
    Other(String),
}

impl Seen {
    fn summary(&self) -> String {
        match self {
            Seen::Echoed => "echoed".into(),
            Seen::Closed(how) => format!("closed: {how}"),
            Seen::Other(what) => format!("unexpected: {what}"),
        }
    }
}

const PAYLOAD: &[u8] = b"istio-authz end to end\n";

async fn attempt(mesh: &NetMesh, route: Route, dst: SocketAddr) -> Seen {
    let h = mesh.ns_a.run(move || async move {
        let work = async {
            let stream = match connect(dst, route == Route::Plaintext).await {
                Ok(s) => s,
                Err(e) => return Seen::Other(format!("connect: {e}")),
            };
            match workload::round_trip(stream, PAYLOAD).await {
                Ok(back) if back == PAYLOAD => Seen::Echoed,
                Ok(back) if back.is_empty() => Seen::Closed("EOF without data".into()),
                Ok(back) => Seen::Other(format!("{} bytes back: {back:?}", back.len())),
                Err(e) => Seen::Closed(format!("{e}")),
            }
        };
        tokio::time::timeout(Duration::from_secs(30), work)
            .await
            .unwrap_or_else(|_| Seen::Other("no answer within 30s".into()))
    });
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

/// Run one case on a mesh that serves its config; returns what the client saw and what disagrees with the case.
async fn check_case(mesh: &NetMesh, case: &Case, route: Route) -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let (a_before, b_before) = (mesh.a.access_logs().len(), mesh.b.access_logs().len());
    let seen = attempt(mesh, route, case.dst).await;
    match (case.expect, &seen) {
        (Expect::Allow, Seen::Echoed) | (Expect::Deny, Seen::Closed(_)) => {}
        _ => problems.push(format!(
            "expected {:?}, the client saw {seen:?}",
            case.expect
        )),
    }
    let seen = seen.summary();
    // Node B logs every inbound connection: denied at once, allowed when it ends.
    let lines = wait_for(Duration::from_secs(30), "node B's access log", || async {
        let l = access_after(&mesh.b, b_before);
        (!l.is_empty()).then_some(l)
    })
    .await;
    let lines = match lines {
        Ok(l) => l,
        Err(e) => {
            problems.push(e);
            return (seen, problems);
        }
    };
    if lines.len() != 1 {
        problems.push(format!(
            "{} access-log lines on node B, expected 1: {lines:?}",
            lines.len()
        ));
    }
    let l = &lines[0];
    let src_ip = l["src.addr"]
        .as_str()
        .and_then(|s| s.parse::<SocketAddr>().ok())
        .map(|a| a.ip());
    if src_ip != Some(case.src) || l["dst.addr"] != case.dst.to_string() {
        problems.push(format!(
            "node B logged {} -> {}, expected {} -> {}",
            l["src.addr"], l["dst.addr"], case.src, case.dst
        ));
    }
    if l["src.identity"].as_str() != case.identity.as_deref() || l["direction"] != "inbound" {
        problems.push(format!("node B's log line: {l}"));
    }
    let error = l["error"].as_str().unwrap_or_default();
    match case.expect {
        Expect::Allow if !error.is_empty() => {
            problems.push(format!("allowed, but node B logged error {error:?}"))
        }
        Expect::Deny if !error.contains("istio-authz") => problems.push(format!(
            "denied, but node B's log does not name istio-authz: {error:?}"
        )),
        Expect::Deny
            if case
                .reason
                .as_deref()
                .is_some_and(|want| !error.contains(want)) =>
        {
            problems.push(format!(
                "denied with {error:?}, expected a reason containing {:?}",
                case.reason.as_deref().unwrap_or_default()
            ))
        }
        _ => {}
    }
    // Over HBONE, node A is told with a 401 and reports the denial.
    if case.expect == Expect::Deny && route != Route::Plaintext {
        let told = wait_for(Duration::from_secs(30), "node A's 401", || async {
            access_after(&mesh.a, a_before).into_iter().find(|l| {
                l["dst.addr"] == case.dst.to_string()
                    && l["error"].as_str().is_some_and(|e| e.contains("401"))
            })
        })
        .await;
        if let Err(e) = told {
            problems.push(e);
        }
    }
    (seen, problems)
}

// ---- the test --------------------------------------------------------------------------------------------------

/// One mesh and what its node B's plugin was last handed.
struct Lane {
    mesh: NetMesh,
    policies_b: serde_json::Value,
}

/// Both meshes have both address families (the mesh file lists both); the IPv6 one captures IPv6.
async fn start_lane(ipv6: bool, first: &Case, dsts: Vec<SocketAddr>) -> Lane {
    let mut layout = Layout::new(CLIENT_V4, SERVER_V4, 24);
    layout.extra_a.push(format!("{CLIENT_V6}/64"));
    layout.extra_b.push(format!("{SERVER_V6}/64"));
    let poll = ["--config-poll".to_owned(), "10ms".to_owned()];
    layout.flags_a.extend(poll.clone());
    layout.flags_b.extend(poll);
    // One HBONE listener per server address (0.0.0.0:15008 takes no IPv6).
    layout
        .flags_b
        .extend(["--hbone".to_owned(), "workloads".to_owned()]);
    if ipv6 {
        layout.capture_ipv6 = true;
        layout
            .flags_a
            .extend(["--outbound".to_owned(), "[::]:15001".to_owned()]);
        layout
            .flags_b
            .extend(["--inbound-plaintext".to_owned(), "[::]:15006".to_owned()]);
    }
    let tag = if ipv6 { "z6" } else { "z4" };
    let mesh = NetMesh::start_with(tag, &layout, &mesh_file(first, "start"), "info")
        .await
        .expect("network namespaces (needs root)");
    // Echo servers on every destination the lane's cases dial, on a thread in node B's namespace that keeps
    // serving (it reports once they are bound).
    let (tx, rx) = std::sync::mpsc::channel();
    let _serving = mesh.ns_b.run(move || async move {
        let mut tasks = Vec::new();
        for d in dsts {
            match workload::echo_server(d).await {
                Ok((_, t)) => tasks.push(t),
                Err(e) => {
                    let _ = tx.send(Err(format!("echo server on {d}: {e}")));
                    return;
                }
            }
        }
        let _ = tx.send(Ok(()));
        for t in tasks {
            let _ = t.await;
        }
    });
    tokio::task::spawn_blocking(move || rx.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let policies_b = mesh.b.config_dump().await.unwrap()["policies"].clone();
    Lane { mesh, policies_b }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_authz_case_table_end_to_end() {
    let started = Instant::now();
    let cases = load_cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let planned: Vec<(&Case, Result<Route, &'static str>)> =
        cases.iter().map(|c| (c, plan(c))).collect();
    let lane_cases = |v6: bool| -> Vec<&Case> {
        planned
            .iter()
            .filter(|(c, r)| r.is_ok() && c.src.is_ipv6() == v6)
            .map(|(c, _)| *c)
            .collect()
    };
    let mut lanes: Vec<Option<Lane>> = Vec::new();
    for v6 in [false, true] {
        let mine = lane_cases(v6);
        let lane = match mine.first() {
            Some(first) => {
                let mut dsts: Vec<SocketAddr> = mine.iter().map(|c| c.dst).collect();
                dsts.sort();
                dsts.dedup();
                Some(start_lane(v6, first, dsts).await)
            }
            None => None,
        };
        lanes.push(lane);
    }
    let setup = started.elapsed();

    let mut failures = Vec::new();
    let mut ran = 0usize;
    let mut skipped: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (i, (case, route)) in planned.iter().enumerate() {
        let route = match route {
            Ok(r) => *r,
            Err(why) => {
                println!("skip {:2} {}: {why}", i + 1, case.name);
                skipped.entry(why).or_default().push(&case.name);
                continue;
            }
        };
        let lane = lanes[usize::from(case.src.is_ipv6())].as_mut().unwrap();
        let mesh = &lane.mesh;
        let t = Instant::now();
        let (va, vb) = (version(&mesh.a).await, version(&mesh.b).await);
        std::fs::write(
            mesh.config_path(),
            mesh_file(case, &format!("case {}: {}", i + 1, case.name)),
        )
        .unwrap();
        wait_version(&mesh.a, va).await;
        let (vb, dump_b) = wait_version(&mesh.b, vb).await;
        if dump_b["policies"] != lane.policies_b {
            wait_plugin_applied(&mesh.b, vb).await;
            lane.policies_b = dump_b["policies"].clone();
        }
        let applied = t.elapsed();
        let (seen, problems) = check_case(mesh, case, route).await;
        ran += 1;
        println!(
            "{} {:2} {:<52} {:<9} {:<4} {:<5} {seen} (config {} ms, total {} ms)",
            if problems.is_empty() { "ok  " } else { "FAIL" },
            i + 1,
            case.name,
            route.as_str(),
            if case.src.is_ipv6() { "ipv6" } else { "ipv4" },
            format!("{:?}", case.expect).to_lowercase(),
            applied.as_millis(),
            t.elapsed().as_millis()
        );
        for p in &problems {
            println!("       {p}");
        }
        if !problems.is_empty() {
            failures.push(format!("{}: {}", case.name, problems.join("; ")));
        }
    }
    let why: Vec<String> = skipped
        .iter()
        .map(|(why, names)| format!("{}: {why}", names.join(", ")))
        .collect();
    println!(
        "authz table end to end: {ran} cases, {} skipped ({}); {:.1?} (meshes up in {setup:.1?})",
        cases.len() - ran,
        if why.is_empty() {
            "none".to_owned()
        } else {
            why.join("; ")
        },
        started.elapsed()
    );
    assert!(ran >= 40, "only {ran} cases ran end to end");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed end to end:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
