//! In-pod mode end to end: pods are network namespaces with istio-cni's capture rules, a test-side CNI agent hands
//! them to weft over ZDS (a real Unix socket, real namespace descriptors), and weft serves each pod from inside its
//! namespace. Needs root (CI runs as root).
#![allow(clippy::unwrap_used)] // a test panics to fail

mod inpod_common;

use inpod_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_to_pod_over_hbone_with_both_identities_and_direct_hbone() {
    pod_to_pod(mesh("ia", 231)).await;
}

/// The same under istio-cni's earlier TPROXY rules: only transparent listeners receive the pods' inbound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_to_pod_under_tproxy_rules() {
    pod_to_pod(mesh_with("ta", 241, PodRules::Tproxy)).await;
}

async fn pod_to_pod(m: Mesh) {
    let a = m.start_node(false, "127.0.0.1", "a").await;
    let b = m.start_node(true, "127.0.0.1", "b").await;
    let dst = m.server.spawn_echo();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let back = round_trip_from(&m.client, dst, data.clone()).await.unwrap();
    assert!(back == data, "echo corrupted: {} bytes back", back.len());
    // The application in the server pod sees the client pod's own address as its peer, as with ztunnel (its
    // original-source default), not the server pod's.
    let whoami = whoami_in(&m.server);
    assert_eq!(
        peer_seen_from(&m.client, whoami).await,
        m.client.ip.to_string()
    );

    // Node B terminated HBONE inside the server pod: the peer is the client pod's own address and identity.
    let inbound = eventually(WAIT, "node B inbound access log", || async {
        b.access_logs()
            .into_iter()
            .find(|l| l["direction"] == "inbound")
    })
    .await;
    assert_eq!(
        inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
        "{inbound}"
    );
    assert!(
        inbound["src.addr"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}:", m.client.ip)),
        "source must be the client pod's own address: {inbound}"
    );
    assert_eq!(inbound["dst.addr"], dst.to_string());
    // Node A dialled the server pod's 15008 and accepted only the server's identity.
    let outbound = eventually(WAIT, "node A outbound access log", || async {
        a.access_logs()
            .into_iter()
            .find(|l| l["direction"] == "outbound")
    })
    .await;
    assert_eq!(
        outbound["dst.identity"], "spiffe://cluster.local/ns/default/sa/echo",
        "{outbound}"
    );
    assert_eq!(
        outbound["dst.hbone_addr"],
        format!("{}:15008", m.server.ip),
        "{outbound}"
    );

    // config_dump and metrics show the pod served.
    let dump = a.config_dump().await.unwrap();
    assert_eq!(
        pods_in_dump(&dump),
        vec![("client".to_owned(), "serving".to_owned())],
        "{dump}"
    );
    assert_eq!(dump["inpod"]["connected"], true);
    // ztunnel's `workloadState` (what `istioctl ztunnel-config connections` reads): the pod, up, by its uid.
    let states: Vec<(String, String)> = dump["workloadState"]
        .as_object()
        .unwrap()
        .values()
        .map(|w| {
            (
                w["info"]["name"].as_str().unwrap_or_default().to_owned(),
                w["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(states, [("client".to_owned(), "Up".to_owned())], "{dump}");
    let metrics = a.scrape().await.unwrap();
    assert_eq!(
        weft_conformance::metric_sum(&metrics, "weft_inpod_pods{state=\"serving\"}"),
        1.0,
        "{metrics}"
    );

    // A direct HBONE connection into the server pod's 15008, from node A's namespace, with the client's certificate.
    let ca = m.dir.path().join("ca");
    let server_ip = m.server.ip;
    let h = m.nodes.a.run(move || async move {
        direct_hbone(&ca, SocketAddr::from((server_ip, 15008)), dst, b"direct").await
    });
    let r = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.unwrap(), b"direct");
    let node_a_link = format!("{}:", m.nodes.a_link_ip());
    let inbound = eventually(WAIT, "the direct tunnel's access log", || async {
        b.access_logs().into_iter().find(|l| {
            l["direction"] == "inbound"
                && l["src.addr"]
                    .as_str()
                    .is_some_and(|a| a.starts_with(&node_a_link))
        })
    })
    .await;
    assert_eq!(
        inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
        "{inbound}"
    );
}

/// HBONE by hand: TLS with the client's certificate (from the dev CA), accepting only the echo identity, one
/// CONNECT to `dst`, `payload` echoed back.
async fn direct_hbone(
    ca: &Path,
    hbone: SocketAddr,
    dst: SocketAddr,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId};
    let ca = LocalCa::from_dir(ca).map_err(|e| e.to_string())?;
    let ids = SecretManager::new(std::sync::Arc::new(ca), ManagerConfig::default());
    let cert = ids
        .fetch(
            &"spiffe://cluster.local/ns/default/sa/client"
                .parse::<SpiffeId>()
                .unwrap(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let echo: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
    let cfg = cert.client_config(vec![echo]).map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect(hbone)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(
            rustls::pki_types::ServerName::IpAddress(hbone.ip().into()),
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    let h2 = weft_hbone::handshake(tls, &weft_hbone::H2Config::default())
        .await
        .map_err(|e| e.to_string())?;
    let (mut stream, _) = h2
        .connect(weft_hbone::ConnectRequest::new(dst.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(payload).await.map_err(|e| e.to_string())?;
    stream.shutdown().await.map_err(|e| e.to_string())?;
    let mut back = Vec::new();
    stream
        .read_to_end(&mut back)
        .await
        .map_err(|e| e.to_string())?;
    Ok(back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_workload_closes_the_pod_listeners_and_a_re_add_restores_them() {
    del_workload_closes_the_pod_listeners_and_a_re_add_restores_them_with(mesh("ib", 232)).await;
}

/// Delete and re-add under istio-cni's earlier TPROXY rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_workload_closes_the_pod_listeners_and_a_re_add_restores_them_under_tproxy_rules() {
    del_workload_closes_the_pod_listeners_and_a_re_add_restores_them_with(mesh_with(
        "tb",
        242,
        PodRules::Tproxy,
    ))
    .await;
}

async fn del_workload_closes_the_pod_listeners_and_a_re_add_restores_them_with(m: Mesh) {
    let _a = m.start_node(false, "127.0.0.1", "a").await;
    let b = m.start_node(true, "127.0.0.1", "b").await;
    let dst = m.server.spawn_echo();
    let hbone = SocketAddr::from((m.server.ip, 15008));
    assert_eq!(
        round_trip_from(&m.client, dst, b"before".to_vec())
            .await
            .unwrap(),
        b"before"
    );
    assert!(listening(&m.nodes.b, hbone).await);

    assert_eq!(
        m.agent_b.del_pod(&m.server.uid).await,
        vec![Ok(String::new())]
    );
    eventually(WAIT, "pod drained on node B", || async {
        let d = b.config_dump().await.ok()?;
        pods_in_dump(&d).is_empty().then_some(())
    })
    .await;
    assert!(
        !listening(&m.nodes.b, hbone).await,
        "15008 must be closed in the deleted pod"
    );
    let r = round_trip_from(&m.client, dst, b"while deleted".to_vec()).await;
    assert!(
        !matches!(&r, Ok(b) if b == b"while deleted"),
        "the deleted pod still served: {r:?}"
    );
    let metrics = b.scrape().await.unwrap();
    assert_eq!(
        weft_conformance::metric_sum(&metrics, "weft_inpod_pods_drained_total"),
        1.0,
        "{metrics}"
    );

    assert_eq!(
        m.agent_b.add_pod(m.server.agent_pod()).await,
        Ok(String::new())
    );
    assert!(listening(&m.nodes.b, hbone).await);
    assert_eq!(
        round_trip_from(&m.client, dst, b"after".to_vec())
            .await
            .unwrap(),
        b"after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_weft_gets_the_snapshot_again_and_serves_the_pod() {
    a_restarted_weft_gets_the_snapshot_again_and_serves_the_pod_with(mesh("ic", 233)).await;
}

/// A restart under istio-cni's earlier TPROXY rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_weft_gets_the_snapshot_again_and_serves_the_pod_under_tproxy_rules() {
    a_restarted_weft_gets_the_snapshot_again_and_serves_the_pod_with(mesh_with(
        "tc",
        243,
        PodRules::Tproxy,
    ))
    .await;
}

async fn a_restarted_weft_gets_the_snapshot_again_and_serves_the_pod_with(m: Mesh) {
    let _a = m.start_node(false, "127.0.0.1", "a").await;
    let mut b = m.start_node(true, "127.0.0.1", "b").await;
    let dst = m.server.spawn_echo();
    assert_eq!(
        round_trip_from(&m.client, dst, b"one".to_vec())
            .await
            .unwrap(),
        b"one"
    );
    assert!(
        b.terminate(WAIT).await,
        "weft exits on SIGTERM after draining"
    );
    m.agent_b
        .wait("the old connection to end", |e| e.closed >= 1)
        .await;
    assert!(!listening(&m.nodes.b, SocketAddr::from((m.server.ip, 15008))).await);

    let b2 = m.start_node(true, "127.0.0.1", "b2").await;
    let ev = m
        .agent_b
        .wait("a second snapshot", |e| e.snapshots >= 2)
        .await;
    assert_eq!((ev.accepted, ev.error_acks), (2, 0), "{ev:?}");
    assert_eq!(
        round_trip_from(&m.client, dst, b"two".to_vec())
            .await
            .unwrap(),
        b"two"
    );
    let d = b2.config_dump().await.unwrap();
    assert_eq!(
        pods_in_dump(&d),
        vec![("echo".to_owned(), "serving".to_owned())],
        "{d}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_gets_an_error_ack_and_other_pods_keep_serving() {
    let m = mesh("id", 234);
    let _a = m.start_node(false, "127.0.0.1", "a").await;
    let second = m.nodes.pod(true, 2, "echo2", "echo").unwrap();
    let b = m.start_node(true, "127.0.0.1", "b").await;
    assert_eq!(
        m.agent_b.add_pod(second.agent_pod()).await,
        Ok(String::new())
    );
    let dst = m.server.spawn_echo();
    let hbone2 = SocketAddr::from((second.ip, 15008));
    assert!(listening(&m.nodes.b, hbone2).await);

    // A long-lived connection through the first pod, open across everything below.
    let (to_conn, mut rx_conn) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let (from_conn, mut echoed) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let _long = m.client.ns.run(move || async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(dst).await.unwrap();
        while let Some(msg) = rx_conn.recv().await {
            s.write_all(&msg).await.unwrap();
            let mut back = vec![0; msg.len()];
            s.read_exact(&mut back).await.unwrap();
            from_conn.send(back).await.unwrap();
        }
    });
    to_conn.send(b"ping 1".to_vec()).await.unwrap();
    assert_eq!(echoed.recv().await.unwrap(), b"ping 1");

    // The agent loses the second pod while weft is disconnected, then sends garbage.
    m.agent_b.forget_pod(&second.uid);
    let err = m
        .agent_b
        .send_raw(vec![0xff, 0x01, 0x02], None)
        .await
        .unwrap();
    assert!(err.starts_with("failure to read message"), "{err}");
    // weft reconnects; the snapshot has the first pod only, so the second one is removed.
    m.agent_b
        .wait("the snapshot after the reconnect", |e| e.snapshots >= 2)
        .await;
    eventually(WAIT, "the second pod removed", || async {
        let d = b.config_dump().await.ok()?;
        (pods_in_dump(&d) == vec![("echo".to_owned(), "serving".to_owned())]).then_some(())
    })
    .await;
    assert!(!listening(&m.nodes.b, hbone2).await);
    // The first pod never stopped: the long-lived connection still works, new ones too.
    to_conn.send(b"ping 2".to_vec()).await.unwrap();
    assert_eq!(echoed.recv().await.unwrap(), b"ping 2");
    assert_eq!(
        round_trip_from(&m.client, dst, b"new".to_vec())
            .await
            .unwrap(),
        b"new"
    );
    let metrics = b.scrape().await.unwrap();
    assert_eq!(
        weft_conformance::metric_sum(
            &metrics,
            "weft_inpod_zds_requests_total{kind=\"invalid\",result=\"error\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert!(
        b.log_lines()
            .iter()
            .any(|l| l["message"] == "invalid message from the CNI node agent")
    );
}

/// The per-pod DNS proxy: `dig` inside the client pod asks "the cluster's DNS server" on port 53 and istio-cni's
/// pod rules redirect it to weft's 15053 on the pod's loopback. Mesh names are answered from the mesh state (UDP
/// and TCP, the pod's namespace for short names); other names are forwarded, from inside the pod (the upstream
/// sees the pod's address), to the node's resolver; a deleted pod's DNS listener is closed with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_dns_proxy_answers_mesh_names_and_forwards_from_the_pod() {
    use weft_conformance::dig::{data, dig_from};
    use weft_devmesh::dns::{RecordType, Upstream};

    let net = 236;
    let m = mesh("if", net);
    let vip = "10.96.7.7";
    let yaml = std::fs::read_to_string(m.dir.path().join("mesh.yaml")).unwrap()
        + &format!(
            "services:\n- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports:\n    80: 8080\n"
        );
    std::fs::write(m.dir.path().join("mesh.yaml"), yaml).unwrap();
    // The node's resolver, on node A's side of the client pod's link.
    let resolver_ip = std::net::Ipv4Addr::new(10, net, 1, 1);
    let (up_tx, up_rx) = std::sync::mpsc::channel();
    let (keep_tx, keep_rx) = tokio::sync::oneshot::channel::<()>();
    let _resolver = m.nodes.a.run(move || async move {
        let up = Upstream::start(
            resolver_ip.into(),
            &[(
                "www.example.org.",
                300,
                vec![std::net::Ipv4Addr::new(192, 0, 2, 80)],
            )],
        )
        .await
        .unwrap();
        up_tx.send(up).unwrap();
        let _ = keep_rx.await;
    });
    let up = up_rx.recv_timeout(WAIT).unwrap();
    let upstream = up.addr.to_string();
    let a = m
        .start_node_with(false, "127.0.0.1", "a", &["--dns-upstream", &upstream])
        .await;
    let _b = m.start_node(true, "127.0.0.1", "b").await;

    let pod_ns = m.client.ns.name.clone();
    let cluster_dns: SocketAddr = "10.96.0.10:53".parse().unwrap();
    let ask = move |args: Vec<String>| {
        let pod_ns = pod_ns.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            dig_from(Some(&pod_ns), cluster_dns, None, &args)
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for tcp in [&[][..], &["+tcp"][..]] {
        let d = ask(args(
            &[tcp, &["echo.default.svc.cluster.local", "A"]].concat(),
        ))
        .await
        .unwrap();
        assert_eq!(d.status, "NOERROR", "{d:?}");
        assert!(d.flags.contains(&"aa".to_owned()), "{d:?}");
        assert_eq!(data(&d, "A"), [vip], "{d:?}");
    }
    // The short name through the pod's search domain, as its resolver (ndots 5) sends it.
    let d = ask(args(&[
        "+domain=default.svc.cluster.local",
        "+ndots=5",
        "echo",
        "A",
    ]))
    .await
    .unwrap();
    assert_eq!(data(&d, "A"), [vip], "{d:?}");
    assert_eq!(up.total(), 0, "mesh names never reach the upstream");

    // Outside the mesh: forwarded from inside the pod, then answered from the pod proxy's cache.
    for _ in 0..2 {
        let d = ask(args(&["www.example.org", "A"])).await.unwrap();
        assert_eq!(d.status, "NOERROR", "{d:?}");
        assert!(!d.flags.contains(&"aa".to_owned()), "{d:?}");
        assert_eq!(data(&d, "A"), ["192.0.2.80"], "{d:?}");
    }
    assert_eq!(up.asked("www.example.org.", RecordType::A), 1);
    let d = ask(args(&["+tcp", "nothing.example", "A"])).await.unwrap();
    assert_eq!(d.status, "NXDOMAIN", "{d:?}");
    assert_eq!(
        up.sources(),
        [std::net::IpAddr::from(m.client.ip)],
        "forwarded questions leave from the pod's own address"
    );
    let metrics = a.scrape().await.unwrap();
    assert!(
        weft_conformance::metric_sum(&metrics, "weft_dns_requests_total") >= 5.0,
        "{metrics}"
    );
    let dump = a.config_dump().await.unwrap();
    let listeners = dump["inpod"]["pods"][0]["detail"]["listeners"].to_string();
    assert!(
        listeners.contains("\"127.0.0.1:15053\"") && listeners.contains("dns_udp"),
        "{dump}"
    );

    // The pod's DNS listener closes with its other listeners.
    let dns_tcp = SocketAddr::from(([127, 0, 0, 1], 15053));
    assert!(listening(&m.client.ns, dns_tcp).await);
    assert_eq!(
        m.agent_a.del_pod(&m.client.uid).await,
        vec![Ok(String::new())]
    );
    eventually(WAIT, "pod drained on node A", || async {
        let d = a.config_dump().await.ok()?;
        pods_in_dump(&d).is_empty().then_some(())
    })
    .await;
    assert!(
        !listening(&m.client.ns, dns_tcp).await,
        "15053 must be closed in the deleted pod"
    );
    let _ = keep_tx.send(());
}
