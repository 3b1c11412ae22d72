//! Istio's ztunnel Grafana dashboard shows data on weft: a real Prometheus (Debian's `prometheus`) scrapes two real
//! weft nodes, and every PromQL expression of the dashboard (`conformance/fixtures/ztunnel-dashboard.gen.json`,
//! Istio's, verbatim) returns at least one series.
//!
//! The nodes run as Istio ambient runs ztunnel: in-pod mode (a test-side CNI agent hands them a client pod and a
//! server pod over ZDS), fed over xDS by a `weft-control` (one per node network namespace, both serving the same
//! mesh file), with the default plugins (istio-telemetry exports `istio_tcp_*`). Traffic: a round trip from the
//! client pod to the server pod through both nodes, and DNS queries from the client pod to its pod DNS proxy.
//!
//! Prometheus runs in node A's namespace (it reaches both nodes' metrics servers on the link between the nodes) with
//! a 1s scrape interval; its scrape config gives each target the labels the Kubernetes pod discovery and Istio's
//! Prometheus addon relabelling give a ztunnel pod (`pod: ztunnel-<node>`, `app: ztunnel`): the dashboard selects
//! by them. Grafana's variables are replaced: `$__rate_interval` by `10s` (Grafana's own value for a 1s scrape
//! interval is 4s; 10s leaves room for a late scrape), `$__interval` by `1s`, `$__range` by `1m`.
//!
//! Two expressions are not weft's (nor ztunnel's) to answer: `container_memory_working_set_bytes` and
//! `container_cpu_usage_seconds_total` come from the kubelet's cAdvisor, which this test has no kubelet to run;
//! they are checked to be exactly those and skipped. Needs root (CI runs as root) and `/usr/bin/prometheus`.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::cni::Agent;
use weft_conformance::eventually;
use weft_conformance::podmesh::{Nodes, mesh_yaml};
use weft_devmesh::control::write_tokens;
use weft_devmesh::netns::Netns;
use weft_devmesh::{NodeOptions, NodeProcess, workload};

const DASHBOARD: &str = include_str!("../fixtures/ztunnel-dashboard.gen.json");
const WAIT: Duration = Duration::from_secs(30);
/// How long the expressions get to return series once both targets are up.
const QUERIES_WAIT: Duration = Duration::from_secs(120);
/// Metrics of the kubelet's cAdvisor, not of the node proxy.
const KUBELET_METRICS: [&str; 2] = [
    "container_memory_working_set_bytes",
    "container_cpu_usage_seconds_total",
];
/// The xDS server's port inside each node's namespace.
const XDS_PORT: u16 = 15010;
/// Prometheus's port inside node A's namespace.
const PROMETHEUS_PORT: u16 = 19090;

/// A child process killed (and reaped) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `program args` inside network namespace `ns`, stdout and stderr to `log`.
fn spawn_in(ns: &str, program: &Path, args: &[String], log: &Path) -> Proc {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc(child)
}

/// Every `expr` of the dashboard's panels, in order.
fn expressions(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// `expr` with Grafana's variables replaced by concrete values (see the module docs).
fn concrete(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$__interval", "1s")
        .replace("$__range", "1m")
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One HTTP/1.0 GET (so the answer is never chunked) from inside `ns`; returns (status, body).
async fn get_in(ns: &str, addr: SocketAddr, path: String) -> Result<(u16, String), String> {
    Netns::existing(ns)
        .within(move || async move {
            let work = async {
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
                s.write_all(req.as_bytes()).await?;
                let mut buf = Vec::new();
                s.read_to_end(&mut buf).await?;
                Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
            };
            let text = tokio::time::timeout(Duration::from_secs(10), work)
                .await
                .map_err(|_| format!("GET {addr} timed out"))?
                .map_err(|e| e.to_string())?;
            let status = text
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad response: {text:.200}"))?;
            let body = text
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_owned())
                .unwrap_or_default();
            Ok((status, body))
        })
        .await?
}

/// Prometheus's answer to an API call, as JSON.
async fn api(ns: &str, path: String) -> Result<serde_json::Value, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PROMETHEUS_PORT));
    let (code, body) = get_in(ns, addr, path).await?;
    if code != 200 {
        return Err(format!("{code} {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

/// The number of series `expr` returns now.
async fn series(ns: &str, expr: &str) -> Result<usize, String> {
    let v = api(ns, format!("/api/v1/query?query={}", percent_encode(expr))).await?;
    if v["status"] != "success" {
        return Err(v.to_string());
    }
    Ok(v["data"]["result"].as_array().map_or(0, Vec::len))
}

/// Start `weft run --mode inpod` in `ns` with its metrics server on `metrics` (its other servers on loopback), fed
/// over xDS by the control plane on its namespace's loopback.
fn spawn_node(
    name: &str,
    ns: &Netns,
    metrics: SocketAddr,
    dir: &Path,
    agent: &Agent,
) -> NodeProcess {
    let weft = weft_devmesh::weft_binary().unwrap();
    let root = dir.join("ca").join("root-cert.pem");
    let opts = NodeOptions {
        name: name.into(),
        control_ip: Ipv4Addr::LOCALHOST.into(),
        config: "".into(),
        ca_dir: dir.join("ca"),
        log_path: dir.join(format!("{name}.log")),
        netns: Some(ns.name.clone()),
        extra: [
            "--mode",
            "inpod",
            "--inpod-uds",
            &agent.path.display().to_string(),
            "--metrics",
            &metrics.to_string(),
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(weft_devmesh::control::xds_flags(
            SocketAddr::from((Ipv4Addr::LOCALHOST, XDS_PORT)),
            &root,
            &dir.join(format!("{name}.token")),
            name,
        ))
        .collect(),
        log: "info".into(),
        log_linger: Some("0s".into()),
        env: Vec::new(),
    };
    NodeProcess::spawn(&weft, &opts).unwrap()
}

/// `weft-control` serving `dir/mesh.yaml` on `127.0.0.1:XDS_PORT` inside `ns`.
fn spawn_control(ns: &Netns, dir: &Path, tokens: &Path, log: &str) -> Proc {
    let control = weft_devmesh::control_binary().unwrap();
    let args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{XDS_PORT}"),
        "--ca-dir",
        &dir.join("ca").display().to_string(),
        "--tokens",
        &tokens.display().to_string(),
        "--mesh",
        &dir.join("mesh.yaml").display().to_string(),
        "--status",
        "off",
        "--metrics",
        "off",
        "--log-json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    spawn_in(&ns.name, &control, &args, &dir.join(log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ztunnel_dashboard_expression_returns_series_from_weft() {
    let prometheus = Path::new("/usr/bin/prometheus");
    assert!(
        prometheus.exists(),
        "needs Debian's prometheus package (.ci/run installs it)"
    );
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= 10, "{exprs:?}");

    // Two nodes, a client pod on A and an echo pod on B, each node's agent knowing its pod.
    let net = 226;
    let nodes = Nodes::create("db", net).expect("network namespaces (needs root)");
    let client = nodes.pod(false, 1, "client", "client").unwrap();
    let server = nodes.pod(true, 1, "echo", "echo").unwrap();
    let dir = tempfile::tempdir().unwrap();
    weft_devmesh::write_dev_ca(&dir.path().join("ca"), "cluster.local").unwrap();
    let vip = "10.96.7.7";
    let yaml = mesh_yaml(&[(&client, "node-a"), (&server, "node-b")])
        + &format!(
            "services:\n- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports:\n    80: 8080\n"
        );
    std::fs::write(dir.path().join("mesh.yaml"), yaml).unwrap();
    let tokens = write_tokens(dir.path(), &["node-a", "node-b"]).unwrap();
    let _control_a = spawn_control(&nodes.a, dir.path(), &tokens, "control-a.log");
    let _control_b = spawn_control(&nodes.b, dir.path(), &tokens, "control-b.log");
    let agent_a = Agent::start(&dir.path().join("a.sock")).unwrap();
    let agent_b = Agent::start(&dir.path().join("b.sock")).unwrap();
    agent_a.know_pod(client.agent_pod());
    agent_b.know_pod(server.agent_pod());
    // The metrics servers on the link between the nodes, where Prometheus (in node A's namespace) reaches both.
    let (metrics_a, metrics_b) = (
        SocketAddr::from((Ipv4Addr::new(10, net, 0, 1), 15020)),
        SocketAddr::from((Ipv4Addr::new(10, net, 0, 2), 15020)),
    );
    let mut a = spawn_node("node-a", &nodes.a, metrics_a, dir.path(), &agent_a);
    let mut b = spawn_node("node-b", &nodes.b, metrics_b, dir.path(), &agent_b);
    a.wait_ready(WAIT).await.unwrap();
    b.wait_ready(WAIT).await.unwrap();
    for (node, name) in [(&a, "client"), (&b, "echo")] {
        eventually(WAIT, "the pod served", || async {
            let d = node.config_dump().await.ok()?;
            d["inpod"]["pods"]
                .as_array()?
                .iter()
                .any(|p| p["name"] == name && p["state"] == "serving")
                .then_some(())
        })
        .await;
    }

    // Traffic: client pod → echo pod (captured on both sides), and DNS from the client pod.
    let dst = server.spawn_echo();
    let pod_ns = client.ns.name.clone();
    let data = b"dashboard".to_vec();
    let back = eventually(WAIT, "a round trip", || {
        let (pod_ns, data) = (pod_ns.clone(), data.clone());
        async move {
            Netns::existing(&pod_ns)
                .within(move || async move {
                    let s = tokio::net::TcpStream::connect(dst).await.ok()?;
                    workload::round_trip(s, &data).await.ok()
                })
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(back, data);
    let cluster_dns: SocketAddr = "10.96.0.10:53".parse().unwrap();
    let d = tokio::task::spawn_blocking(move || {
        weft_conformance::dig::dig_from(
            Some(&pod_ns),
            cluster_dns,
            None,
            &["echo.default.svc.cluster.local", "A"],
        )
    })
    .await
    .unwrap();
    assert_eq!(weft_conformance::dig::data(&d, "A"), [vip], "{d:?}");

    // Prometheus in node A's namespace, scraping both nodes every second.
    let config = format!(
        r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: ztunnel
  metrics_path: /stats/prometheus
  static_configs:
  - targets: ["{ma}"]
    labels: {{pod: ztunnel-node-a, app: ztunnel, container: istio-proxy}}
  - targets: ["{mb}"]
    labels: {{pod: ztunnel-node-b, app: ztunnel, container: istio-proxy}}
"#,
        ma = metrics_a,
        mb = metrics_b,
    );
    let config_file = dir.path().join("prometheus.yml");
    std::fs::write(&config_file, config).unwrap();
    let _prometheus = spawn_in(
        &nodes.a.name,
        prometheus,
        &[
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"),
        ],
        &dir.path().join("prometheus.log"),
    );
    let ns_a = nodes.a.name.clone();
    let prom_log = dir.path().join("prometheus.log");
    eventually(Duration::from_secs(60), "both targets up", || async {
        let v = api(&ns_a, "/api/v1/targets".into()).await.ok()?;
        let active = v["data"]["activeTargets"].as_array()?;
        (active.len() == 2 && active.iter().all(|t| t["health"] == "up")).then_some(())
    })
    .await;

    // Every expression returns at least one series (some need two samples of a counter first).
    let (skipped, checked): (Vec<&String>, Vec<&String>) = exprs
        .iter()
        .partition(|e| KUBELET_METRICS.iter().any(|m| e.contains(m)));
    assert_eq!(
        skipped.len(),
        KUBELET_METRICS.len(),
        "the kubelet's expressions: {skipped:?}"
    );
    let start = Instant::now();
    let (mut missing, mut found): (Vec<String>, Vec<String>);
    loop {
        (missing, found) = (Vec::new(), Vec::new());
        for e in &checked {
            let q = concrete(e);
            match series(&ns_a, &q).await {
                Ok(n) if n > 0 => found.push(format!("{n} series: {q}")),
                Ok(_) => missing.push(format!("{q}: no series")),
                Err(err) => missing.push(format!("{q}: {err}")),
            }
        }
        if missing.is_empty() || start.elapsed() > QUERIES_WAIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        missing.is_empty(),
        "{} of {} dashboard expressions return no series:\n{}\nprometheus log:\n{}",
        missing.len(),
        checked.len(),
        missing.join("\n"),
        std::fs::read_to_string(&prom_log).unwrap_or_default()
    );
    println!(
        "{} dashboard expressions return series:\n{}\nskipped (the kubelet's): {skipped:?}",
        checked.len(),
        found.join("\n")
    );
}
