//! The DNS proxy of a real `weft run` node, asked by `dig` (Debian's dnsutils) from workload addresses: mesh
//! names answered authoritatively (VIPs by family, headless endpoints, short names through the search domain,
//! the CNAME a search-completed name gets), misses forwarded to a real upstream and cached, TCP as well as UDP,
//! refused for sources that are not this node's mesh workloads, and a malformed query that leaves it serving.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use weft_conformance::dig::{data, dig};
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml, metric_sum};
use weft_devmesh::dns::{RecordType, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_against_a_running_node() {
    let a = Addrs { n: 160 };
    let up = Upstream::start(
        IpAddr::V4(Ipv4Addr::new(127, 0, 160, 53)),
        &[("www.example.org.", 300, vec![Ipv4Addr::new(192, 0, 2, 80)])],
    )
    .await
    .unwrap();
    let extra_services = r#"- name: db
  namespace: default
  hostname: db.default.svc.cluster.local
- name: dual
  namespace: default
  hostname: dual.default.svc.cluster.local
  vips: ["/127.10.160.2", "/fd00:10::2"]
"#;
    // The echo workload also backs the headless `db` service.
    let yaml = mesh_yaml(a, "echo")
        .replace(
            "    default/echo.default.svc.cluster.local:\n      80: 8080\n",
            "    default/echo.default.svc.cluster.local:\n      80: 8080\n    default/db.default.svc.cluster.local: {}\n",
        )
        + extra_services;
    let upstream = up.addr.to_string();
    let mesh = Mesh::start_with(a, &yaml, &yaml, |o| {
        o.extra.extend(["--dns-upstream".into(), upstream.clone()]);
    })
    .await
    .unwrap();
    let dns = mesh.a.dns;
    let client = a.client();

    for tcp in [false, true] {
        let t: &[&str] = if tcp { &["+tcp"] } else { &[] };
        // The service VIP, authoritative, TTL 30.
        let d = dig(
            dns,
            client,
            &[t, &["echo.default.svc.cluster.local", "A"]].concat(),
        );
        assert_eq!(d.status, "NOERROR", "{d:?}");
        assert!(d.flags.contains(&"aa".to_owned()), "{d:?}");
        assert_eq!(data(&d, "A"), [a.vip().to_string()]);
        assert_eq!(d.answers[0].1, 30);
        // The name exists, the family does not: NOERROR and no answer.
        let d = dig(
            dns,
            client,
            &[t, &["echo.default.svc.cluster.local", "AAAA"]].concat(),
        );
        assert_eq!(d.status, "NOERROR", "{d:?}");
        assert!(
            d.answers.is_empty() && d.flags.contains(&"aa".to_owned()),
            "{d:?}"
        );
        let d = dig(
            dns,
            client,
            &[t, &["dual.default.svc.cluster.local", "AAAA"]].concat(),
        );
        assert_eq!(data(&d, "AAAA"), ["fd00:10::2"]);
        // Headless: the endpoint's address.
        let d = dig(
            dns,
            client,
            &[t, &["db.default.svc.cluster.local", "A"]].concat(),
        );
        assert_eq!(data(&d, "A"), [a.echo().to_string()], "{d:?}");
    }
    // A short name through the pod's search domain (dig's +domain sets the search list), as a pod's resolver
    // with ndots:5 sends it.
    let d = dig(
        dns,
        client,
        &["+domain=default.svc.cluster.local", "+ndots=5", "echo", "A"],
    );
    assert_eq!(d.answers[0].0, "echo.default.svc.cluster.local.");
    assert_eq!(data(&d, "A"), [a.vip().to_string()]);
    // `echo.default` completed with the first search domain: a CNAME to the name meant, then its address.
    let d = dig(
        dns,
        client,
        &["echo.default.default.svc.cluster.local", "A"],
    );
    assert_eq!(data(&d, "CNAME"), ["echo.default."], "{d:?}");
    assert_eq!(data(&d, "A"), [a.vip().to_string()]);
    assert_eq!(up.total(), 0, "mesh names never reach the upstream");

    // Outside the mesh: forwarded, not authoritative, then answered from the cache.
    for _ in 0..2 {
        let d = dig(dns, client, &["www.example.org", "A"]);
        assert_eq!(d.status, "NOERROR", "{d:?}");
        assert!(!d.flags.contains(&"aa".to_owned()), "{d:?}");
        assert_eq!(data(&d, "A"), ["192.0.2.80"]);
    }
    assert_eq!(
        up.asked("www.example.org.", RecordType::A),
        1,
        "the second answer came from the cache"
    );
    let d = dig(dns, client, &["+tcp", "nothing.example", "A"]);
    assert_eq!(d.status, "NXDOMAIN", "{d:?}");

    // Not this node's mesh workload: an address of no workload, and node B's workload.
    for src in [Ipv4Addr::new(127, 0, 160, 9), a.echo()] {
        for tcp in [&[][..], &["+tcp"][..]] {
            let d = dig(
                dns,
                src,
                &[tcp, &["echo.default.svc.cluster.local", "A"]].concat(),
            );
            assert_eq!(d.status, "REFUSED", "{src} {d:?}");
            assert!(d.answers.is_empty());
        }
    }
    let d = dig(
        dns,
        Ipv4Addr::new(127, 0, 160, 9),
        &["www.example.org", "A"],
    );
    assert_eq!(d.status, "REFUSED");

    // Malformed: a header that promises a question it does not carry gets FORMERR; the node keeps serving.
    let s = tokio::net::UdpSocket::bind((client, 0)).await.unwrap();
    s.send_to(&[0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0], dns)
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(30), s.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(n >= 12);
    assert_eq!(&buf[..2], &[0x12, 0x34]);
    assert_eq!(buf[3] & 0x0f, 1, "RCODE FORMERR");
    let d = dig(dns, client, &["echo.default.svc.cluster.local", "A"]);
    assert_eq!(d.status, "NOERROR");

    // Counted on the node's metrics endpoint.
    let m = eventually(Duration::from_secs(30), "DNS metrics", || async {
        let m = mesh.a.scrape().await.ok()?;
        (metric_sum(
            &m,
            "weft_dns_requests_total{transport=\"udp\",result=\"refused\"}",
        ) >= 3.0)
            .then_some(m)
    })
    .await;
    assert!(
        metric_sum(
            &m,
            "weft_dns_requests_total{transport=\"tcp\",result=\"answered\"}"
        ) >= 3.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "weft_dns_requests_total{transport=\"udp\",result=\"formerr\"}"
        ),
        1.0
    );
    assert!(metric_sum(&m, "weft_dns_cache_hits_total") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_off_binds_nothing() {
    let a = Addrs { n: 162 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start_with(a, &yaml, &yaml, |o| {
        o.extra.extend(["--dns".into(), "off".into()]);
    })
    .await
    .unwrap();
    // Nothing listens on the DNS address: a TCP connect is refused.
    let e = tokio::net::TcpStream::connect(mesh.a.dns)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
}
