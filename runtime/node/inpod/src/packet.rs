//! The ZDS transport: a `SOCK_SEQPACKET` Unix socket, one protobuf message per packet (no length prefix), a
//! namespace descriptor riding along as `SCM_RIGHTS` ancillary data. Reads are cancel-safe: a packet is taken off
//! the socket only inside one non-blocking `recvmsg`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};

/// Largest packet accepted: a `WorkloadRequest` is a few hundred bytes; a larger one is reported as truncated.
pub const MAX_PACKET: usize = 16 * 1024;

/// One received packet.
#[derive(Debug)]
pub struct Packet {
    /// The bytes (`len` of them were received, at most [`MAX_PACKET`]).
    pub data: Vec<u8>,
    /// Descriptors passed with it (all of them are owned, so dropping closes them).
    pub fds: Vec<OwnedFd>,
    /// The packet did not fit.
    pub truncated: bool,
    /// The ancillary data did not fit (descriptors were lost).
    pub control_truncated: bool,
}

/// A connected `SOCK_SEQPACKET` Unix socket (tokio's `UnixStream` only registers the descriptor with the reactor;
/// every read and write here is a `recvmsg`/`sendmsg`, which keep packet boundaries).
#[derive(Debug)]
pub struct SeqPacket {
    s: UnixStream,
}

impl SeqPacket {
    /// Connect to the agent's socket at `path`.
    pub async fn connect(path: &Path) -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        let addr = SocketAddrUnix::new(path)?;
        let pending = match rustix::net::connect(&fd, &addr) {
            Ok(()) => false,
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INPROGRESS => true,
            Err(e) => return Err(e.into()),
        };
        let s = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?;
        if pending {
            s.writable().await?;
            if let Some(e) = s.take_error()? {
                return Err(e);
            }
        }
        Ok(Self { s })
    }

    /// Wrap an already connected non-blocking socket (tests, the agent side of a socketpair).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            s: UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?,
        })
    }

    /// Send one packet, with `fds` as `SCM_RIGHTS` when not empty.
    pub async fn send(&self, data: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
        loop {
            self.s.writable().await?;
            let res = self.s.try_io(Interest::WRITABLE, || {
                let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "too many descriptors",
                    ));
                }
                let n = rustix::net::sendmsg(
                    &self.s,
                    &[IoSlice::new(data)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                )?;
                if n != data.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "short packet write",
                    ));
                }
                Ok(())
            });
            match res {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }

    /// Receive one packet; `None` at end of stream.
    pub async fn recv(&self) -> io::Result<Option<Packet>> {
        loop {
            self.s.readable().await?;
            match self.s.try_io(Interest::READABLE, || recv_now(&self.s)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

fn recv_now(fd: impl AsFd) -> io::Result<Option<Packet>> {
    let mut data = vec![0u8; MAX_PACKET];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        fd,
        &mut [IoSliceMut::new(&mut data)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Take ownership of every descriptor first, so none leaks whatever is wrong with the packet.
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    data.truncate(msg.bytes.min(MAX_PACKET));
    Ok(Some(Packet {
        data,
        fds,
        truncated: msg.flags.contains(ReturnFlags::TRUNC),
        control_truncated: msg.flags.contains(ReturnFlags::CTRUNC),
    }))
}

/// A connected pair (tests).
pub fn pair() -> io::Result<(SeqPacket, SeqPacket)> {
    let (a, b) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    Ok((SeqPacket::from_fd(a)?, SeqPacket::from_fd(b)?))
}

/// A listening `SOCK_SEQPACKET` Unix socket: the agent's side (tests).
#[derive(Debug)]
pub struct SeqPacketListener {
    l: UnixListener,
}

impl SeqPacketListener {
    /// Bind and listen at `path`.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        rustix::net::listen(&fd, 16)?;
        Ok(Self {
            l: UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))?,
        })
    }

    /// Accept one connection.
    pub async fn accept(&self) -> io::Result<SeqPacket> {
        let (s, _) = self.l.accept().await?;
        Ok(SeqPacket { s })
    }
}
