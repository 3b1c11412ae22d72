//! Leader election (`kube::leader`) and the replicas' reports (`kube::report`) against the Kubernetes API-server
//! stand-in: one leader at a time, the Lease released on a clean stop and taken over only after expiry on a
//! crash, a live holder respected, a leader cut off from the API stepping down before another takes over, and the
//! reports merged newest-first with stale and unreadable ones ignored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test panics to fail

use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use weft_control::ads::metrics::Metrics;
use weft_control::ads::registry::{NodeRecord, Registry, Sent};
use weft_control::kube::report::{self, NodeReport, Report};
use weft_control::kube::{KubeOptions, client, leader};
use weft_kubeapi::{ApiServer, Resource, WatchStream};
use weft_proto::type_url;
use weft_testkit::{PATIENCE, eventually};

const NS: &str = "weft-system";

fn opts(server: &ApiServer, replica: &str, lease: Duration, retry: Duration) -> KubeOptions {
    KubeOptions {
        api: server.url(),
        ca_file: None,
        token_file: None,
        root_namespace: "istio-system".into(),
        cluster_id: "Kubernetes".into(),
        namespace: NS.into(),
        replica: replica.into(),
        lease_duration: lease,
        retry_period: retry,
    }
}

/// One replica's elector.
struct Elector {
    name: String,
    leads: watch::Receiver<bool>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn elector(o: &KubeOptions) -> Elector {
    let kube = client::build(o).unwrap();
    let (tx, leads) = watch::channel(false);
    let stop = CancellationToken::new();
    let task = tokio::spawn(leader::run(kube, o.clone(), tx, stop.clone()));
    Elector {
        name: o.replica.clone(),
        leads,
        stop,
        task,
    }
}

/// Wait until `e` says it leads.
async fn leads(e: &mut Elector) -> Instant {
    tokio::time::timeout(PATIENCE, e.leads.wait_for(|l| *l))
        .await
        .unwrap_or_else(|_| panic!("{} leads within {PATIENCE:?}", e.name))
        .expect("the elector is running");
    Instant::now()
}

/// Of two electors, the index of the one that leads once one does; fails if both say they lead.
async fn one_leads(es: &[Elector; 2]) -> usize {
    eventually("one of the two electors leads", || {
        let (a, b) = (*es[0].leads.borrow(), *es[1].leads.borrow());
        assert!(!(a && b), "both electors lead at once");
        std::future::ready(if a {
            Some(0)
        } else if b {
            Some(1)
        } else {
            None
        })
    })
    .await
}

/// A task that ends with `true` as soon as both receivers say they lead (or `false` once either elector ended).
fn overlap(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>) -> JoinHandle<bool> {
    tokio::spawn(async move {
        loop {
            let (la, lb) = (*a.borrow_and_update(), *b.borrow_and_update());
            if la && lb {
                return true;
            }
            tokio::select! {
                r = a.changed() => if r.is_err() { return false },
                r = b.changed() => if r.is_err() { return false },
            }
        }
    })
}

fn lease(server: &ApiServer) -> Value {
    server
        .get(Resource::Lease, NS, leader::LEASE)
        .expect("the leader Lease exists")
}

fn holder(lease: &Value) -> Option<String> {
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

fn transitions(lease: &Value) -> i64 {
    lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0)
}

/// A watch of the Leases of [`NS`] from now on.
async fn watch_leases(server: &ApiServer) -> WatchStream {
    let w = server
        .client()
        .watch(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases?watch=1"
        ))
        .await
        .unwrap();
    assert_eq!(w.code, 200);
    w
}

/// The holders the Lease had, in order (consecutive repeats folded), read from `w` until `until` holds it.
async fn holders_until(w: &mut WatchStream, until: &str) -> Vec<Option<String>> {
    let mut seen: Vec<Option<String>> = Vec::new();
    loop {
        let ev = tokio::time::timeout(PATIENCE, w.next())
            .await
            .expect("a Lease event")
            .unwrap()
            .expect("the watch is open");
        if ev["object"]["metadata"]["name"] != json!(leader::LEASE) {
            continue;
        }
        let h = holder(&ev["object"]);
        if seen.last() != Some(&h) {
            seen.push(h.clone());
        }
        if h.as_deref() == Some(until) {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_clean_stop_releases_the_lease_and_the_other_replica_takes_over_at_once() {
    let server = ApiServer::start().await.unwrap();
    let mut events = watch_leases(&server).await;
    // A long lease: a takeover well within it can only come from the release.
    let lease_duration = Duration::from_secs(10);
    let retry = Duration::from_millis(100);
    let mut es = [
        elector(&opts(&server, "replica-a", lease_duration, retry)),
        elector(&opts(&server, "replica-b", lease_duration, retry)),
    ];
    let both = overlap(es[0].leads.clone(), es[1].leads.clone());
    let first = one_leads(&es).await;
    let other = 1 - first;
    let (leader_name, other_name) = (es[first].name.clone(), es[other].name.clone());
    let l = lease(&server);
    assert_eq!(holder(&l).as_deref(), Some(leader_name.as_str()));
    assert_eq!(transitions(&l), 0, "{l}");
    // The other stays a follower while the leader renews (many retry periods).
    let gets = server.requests("get");
    assert!(
        tokio::time::timeout(retry * 15, es[other].leads.wait_for(|l| *l))
            .await
            .is_err(),
        "{other_name} took a Lease {leader_name} renews"
    );
    assert!(
        server.requests("get") >= gets + 10,
        "both electors kept reading the Lease"
    );
    assert!(*es[first].leads.borrow());
    assert_eq!(
        holder(&lease(&server)).as_deref(),
        Some(leader_name.as_str())
    );

    let stopped = Instant::now();
    es[first].stop.cancel();
    let [a, b] = es;
    let (mut stopping, mut taking) = if first == 0 { (a, b) } else { (b, a) };
    tokio::time::timeout(PATIENCE, &mut stopping.task)
        .await
        .expect("the stopped elector ends")
        .unwrap();
    assert!(
        !*stopping.leads.borrow(),
        "a stopped elector no longer leads"
    );
    let took = leads(&mut taking).await;
    assert!(
        took - stopped < lease_duration / 2,
        "{other_name} took over {:?} after the stop: not at once",
        took - stopped
    );
    // The stopping replica released the Lease (holder cleared) before the other took it.
    assert_eq!(
        holders_until(&mut events, &other_name).await,
        [
            None,
            Some(leader_name.clone()),
            None,
            Some(other_name.clone())
        ]
        .into_iter()
        .skip(1)
        .collect::<Vec<_>>(),
        "the Lease's holders, in order"
    );
    let l = lease(&server);
    assert_eq!(holder(&l).as_deref(), Some(other_name.as_str()));
    assert_eq!(transitions(&l), 1, "{l}");

    taking.stop.cancel();
    tokio::time::timeout(PATIENCE, taking.task)
        .await
        .unwrap()
        .unwrap();
    assert!(!both.await.unwrap(), "two electors led at once");
    assert_eq!(holder(&lease(&server)), None, "released on the last stop");
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_only_after_its_lease_expires() {
    let server = ApiServer::start().await.unwrap();
    let mut events = watch_leases(&server).await;
    let lease_duration = Duration::from_secs(2);
    let retry = Duration::from_millis(100);
    let es = [
        elector(&opts(&server, "replica-a", lease_duration, retry)),
        elector(&opts(&server, "replica-b", lease_duration, retry)),
    ];
    let first = one_leads(&es).await;
    let [a, b] = es;
    let (crashing, mut taking) = if first == 0 { (a, b) } else { (b, a) };
    let l = lease(&server);
    assert_eq!(holder(&l).as_deref(), Some(crashing.name.as_str()));
    assert_eq!(transitions(&l), 0, "{l}");
    // Let it renew a few times, so the follower has seen the Lease live.
    let rv = l["metadata"]["resourceVersion"].clone();
    eventually("the leader renews its Lease", || {
        std::future::ready((lease(&server)["metadata"]["resourceVersion"] != rv).then_some(()))
    })
    .await;
    assert!(!*taking.leads.borrow());

    // A crash: the task is gone without releasing anything.
    let crashed = Instant::now();
    crashing.task.abort();
    let took = leads(&mut taking).await;
    // The last renewal was at most about one retry period before the crash; the follower waits out the whole
    // duration from when it saw it.
    assert!(
        took - crashed >= lease_duration - retry * 5,
        "{} took over {:?} after the crash, before the {lease_duration:?} lease expired",
        taking.name,
        took - crashed
    );
    assert_eq!(
        holders_until(&mut events, &taking.name).await,
        vec![Some(crashing.name.clone()), Some(taking.name.clone())],
        "no release on a crash: the Lease went from holder to holder"
    );
    let l = lease(&server);
    assert_eq!(holder(&l).as_deref(), Some(taking.name.as_str()));
    assert_eq!(transitions(&l), 1, "{l}");

    taking.stop.cancel();
    tokio::time::timeout(PATIENCE, taking.task)
        .await
        .unwrap()
        .unwrap();
}

/// A TCP proxy to `upstream` that forwards nothing while `frozen` is true (a stalled connection: requests get
/// no answer, nothing is reset). Counts the chunks it forwarded upstream.
async fn stalling_proxy(
    upstream: SocketAddr,
) -> (SocketAddr, watch::Sender<bool>, Arc<AtomicUsize>) {
    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: watch::Receiver<bool>,
        forwarded: Option<Arc<AtomicUsize>>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if let Some(c) = &forwarded {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    let forwarded = Arc::new(AtomicUsize::new(0));
    let counter = forwarded.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let Ok(up) = TcpStream::connect(upstream).await else {
                continue;
            };
            let ((dr, dw), (ur, uw)) = (down.into_split(), up.into_split());
            tokio::spawn(pipe(dr, uw, rx.clone(), Some(counter.clone())));
            tokio::spawn(pipe(ur, dw, rx.clone(), None));
        }
    });
    (addr, tx, forwarded)
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_steps_down_before_another_takes_over() {
    let server = ApiServer::start().await.unwrap();
    let (proxy, frozen, forwarded) = stalling_proxy(server.addr()).await;
    // Not a whole number of seconds: the Lease says it in seconds.
    let lease_duration = Duration::from_millis(1900);
    let retry = Duration::from_millis(100);
    let mut cut = opts(&server, "replica-a", lease_duration, retry);
    cut.api = format!("http://{proxy}");
    let mut a = elector(&cut);
    leads(&mut a).await;
    let mut b = elector(&opts(&server, "replica-b", lease_duration, retry));
    let both = overlap(a.leads.clone(), b.leads.clone());
    let gets = server.requests("get");
    eventually("replica-b reads the Lease", || {
        std::future::ready((server.requests("get") > gets + 5).then_some(()))
    })
    .await;
    assert!(!*b.leads.borrow());

    // Replica-a's connection stalls: its renewals get no answer (no error either).
    frozen.send_replace(true);
    leads(&mut b).await;
    assert!(
        !*a.leads.borrow(),
        "replica-a still says it leads after replica-b took the Lease over"
    );
    assert_eq!(holder(&lease(&server)).as_deref(), Some("replica-b"));

    // Its connection back, replica-a follows.
    let sent = forwarded.load(Ordering::Relaxed);
    frozen.send_replace(false);
    eventually("replica-a's requests get through again", || {
        std::future::ready((forwarded.load(Ordering::Relaxed) > sent + 10).then_some(()))
    })
    .await;
    assert!(!*a.leads.borrow() && *b.leads.borrow());
    assert_eq!(holder(&lease(&server)).as_deref(), Some("replica-b"));
    for e in [a, b] {
        e.stop.cancel();
        tokio::time::timeout(PATIENCE, e.task)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(!both.await.unwrap(), "two electors led at once");
}

fn now_micro() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap()
}

fn foreign_lease(holder: &str, transitions: i64) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": leader::LEASE, "namespace": NS},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 1,
            "acquireTime": now_micro(),
            "renewTime": now_micro(),
            "leaseTransitions": transitions,
        },
    })
}

#[tokio::test]
async fn a_lease_renewed_by_another_holder_is_not_taken_until_it_lapses() {
    let server = Arc::new(ApiServer::start().await.unwrap());
    server.apply(foreign_lease("someone-else", 3)).unwrap();
    // The test renews it for the other holder, every 200 ms of a 1 s lease.
    let renewing = CancellationToken::new();
    let last_renewal = Arc::new(Mutex::new(Instant::now()));
    let renewer = tokio::spawn({
        let (server, renewing, last) = (server.clone(), renewing.clone(), last_renewal.clone());
        async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = renewing.cancelled() => return,
                }
                *last.lock().unwrap() = Instant::now();
                server.apply(foreign_lease("someone-else", 3)).unwrap();
            }
        }
    });
    let lease_duration = Duration::from_secs(1);
    let mut e = elector(&opts(
        &server,
        "replica-a",
        lease_duration,
        Duration::from_millis(100),
    ));
    let gets = server.requests("get");
    assert!(
        tokio::time::timeout(lease_duration * 3, e.leads.wait_for(|l| *l))
            .await
            .is_err(),
        "took a Lease its holder keeps renewing"
    );
    assert!(
        server.requests("get") >= gets + 10,
        "the elector kept reading the Lease"
    );
    assert_eq!(
        holder(&lease(&server)).as_deref(),
        Some("someone-else"),
        "{}",
        lease(&server)
    );

    renewing.cancel();
    renewer.await.unwrap();
    let last = *last_renewal.lock().unwrap();
    let took = leads(&mut e).await;
    assert!(
        took - last >= lease_duration,
        "took over {:?} after the last renewal, within the {lease_duration:?} lease",
        took - last
    );
    let l = lease(&server);
    assert_eq!(holder(&l).as_deref(), Some("replica-a"));
    assert_eq!(transitions(&l), 4, "{l}");

    e.stop.cancel();
    tokio::time::timeout(PATIENCE, e.task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder(&lease(&server)), None, "released on a clean stop");
}

// Reports.

const PLUGIN: &str = "weft-system/limits";

/// A node's stream in `registry`, having ACKed `version` of [`PLUGIN`].
fn node(registry: &Registry, name: &str, version: &str) -> u64 {
    let stream = registry.connect(NodeRecord {
        stream: 0,
        id: format!("sidecar~10.0.0.1~{name}.weft~weft.svc.cluster.local"),
        name: name.into(),
        cluster: "Kubernetes".into(),
        peer: None,
        caller: "spiffe://cluster.local/ns/weft/sa/weft-node".into(),
        caller_node: Some(name.into()),
        connected_at: "2026-01-01T00:00:00Z".into(),
        types: Default::default(),
        rollbacks: VecDeque::new(),
        shadows: Default::default(),
        counts: Default::default(),
    });
    ack(registry, stream, name, version);
    stream
}

fn ack(registry: &Registry, stream: u64, name: &str, version: &str) {
    let sent = Sent {
        resources: vec![(PLUGIN.into(), version.into())],
        removed: vec![],
        at: tokio::time::Instant::now(),
    };
    registry.sent(stream, type_url::EXTENSION_CONFIG, &sent);
    registry.ack(stream, name, type_url::EXTENSION_CONFIG, "1", &sent);
}

fn version(nodes: &std::collections::BTreeMap<String, NodeReport>, node: &str) -> Option<String> {
    nodes.get(node).and_then(|n| n.plugins.get(PLUGIN).cloned())
}

fn report_of(server: &ApiServer, replica: &str) -> Option<Report> {
    let cm = server.get(
        Resource::ConfigMap,
        NS,
        &format!("{}{replica}", report::PREFIX),
    )?;
    Some(serde_json::from_str(cm["data"]["report.json"].as_str().unwrap()).unwrap())
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A report ConfigMap written directly (as another replica would), `age` old.
fn written_report(replica: &str, age: Duration, node: &str, version: &str) -> Value {
    let r = Report {
        replica: replica.into(),
        updated_at: rfc3339(SystemTime::now() - age),
        nodes: [(
            node.to_owned(),
            NodeReport {
                plugins: [(PLUGIN.to_owned(), version.to_owned())].into(),
                ..Default::default()
            },
        )]
        .into(),
    };
    config_map(replica, &serde_json::to_string(&r).unwrap())
}

fn config_map(replica: &str, text: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": format!("{}{replica}", report::PREFIX), "namespace": NS},
        "data": {"report.json": text},
    })
}

/// A log sink for the test's thread.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn reports_merge_newest_first_and_skip_stale_and_unreadable_ones() {
    let logs = Logs::default();
    let sink = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish(),
    );
    let server = ApiServer::start().await.unwrap();
    // A long retry period: no heartbeat rewrite (every HEARTBEAT periods) reorders the reports during the test,
    // and the stale bound is STALE periods.
    let retry = Duration::from_secs(2);
    let stale = retry * report::STALE;
    let one = opts(&server, "replica-1", Duration::from_secs(15), retry);
    let two = opts(&server, "replica-2", Duration::from_secs(15), retry);
    let reader = client::build(&one).unwrap();

    let reg1 = Arc::new(Registry::new(Arc::new(Metrics::new())));
    node(&reg1, "node-1", "v1");
    let moved_on_1 = node(&reg1, "node-moved", "old");
    let stop1 = CancellationToken::new();
    let task1 = tokio::spawn(report::run(
        client::build(&one).unwrap(),
        one.clone(),
        reg1.clone(),
        Arc::new(weft_control::rollout::driver::Rollouts::mirror(
            reg1.clone(),
        )),
        stop1.clone(),
    ));
    let first = eventually("replica-1's report", || {
        std::future::ready(report_of(&server, "replica-1"))
    })
    .await;
    assert_eq!(first.replica, "replica-1");
    assert_eq!(first.nodes["node-1"].plugins[PLUGIN], "v1");
    // The second replica writes strictly later (timestamps are in milliseconds).
    let at1 = humantime::parse_rfc3339_weak(&first.updated_at).unwrap();
    eventually("a later millisecond", || {
        std::future::ready((SystemTime::now() > at1 + Duration::from_millis(5)).then_some(()))
    })
    .await;
    let reg2 = Arc::new(Registry::new(Arc::new(Metrics::new())));
    node(&reg2, "node-2", "v2");
    node(&reg2, "node-moved", "new");
    let stop2 = CancellationToken::new();
    let task2 = tokio::spawn(report::run(
        client::build(&two).unwrap(),
        two.clone(),
        reg2.clone(),
        Arc::new(weft_control::rollout::driver::Rollouts::mirror(
            reg2.clone(),
        )),
        stop2.clone(),
    ));
    let second = eventually("replica-2's report", || {
        std::future::ready(report_of(&server, "replica-2"))
    })
    .await;
    assert!(second.updated_at > first.updated_at);

    // Other replicas' reports written directly: one just within the stale bound, one just beyond it, one that
    // does not parse, and a ConfigMap that is no report at all.
    server
        .apply(written_report(
            "replica-old",
            stale - Duration::from_secs(10),
            "node-old",
            "v-old",
        ))
        .unwrap();
    server
        .apply(written_report(
            "replica-dead",
            stale + Duration::from_secs(10),
            "node-dead",
            "v-dead",
        ))
        .unwrap();
    server
        .apply(config_map("replica-broken", "{\"replica\": 42"))
        .unwrap();
    server
        .apply(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "something-else", "namespace": NS},
            "data": {"report.json": serde_json::to_string(&Report {
                replica: "x".into(),
                updated_at: rfc3339(SystemTime::now()),
                nodes: [("node-x".to_owned(), NodeReport::default())].into(),
            }).unwrap()},
        }))
        .unwrap();

    let nodes = report::read_all(&reader, &one).await.unwrap();
    assert_eq!(
        nodes.keys().map(String::as_str).collect::<Vec<_>>(),
        ["node-1", "node-2", "node-moved", "node-old"],
        "{nodes:?}"
    );
    assert_eq!(version(&nodes, "node-1").as_deref(), Some("v1"));
    assert_eq!(version(&nodes, "node-2").as_deref(), Some("v2"));
    assert_eq!(
        version(&nodes, "node-moved").as_deref(),
        Some("new"),
        "a node in two reports counts as the newer"
    );
    assert_eq!(version(&nodes, "node-old").as_deref(), Some("v-old"));
    let warned = logs.text();
    assert!(
        warned
            .lines()
            .any(|l| l.contains("WARN") && l.contains("weft-control-report-replica-broken")),
        "a warning names the unreadable report: {warned}"
    );

    // The node ACKs something else on replica-1: its rewritten report is now the newer.
    ack(&reg1, moved_on_1, "node-moved", "newest");
    let nodes = eventually("replica-1's newer report wins", || {
        let (reader, one) = (reader.clone(), one.clone());
        async move {
            let nodes = report::read_all(&reader, &one).await.unwrap();
            (version(&nodes, "node-moved").as_deref() == Some("newest")).then_some(nodes)
        }
    })
    .await;
    assert_eq!(version(&nodes, "node-2").as_deref(), Some("v2"));
    assert!(
        report_of(&server, "replica-1").unwrap().updated_at
            > report_of(&server, "replica-2").unwrap().updated_at
    );
    // Replica-2 still reports it, older: the merge ignores that.
    assert_eq!(
        report_of(&server, "replica-2").unwrap().nodes["node-moved"].plugins[PLUGIN],
        "new"
    );

    // A clean stop deletes the replica's report, and its nodes leave the merge.
    stop2.cancel();
    tokio::time::timeout(PATIENCE, task2)
        .await
        .unwrap()
        .unwrap();
    assert!(report_of(&server, "replica-2").is_none(), "report deleted");
    let nodes = report::read_all(&reader, &one).await.unwrap();
    assert_eq!(
        nodes.keys().map(String::as_str).collect::<Vec<_>>(),
        ["node-1", "node-moved", "node-old"],
        "{nodes:?}"
    );
    assert!(report_of(&server, "replica-1").is_some());

    stop1.cancel();
    tokio::time::timeout(PATIENCE, task1)
        .await
        .unwrap()
        .unwrap();
    assert!(report_of(&server, "replica-1").is_none(), "report deleted");
}

#[test]
fn a_report_carries_the_call_counts_of_the_plugins_in_a_rollout_only() {
    use weft_proto::weft::plugin::v1::PluginCounts;
    let registry = Registry::new(Arc::new(Metrics::new()));
    let stream = node(&registry, "node-1", "v1");
    let counts = |plugin: &str, calls: u64| {
        weft_proto::to_any(
            weft_proto::type_url::PLUGIN_COUNTS,
            &PluginCounts {
                plugin: plugin.into(),
                sha256: "ab".into(),
                calls,
                failures: 1,
            },
        )
    };
    registry.report(
        stream,
        weft_proto::type_url::EXTENSION_CONFIG,
        &weft_proto::google::rpc::Status {
            code: 0,
            message: "plugin counts".into(),
            details: vec![counts(PLUGIN, 10), counts("other/plugin", 20)],
        },
    );
    let counted = [PLUGIN.to_owned()].into();
    let r = report::of_registry("replica-1", &registry, &counted);
    let c = &r.nodes["node-1"].counts;
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[PLUGIN].calls, c[PLUGIN].failures), (10, 1));
    assert!(
        report::of_registry("replica-1", &registry, &Default::default()).nodes["node-1"]
            .counts
            .is_empty()
    );
}
