//! The pairs the mesh bench compares: starting them (weft builds, ztunnel, the relay yardstick, the direct path) and
//! what keeps them up.

use std::net::Ipv4Addr;
use std::time::Duration;

use weft_conformance::netmesh::{Layout, NetMesh, Topology, yaml};
use weft_conformance::relay;
use weft_conformance::ztunnel::{NsProcess, ZtunnelMesh, ztunnel_binary};
use weft_devmesh::netns::Netns;

use super::env::{POLICY_NEVER_MATCHING, wanted};
use super::probes::Servers;
use super::rounds::Pair;

/// What keeps a pair up (dropped at the end: processes killed, namespaces deleted).
pub(crate) enum Running {
    Weft(Box<NetMesh>),
    Ztunnel(Box<ZtunnelMesh>),
    Relay(Box<RelayPair>),
}

/// The yardstick pair: [`relay`] on both nodes of a [`Topology`], each node this bench binary again with
/// `BENCH_RELAY` (`out:<node B's address>` or `in`). Field order is drop order: processes before namespaces.
pub(crate) struct RelayPair {
    a: NsProcess,
    b: NsProcess,
    topo: Topology,
    _dir: tempfile::TempDir,
}

impl RelayPair {
    async fn start(tag: &str, subnet: u8) -> Result<Self, String> {
        let (c, s) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let topo = Topology::create(tag, &Layout::new(c, s, 24))?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let node = |name: &str, ns: &Netns, spec: String| {
            NsProcess::spawn(
                name,
                &ns.name,
                &me,
                &[],
                &[("BENCH_RELAY".to_owned(), spec)],
                dir.path().join(format!("{name}.log")),
            )
        };
        let mut b = node("relay-b", &topo.ns_b, "in".into())?;
        let mut a = node("relay-a", &topo.ns_a, format!("out:{s}"))?;
        b.wait_log(relay::LISTENING, Duration::from_secs(30))
            .await?;
        a.wait_log(relay::LISTENING, Duration::from_secs(30))
            .await?;
        Ok(Self {
            a,
            b,
            topo,
            _dir: dir,
        })
    }
}

/// This process as one node of the relay pair (`BENCH_RELAY`: `in`, or `out:<node B's IPv4 address>`).
pub(crate) async fn run_relay(spec: &str) {
    let served = match spec.strip_prefix("out:") {
        Some(peer) => relay::outbound(peer.parse().expect("BENCH_RELAY out:<IPv4>")).await,
        None => relay::inbound().await,
    };
    if let Err(e) = served {
        eprintln!("relay {spec}: {e}");
        std::process::exit(1);
    }
}

impl Running {
    /// The last lines of both proxies' logs (to show why a path failed).
    pub(crate) fn log_tails(&self) -> String {
        let (a, b) = match self {
            Running::Weft(m) => (m.a.log_tail(20), m.b.log_tail(20)),
            Running::Ztunnel(z) => (z.a.log_tail(20), z.b.log_tail(20)),
            Running::Relay(r) => (r.a.log_tail(20), r.b.log_tail(20)),
        };
        format!("node A:\n{a}\nnode B:\n{b}")
    }
}

/// Start the pairs asked for: (what keeps them up, how to measure them, their servers).
pub(crate) async fn start_pairs(log: &str) -> (Vec<Running>, Vec<Pair>, Vec<Servers>) {
    let (mut running, mut pairs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    let base = std::env::var_os("WEFT_BASE_BIN").map(std::path::PathBuf::from);
    for (name, tag, subnet, plugins) in [
        ("weft", "m", 9u8, true),
        ("weft-pol", "p", 13, true),
        ("weft-np", "n", 10, false),
        ("weft-base", "o", 12, true),
        ("weft-shadow", "s", 15, true),
    ] {
        if !wanted(name) {
            continue;
        }
        let (c, s) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let mut layout = Layout::new(c, s, 24);
        // What ships: weft's own log buffering (and the flag is unknown to an older baseline build).
        layout.sync_logs = false;
        if name == "weft-base" {
            let Some(bin) = &base else {
                continue;
            };
            layout.weft_bin = Some(bin.clone());
        }
        if !plugins {
            layout.flags_a = vec!["--default-plugins".into(), "false".into()];
            layout.flags_b = layout.flags_a.clone();
        }
        if name == "weft-base"
            && let Ok(flags) = std::env::var("BENCH_BASE_FLAGS")
        {
            layout.flags_a = flags.split_whitespace().map(String::from).collect();
            layout.flags_b = layout.flags_a.clone();
        }
        let mut config = yaml(c, s);
        if name == "weft-pol"
            || name == "weft-shadow"
            || (name == "weft-base"
                && std::env::var_os("BENCH_BASE_POLICY").is_some_and(|v| v == "1"))
        {
            config.push_str(POLICY_NEVER_MATCHING);
        }
        let mesh = if name == "weft-shadow" {
            super::shadow::start(tag, &layout, &config, log)
                .await
                .unwrap_or_else(|e| panic!("the weft-shadow pair: {e}"))
        } else {
            NetMesh::start_with(tag, &layout, &config, log)
                .await
                .expect("network namespaces (needs root) and a weft build")
        };
        pairs.push(Pair {
            name,
            ns_a: mesh.ns_a.name.clone(),
            server_ip: s,
            bypass: false,
            pids: (mesh.a.pid(), mesh.b.pid()),
            running: Some(running.len()),
        });
        servers.push(Servers::spawn(&mesh.ns_b.name, s));
        running.push(Running::Weft(Box::new(mesh)));
    }
    match ztunnel_binary() {
        Ok(bin) if wanted("ztunnel") => {
            let z = ZtunnelMesh::start("z", 11, &bin, log, &[])
                .await
                .expect("the ztunnel pair (ZTUNNEL_BIN is set)");
            let s = z.topo.server_ip;
            pairs.push(Pair {
                name: "ztunnel",
                ns_a: z.topo.ns_a.name.clone(),
                server_ip: s,
                bypass: false,
                pids: (z.a.pid(), z.b.pid()),
                running: Some(running.len()),
            });
            servers.push(Servers::spawn(&z.topo.ns_b.name, s));
            running.push(Running::Ztunnel(Box::new(z)));
        }
        Ok(_) => println!("ztunnel pair skipped: not in BENCH_PAIRS"),
        Err(why) => println!("ztunnel pair skipped: {why}"),
    }
    if wanted("relay") {
        let r = RelayPair::start("r", 14)
            .await
            .expect("the relay pair (network namespaces need root)");
        pairs.push(Pair {
            name: "relay",
            ns_a: r.topo.ns_a.name.clone(),
            server_ip: r.topo.server_ip,
            bypass: false,
            pids: (r.a.pid(), r.b.pid()),
            running: Some(running.len()),
        });
        servers.push(Servers::spawn(&r.topo.ns_b.name, r.topo.server_ip));
        running.push(Running::Relay(Box::new(r)));
    }
    // Direct: the first pair's namespaces with the capture skipped.
    if wanted("direct")
        && let Some(first) = pairs.first()
    {
        let direct = Pair {
            name: "direct",
            ns_a: first.ns_a.clone(),
            server_ip: first.server_ip,
            bypass: true,
            pids: (None, None),
            running: None,
        };
        pairs.push(direct);
    }
    (running, pairs, servers)
}
