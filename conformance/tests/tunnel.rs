//! End to end through two real weft processes on 127.0.N.x: SOCKS5 → node A → mTLS HBONE → node B → workload.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml, metric_sum};
use weft_devmesh::{socks5, workload};

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_through_two_nodes_with_verified_identities() {
    let a = Addrs { n: 20 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let src = Some(IpAddr::V4(a.client()));
    // Service VIP (port 80 → target 8080) and the workload directly; a payload large enough to cross many frames.
    for dst in [
        SocketAddr::from((a.vip(), 80)),
        SocketAddr::from((a.echo(), 8080)),
    ] {
        let data = payload(4 * 1024 * 1024 + 7);
        let s = socks5::connect(mesh.a.socks5, src, dst).await.unwrap();
        let back = workload::round_trip(s, &data).await.unwrap();
        assert!(
            back == data,
            "echo through {dst} corrupted ({} of {} bytes back)",
            back.len(),
            data.len()
        );
    }
    let logs = eventually(Duration::from_secs(30), "node-b access logs", || async {
        let l = mesh.b.access_logs();
        (l.len() >= 2).then_some(l)
    })
    .await;
    for l in &logs {
        assert_eq!(
            l["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
            "{l}"
        );
        assert_eq!(
            l["dst.identity"], "spiffe://cluster.local/ns/default/sa/echo",
            "{l}"
        );
        assert_eq!(l["direction"], "inbound");
        assert_eq!(l["bytes_sent"], 4 * 1024 * 1024 + 7, "{l}");
        assert_eq!(
            l["src.addr"].as_str().unwrap().split(':').next().unwrap(),
            a.client().to_string()
        );
    }
    // Node A counts a connection's bytes and then logs it, when the connection closes (just after the client got
    // its echo): wait for both lines, then the counters are final.
    let out = eventually(Duration::from_secs(30), "node-a access logs", || async {
        let l = mesh.a.access_logs();
        (l.len() >= 2).then_some(l)
    })
    .await;
    assert!(
        out.iter()
            .any(|l| l["dst.service"] == "default/echo.default.svc.cluster.local"),
        "{out:?}"
    );
    assert!(
        out.iter()
            .all(|l| l["dst.hbone_addr"] == format!("{}:15008", a.echo())),
        "{out:?}"
    );
    // Metrics count the connections and bytes.
    let m = mesh.a.scrape().await.unwrap();
    assert_eq!(
        metric_sum(
            &m,
            "weft_connections_opened_total{direction=\"outbound\",transport=\"hbone\"}"
        ),
        2.0,
        "{m}"
    );
    assert!(
        metric_sum(&m, "weft_sent_bytes_total{direction=\"outbound\"") >= 8.0 * 1024.0 * 1024.0
    );
    // Each node holds a certificate only for its own workloads' identities.
    for (node, want) in [(&mesh.a, "client"), (&mesh.b, "echo")] {
        let dump = node.config_dump().await.unwrap();
        let certs = dump["certificates"].as_array().unwrap();
        assert_eq!(certs.len(), 1, "{}: {certs:?}", node.name);
        assert_eq!(
            certs[0]["identity"],
            format!("spiffe://cluster.local/ns/default/sa/{want}")
        );
        assert_eq!(certs[0]["state"], "Available");
        assert!(
            certs[0]["certChain"][0]["expirationTime"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
    }
    // One pooled HBONE connection served both tunnels (same source and destination identity and address).
    let dump = mesh.a.config_dump().await.unwrap();
    assert_eq!(
        dump["connections"]["pooledHbone"], 1,
        "{}",
        dump["connections"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_workload_is_reached_without_hbone() {
    let a = Addrs { n: 22 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.legacy(), 8080)),
    )
    .await
    .unwrap();
    assert_eq!(workload::round_trip(s, b"plain").await.unwrap(), b"plain");
    let out = eventually(Duration::from_secs(30), "node-a access log", || async {
        mesh.a.access_logs().into_iter().next()
    })
    .await;
    assert!(out.get("dst.hbone_addr").is_none(), "{out}");
    assert_eq!(out["dst.workload"], "db");
    // Had node B carried it, it would have opened (and counted) the connection before the echo could answer: the
    // completed round trip orders that before this scrape, so no waiting is needed to see that it did not.
    let mb = mesh.b.scrape().await.unwrap();
    assert_eq!(
        metric_sum(&mb, "weft_connections_opened_total"),
        0.0,
        "{mb}"
    );
    assert!(
        mesh.b.access_logs().is_empty(),
        "node B must not see plain TCP traffic"
    );
    let m = mesh.a.scrape().await.unwrap();
    assert_eq!(
        metric_sum(
            &m,
            "weft_connections_opened_total{direction=\"outbound\",transport=\"tcp\"}"
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_with_the_wrong_identity_is_refused() {
    let a = Addrs { n: 24 };
    // Node B believes the echo workload runs as `impostor` and serves that certificate; node A expects `echo`.
    let mesh = Mesh::start(a, &mesh_yaml(a, "echo"), &mesh_yaml(a, "impostor"))
        .await
        .unwrap();
    let r = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await;
    match r {
        Err(socks5::Socks5Error::Reply(5)) => {}
        other => panic!("expected SOCKS5 'connection refused', got {other:?}"),
    }
    let l = eventually(Duration::from_secs(30), "failure log", || async {
        mesh.a
            .access_logs()
            .into_iter()
            .find(|l| !l["error"].as_str().unwrap_or("").is_empty())
    })
    .await;
    let err = l["error"].as_str().unwrap();
    assert!(
        err.contains("impostor") && err.contains("WrongIdentity"),
        "{err}"
    );
    let m = mesh.a.scrape().await.unwrap();
    assert_eq!(
        metric_sum(
            &m,
            "weft_connections_failed_total{direction=\"outbound\",reason=\"connect\"}"
        ),
        1.0,
        "{m}"
    );
    // Node A refused node B's certificate before sending a CONNECT, so node B cannot have opened a tunnel: its
    // handshake ended with A's alert, which it counts; once counted, nothing of that connection is left to happen.
    let mb = eventually(
        Duration::from_secs(30),
        "node B counts the failed handshake",
        || async {
            let m = mesh.b.scrape().await.ok()?;
            (metric_sum(&m, "weft_connections_failed_total{direction=\"inbound\"") >= 1.0)
                .then_some(m)
        },
    )
    .await;
    assert_eq!(
        metric_sum(&mb, "weft_connections_opened_total"),
        0.0,
        "{mb}"
    );
    assert!(
        mesh.b.access_logs().is_empty(),
        "no tunnel may reach node B's workload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_edits_apply_live_and_bad_edits_are_refused() {
    let a = Addrs { n: 26 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let src = Some(IpAddr::V4(a.client()));
    let new_vip = std::net::Ipv4Addr::new(127, 10, a.n, 2);
    let dst = SocketAddr::from((new_vip, 80));
    // Unknown VIP: passed through as plain TCP, and nothing listens there.
    assert!(socks5::connect(mesh.a.socks5, src, dst).await.is_err());
    let v0 = mesh.a.config_dump().await.unwrap()["version"]
        .as_u64()
        .unwrap();
    // Add a second VIP to the echo service in node A's file.
    let edited = yaml.replace(
        &format!("vips: [\"/{}\"]", a.vip()),
        &format!("vips: [\"/{}\", \"/{new_vip}\"]", a.vip()),
    );
    assert_ne!(edited, yaml);
    weft_conformance::replace_file(&mesh.config_a, &edited).unwrap();
    eventually(Duration::from_secs(30), "new config version", || async {
        let v = mesh.a.config_dump().await.ok()?["version"].as_u64()?;
        (v > v0).then_some(())
    })
    .await;
    let s = socks5::connect(mesh.a.socks5, src, dst).await.unwrap();
    assert_eq!(
        workload::round_trip(s, b"after edit").await.unwrap(),
        b"after edit"
    );
    // A broken edit is refused with its line; the last good config keeps serving.
    let broken = edited.replace(&format!("[{}]", a.client()), "[127.0.0.300]");
    weft_conformance::replace_file(&mesh.config_a, &broken).unwrap();
    let dump = eventually(Duration::from_secs(30), "refused edit", || async {
        let d = mesh.a.config_dump().await.ok()?;
        d["config"]["lastError"].is_string().then_some(d)
    })
    .await;
    let err = dump["config"]["lastError"].as_str().unwrap();
    assert!(
        err.contains("127.0.0.300") && err.contains("line 9"),
        "{err}"
    );
    assert_eq!(
        dump["version"].as_u64().unwrap(),
        v0 + 1,
        "a refused edit must not change the state"
    );
    let s = socks5::connect(mesh.a.socks5, src, dst).await.unwrap();
    assert_eq!(
        workload::round_trip(s, b"still serving").await.unwrap(),
        b"still serving"
    );
    let m = mesh.a.scrape().await.unwrap();
    assert!(
        metric_sum(&m, "weft_config_reloads_refused_total") >= 1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_closes() {
    let a = Addrs { n: 30 };
    let yaml = mesh_yaml(a, "echo");
    let mut mesh = Mesh::start_with(a, &yaml, &yaml, |o| {
        o.extra.push("--drain-deadline".into());
        o.extra.push("1s".into());
    })
    .await
    .unwrap();
    let s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    // An open, idle tunnel holds node B's drain until the deadline, then it is closed.
    let start = std::time::Instant::now();
    assert!(
        mesh.b.terminate(Duration::from_secs(30)).await,
        "node B must exit by itself"
    );
    // A lower bound only (a loaded machine can make the exit later, never earlier): the open tunnel held the drain
    // until its deadline, which the log line below confirms.
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "drain took {took:?}");
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut { s }, &mut buf),
    )
    .await
    .expect("the tunnel must be closed after the drain");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let log = mesh.b.log_tail(20);
    assert!(
        log.contains("drain deadline reached") && log.contains("drained"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_time_out_and_log_level_changes_at_run_time() {
    let a = Addrs { n: 52 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start_with(a, &yaml, &yaml, |o| {
        o.extra.extend(["--idle-timeout".into(), "300ms".into()]);
    })
    .await
    .unwrap();
    let mut s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    let start = std::time::Instant::now();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut s, &mut buf),
    )
    .await
    .expect("an idle connection must be closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    // A lower bound only: the timer cannot fire before 300 ms of silence, however loaded the machine is.
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "closed too early: {:?}",
        start.elapsed()
    );
    // Either node's idle timer may fire first; the other then sees the tunnel end.
    eventually(Duration::from_secs(30), "idle log", || async {
        let mut logs = mesh.a.access_logs();
        logs.extend(mesh.b.access_logs());
        logs.into_iter().find(|l| l["error"] == "idle timeout")
    })
    .await;

    // /logging: read, change, refuse a bad filter.
    let (code, body) = mesh.a.admin_get("/logging").await.unwrap();
    assert_eq!((code, body.trim()), (200, "info"));
    let (code, _) = mesh
        .a
        .http(mesh.a.admin, "POST", "/logging?level=weft_proxy=debug,info")
        .await
        .unwrap();
    assert_eq!(code, 200);
    let (_, body) = mesh.a.admin_get("/logging").await.unwrap();
    assert!(body.contains("weft_proxy=debug"), "{body}");
    let (code, body) = mesh
        .a
        .http(mesh.a.admin, "POST", "/logging?level=[[[")
        .await
        .unwrap();
    assert_eq!(code, 400, "{body}");
    // Debug lines now appear.
    let s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    assert_eq!(workload::round_trip(s, b"x").await.unwrap(), b"x");
    eventually(Duration::from_secs(30), "debug line", || async {
        mesh.a
            .log_lines()
            .into_iter()
            .find(|l| l["level"] == "debug" && l["message"] == "connection established")
    })
    .await;
    // Readiness stays on 127.0.x.254 only where asked; the admin server refuses a non-loopback bind.
    let (code, body) = weft_devmesh::http::get(mesh.a.readiness, "/healthz/ready")
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "ready\n"));
}
