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
    let t = Arc::new(NetnsThread::spawn("weft-ns-test".into(), Arc::new(ns.open())).unwrap());
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

#[test]
fn the_thread_ends_when_its_last_handle_goes() {
    let ns = TestNs::new();
    let t = NetnsThread::spawn("weft-ns-end".into(), Arc::new(ns.open())).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    // A job that keeps a sender: when the thread ends, its channel (and this sender) is dropped.
    t.jobs.send(Box::new(move || drop(tx))).unwrap();
    drop(t);
    assert!(rx.recv().is_err());
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
    let t = NetnsThread::spawn("weft-ns-sysctl".into(), Arc::new(ns.open())).unwrap();
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
