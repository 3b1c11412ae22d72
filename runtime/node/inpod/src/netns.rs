//! Pod network namespaces: a handle on the descriptor the CNI agent sent, its identity (device and inode), and a
//! dedicated thread that has entered it and creates the pod's sockets. A socket belongs to the namespace it was
//! created in, so only creation happens on that thread; binding, listening and connecting run on the data-path
//! runtime. No tokio worker ever calls `setns`.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::mpsc;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use socket2::{Domain, Protocol, Socket, Type};
use weft_proxy::SocketFactory;

/// `statfs` magic of nsfs (namespace descriptors on current kernels).
const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `statfs` magic of procfs (namespace descriptors opened under `/proc` on old kernels).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Identity of a network namespace: two descriptors name the same namespace when device and inode are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct NetnsId {
    /// Device of the nsfs inode.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dev, self.ino)
    }
}

/// A pod's network namespace, held open by its descriptor.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
}

impl Netns {
    /// Take a descriptor received from the agent; it must be a namespace descriptor (nsfs or procfs).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let fs = rustix::fs::fstatfs(&fd)?;
        #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets
        let magic = fs.f_type as i64;
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("descriptor is not a namespace (filesystem magic {magic:#x})"),
            ));
        }
        let st = rustix::fs::fstat(&fd)?;
        Ok(Self {
            fd,
            id: NetnsId {
                dev: st.st_dev,
                ino: st.st_ino,
            },
        })
    }

    /// Open a namespace by path (`/var/run/netns/<name>`, `/proc/<pid>/ns/net`).
    pub fn open(path: &std::path::Path) -> io::Result<Self> {
        Self::from_fd(std::fs::File::open(path)?.into())
    }

    /// Device and inode.
    pub fn id(&self) -> NetnsId {
        self.id
    }
}

/// Check once at startup that this process may enter network namespaces (CAP_SYS_ADMIN) and mark sockets
/// (CAP_NET_ADMIN), so in-pod mode fails at start with a clear error rather than on the first pod. Runs on a
/// short-lived thread that enters weft's own namespace.
pub fn check_capabilities(mark: Option<u32>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("weft-ns-check".into())
        .spawn(move || {
            let own = std::fs::File::open("/proc/thread-self/ns/net")?;
            move_into_link_name_space(own.as_fd(), Some(LinkNameSpaceType::Network)).map_err(
                |e| io::Error::new(e.kind(), format!("setns into weft's own network namespace: {e} (in-pod mode needs CAP_SYS_ADMIN)")),
            )?;
            if let Some(m) = mark {
                let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
                s.set_mark(m).map_err(|e| {
                    io::Error::new(e.kind(), format!("SO_MARK {m:#x}: {e} (in-pod mode needs CAP_NET_ADMIN)"))
                })?;
            }
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("namespace check thread panicked"))?
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread that lives inside one pod's network namespace and creates sockets there on request. It ends when the
/// last handle is dropped.
pub struct NetnsThread {
    jobs: mpsc::Sender<Job>,
    id: NetnsId,
}

impl fmt::Debug for NetnsThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetnsThread")
            .field("netns", &self.id)
            .finish()
    }
}

/// Stack of a namespace thread: it only creates sockets.
const STACK: usize = 128 * 1024;

impl NetnsThread {
    /// Start a thread named `name` and move it into `netns` (the thread holds the descriptor while it lives).
    /// Fails if `setns` fails.
    pub fn spawn(name: String, netns: std::sync::Arc<Netns>) -> io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<io::Result<()>>(1);
        let id = netns.id;
        std::thread::Builder::new()
            .name(name)
            .stack_size(STACK)
            .spawn(move || {
                let entered =
                    move_into_link_name_space(netns.fd.as_fd(), Some(LinkNameSpaceType::Network))
                        .map_err(|e| {
                            io::Error::new(
                                e.kind(),
                                format!("setns into pod network namespace {}: {e}", netns.id),
                            )
                        });
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                // Keep the namespace descriptor open while the thread lives (the namespace stays addressable).
                let _netns = netns;
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        ready_rx.recv().map_err(|_| {
            io::Error::other("namespace thread ended before entering the namespace")
        })??;
        Ok(Self { jobs, id })
    }

    /// The namespace this thread is in.
    pub fn netns_id(&self) -> NetnsId {
        self.id
    }

    /// Run `f` on the namespace thread and return its result.
    pub async fn run<T, F>(&self, f: F) -> io::Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| io::Error::other("namespace thread has ended"))?;
        rx.await
            .map_err(|_| io::Error::other("namespace thread dropped the request"))
    }
}

impl SocketFactory for NetnsThread {
    fn tcp_socket(
        &self,
        domain: Domain,
    ) -> Pin<Box<dyn std::future::Future<Output = io::Result<Socket>> + Send + '_>> {
        Box::pin(async move {
            self.run(move || {
                Socket::new(
                    domain,
                    Type::STREAM.nonblocking().cloexec(),
                    Some(Protocol::TCP),
                )
            })
            .await?
        })
    }
}

#[cfg(test)]
mod tests;
