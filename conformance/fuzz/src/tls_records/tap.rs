//! The ends' transports: a duplex stream seen on the way (every byte written, every read), and for an attacker
//! client held back after its first flight so its Finished and what follows reach the victim in one write.

use super::*;

/// What one end's transport saw.
#[derive(Default)]
pub(super) struct TapLog {
    /// Every byte written, in the order the other end receives them (held bytes where they were written).
    pub(super) written: Vec<u8>,
    /// Reads from the transport (`poll_read` calls).
    pub(super) reads: u64,
    /// Writes held back (after the first flush, while `hold_after_first_flush` was set) until released.
    pub(super) held: Option<Vec<u8>>,
    pub(super) hold_after_first_flush: bool,
    pub(super) shutdown_held: bool,
}

/// An end's transport: the duplex stream, seen (and for an attacker client, held back) on the way.
pub(super) struct Tap {
    pub(super) io: DuplexStream,
    pub(super) log: Rc<RefCell<TapLog>>,
}

impl Tap {
    pub(super) fn new(
        io: DuplexStream,
        hold_after_first_flush: bool,
    ) -> (Self, Rc<RefCell<TapLog>>) {
        let log = Rc::new(RefCell::new(TapLog {
            hold_after_first_flush,
            ..TapLog::default()
        }));
        (
            Self {
                io,
                log: log.clone(),
            },
            log,
        )
    }

    /// Send everything held in one write (then end the transport, if the session asked to meanwhile).
    pub(super) async fn release(&mut self) {
        let (held, shutdown) = {
            let mut log = self.log.borrow_mut();
            (log.held.take(), std::mem::take(&mut log.shutdown_held))
        };
        if let Some(held) = held.filter(|h| !h.is_empty()) {
            let sent = self.io.write_all(&held).await.and(self.io.flush().await);
            assert!(sent.is_ok(), "the held flight was not written: {sent:?}");
        }
        if shutdown {
            let _ = self.io.shutdown().await;
        }
    }
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.log.borrow_mut().reads += 1;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut log = this.log.borrow_mut();
        let log = &mut *log;
        if let Some(held) = log.held.as_mut() {
            let mut n = 0;
            for b in bufs {
                held.extend_from_slice(b);
                log.written.extend_from_slice(b);
                n += b.len();
            }
            return Poll::Ready(Ok(n));
        }
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            let mut left = n;
            for b in bufs {
                let k = left.min(b.len());
                log.written.extend_from_slice(&b[..k]);
                left -= k;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.log.borrow().held.is_some() {
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut this.io).poll_flush(cx);
        let mut log = this.log.borrow_mut();
        if r.is_ready() && std::mem::take(&mut log.hold_after_first_flush) {
            log.held = Some(Vec::new());
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        {
            let mut log = this.log.borrow_mut();
            if log.held.is_some() {
                log.shutdown_held = true;
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
