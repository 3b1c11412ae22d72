//! `weft-demo`: weft's main job on one machine, no Kubernetes. The control plane (`weft-control`, its own process
//! from its own binary) serves the mesh (a file in ztunnel's local-config format) and the plugins (a directory of
//! WeftPlugin files) over Delta ADS with TLS; two weft nodes run as real processes on 127.0.0.x and learn
//! everything from it. An echo workload sits behind node B, a client
//! workload on node A sends traffic through node A's SOCKS5 listener; node A tunnels it over mutual-TLS HBONE to
//! node B, which checks the client's SPIFFE identity and hands the bytes to the workload. Then a policy plugin is
//! pushed to both nodes over xDS and decides the next connection; the output shows the push-to-effect times.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use sha2::Digest as _;
use weft_devmesh::control::{Control, free_port, plugin_xds_flags, write_tokens, xds_flags};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};

/// weft-demo: a two-node weft mesh on 127.0.0.x with its control plane; sends traffic through it, shows the mTLS
/// identities, then pushes a policy plugin over xDS. Runs the `weft` and `weft-control` binaries next to this one
/// (or $WEFT_BIN, $WEFT_CONTROL_BIN).
#[derive(Debug, Parser)]
#[command(version, about)]
struct DemoArgs {
    /// Keep the mesh running until Ctrl-C after the traffic has been shown.
    #[arg(long)]
    keep: bool,
}

const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);
const ECHO_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);
const LEGACY_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 2);
const ECHO_VIP: Ipv4Addr = Ipv4Addr::new(127, 10, 0, 1);

/// The plugin the demo pushes (see build.rs).
static PORT_ALLOWLIST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/port_allowlist.wasm"));

/// The WeftPlugin file the demo writes: port-allowlist on inbound, allowing `ports`.
fn allowlist_yaml(ports: &str) -> String {
    format!(
        "# Pushed by weft-demo: weft-control serves this file to every node as an xDS extension config.\n\
         apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: allowlist\nspec:\n  \
         url: file://port_allowlist.wasm\n  pluginConfig: {{ports: [{ports}]}}\n  kind: policy\n  \
         directions: [inbound]\n  failStrategy: FAIL_CLOSE\n"
    )
}

/// Write `file` in `dir` atomically (as a ConfigMap update lands).
fn put(dir: &Path, file: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(file))
}

/// Poll `f` every 2 ms until it holds (or 30 s pass); the time it took.
async fn time_until<F, Fut>(what: &str, mut f: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if f().await {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("{what}: not within 30 s")
}

/// Poll `f` every 10 ms until it gives a value (or 30 s pass).
async fn poll<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(v) = f().await {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("{what}: not within 30 s")
}

/// Whether `node` serves plugin `name` with `config` (its status in /config_dump).
async fn serves(node: &NodeProcess, name: &str, sha256: &str) -> bool {
    node.config_dump().await.is_ok_and(|d| {
        d["plugins"].as_array().is_some_and(|ps| {
            ps.iter()
                .any(|p| p["name"] == name && p["sha256"] == sha256 && p["state"] == "serving")
        })
    })
}

fn mesh_yaml() -> String {
    format!(
        r#"# A two-node mesh on this machine. Format: ztunnel's local config (weft accepts it as is).
workloads:
- uid: Kubernetes//Pod/default/sleep-1
  name: sleep-1
  namespace: default
  serviceAccount: sleep
  workloadName: sleep
  canonicalName: sleep
  workloadIps: [{CLIENT_IP}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: Kubernetes//Pod/default/echo-1
  name: echo-1
  namespace: default
  serviceAccount: echo
  workloadName: echo
  canonicalName: echo
  workloadIps: [{ECHO_IP}]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/legacy/db-1
  name: db-1
  namespace: legacy
  workloadIps: [{LEGACY_IP}]
  protocol: TCP
  node: node-b
  services: {{}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{ECHO_VIP}"]
  ports:
    80: 8080
"#
    )
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

async fn send(node_a: &NodeProcess, dst: SocketAddr, what: &str) -> anyhow::Result<()> {
    let msg = format!("hello {what} from sleep-1");
    let s = socks5::connect(node_a.socks5, Some(IpAddr::V4(CLIENT_IP)), dst)
        .await
        .with_context(|| format!("SOCKS5 connect to {dst} via node-a"))?;
    let back = workload::round_trip(s, msg.as_bytes()).await?;
    if back != msg.as_bytes() {
        bail!(
            "echo mismatch for {dst}: sent {msg:?}, got {:?}",
            String::from_utf8_lossy(&back)
        );
    }
    println!(
        "  sleep-1 ({CLIENT_IP}) -> {dst:<17} {what:<28} echoed {} bytes OK",
        back.len()
    );
    Ok(())
}

async fn demo(args: DemoArgs, dir: &Path) -> anyhow::Result<()> {
    let weft = weft_devmesh::weft_binary().map_err(anyhow::Error::msg)?;
    let control_bin = weft_devmesh::control_binary().map_err(anyhow::Error::msg)?;
    let ca = dir.join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local")?;
    let mesh = dir.join("mesh.yaml");
    std::fs::write(&mesh, mesh_yaml())?;
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    let tokens = write_tokens(dir, &["node-a", "node-b"])?;
    let (_, _echo) = workload::echo_server(SocketAddr::from((ECHO_IP, 8080))).await?;
    let (_, _legacy) = workload::echo_server(SocketAddr::from((LEGACY_IP, 8080))).await?;

    println!(
        "weft-demo: a control plane and two nodes on this machine (files in {})",
        dir.display()
    );
    let (ads, status) = (
        free_port().map_err(anyhow::Error::msg)?,
        free_port().map_err(anyhow::Error::msg)?,
    );
    let _control = Control::spawn(
        &control_bin,
        ads,
        &ca,
        &tokens,
        &mesh,
        Some(&plugins),
        Some(status),
        &dir.join("control.log"),
    )
    .map_err(anyhow::Error::msg)?;
    println!(
        "  weft-control: serves {} and {}/ over Delta ADS at https://localhost:{} (status http://{status}/status)",
        mesh.display(),
        plugins.display(),
        ads.port()
    );
    let root = ca.join("root-cert.pem");
    let mut nodes = Vec::new();
    for (name, ip) in [("node-a", [127, 0, 1, 254]), ("node-b", [127, 0, 2, 254])] {
        let mut opts = NodeOptions::loopback(
            name,
            IpAddr::V4(Ipv4Addr::from(ip)),
            Path::new(""),
            &ca,
            dir,
        );
        let token = dir.join(format!("{name}.token"));
        opts.extra.extend(xds_flags(ads, &root, &token, name));
        opts.extra.extend(plugin_xds_flags(ads, &root, &token));
        opts.extra
            .extend(["--plugin-shadow-report-interval".into(), "500ms".into()]);
        let mut n = NodeProcess::spawn(&weft, &opts)?;
        n.wait_ready(Duration::from_secs(30))
            .await
            .map_err(anyhow::Error::msg)?;
        println!(
            "  {name}: ready, mesh and plugins from weft-control (admin http://{}/config_dump, log {})",
            n.admin,
            n.log_path.display()
        );
        nodes.push(n);
    }
    println!(
        "\ntraffic (client workload on node-a, via node-a's SOCKS5 {}):",
        nodes[0].socks5
    );
    send(
        &nodes[0],
        SocketAddr::from((ECHO_VIP, 80)),
        "service echo (VIP:80)",
    )
    .await?;
    send(
        &nodes[0],
        SocketAddr::from((ECHO_IP, 8080)),
        "workload echo-1",
    )
    .await?;
    send(
        &nodes[0],
        SocketAddr::from((LEGACY_IP, 8080)),
        "plain-TCP workload db-1",
    )
    .await?;
    // Node B logs a connection when it closes, just after the client saw its echo: wait for both HBONE ones.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nodes[1].access_logs().len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    println!("\nwhat node-b saw (inbound, identities verified by mutual TLS):");
    for l in nodes[1].access_logs() {
        println!(
            "  {} -> {}  peer identity {}  served as {}  {} bytes in, {} out",
            field(&l, "src.addr"),
            field(&l, "dst.addr"),
            field(&l, "src.identity"),
            field(&l, "dst.identity"),
            l.get("bytes_sent").cloned().unwrap_or_default(),
            l.get("bytes_recv").cloned().unwrap_or_default(),
        );
    }
    println!("\nwhat node-a did (outbound):");
    for l in nodes[0].access_logs() {
        let via = match field(&l, "dst.hbone_addr") {
            "" => "plain TCP (destination does not speak HBONE)".to_owned(),
            a => format!("HBONE via {a}, server proved {}", field(&l, "dst.identity")),
        };
        println!(
            "  {} -> {}  {}",
            field(&l, "src.addr"),
            field(&l, "dst.addr"),
            via
        );
    }
    println!("\ncertificates (in memory only, one per local identity):");
    for n in &nodes {
        let dump = n.config_dump().await.map_err(anyhow::Error::msg)?;
        for c in dump["certificates"].as_array().cloned().unwrap_or_default() {
            let leaf = &c["certChain"][0];
            println!(
                "  {}: {} {} serial {} expires {}",
                n.name,
                field(&c, "identity"),
                field(&c, "state"),
                field(leaf, "serialNumber"),
                field(leaf, "expirationTime")
            );
        }
    }
    println!("\nplugins (sandboxed Wasm, the defaults built in; more come over xDS):");
    for n in &nodes {
        let dump = n.config_dump().await.map_err(anyhow::Error::msg)?;
        let plugins: Vec<String> = dump["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                format!(
                    "{} ({}, {})",
                    field(p, "name"),
                    field(p, "kind"),
                    field(p, "state")
                )
            })
            .collect();
        println!("  {}: {}", n.name, plugins.join(", "));
    }
    let scrape = nodes[1].scrape().await.map_err(anyhow::Error::msg)?;
    if let Some(line) = scrape
        .lines()
        .find(|l| l.starts_with("istio_tcp_connections_opened_total{") && l.contains("sa/sleep"))
    {
        println!("  node-b /stats/prometheus: {line}");
    }
    push_plugin(&nodes, &plugins, status).await?;
    shadow_and_rollout(&nodes, &plugins, status).await?;
    if args.keep {
        println!(
            "\nmesh running; try: curl -s http://{}/config_dump ; Ctrl-C to stop",
            nodes[0].admin
        );
        tokio::signal::ctrl_c().await?;
    }
    for n in &mut nodes {
        let clean = n.terminate(Duration::from_secs(10)).await;
        println!(
            "{}: {}",
            n.name,
            if clean {
                "drained and stopped"
            } else {
                "killed after timeout"
            }
        );
    }
    Ok(())
}

/// Push port-allowlist to both nodes over xDS, see it decide the next connection, then push a new configuration;
/// print the push-to-effect times and what weft-control says each node runs.
async fn push_plugin(
    nodes: &[NodeProcess],
    plugins: &Path,
    status: SocketAddr,
) -> anyhow::Result<()> {
    let echo = SocketAddr::from((ECHO_IP, 8080));
    let sha256: String = sha2::Sha256::digest(PORT_ALLOWLIST)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!(
        "\npushing a policy plugin over xDS: port-allowlist (sha256 {}...), inbound, allowing port 9090 only",
        &sha256[..12]
    );
    put(plugins, "port_allowlist.wasm", PORT_ALLOWLIST)?;
    let pushed = Instant::now();
    put(plugins, "allowlist.yaml", allowlist_yaml("9090").as_bytes())?;
    for n in nodes {
        time_until("plugin serving", || serves(n, "allowlist", &sha256)).await?;
        println!(
            "  {}: serving it {:.0?} after the file was written (fetched, compiled, configured, swapped in)",
            n.name,
            pushed.elapsed()
        );
    }
    match send(&nodes[0], echo, "workload echo-1").await {
        Ok(()) => bail!("the plugin was serving on node-b and still allowed port 8080"),
        Err(e) => println!("  sleep-1 -> {echo} refused now: {e:#}"),
    }
    let denied = nodes[1]
        .log_lines()
        .into_iter()
        .rev()
        .find(|l| l["message"] == "connection denied by policy");
    if let Some(l) = denied {
        println!(
            "  node-b: connection denied by policy ({})",
            field(&l, "verdict")
        );
    }
    println!("pushing a new configuration: allowing port 8080");
    put(plugins, "allowlist.yaml", allowlist_yaml("8080").as_bytes())?;
    let took = time_until("8080 allowed again", || send_quiet(&nodes[0], echo)).await?;
    println!("  push to effect: the next connection passed {took:.0?} after the file was written");
    send(&nodes[0], echo, "workload echo-1").await?;
    let (code, body) = weft_devmesh::http::get(status, "/status").await?;
    if code == 200
        && let Ok(doc) = serde_json::from_str::<serde_json::Value>(&body)
    {
        println!("weft-control /status, what each node runs:");
        for n in doc["nodes"].as_array().cloned().unwrap_or_default() {
            let runs: Vec<String> = n["plugins"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            format!(
                                "{k} version {} (current: {})",
                                field(v, "version"),
                                v["current"]
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            // Each node has two streams (mesh, plugins); the plugin stream is the one with plugins to show.
            if !runs.is_empty() {
                println!("  {}: {}", field(&n, "name"), runs.join(", "));
            }
        }
    }
    Ok(())
}

/// weft-control's `/status`.
async fn control_status(status: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) = weft_devmesh::http::get(status, "/status").await.ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// A shadow version beside the serving one (its divergences reported to weft-control), then a staged rollout of
/// a new version that runs as a shadow on one node before it serves there and then everywhere.
async fn shadow_and_rollout(
    nodes: &[NodeProcess],
    plugins: &Path,
    status: SocketAddr,
) -> anyhow::Result<()> {
    let echo = SocketAddr::from((ECHO_IP, 8080));
    println!("
adding a shadow version that would allow port 9090 only (decided beside the serving one, never enforced)");
    let shadowed = format!(
        "{}  shadow:\n    url: file://port_allowlist.wasm\n    pluginConfig: {{ports: [9090]}}\n",
        allowlist_yaml("8080")
    );
    put(plugins, "allowlist.yaml", shadowed.as_bytes())?;
    let node_b = &nodes[1];
    time_until("the shadow loaded on node-b", || async {
        node_b.config_dump().await.is_ok_and(|d| {
            d["plugins"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["name"] == "allowlist" && p["shadow"]["sha256"].is_string())
            })
        })
    })
    .await?;
    for _ in 0..3 {
        send_quiet(&nodes[0], echo)
            .await
            .then_some(())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "a connection to {echo} was refused while only the shadow would deny it"
                )
            })?;
    }
    println!("  3 connections to {echo}: all passed (the serving version allows 8080)");
    let report = poll("node-b's shadow report in weft-control", || async {
        let doc = control_status(status).await?;
        doc["nodes"].as_array()?.iter().find_map(|n| {
            (n["name"] == "node-b" && n["shadows"]["allowlist"]["divergences"].as_u64() >= Some(3))
                .then(|| n["shadows"]["allowlist"].clone())
        })
    })
    .await?;
    let total: u64 = report["decisions"]
        .as_array()
        .map(|ds| ds.iter().filter_map(|d| d["count"].as_u64()).sum())
        .unwrap_or(0);
    println!(
        "  weft-control /status, node-b's shadow report: {total} decisions, {} divergent",
        report["divergences"]
    );
    if let Some(s) = report["samples"].as_array().and_then(|s| s.last()) {
        println!(
            "    e.g. {} {} -> {} ({} -> {}): serving {}, shadow {} ({})",
            field(s, "direction"),
            field(s, "source"),
            field(s, "destination"),
            field(s, "sourceWorkload"),
            field(s, "destinationWorkload"),
            field(s, "serving"),
            field(s, "shadow"),
            field(s, "shadowReason")
        );
    }

    println!(
        "staged rollout of a version allowing 8080 and 9090: 1 node as a shadow first (2 s), then serving (2 s), then every node"
    );
    let staged = format!(
        "{}  rollout:\n    stages:\n    - {{nodes: 1, bake: 2s, shadowFirst: true}}\n    - {{percent: 100, bake: 1s}}\n    \
         abortWhen: {{divergenceRatio: 0.05, minCalls: 5}}\n",
        allowlist_yaml("8080, 9090")
    );
    put(plugins, "allowlist.yaml", staged.as_bytes())?;
    let node_a = &nodes[0];
    let rollout = poll("the staged rollout to end", || async {
        // Traffic for the stage to judge.
        let _ = send_quiet(node_a, echo).await;
        let doc = control_status(status).await?;
        let r = doc["rollouts"]["plugins"]["allowlist"]["rollout"].clone();
        (r["state"].is_string() && r["state"] != "progressing").then_some(r)
    })
    .await?;
    for e in rollout["timeline"].as_array().cloned().unwrap_or_default() {
        println!(
            "  {:>5.1}s  stage {}: {}",
            e["afterSeconds"].as_f64().unwrap_or_default(),
            e["stage"],
            field(&e, "event")
        );
    }
    if rollout["state"] != "complete" {
        bail!("the staged rollout did not complete: {rollout}");
    }
    Ok(())
}

/// One echo round trip through node A, true if it came back intact.
async fn send_quiet(node_a: &NodeProcess, dst: SocketAddr) -> bool {
    let Ok(s) = socks5::connect(node_a.socks5, Some(IpAddr::V4(CLIENT_IP)), dst).await else {
        return false;
    };
    workload::round_trip(s, b"ping")
        .await
        .is_ok_and(|b| b == b"ping")
}

fn main() -> anyhow::Result<()> {
    let args = DemoArgs::parse();
    let dir = std::env::temp_dir().join(format!("weft-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt.block_on(demo(args, &dir));
    if r.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("demo failed; node logs kept in {}", dir.display());
    }
    r
}
