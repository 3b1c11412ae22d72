//! A test-side CNI node agent: what istio-cni's node agent does for the node proxy (its `ztunnelserver.go`), over
//! a real `SOCK_SEQPACKET` Unix socket with real namespace descriptors. It listens; each proxy that connects sends
//! `ZdsHello` first, then gets a snapshot (one `AddWorkload` per known pod with its namespace descriptor as
//! `SCM_RIGHTS`, each waiting for its ack, then `SnapshotSent`). Afterwards new pods go to the newest connection and
//! deletes to every connection, as istio-cni does. Written independently of weft's ZDS client (rustix calls here).

use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use weft_proto::zds::{
    AddWorkload, DelWorkload, SnapshotSent, WorkloadInfo, WorkloadRequest, WorkloadResponse,
    ZdsHello, workload_request::Payload, workload_response,
};

/// A pod as the agent knows it.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Kubernetes pod uid.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
    /// Its network namespace (`/var/run/netns/<name>`).
    pub netns: PathBuf,
}

impl Pod {
    fn add(&self) -> Vec<u8> {
        WorkloadRequest {
            payload: Some(Payload::Add(AddWorkload {
                uid: self.uid.clone(),
                workload_info: Some(WorkloadInfo {
                    name: self.name.clone(),
                    namespace: self.namespace.clone(),
                    service_account: self.service_account.clone(),
                }),
            })),
        }
        .encode_to_vec()
    }
}

/// One request to one connected proxy: bytes, an optional descriptor, the reply (the ack's error text).
struct Send {
    data: Vec<u8>,
    fd: Option<OwnedFd>,
    reply: oneshot::Sender<Result<String, String>>,
}

struct Conn {
    id: u64,
    tx: mpsc::Sender<Send>,
}

#[derive(Default)]
struct Shared {
    pods: BTreeMap<String, Pod>,
    conns: Vec<Conn>,
    next_id: u64,
}

/// What the agent has seen: connections accepted, snapshots acked, connections that ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Events {
    /// Connections accepted.
    pub accepted: u64,
    /// Snapshots fully acked (one per connection that got that far).
    pub snapshots: u64,
    /// Connections that ended.
    pub closed: u64,
    /// Error acks received.
    pub error_acks: u64,
}

/// The agent; stops listening on drop.
pub struct Agent {
    /// Its socket.
    pub path: PathBuf,
    shared: Arc<Mutex<Shared>>,
    events: watch::Receiver<Events>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?)
}

async fn send_packet(fd: &UnixStream, data: &[u8], pass: Option<&OwnedFd>) -> std::io::Result<()> {
    loop {
        fd.writable().await?;
        let r = fd.try_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let borrowed = pass.map(|f| [f.as_fd()]);
            if let Some(b) = &borrowed {
                control.push(SendAncillaryMessage::ScmRights(b));
            }
            rustix::net::sendmsg(fd, &[IoSlice::new(data)], &mut control, SendFlags::NOSIGNAL)?;
            Ok(())
        });
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// One packet, or `None` at end of stream.
async fn recv_packet(fd: &UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    loop {
        fd.readable().await?;
        let r = fd.try_io(Interest::READABLE, || {
            let mut buf = vec![0u8; 4096];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let m = rustix::net::recvmsg(
                fd,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::empty(),
            )?;
            buf.truncate(m.bytes);
            Ok(buf)
        });
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r.map(|b| (!b.is_empty()).then_some(b)),
        }
    }
}

async fn request(fd: &UnixStream, data: &[u8], pass: Option<&OwnedFd>) -> Result<String, String> {
    send_packet(fd, data, pass)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let p = recv_packet(fd)
        .await
        .map_err(|e| format!("recv: {e}"))?
        .ok_or("proxy closed the connection instead of acking")?;
    match WorkloadResponse::decode(p.as_slice())
        .map_err(|e| e.to_string())?
        .payload
    {
        Some(workload_response::Payload::Ack(a)) => Ok(a.error),
        None => Err("response without an ack".into()),
    }
}

fn open_netns(p: &Path) -> Result<OwnedFd, String> {
    std::fs::File::open(p)
        .map(OwnedFd::from)
        .map_err(|e| format!("{}: {e}", p.display()))
}

impl Agent {
    /// Listen at `path` (a stale socket file is removed first).
    pub fn start(path: &Path) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let fd = seqpacket()?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        rustix::net::listen(&fd, 16)?;
        let lis = UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (ev_tx, events) = watch::channel(Events::default());
        let ev_tx = Arc::new(ev_tx);
        let task = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((c, _)) = lis.accept().await else {
                        return;
                    };
                    ev_tx.send_modify(|e| e.accepted += 1);
                    tokio::spawn(serve(c, shared.clone(), ev_tx.clone()));
                }
            })
        };
        Ok(Self {
            path: path.to_owned(),
            shared,
            events,
            task,
        })
    }

    /// What happened so far.
    pub fn events(&self) -> Events {
        *self.events.borrow()
    }

    /// Wait until `f` holds for the events (a 30 s floor; the wait ends at the event).
    pub async fn wait(&self, what: &str, f: impl Fn(&Events) -> bool) -> Events {
        let mut rx = self.events.clone();
        match tokio::time::timeout(crate::EVENT_TIMEOUT_FLOOR * 2, rx.wait_for(|e| f(e))).await {
            Ok(Ok(e)) => *e,
            _ => panic!("agent: timed out waiting for {what}: {:?}", self.events()),
        }
    }

    /// Connections that are up now.
    pub fn live_connections(&self) -> usize {
        self.shared.lock().map(|s| s.conns.len()).unwrap_or(0)
    }

    /// Remember a pod for the snapshots of later connections without sending it now.
    pub fn know_pod(&self, pod: Pod) {
        if let Ok(mut s) = self.shared.lock() {
            s.pods.insert(pod.uid.clone(), pod);
        }
    }

    /// Forget a pod without telling any proxy (as if it was deleted while no proxy was connected): the next
    /// snapshot lacks it.
    pub fn forget_pod(&self, uid: &str) {
        if let Ok(mut s) = self.shared.lock() {
            s.pods.remove(uid);
        }
    }

    /// A new pod: remembered for later snapshots and sent to the newest connection; its ack's error text.
    pub async fn add_pod(&self, pod: Pod) -> Result<String, String> {
        let data = pod.add();
        let fd = open_netns(&pod.netns)?;
        let tx = {
            let mut s = self.shared.lock().map_err(|e| e.to_string())?;
            s.pods.insert(pod.uid.clone(), pod);
            s.conns.last().map(|c| c.tx.clone())
        };
        match tx {
            Some(tx) => Self::call(&tx, data, Some(fd)).await,
            None => Err("no proxy connected".into()),
        }
    }

    /// A pod is gone: forgotten and deleted on every connection; the acks' error texts.
    pub async fn del_pod(&self, uid: &str) -> Vec<Result<String, String>> {
        let data = WorkloadRequest {
            payload: Some(Payload::Del(DelWorkload { uid: uid.into() })),
        }
        .encode_to_vec();
        let txs: Vec<_> = match self.shared.lock() {
            Ok(mut s) => {
                s.pods.remove(uid);
                s.conns.iter().map(|c| c.tx.clone()).collect()
            }
            Err(_) => Vec::new(),
        };
        let mut out = Vec::new();
        for tx in txs {
            out.push(Self::call(&tx, data.clone(), None).await);
        }
        out
    }

    /// Send raw bytes (and a descriptor) to the newest connection; its ack's error text.
    pub async fn send_raw(&self, data: Vec<u8>, netns: Option<&Path>) -> Result<String, String> {
        let fd = netns.map(open_netns).transpose()?;
        let tx = self
            .shared
            .lock()
            .map_err(|e| e.to_string())?
            .conns
            .last()
            .map(|c| c.tx.clone())
            .ok_or("no proxy connected")?;
        Self::call(&tx, data, fd).await
    }

    async fn call(
        tx: &mpsc::Sender<Send>,
        data: Vec<u8>,
        fd: Option<OwnedFd>,
    ) -> Result<String, String> {
        let (reply, rx) = oneshot::channel();
        tx.send(Send { data, fd, reply })
            .await
            .map_err(|_| "connection gone".to_owned())?;
        rx.await.map_err(|_| "connection gone".to_owned())?
    }
}

/// One proxy connection: hello, snapshot, then requests from the test, while watching for the proxy hanging up.
async fn serve(c: UnixStream, shared: Arc<Mutex<Shared>>, ev: Arc<watch::Sender<Events>>) {
    let ended = |ev: &watch::Sender<Events>| ev.send_modify(|e| e.closed += 1);
    match recv_packet(&c).await {
        Ok(Some(p)) if ZdsHello::decode(p.as_slice()).is_ok_and(|h| h.version == 1) => {}
        _ => return ended(&ev),
    }
    let pods: Vec<Pod> = match shared.lock() {
        Ok(s) => s.pods.values().cloned().collect(),
        Err(_) => return ended(&ev),
    };
    for pod in pods {
        let Ok(fd) = open_netns(&pod.netns) else {
            continue;
        };
        match request(&c, &pod.add(), Some(&fd)).await {
            Ok(e) if e.is_empty() => {}
            Ok(_) => ev.send_modify(|e| e.error_acks += 1),
            Err(_) => return ended(&ev),
        }
    }
    let snap = WorkloadRequest {
        payload: Some(Payload::SnapshotSent(SnapshotSent {})),
    }
    .encode_to_vec();
    if request(&c, &snap, None).await.is_err() {
        return ended(&ev);
    }
    let (tx, mut rx) = mpsc::channel::<Send>(8);
    let id = match shared.lock() {
        Ok(mut s) => {
            s.next_id += 1;
            let id = s.next_id;
            s.conns.push(Conn { id, tx });
            id
        }
        Err(_) => return ended(&ev),
    };
    ev.send_modify(|e| e.snapshots += 1);
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { break };
                let r = request(&c, &m.data, m.fd.as_ref()).await;
                if matches!(&r, Ok(e) if !e.is_empty()) {
                    ev.send_modify(|e| e.error_acks += 1);
                }
                let gone = r.is_err();
                let _ = m.reply.send(r);
                if gone {
                    break;
                }
            }
            // The proxy sends nothing unprompted: readable means it hung up (or broke the protocol).
            _ = recv_packet(&c) => break,
        }
    }
    if let Ok(mut s) = shared.lock() {
        s.conns.retain(|c| c.id != id);
    }
    ended(&ev);
}
