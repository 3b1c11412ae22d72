//! The default plugins in real weft processes: istio-authz enforces Istio L4 policies from the mesh file
//! (HBONE 401 on deny; a policy change closes live connections now denied) and istio-telemetry exports Istio's
//! standard TCP metrics with ztunnel's names and labels.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml, metric_sum};
use weft_devmesh::{socks5, workload};

const DENY_OTHER: &str = r#"policies:
- name: only-8080
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - notDestinationPorts: [8080]
"#;

fn deny_client(principal: &str) -> String {
    format!(
        r#"policies:
- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact {principal}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_plugins_enforce_policies_and_export_istio_metrics() {
    let a = Addrs { n: 48 };
    let base = mesh_yaml(a, "echo");
    let mesh = Mesh::start_with(a, &base, &format!("{base}{DENY_OTHER}"), |o| {
        o.extra.extend(["--config-poll".into(), "10ms".into()]);
    })
    .await
    .unwrap();
    let dump = mesh.b.config_dump().await.unwrap();
    let names: Vec<&str> = dump["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "serving")
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["istio-authz", "istio-telemetry"],
        "{}",
        dump["plugins"]
    );
    let _e = workload::echo_server(SocketAddr::from((a.echo(), 8081)))
        .await
        .unwrap();
    let src = Some(IpAddr::V4(a.client()));

    let s = socks5::connect(mesh.a.socks5, src, SocketAddr::from((a.echo(), 8080)))
        .await
        .unwrap();
    assert_eq!(
        workload::round_trip(s, b"allowed").await.unwrap(),
        b"allowed"
    );
    // Through the service VIP: node B learns the service from `forwarded: ...;host=`.
    let s = socks5::connect(mesh.a.socks5, src, SocketAddr::from((a.vip(), 80)))
        .await
        .unwrap();
    assert_eq!(
        workload::round_trip(s, b"via vip").await.unwrap(),
        b"via vip"
    );
    // The Namespace DENY for any port but 8080: node B answers 401.
    let r = socks5::connect(mesh.a.socks5, src, SocketAddr::from((a.echo(), 8081))).await;
    assert!(matches!(r, Err(socks5::Socks5Error::Reply(2))), "{r:?}");
    let denied = eventually(Duration::from_secs(30), "deny log", || async {
        mesh.b.access_logs().into_iter().find(|l| {
            l["error"]
                .as_str()
                .is_some_and(|e| e.contains("default/only-8080"))
        })
    })
    .await;
    assert!(
        denied["error"].as_str().unwrap().contains("istio-authz"),
        "{denied}"
    );

    // Istio's metrics, as ztunnel names and labels them.
    // Telemetry events reach the plugin through its queue: wait until the three closes and the denial are counted.
    let m = eventually(Duration::from_secs(30), "istio metrics", || async {
        let m = mesh.b.scrape().await.ok()?;
        let denied = m.lines().any(|l| {
            l.starts_with("istio_tcp_connections_failed_total{")
                && l.contains("response_flags=\"DENY\"")
        });
        (metric_sum(&m, "istio_tcp_connections_closed_total{") >= 3.0 && denied).then_some(m)
    })
    .await;
    let opened: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total{"))
        .collect();
    assert!(!opened.is_empty(), "{m}");
    let line = opened
        .iter()
        .find(|l| l.contains("response_flags=\"-\""))
        .unwrap();
    for label in [
        "reporter=\"destination\"",
        "source_workload=\"client\"",
        "source_workload_namespace=\"default\"",
        "source_principal=\"spiffe://cluster.local/ns/default/sa/client\"",
        "destination_workload=\"echo\"",
        "destination_workload_namespace=\"default\"",
        "destination_principal=\"spiffe://cluster.local/ns/default/sa/echo\"",
        "request_protocol=\"tcp\"",
        "connection_security_policy=\"mutual_tls\"",
        "source_cluster=",
        "destination_region=",
    ] {
        assert!(line.contains(label), "missing {label} in {line}");
    }
    assert!(
        metric_sum(&m, "istio_tcp_received_bytes_total{") >= 7.0,
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("istio_tcp_connections_failed_total{")
                && l.contains("response_flags=\"DENY\"")),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_change_closes_live_connections_now_denied() {
    let a = Addrs { n: 50 };
    let base = mesh_yaml(a, "echo");
    let mesh = Mesh::start_with(a, &base, &base, |o| {
        o.extra.extend(["--config-poll".into(), "10ms".into()]);
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
    s.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).await.unwrap();
    // Now deny this client: the open tunnel is re-checked and closed.
    std::fs::write(
        &mesh.config_b,
        format!(
            "{base}{}",
            deny_client("cluster.local/ns/default/sa/client")
        ),
    )
    .unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "the live connection must be closed: {n:?}"
    );
    let l = eventually(Duration::from_secs(30), "re-check log", || async {
        mesh.b
            .access_logs()
            .into_iter()
            .find(|l| l["error"].as_str().is_some_and(|e| e.contains("re-check")))
    })
    .await;
    assert!(
        l["error"].as_str().unwrap().contains("default/deny-client"),
        "{l}"
    );
    let m = mesh.b.scrape().await.unwrap();
    assert_eq!(
        metric_sum(&m, "weft_policy_recheck_closed_total"),
        1.0,
        "{m}"
    );
    // And new connections are denied.
    let r = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await;
    assert!(matches!(r, Err(socks5::Socks5Error::Reply(2))), "{r:?}");
}

/// With the default plugins off, nothing enforces the mesh's policies: node B then denies connections to the
/// workloads they apply to, logs the policy, counts it and lists it in `/config_dump`, unless the operator passes
/// `--allow-unenforced-policies` (ztunnel always enforces them; weft must not drop them by accident).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_no_plugin_enforces_fail_closed_unless_allowed() {
    for (n, allow) in [(54u8, false), (56, true)] {
        let a = Addrs { n };
        let base = mesh_yaml(a, "echo");
        let mesh = Mesh::start_with(a, &base, &format!("{base}{DENY_OTHER}"), |o| {
            o.extra.extend(["--default-plugins".into(), "false".into()]);
            if allow {
                o.extra.push("--allow-unenforced-policies".into());
            }
        })
        .await
        .unwrap();
        let src = Some(IpAddr::V4(a.client()));
        let r = socks5::connect(mesh.a.socks5, src, SocketAddr::from((a.echo(), 8080))).await;
        let dump = mesh.b.config_dump().await.unwrap();
        let listed = dump["unenforcedPolicies"].as_array().unwrap().clone();
        if allow {
            let s = r.unwrap();
            assert_eq!(
                workload::round_trip(s, b"opted out").await.unwrap(),
                b"opted out"
            );
            assert!(listed.is_empty(), "{listed:?}");
        } else {
            assert!(matches!(r, Err(socks5::Socks5Error::Reply(2))), "{r:?}");
            assert_eq!(listed.len(), 1, "{listed:?}");
            assert!(
                listed[0].as_str().unwrap().contains("default/only-8080"),
                "{listed:?}"
            );
            let m = mesh.b.scrape().await.unwrap();
            assert_eq!(
                metric_sum(
                    &m,
                    "weft_plugin_unenforced_policy_denials_total{policy=\"default/only-8080\"}"
                ),
                1.0,
                "{m}"
            );
            let logged = eventually(Duration::from_secs(10), "the policy logged", || async {
                mesh.b
                    .log_lines()
                    .into_iter()
                    .find(|l| l["policy"] == "default/only-8080" && l["level"] == "error")
            })
            .await;
            assert!(
                logged["message"]
                    .as_str()
                    .unwrap()
                    .contains("no serving policy plugin enforces"),
                "{logged}"
            );
        }
    }
}
