//! Pod network namespaces: a handle on the descriptor the CNI agent sent, its identity (device and inode), and the
//! namespace thread that enters pods' namespaces to create their sockets (one thread for every pod). A socket
//! belongs to the namespace it was created in, so only creation happens on that thread; binding, listening and
//! connecting run on the data-path runtime. No tokio worker ever calls `setns`.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, OnceLock, mpsc};

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

/// A job for the namespace thread: told whether the thread entered the job's namespace, it runs there (or reports
/// why it could not).
type Job = Box<dyn FnOnce(io::Result<()>) + Send>;

/// The one thread that enters pods' network namespaces to create their sockets (and write their sysctls), for
/// every pod of the node: a job names its namespace, the thread `setns`es into it unless it is there already, runs
/// the job, and goes back to weft's own namespace when no job has come for [`HOME_AFTER`], so it does not keep a
/// deleted pod's namespace alive. A pod costs no thread of its own (ztunnel's model: it enters the pod's namespace on the
/// thread that needs a socket, and back), and no tokio worker ever calls `setns`.
struct Worker {
    jobs: mpsc::Sender<(Arc<Netns>, Job)>,
}

/// How long the namespace thread waits for another job before it returns to weft's own namespace.
const HOME_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Stack of the namespace thread: it only creates sockets and writes sysctls.
const STACK: usize = 128 * 1024;

static WORKER: OnceLock<Result<Worker, String>> = OnceLock::new();

impl Worker {
    /// The process's namespace thread, started on first use.
    fn get() -> io::Result<&'static Worker> {
        WORKER
            .get_or_init(|| Worker::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| io::Error::other(format!("cannot start the namespace thread: {e}")))
    }

    fn start() -> io::Result<Worker> {
        let home = std::fs::File::open("/proc/thread-self/ns/net")?;
        let (jobs, rx) = mpsc::channel::<(Arc<Netns>, Job)>();
        std::thread::Builder::new()
            .name("weft-netns".into())
            .stack_size(STACK)
            .spawn(move || Worker::run(home, rx))?;
        Ok(Worker { jobs })
    }

    fn run(home: std::fs::File, rx: mpsc::Receiver<(Arc<Netns>, Job)>) {
        // The namespace the thread is in: None while it is in weft's own.
        let mut current: Option<NetnsId> = None;
        let mut next = rx.recv().ok();
        while let Some((netns, job)) = next.take() {
            let entered = if current == Some(netns.id) {
                Ok(())
            } else {
                match move_into_link_name_space(netns.fd.as_fd(), Some(LinkNameSpaceType::Network))
                {
                    Ok(()) => {
                        current = Some(netns.id);
                        Ok(())
                    }
                    Err(e) => Err(io::Error::new(
                        e.kind(),
                        format!("setns into pod network namespace {}: {e}", netns.id),
                    )),
                }
            };
            // A job that panics must not take the thread (and every pod's sockets) with it; its caller sees its
            // reply channel dropped.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(entered)));
            drop(netns);
            // The next job; with none for a while, back to weft's own namespace first (not after every job: a pod
            // taking connections one after another would pay two more `setns` each).
            next = match rx.recv_timeout(HOME_AFTER) {
                Ok(j) => Some(j),
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if current.is_some() {
                        if let Err(e) = move_into_link_name_space(
                            home.as_fd(),
                            Some(LinkNameSpaceType::Network),
                        ) {
                            // Only a job for the same namespace could run here now; every other one enters its own
                            // first, so a failed return home costs a kept namespace, not a socket in the wrong one.
                            tracing::warn!(error = %e, "the namespace thread cannot return to weft's own network namespace");
                        } else {
                            current = None;
                        }
                    }
                    rx.recv().ok()
                }
            };
        }
    }
}

/// A pod's network namespace and the namespace thread that creates sockets in it (one thread for every pod).
pub struct NetnsThread {
    netns: Arc<Netns>,
    worker: &'static Worker,
}

impl fmt::Debug for NetnsThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetnsThread")
            .field("netns", &self.netns.id)
            .finish()
    }
}

impl NetnsThread {
    /// A handle on the namespace thread for `netns` (started on first use). Fails if the thread cannot start or
    /// cannot enter `netns`.
    pub async fn new(netns: Arc<Netns>) -> io::Result<Self> {
        let t = Self {
            netns,
            worker: Worker::get()?,
        };
        t.run(|| ()).await?;
        Ok(t)
    }

    /// The namespace this handle creates sockets in.
    pub fn netns_id(&self) -> NetnsId {
        self.netns.id
    }

    /// Run `f` on the namespace thread, inside this handle's namespace, and return its result.
    pub async fn run<T, F>(&self, f: F) -> io::Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |entered: io::Result<()>| {
            let _ = tx.send(entered.map(|()| f()));
        });
        self.worker
            .jobs
            .send((self.netns.clone(), job))
            .map_err(|_| io::Error::other("namespace thread has ended"))?;
        rx.await
            .map_err(|_| io::Error::other("namespace thread dropped the request"))?
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
