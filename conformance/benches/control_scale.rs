//! weft-control at fleet scale: one real `weft-control` process (file mode: a mesh file of workloads, services and
//! policies, and a directory of WeftPlugin files) and, in this process, a load generator holding N simulated nodes,
//! each as a real `weft run` node connects: weft-xds's own Delta ADS client (`AdsClient`: TLS 1.3 to the dev CA's
//! root, the node's bearer token, ztunnel's node id and metadata with `NODE_NAME`, ACK/NACK by nonce once the
//! handler returned), one stream for the mesh source (`istio.workload.Address` and `istio.security.Authorization`)
//! and one for the plugin source (extension configs), as `weft run --xds-address ... --plugin-xds-address ...`
//! opens them. The handlers apply nothing: they note when each node received what.
//!
//! Measured:
//! - connect: the time for all N nodes to connect and be synced (every type's first response handled), with at
//!   most BENCH_CONNECTING (default 256) nodes connecting at once (a fleet coming up, not a stampede);
//! - memory: weft-control's RSS and RssAnon (`/proc/<pid>/status`) before any node and with N connected, and the
//!   difference per connected node (target ≤ 100 KiB);
//! - quiet: weft-control's CPU with every node connected and no change, over 5 s;
//! - edits: BENCH_EDITS edits (default 10; alternately a policy in the mesh file and a plugin's configuration, each
//!   an atomic file write), and for each the time from the write until each node's stream received it: p50, p99
//!   and max over nodes (target p99 ≤ 1 s). The time includes weft-control's file poll (`--poll 20ms`; a plugin
//!   file is taken once two polls agree). Then weft-control's CPU time per edit, from the write until it counted
//!   every node's ACK of it (its `/metrics`).
//!
//! Full sizes (N = 5000, BENCH_NODES to change) under `cargo bench` (which passes `--bench`) or with
//! `BENCH_FULL=1`; otherwise a smoke run (50 nodes, 2 edits) that asserts every node got its initial state and
//! every edit, and judges no figure:
//!   cargo build --profile quick-release -p weft-control
//!   WEFT_CONTROL_BIN=$PWD/target/quick-release/weft-control BENCH_FULL=1 cargo test -p weft-conformance \
//!     --bench control_scale --config 'profile.dev.package.weft-conformance.opt-level=3' \
//!     --config 'profile.dev.package.weft-xds.opt-level=3' -- --nocapture
//!   cargo test -p weft-conformance --bench control_scale          # the smoke run, as CI runs it
//! (the load generator shares the machine: an unoptimized weft-xds client costs it twice the CPU).
//!
//! The plugin stream can be left out (BENCH_PLUGIN_STREAM=0: one stream per node, the mesh source only).
//! BENCH_REPLICAS=2 runs two weft-control replicas in kube mode (`--plugins-from-kube`, leader election) against
//! the API-server stand-in (`weft-kubeapi`, in this process): the WeftPlugins are resources of the root namespace,
//! a plugin edit an update of one, the nodes split between the replicas (memory and CPU are the replicas' sums).
//! Sizes: BENCH_WORKLOADS (200), BENCH_SERVICES (50), BENCH_POLICIES (150), BENCH_PLUGINS (50).
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use weft_devmesh::control::{Control, free_port};
use weft_xds::{AdsClient, Delta, Handler, NodeInfo, Rejection, SourceConfig, XdsHandle};

/// The policy and the plugin the edits change (each carries a marker `mark-<n>`).
const EDIT_NAME: &str = "bench-edit";

#[derive(Debug, Clone)]
struct Sizes {
    full: bool,
    nodes: usize,
    edits: usize,
    connecting: usize,
    plugin_stream: bool,
    workloads: usize,
    services: usize,
    /// Authorization policies (the edited one included).
    policies: usize,
    /// WeftPlugins (the edited one included).
    plugins: usize,
    /// 1: one weft-control serving files; more: replicas in kube mode against the API-server stand-in, the nodes
    /// split between them.
    replicas: usize,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

impl Sizes {
    fn from_env() -> Self {
        let full = std::env::args().any(|a| a == "--bench")
            || std::env::var("BENCH_FULL").is_ok_and(|v| v == "1");
        Self {
            full,
            nodes: env_usize("BENCH_NODES", if full { 5000 } else { 50 }),
            edits: env_usize("BENCH_EDITS", if full { 10 } else { 2 }),
            connecting: env_usize("BENCH_CONNECTING", 256).max(1),
            plugin_stream: std::env::var("BENCH_PLUGIN_STREAM").map_or(true, |v| v != "0"),
            workloads: env_usize("BENCH_WORKLOADS", 200),
            services: env_usize("BENCH_SERVICES", 50),
            policies: env_usize("BENCH_POLICIES", 150).max(1),
            plugins: env_usize("BENCH_PLUGINS", 50).max(1),
            replicas: env_usize("BENCH_REPLICAS", 1).max(1),
        }
    }
}

/// The mesh file: workloads spread over the nodes, services, and policies (the edited one says `mark-<marker>`).
fn mesh_yaml(s: &Sizes, marker: usize) -> String {
    let mut y = String::from("workloads:\n");
    for i in 0..s.workloads {
        let ns = format!("ns-{}", i % 10);
        let svc = i % s.services.max(1);
        y.push_str(&format!(
            "- uid: Kubernetes//Pod/{ns}/w-{i}\n  name: w-{i}\n  namespace: {ns}\n  serviceAccount: sa-{svc}\n  \
             workloadName: app-{svc}\n  canonicalName: app-{svc}\n  canonicalRevision: v1\n  \
             workloadIps: [10.{}.{}.{}]\n  protocol: HBONE\n  node: node-{}\n",
            1 + i / 65536,
            (i / 256) % 256,
            i % 256,
            i % s.nodes.max(1)
        ));
        if s.services > 0 {
            let sns = format!("ns-{}", svc % 10);
            y.push_str(&format!(
                "  services:\n    {sns}/svc-{svc}.{sns}.svc.cluster.local:\n      80: 8080\n"
            ));
        } else {
            y.push_str("  services: {}\n");
        }
    }
    if s.services > 0 {
        y.push_str("services:\n");
        for j in 0..s.services {
            let ns = format!("ns-{}", j % 10);
            y.push_str(&format!(
                "- name: svc-{j}\n  namespace: {ns}\n  hostname: svc-{j}.{ns}.svc.cluster.local\n  \
                 vips: [\"/10.96.{}.{}\"]\n  ports:\n    80: 8080\n",
                j / 256,
                j % 256
            ));
        }
    }
    y.push_str("policies:\n");
    for p in 0..s.policies {
        let (name, principal) = if p == 0 {
            (EDIT_NAME.to_owned(), format!("mark-{marker}"))
        } else {
            (format!("policy-{p}"), format!("sa-{p}"))
        };
        let ns = if p == 0 {
            "default".to_owned()
        } else {
            format!("ns-{}", p % 10)
        };
        y.push_str(&format!(
            "- name: {name}\n  namespace: {ns}\n  scope: Namespace\n  action: Deny\n  \
             rules:\n  - - - principals: [!Exact cluster.local/ns/{ns}/sa/{principal}]\n"
        ));
    }
    y
}

/// One WeftPlugin file (remote code pinned by sha256: weft-control hands the URL on, the nodes would fetch it).
fn plugin_yaml(i: usize, marker: usize) -> String {
    let name = if i == 0 {
        EDIT_NAME.to_owned()
    } else {
        format!("plugin-{i}")
    };
    format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: {name}\nspec:\n  \
         url: https://plugins.example/{name}.wasm\n  sha256: {:064x}\n  \
         pluginConfig: {{marker: mark-{marker}, ports: [8080]}}\n  kind: policy\n  directions: [inbound]\n",
        i + 1
    )
}

/// The same plugin as a WeftPlugin resource of the root namespace (mesh-wide), for the replicas in kube mode.
fn plugin_object(i: usize, marker: usize) -> serde_json::Value {
    let doc: serde_json::Value = serde_yaml::from_str(&plugin_yaml(i, marker)).unwrap();
    let mut o = doc;
    o["metadata"]["namespace"] = "istio-system".into();
    o
}

fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The edit being waited for: when each node's stream received it.
struct EditWatch {
    marker: usize,
    times: Vec<Mutex<Option<Instant>>>,
    remaining: AtomicUsize,
    done: tokio::sync::Notify,
}

/// What the handlers of every node share.
struct Shared {
    /// The edit in flight, if any.
    watch: Mutex<Option<Arc<EditWatch>>>,
    /// Per node: resources received of each source (upserts, summed over responses).
    received: Vec<[AtomicUsize; 2]>,
}

/// The marker `mark-<n>` in a resource's bytes.
fn marker(bytes: &[u8]) -> Option<usize> {
    let pat = b"mark-";
    let at = bytes.windows(pat.len()).position(|w| w == pat)? + pat.len();
    let digits: String = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .map(|b| *b as char)
        .collect();
    digits.parse().ok()
}

/// A node's handler of one source: counts what it received and notes the edit markers.
struct Sink {
    node: usize,
    source: usize,
    shared: Arc<Shared>,
}

impl Handler for Sink {
    fn apply(&self, delta: Delta) -> BoxFuture<'_, Vec<Rejection>> {
        let now = Instant::now();
        self.shared.received[self.node][self.source]
            .fetch_add(delta.upserts.len(), Ordering::Relaxed);
        let watch = self.shared.watch.lock().unwrap().clone();
        if let Some(w) = watch {
            let seen = delta
                .upserts
                .iter()
                .filter(|u| u.name.ends_with(EDIT_NAME))
                .filter_map(|u| marker(&u.resource.value))
                .any(|m| m == w.marker);
            if seen {
                let mut t = w.times[self.node].lock().unwrap();
                if t.is_none() {
                    *t = Some(now);
                    drop(t);
                    if w.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        w.done.notify_one();
                    }
                }
            }
        }
        Box::pin(async { Vec::new() })
    }
}

/// weft-control's memory (kB, from `/proc/<pid>/status`): (VmRSS, RssAnon).
fn memory(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// The machine's load average over the last minute (other work on it slows every figure but the CPU times).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// A process's CPU time so far (user + system): weft-control's, or the load generator's own (`self`).
fn cpu(pid: impl std::fmt::Display) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // In clock ticks of USER_HZ, 100 a second on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The ACKs weft-control counted so far (every type), from its `/metrics`.
async fn server_acks(metrics: SocketAddr) -> u64 {
    let Ok((200, body)) = weft_devmesh::http::get(metrics, "/metrics").await else {
        return 0;
    };
    body.lines()
        .filter(|l| l.starts_with("weft_control_acks_total"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Wait (polling their `/metrics`) until the replicas counted at least `n` ACKs between them.
async fn until_acks(metrics: &[SocketAddr], n: u64, within: Duration) -> u64 {
    let start = Instant::now();
    loop {
        let mut got = 0;
        for m in metrics {
            got += server_acks(*m).await;
        }
        if got >= n || start.elapsed() > within {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn kib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// Start a simulated node's sources (the mesh stream, and the plugin stream when on).
fn start_node(
    i: usize,
    addr: SocketAddr,
    root: &Path,
    token: PathBuf,
    plugin_stream: bool,
    shared: &Arc<Shared>,
) -> Vec<XdsHandle> {
    let name = format!("node-{i}");
    let node = NodeInfo {
        instance_ip: Some(format!("10.200.{}.{}", i / 256, i % 256)),
        pod_name: format!("weft-{name}"),
        pod_namespace: "weft-system".into(),
        node_name: name,
        ..Default::default()
    }
    .default_metadata("CLUSTER_ID", "Kubernetes")
    .default_metadata("ISTIO_VERSION", "1.32.0");
    let cfg = |source: &str| {
        let mut c = SourceConfig::new(source, format!("https://localhost:{}", addr.port()));
        c.root_cert = Some(root.to_path_buf());
        c.token_file = Some(token.clone());
        c.node = node.clone();
        c
    };
    let sink = |source| {
        Arc::new(Sink {
            node: i,
            source,
            shared: shared.clone(),
        })
    };
    let mut handles = vec![
        AdsClient::new(cfg("mesh"))
            .subscribe(weft_proto::type_url::ADDRESS, sink(0))
            .subscribe(weft_proto::type_url::AUTHORIZATION, sink(0))
            .start()
            .unwrap(),
    ];
    if plugin_stream {
        handles.push(
            AdsClient::new(cfg("plugins"))
                .subscribe(weft_proto::type_url::EXTENSION_CONFIG, sink(1))
                .start()
                .unwrap(),
        );
    }
    handles
}

fn main() {
    let s = Sizes::from_env();
    let streams_per_node = if s.plugin_stream { 2 } else { 1 };
    let streams = s.nodes * streams_per_node;
    // Both ends of every stream are on this machine: the bench's and weft-control's (which inherits the limit).
    let nofile = weft_conformance::load::raise_nofile((streams as u64 * 2 + 4096).max(65_536));
    assert!(
        nofile >= streams as u64 + 1024,
        "open-file limit {nofile} is too low for {streams} streams (raise it: ulimit -n)"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(s, streams_per_node));
}

async fn run(s: Sizes, streams_per_node: usize) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local").unwrap();
    let root = ca.join("root-cert.pem");
    let names: Vec<String> = (0..s.nodes).map(|i| format!("node-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let tokens = weft_devmesh::control::write_tokens(dir.path(), &refs).unwrap();
    let mesh_file = dir.path().join("mesh.yaml");
    std::fs::write(&mesh_file, mesh_yaml(&s, 0)).unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for i in 0..s.plugins {
        std::fs::write(plugins.join(format!("plugin-{i}.yaml")), plugin_yaml(i, 0)).unwrap();
    }
    // Kube mode: the WeftPlugins are resources of the API-server stand-in, watched by every replica.
    let api = if s.replicas > 1 {
        let api = weft_kubeapi::ApiServer::start().await.unwrap();
        for i in 0..s.plugins {
            api.apply(plugin_object(i, 0)).unwrap();
        }
        Some(api)
    } else {
        None
    };
    let mut controls = Vec::new();
    for r in 0..s.replicas {
        let addr = free_port().unwrap();
        let metrics = free_port().unwrap();
        let mut args = Control::args(
            addr,
            &ca,
            &tokens,
            &mesh_file,
            api.is_none().then_some(plugins.as_path()),
            None,
        );
        let at = args.iter().position(|a| a == "--metrics").unwrap();
        args[at + 1] = metrics.to_string();
        if let Some(api) = &api {
            args.extend(
                [
                    "--kube-api",
                    &api.url(),
                    "--plugins-from-kube",
                    "--namespace",
                    "weft-system",
                    "--replica",
                    &format!("weft-control-{r}"),
                ]
                .map(str::to_owned),
            );
        }
        let control = Control::with_args(
            &weft_devmesh::control_binary().unwrap(),
            addr,
            args,
            &dir.path().join(format!("control-{r}.log")),
        )
        .unwrap();
        // Ready: its metrics endpoint answers (bound after the sources loaded, before the gRPC listener).
        weft_conformance::eventually(Duration::from_secs(60), "weft-control serving", || async {
            let ok = weft_devmesh::http::get(metrics, "/metrics")
                .await
                .is_ok_and(|(st, _)| st == 200);
            let grpc = tokio::net::TcpStream::connect(addr).await.is_ok();
            (ok && grpc).then_some(())
        })
        .await;
        controls.push((control, addr, metrics));
    }
    let pids: Vec<u32> = controls.iter().map(|c| c.0.pid().unwrap()).collect();
    let metrics: Vec<SocketAddr> = controls.iter().map(|c| c.2).collect();
    let memory_all = || {
        pids.iter()
            .map(|p| memory(*p))
            .fold((0, 0), |a, m| (a.0 + m.0, a.1 + m.1))
    };
    let cpu_all = || pids.iter().map(cpu).sum::<Duration>();
    let idle = memory_all();

    let shared = Arc::new(Shared {
        watch: Mutex::new(None),
        received: (0..s.nodes).map(|_| Default::default()).collect(),
    });

    // Connect: at most `connecting` nodes at once, each counted once every source is synced.
    println!(
        "weft-control at scale ({}, {} cores, load {}): {} replica(s){}, {} nodes × {} stream(s) (mesh{}), {} \
         workloads, {} services, {} policies, {} plugins",
        if s.full { "full" } else { "smoke" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        s.replicas,
        if s.replicas > 1 {
            " (kube mode, WeftPlugins from the API-server stand-in)"
        } else {
            " (file mode)"
        },
        s.nodes,
        streams_per_node,
        if s.plugin_stream { " + plugins" } else { "" },
        s.workloads,
        s.services,
        s.policies,
        s.plugins
    );
    let cpu0 = cpu_all();
    let gen0 = cpu("self");
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(s.connecting));
    let mut handles: Vec<XdsHandle> = Vec::with_capacity(s.nodes * streams_per_node);
    let mut synced = Vec::with_capacity(s.nodes);
    for i in 0..s.nodes {
        let permit = tokio::time::timeout(Duration::from_secs(300), gate.clone().acquire_owned())
            .await
            .expect("a node synced within 300 s")
            .unwrap();
        let hs = start_node(
            i,
            controls[i % controls.len()].1,
            &root,
            dir.path().join(format!("node-{i}.token")),
            s.plugin_stream,
            &shared,
        );
        let waits: Vec<XdsHandle> = hs.clone();
        handles.extend(hs);
        synced.push(tokio::spawn(async move {
            for h in &waits {
                h.wait_for(|st| st.synced).await;
            }
            drop(permit);
            Instant::now()
        }));
    }
    let mut last = start;
    for t in synced {
        let t = tokio::time::timeout(Duration::from_secs(600), t)
            .await
            .expect("every node synced within 600 s")
            .unwrap();
        last = last.max(t);
    }
    let connect = last - start;
    let cpu_connect = cpu_all() - cpu0;
    let gen_connect = cpu("self") - gen0;
    let want = [
        s.workloads + s.services + s.policies,
        if s.plugin_stream { s.plugins } else { 0 },
    ];
    for (i, r) in shared.received.iter().enumerate() {
        for (src, w) in want.iter().enumerate() {
            let got = r[src].load(Ordering::Relaxed);
            assert!(
                got >= *w,
                "node-{i} received {got} resources of source {src} on connect, expected {w}"
            );
        }
    }
    let acks_connected = until_acks(
        &metrics,
        (s.nodes * if s.plugin_stream { 3 } else { 2 }) as u64,
        Duration::from_secs(60),
    )
    .await;
    let connected = memory_all();
    println!(
        "connect: {} nodes connected and synced in {:.2?} ({:.0} nodes/s, at most {} connecting at once); \
         weft-control CPU {:.2?}, load generator CPU {:.2?}",
        s.nodes,
        connect,
        s.nodes as f64 / connect.as_secs_f64(),
        s.connecting,
        cpu_connect,
        gen_connect
    );
    let per_node = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / s.nodes as f64;
    println!(
        "memory: weft-control RSS (all replicas) {} idle -> {} with {} nodes: {:.1} KiB per node, {:.1} KiB per stream (RssAnon \
         {} -> {}: {:.1} KiB per node; target ≤ 100 KiB per node)",
        kib(idle.0),
        kib(connected.0),
        s.nodes,
        per_node(idle.0, connected.0),
        per_node(idle.0, connected.0) / streams_per_node as f64,
        kib(idle.1),
        kib(connected.1),
        per_node(idle.1, connected.1),
    );

    // Kube mode: each replica's report of its nodes (a ConfigMap the leader reads), once it lists them all.
    if let Some(api) = &api {
        for r in 0..s.replicas {
            let name = format!("weft-control-report-weft-control-{r}");
            let size = weft_conformance::eventually(
                Duration::from_secs(60),
                "every replica's report lists its nodes",
                || async {
                    let cm = api.get(weft_kubeapi::Resource::ConfigMap, "weft-system", &name)?;
                    let text = cm["data"]["report.json"].as_str()?;
                    let listed = serde_json::from_str::<serde_json::Value>(text).ok()?["nodes"]
                        .as_object()?
                        .len();
                    (listed >= s.nodes / s.replicas).then_some((text.len(), listed))
                },
            )
            .await;
            println!(
                "report: {name} lists {} nodes in {:.1} KiB ({:.2} KiB per node; a ConfigMap holds at most 1 MiB)",
                size.1,
                size.0 as f64 / 1024.0,
                size.0 as f64 / 1024.0 / size.1.max(1) as f64
            );
        }
    }

    // Quiet: weft-control's CPU with every node connected and nothing changing (its polls of the sources; in kube
    // mode also the replicas' reports and the leader's status loop), over a measurement window.
    let window = Duration::from_secs(if s.full { 5 } else { 1 });
    let q0 = cpu_all();
    tokio::time::sleep(window).await;
    println!(
        "quiet: weft-control CPU {:.1} % of a core with {} nodes connected and no change ({:.0?} window)",
        (cpu_all() - q0).as_secs_f64() / window.as_secs_f64() * 100.0,
        s.nodes,
        window
    );

    // Edits: alternately the policy and the plugin, each waited for on every node.
    let mut acks = acks_connected;
    let mut by_kind: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut p99s: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut cpus: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let kinds = if s.plugin_stream { 2 } else { 1 };
    for e in 1..=s.edits {
        let kind = (e - 1) % kinds;
        let w = Arc::new(EditWatch {
            marker: e,
            times: (0..s.nodes).map(|_| Mutex::new(None)).collect(),
            remaining: AtomicUsize::new(s.nodes),
            done: tokio::sync::Notify::new(),
        });
        *shared.watch.lock().unwrap() = Some(w.clone());
        let c0 = cpu_all();
        let g0 = cpu("self");
        let t0 = Instant::now();
        match (kind, &api) {
            (0, _) => put(&mesh_file, &mesh_yaml(&s, e)),
            (_, Some(api)) => {
                api.apply(plugin_object(0, e)).unwrap();
            }
            (_, None) => put(&plugins.join("plugin-0.yaml"), &plugin_yaml(0, e)),
        }
        let wait = async {
            while w.remaining.load(Ordering::Acquire) > 0 {
                let notified = w.done.notified();
                if w.remaining.load(Ordering::Acquire) == 0 {
                    break;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(120), wait)
            .await
            .is_err()
        {
            let missing: Vec<usize> = (0..s.nodes)
                .filter(|i| w.times[*i].lock().unwrap().is_none())
                .take(10)
                .collect();
            panic!(
                "edit {e}: {} nodes did not receive it within 120 s (e.g. nodes {missing:?})",
                w.remaining.load(Ordering::Acquire)
            );
        }
        // Settled: weft-control counted every node's ACK of it (one per node: the edited type only).
        acks = until_acks(&metrics, acks + s.nodes as u64, Duration::from_secs(60)).await;
        let c = cpu_all() - c0;
        let g = cpu("self") - g0;
        let mut v: Vec<Duration> = w
            .times
            .iter()
            .map(|t| t.lock().unwrap().unwrap() - t0)
            .collect();
        v.sort();
        println!(
            "edit {e:>2} ({:<6}): p50 {:>9.2?}  p99 {:>9.2?}  max {:>9.2?}  weft-control CPU {:>9.2?}  \
             load generator CPU {:>9.2?}  load {}",
            ["policy", "plugin"][kind],
            pct(&v, 0.5),
            pct(&v, 0.99),
            v[v.len() - 1],
            c,
            g,
            loadavg()
        );
        p99s[kind].push(pct(&v, 0.99));
        cpus[kind].push(c);
        by_kind[kind].extend(v);
    }
    *shared.watch.lock().unwrap() = None;
    for kind in 0..kinds {
        let v = &mut by_kind[kind];
        if v.is_empty() {
            continue;
        }
        v.sort();
        let mut p = p99s[kind].clone();
        p.sort();
        let cpu_sum: Duration = cpus[kind].iter().sum();
        println!(
            "{:<6} edits {:>2} × {} nodes: p50 {:>9.2?}  p99 {:>9.2?}  max {:>9.2?}  (worst edit's p99 {:>9.2?}; \
             target p99 ≤ 1 s)  weft-control CPU per edit {:.2?}",
            ["policy", "plugin"][kind],
            p.len(),
            s.nodes,
            pct(v, 0.5),
            pct(v, 0.99),
            v[v.len() - 1],
            p[p.len() - 1],
            cpu_sum / p.len() as u32,
        );
    }
    let after = memory_all();
    println!(
        "memory after the edits: RSS {} ({:.1} KiB per node over idle), RssAnon {}",
        kib(after.0),
        per_node(idle.0, after.0),
        kib(after.1)
    );
    for h in &handles {
        h.stop();
    }
    drop(controls);
}
