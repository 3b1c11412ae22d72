#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use super::*;
use crate::testutil::TestNs;

#[test]
fn a_descriptor_that_is_no_namespace_is_refused() {
    let f = std::fs::File::open("/dev/null").unwrap();
    let e = Netns::from_fd(f.into()).unwrap_err();
    assert!(e.to_string().contains("not a namespace"), "{e}");
}

#[test]
fn two_descriptors_of_one_namespace_have_one_id() {
    let ns = TestNs::new();
    let (a, b) = (ns.open(), ns.open());
    assert_eq!(a.id(), b.id());
    let own = Netns::open(std::path::Path::new("/proc/self/ns/net")).unwrap();
    assert_ne!(a.id(), own.id());
}

#[tokio::test]
async fn sockets_from_the_thread_live_in_the_pod_namespace() {
    let ns = TestNs::new();
    ns.exec(&["ip", "link", "set", "lo", "up"]);
    let t = Arc::new(NetnsThread::new(Arc::new(ns.open())).await.unwrap());
    // A listener on the pod's loopback, created by the thread and served from this (tokio) thread.
    let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
    let lis = weft_proxy::socket::listen_socket(sock, "127.0.0.1:0".parse().unwrap(), true, None)
        .unwrap();
    let addr: SocketAddr = lis.local_addr().unwrap();
    // From weft's own namespace nothing listens there.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    // A socket from the same thread reaches it.
    let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
    let (c, a) = tokio::join!(
        weft_proxy::socket::connect_socket(sock, addr, None, weft_proxy::socket::Source::Any),
        lis.accept()
    );
    let c = c.unwrap();
    let (_, peer) = a.unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    // A second listener on the same port joins the SO_REUSEPORT group (an upgrade's new instance).
    let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
    weft_proxy::socket::listen_socket(sock, addr, true, None).unwrap();
    // Without SO_REUSEPORT the port is taken.
    let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
    assert!(weft_proxy::socket::listen_socket(sock, addr, false, None).is_err());
}

/// The network namespace the namespace thread is in now (its `/proc/self/task/<tid>/ns/net` link).
fn worker_netns() -> String {
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        if std::fs::read_to_string(task.join("comm"))
            .unwrap_or_default()
            .trim()
            == "weft-netns"
        {
            return std::fs::read_link(task.join("ns/net"))
                .unwrap()
                .display()
                .to_string();
        }
    }
    panic!("no weft-netns thread");
}

/// One thread serves every pod: jobs for two pods, interleaved, each run in their own pod's namespace (a
/// listener on one port in each, each reached only from its own pod's sockets); a job that panics leaves the
/// thread serving; and once no job has come for a while the thread is back in weft's own namespace, so it keeps no deleted pod's
/// namespace alive.
#[tokio::test]
async fn one_thread_serves_every_pod_and_goes_home_when_idle() {
    let (a, b) = (TestNs::new(), TestNs::new());
    for ns in [&a, &b] {
        ns.exec(&["ip", "link", "set", "lo", "up"]);
    }
    let ta = NetnsThread::new(Arc::new(a.open())).await.unwrap();
    let tb = NetnsThread::new(Arc::new(b.open())).await.unwrap();
    let addr: SocketAddr = "127.0.0.1:15111".parse().unwrap();
    let mut listeners = Vec::new();
    for t in [&ta, &tb, &ta] {
        let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
        let reuse = listeners.len() == 2; // the third joins pod a's group: same namespace, same port
        listeners.push(weft_proxy::socket::listen_socket(sock, addr, reuse, None));
    }
    assert!(
        listeners[0].is_ok() && listeners[1].is_ok(),
        "{listeners:?}"
    );
    assert!(
        listeners[2].is_err(),
        "a second listener on pod a's port without SO_REUSEPORT must collide: it was not created in pod a"
    );
    let (la, lb) = (listeners.remove(0).unwrap(), listeners.remove(0).unwrap());
    for (t, lis, other) in [(&ta, &la, &lb), (&tb, &lb, &la)] {
        let sock = t.tcp_socket(Domain::IPV4).await.unwrap();
        let (c, accepted) = tokio::join!(
            weft_proxy::socket::connect_socket(sock, addr, None, weft_proxy::socket::Source::Any),
            lis.accept()
        );
        assert_eq!(accepted.unwrap().1, c.unwrap().local_addr().unwrap());
        // Nothing queued on the other pod's listener.
        assert!(
            tokio::time::timeout(std::time::Duration::ZERO, other.accept())
                .await
                .is_err()
        );
    }
    let panicked = ta.run(|| panic!("a job that panics")).await;
    assert!(panicked.is_err());
    assert_eq!(ta.run(|| 7).await.unwrap(), 7);
    // Back home once idle: wait for it (the switch follows the last job's reply).
    let own = std::fs::read_link("/proc/thread-self/ns/net")
        .unwrap()
        .display()
        .to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while worker_netns() != own {
        assert!(
            std::time::Instant::now() < deadline,
            "the namespace thread stayed in a pod's namespace"
        );
        std::thread::yield_now();
    }
}

#[test]
fn capabilities_check_passes_as_root() {
    check_capabilities(Some(0x539)).unwrap();
}

#[tokio::test]
async fn migrate_req_is_set_in_the_pod_namespace_only() {
    const PATH: &str = "/proc/sys/net/ipv4/tcp_migrate_req";
    let host_before = std::fs::read_to_string(PATH).unwrap();
    let ns = TestNs::new();
    let t = NetnsThread::new(Arc::new(ns.open())).await.unwrap();
    assert_eq!(
        t.run(|| std::fs::read_to_string(PATH).unwrap())
            .await
            .unwrap()
            .trim(),
        "0"
    );
    t.run(crate::pods::enable_migrate_req)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        t.run(|| std::fs::read_to_string(PATH).unwrap())
            .await
            .unwrap()
            .trim(),
        "1"
    );
    assert_eq!(std::fs::read_to_string(PATH).unwrap(), host_before);
}
