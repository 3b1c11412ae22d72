//! The Delta ADS client against a real gRPC server over real TLS: what it sends (node, headers, initial requests,
//! ACK/NACK), per-type handlers that do not block each other, reconnects with `initial_resource_versions`, and the
//! unsolicited NACK.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use prost_types::value::Kind;
use tokio::sync::{Semaphore, mpsc};
use weft_proto::istio::security::Authorization;
use weft_proto::istio::workload::{Address, Workload, address};
use weft_proto::type_url::{ADDRESS, AUTHORIZATION};
use weft_xds::testing::{Pki, Server, resource, response, within};
use weft_xds::{AdsClient, Delta, Handler, NackSent, NodeInfo, Rejection, SourceConfig};

/// A handler that reports every delta, refuses the names it is told to, and can be held back by a gate.
struct Recorder {
    deltas: mpsc::UnboundedSender<Delta>,
    refuse: Mutex<BTreeSet<String>>,
    gate: Option<Arc<Semaphore>>,
}

impl Recorder {
    fn new(gate: Option<Arc<Semaphore>>) -> (Arc<Self>, mpsc::UnboundedReceiver<Delta>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self {
                deltas: tx,
                refuse: Mutex::new(BTreeSet::new()),
                gate,
            }),
            rx,
        )
    }
}

impl Handler for Recorder {
    fn apply(&self, delta: Delta) -> BoxFuture<'_, Vec<Rejection>> {
        Box::pin(async move {
            if let Some(g) = &self.gate {
                g.acquire().await.unwrap().forget();
            }
            let refuse = self.refuse.lock().unwrap().clone();
            let out = delta
                .upserts
                .iter()
                .filter(|u| refuse.contains(&u.name))
                .map(|u| Rejection::new(&u.name, "refused by the test"))
                .collect();
            let _ = self.deltas.send(delta);
            out
        })
    }
}

fn workload(uid: &str) -> Address {
    Address {
        r#type: Some(address::Type::Workload(Workload {
            uid: uid.into(),
            name: "w".into(),
            namespace: "default".into(),
            addresses: vec![vec![10, 0, 0, 1]],
            ..Default::default()
        })),
    }
}

fn config(pki: &Pki, server: &Server) -> SourceConfig {
    let mut cfg = SourceConfig::new("mesh", server.url());
    cfg.root_cert = Some(pki.root.clone());
    cfg.token_file = Some(pki.token.clone());
    cfg.cluster_id = "east".into();
    cfg.node = NodeInfo {
        instance_ip: Some("10.1.2.3".into()),
        pod_name: "weft-x1".into(),
        pod_namespace: "istio-system".into(),
        node_name: "worker-1".into(),
        ..Default::default()
    };
    cfg
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Delta>) -> Delta {
    within("a delta", rx.recv()).await.unwrap()
}

#[tokio::test]
async fn initial_requests_headers_and_acks_as_ztunnel_sends_them() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (addr_h, mut addr_rx) = Recorder::new(None);
    let (auth_h, mut auth_rx) = Recorder::new(None);
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, addr_h)
        .subscribe(AUTHORIZATION, auth_h)
        .start()
        .unwrap();
    let mut conn = server.accept().await;
    assert_eq!(
        conn.metadata.get("authorization").unwrap(),
        "Bearer token-1"
    );
    assert_eq!(conn.metadata.get("clusterid").unwrap(), "east");
    for type_url in [ADDRESS, AUTHORIZATION] {
        let r = conn.next().await;
        assert_eq!(r.type_url, type_url, "types are requested in order");
        assert!(r.resource_names_subscribe.is_empty() && r.resource_names_unsubscribe.is_empty());
        assert!(r.initial_resource_versions.is_empty() && r.response_nonce.is_empty());
        let node = r.node.unwrap();
        assert_eq!(
            node.id,
            "ztunnel~10.1.2.3~weft-x1.istio-system~istio-system.svc.cluster.local"
        );
        let md = node.metadata.unwrap().fields;
        let s = |k: &str| match md[k].kind.as_ref().unwrap() {
            Kind::StringValue(s) => s.clone(),
            _ => panic!("{k} is not a string"),
        };
        assert_eq!(s("NAME"), "weft-x1");
        assert_eq!(s("NAMESPACE"), "istio-system");
        assert_eq!(s("INSTANCE_IPS"), "10.1.2.3");
        assert_eq!(s("NODE_NAME"), "worker-1");
    }
    assert!(!client.is_synced());
    conn.send(response(
        ADDRESS,
        "n1",
        vec![resource(ADDRESS, "uid-1", "1", &workload("uid-1"))],
        &[],
    ));
    let d = next(&mut addr_rx).await;
    assert_eq!(d.upserts.len(), 1);
    assert_eq!(d.upserts[0].name, "uid-1");
    assert_eq!(
        d.upserts[0].decode::<Address>(ADDRESS).unwrap(),
        workload("uid-1")
    );
    let ack = conn.next().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (ADDRESS, "n1")
    );
    assert!(ack.error_detail.is_none() && ack.node.is_none());
    // An empty first response still completes the sync of its type.
    conn.send(response(AUTHORIZATION, "a1", vec![], &[]));
    assert!(next(&mut auth_rx).await.upserts.is_empty());
    assert_eq!(conn.next().await.response_nonce, "a1");
    let s = within("synced", client.wait_for(|s| s.synced)).await;
    assert!(s.connected && s.connections == 1);
    let a = s.of(ADDRESS).unwrap();
    assert_eq!((a.resources, a.acks, a.nacks), (1, 1, 0));
    assert_eq!(a.last_ack.as_ref().unwrap().system_version_info, "v-n1");
    // ztunnel's istio_xds_message_total / _bytes_total: responses and the bytes of the resources' values.
    let bytes = prost::Message::encoded_len(&workload("uid-1")) as u64;
    assert_eq!((a.responses, a.received_bytes), (1, bytes));
    let z = s.of(AUTHORIZATION).unwrap();
    assert_eq!((z.responses, z.received_bytes), (1, 0));
    client.stop();
}

#[tokio::test]
async fn a_refused_resource_is_nacked_by_name_and_the_rest_applies() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (h, mut rx) = Recorder::new(None);
    h.refuse.lock().unwrap().insert("bad".into());
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, h)
        .start()
        .unwrap();
    let mut conn = server.accept().await;
    conn.next_of(ADDRESS).await;
    let mut no_body = resource(ADDRESS, "empty", "1", &workload("empty"));
    no_body.resource = None;
    conn.send(response(
        ADDRESS,
        "n1",
        vec![
            resource(ADDRESS, "good", "1", &workload("good")),
            resource(ADDRESS, "bad", "1", &workload("bad")),
            no_body,
        ],
        &[],
    ));
    let d = next(&mut rx).await;
    let names: Vec<&str> = d.upserts.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        names,
        ["bad", "good"],
        "the handler sees every resource with a body"
    );
    let nack = conn.next().await;
    assert_eq!(nack.response_nonce, "n1");
    let e = nack.error_detail.unwrap();
    assert_eq!(e.code, weft_xds::NACK_CODE);
    assert_eq!(
        e.message,
        "bad: refused by the test; empty: the resource has no body"
    );
    let s = within(
        "the NACK recorded",
        client.wait_for(|s| s.of(ADDRESS).unwrap().nacks == 1),
    )
    .await;
    let t = s.of(ADDRESS).unwrap();
    assert!(
        t.synced,
        "a partly refused first response still completes the sync"
    );
    assert_eq!(t.resources, 1, "only the good resource is held");
    assert!(t.last_nack.as_ref().unwrap().solicited);
    client.stop();
}

#[tokio::test]
async fn a_slow_handler_delays_only_its_own_type_and_its_responses_merge() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let gate = Arc::new(Semaphore::new(0));
    let (slow, mut slow_rx) = Recorder::new(Some(gate.clone()));
    let (fast, mut fast_rx) = Recorder::new(None);
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, slow)
        .subscribe(AUTHORIZATION, fast)
        .start()
        .unwrap();
    let mut conn = server.accept().await;
    conn.next_of(AUTHORIZATION).await;
    conn.send(response(
        ADDRESS,
        "n1",
        vec![resource(ADDRESS, "a", "1", &workload("a"))],
        &[],
    ));
    // The Address handler is now stuck; Authorization is answered regardless.
    within(
        "the slow handler to start",
        client.wait_for(|s| s.of(ADDRESS).unwrap().responses == 1),
    )
    .await;
    conn.send(response(
        AUTHORIZATION,
        "p1",
        vec![resource(
            AUTHORIZATION,
            "ns/p",
            "1",
            &Authorization::default(),
        )],
        &[],
    ));
    assert_eq!(next(&mut fast_rx).await.upserts.len(), 1);
    assert_eq!(conn.next().await.response_nonce, "p1");
    // Two more Address responses while the handler is busy: merged into one delta, answered once.
    conn.send(response(
        ADDRESS,
        "n2",
        vec![
            resource(ADDRESS, "a", "2", &workload("a")),
            resource(ADDRESS, "b", "1", &workload("b")),
        ],
        &[],
    ));
    conn.send(response(ADDRESS, "n3", vec![], &["b"]));
    within(
        "both queued",
        client.wait_for(|s| s.of(ADDRESS).unwrap().queued == 2),
    )
    .await;
    gate.add_permits(2);
    let first = next(&mut slow_rx).await;
    assert_eq!(
        (first.upserts[0].version.as_str(), first.responses),
        ("1", 1)
    );
    assert_eq!(conn.next().await.response_nonce, "n1");
    let merged = next(&mut slow_rx).await;
    assert_eq!(merged.responses, 2);
    assert_eq!(merged.upserts.len(), 1);
    assert_eq!(
        (
            merged.upserts[0].name.as_str(),
            merged.upserts[0].version.as_str()
        ),
        ("a", "2")
    );
    assert_eq!(merged.removals, ["b"]);
    assert_eq!(conn.next().await.response_nonce, "n3");
    client.stop();
}

#[tokio::test]
async fn reconnects_with_the_versions_it_holds_and_a_fresh_token() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (h, mut rx) = Recorder::new(None);
    h.refuse.lock().unwrap().insert("bad".into());
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, h.clone())
        .start()
        .unwrap();
    let mut conn = server.accept().await;
    conn.next_of(ADDRESS).await;
    conn.send(response(
        ADDRESS,
        "n1",
        vec![
            resource(ADDRESS, "a", "1", &workload("a")),
            resource(ADDRESS, "b", "1", &workload("b")),
            resource(ADDRESS, "bad", "1", &workload("bad")),
        ],
        &[],
    ));
    next(&mut rx).await;
    conn.next().await;
    // b is removed, a moves to version 2; then bad is fixed at version 2 but refused again at version 3.
    h.refuse.lock().unwrap().clear();
    conn.send(response(
        ADDRESS,
        "n2",
        vec![
            resource(ADDRESS, "a", "2", &workload("a")),
            resource(ADDRESS, "bad", "2", &workload("bad")),
        ],
        &["b"],
    ));
    next(&mut rx).await;
    conn.next().await;
    h.refuse.lock().unwrap().insert("bad".into());
    conn.send(response(
        ADDRESS,
        "n3",
        vec![resource(ADDRESS, "bad", "3", &workload("bad"))],
        &[],
    ));
    next(&mut rx).await;
    assert!(conn.next().await.error_detail.is_some());

    // The control plane dies mid-stream and comes back with the token rotated.
    std::fs::write(&pki.token, "token-2").unwrap();
    server.restart().await;
    let s = within(
        "the disconnect",
        client.wait_for(|s| s.connections == 2 || !s.connected),
    )
    .await;
    assert!(s.synced, "a lost stream does not make the source unsynced");
    let mut conn = server.accept().await;
    assert_eq!(
        conn.metadata.get("authorization").unwrap(),
        "Bearer token-2"
    );
    let r = conn.next_of(ADDRESS).await;
    let held: Vec<(&str, &str)> = r
        .initial_resource_versions
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect();
    assert_eq!(
        held,
        [("a", "2"), ("bad", "2")],
        "what the node serves, not what it refused"
    );
    assert!(r.node.is_some());
    let s = within(
        "reconnected",
        client.wait_for(|s| s.connected && s.connections == 2),
    )
    .await;
    assert!(s.last_disconnect.is_some());
    client.stop();
}

#[tokio::test]
async fn unsolicited_nack_carries_details_on_the_latest_nonce() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (h, mut rx) = Recorder::new(None);
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, h)
        .start()
        .unwrap();
    let rejection = Rejection::new("a", "rolled back: 9 of 10 calls trapped");
    assert_eq!(
        client.nack(ADDRESS, &rejection, vec![]).unwrap(),
        NackSent::NotSent
    );
    let mut conn = server.accept().await;
    conn.next_of(ADDRESS).await;
    conn.send(response(
        ADDRESS,
        "n7",
        vec![resource(ADDRESS, "a", "1", &workload("a"))],
        &[],
    ));
    next(&mut rx).await;
    conn.next().await;
    within(
        "held",
        client.wait_for(|s| s.of(ADDRESS).unwrap().resources == 1),
    )
    .await;
    let detail = prost_types::Any {
        type_url: weft_proto::type_url::ROLLBACK_REPORT.into(),
        value: vec![1, 2, 3],
    };
    assert_eq!(
        client
            .nack(ADDRESS, &rejection, vec![detail.clone()])
            .unwrap(),
        NackSent::Sent
    );
    let n = conn.next().await;
    assert_eq!(n.response_nonce, "n7");
    let e = n.error_detail.unwrap();
    assert_eq!(e.message, "a: rolled back: 9 of 10 calls trapped");
    assert_eq!(e.details, [detail]);
    let s = client.status();
    let t = s.of(ADDRESS).unwrap();
    assert_eq!(t.resources, 0, "a reconnect asks for it again");
    assert!(!t.last_nack.as_ref().unwrap().solicited);
    assert!(client.nack(AUTHORIZATION, &rejection, vec![]).is_err());
    client.stop();
}

#[tokio::test]
async fn a_response_of_a_type_not_subscribed_is_nacked() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (h, _rx) = Recorder::new(None);
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, h)
        .start()
        .unwrap();
    let mut conn = server.accept().await;
    conn.next_of(ADDRESS).await;
    conn.send(response(AUTHORIZATION, "x1", vec![], &[]));
    let n = conn.next().await;
    assert_eq!(
        (n.type_url.as_str(), n.response_nonce.as_str()),
        (AUTHORIZATION, "x1")
    );
    assert!(
        n.error_detail
            .unwrap()
            .message
            .contains("did not subscribe")
    );
    client.stop();
}

#[tokio::test]
async fn a_server_error_or_an_untrusted_certificate_is_retried() {
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let (h, _rx) = Recorder::new(None);
    let client = AdsClient::new(config(&pki, &server))
        .subscribe(ADDRESS, h)
        .start()
        .unwrap();
    let conn = server.accept().await;
    conn.fail(tonic::Status::unauthenticated("authentication failure"));
    let s = within(
        "the failure",
        client.wait_for(|s| s.last_disconnect.is_some()),
    )
    .await;
    assert!(
        s.last_disconnect
            .unwrap()
            .reason
            .contains("authentication failure")
    );
    // ztunnel counts an Unauthenticated status as reason "Error".
    assert_eq!(
        s.terminations.by_reason(),
        [
            ("ConnectionError", 0),
            ("Error", 1),
            ("Reconnect", 0),
            ("Complete", 0)
        ]
    );
    let _again = server.accept().await;
    client.stop();

    // A client that trusts another root never opens a stream, and says why.
    let other = Pki::new();
    let mut cfg = config(&other, &server);
    cfg.root_cert = Some(other.root.clone());
    let (h, _rx) = Recorder::new(None);
    let client = AdsClient::new(cfg).subscribe(ADDRESS, h).start().unwrap();
    let s = within(
        "connect failures",
        client.wait_for(|s| s.connect_failures >= 2),
    )
    .await;
    assert!(!s.connected && s.connections == 0);
    assert!(
        s.terminations.connection_error >= 2 && s.terminations.error == 0,
        "{:?}",
        s.terminations
    );
    let why = s.last_connect_error.unwrap().reason;
    assert!(
        why.contains("certificate") || why.contains("UnknownIssuer"),
        "{why}"
    );
    assert!(
        server.conns.try_recv().is_err(),
        "no stream reached the server"
    );
    client.stop();
}

#[tokio::test]
async fn several_sources_at_once_each_with_its_own_server_root_and_types() {
    let (pki_a, pki_b) = (Pki::new(), Pki::new());
    let mut mesh = Server::start(pki_a.server_tls(&["localhost"])).await;
    let mut plugins = Server::start(pki_b.server_tls(&["127.0.0.1"])).await;
    let (ha, mut rx_a) = Recorder::new(None);
    let (hb, mut rx_b) = Recorder::new(None);
    let a = AdsClient::new(config(&pki_a, &mesh))
        .subscribe(ADDRESS, ha)
        .start()
        .unwrap();
    let mut cfg_b = SourceConfig::new(
        "plugins",
        format!("https://127.0.0.1:{}", plugins.addr.port()),
    );
    cfg_b.root_cert = Some(pki_b.root.clone());
    let b = AdsClient::new(cfg_b)
        .subscribe(weft_proto::type_url::EXTENSION_CONFIG, hb)
        .start()
        .unwrap();
    let mut ca = mesh.accept().await;
    let mut cb = plugins.accept().await;
    assert_eq!(ca.next().await.type_url, ADDRESS);
    assert_eq!(
        cb.next().await.type_url,
        weft_proto::type_url::EXTENSION_CONFIG
    );
    assert!(
        cb.metadata.get("authorization").is_none(),
        "no token file, no header"
    );
    ca.send(response(ADDRESS, "a1", vec![], &[]));
    cb.send(response(
        weft_proto::type_url::EXTENSION_CONFIG,
        "b1",
        vec![],
        &[],
    ));
    next(&mut rx_a).await;
    next(&mut rx_b).await;
    within("both synced", a.wait_for(|s| s.synced)).await;
    within("both synced", b.wait_for(|s| s.synced)).await;
    assert_eq!((a.name(), b.name()), ("mesh", "plugins"));
    a.stop();
    b.stop();
}
