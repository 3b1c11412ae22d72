//! Drives a rustls unbuffered connection through the TLS 1.3 handshake over an async transport, then takes its
//! traffic secrets: from there on the record layer is weft's, and rustls only derives keys for key updates.

use std::ops::DerefMut;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::CertificateDer;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Error;
use crate::record::{HEADER_LEN, MAX_CIPHERTEXT};

/// Room for one whole record of the largest size a peer may send during the handshake (rustls allows 2^14 + 2048
/// bytes of ciphertext there).
const HANDSHAKE_BUF: usize = HEADER_LEN + MAX_CIPHERTEXT + 2048;
/// The handshake buffer never grows past this: a peer that needs more is not speaking TLS.
const HANDSHAKE_BUF_MAX: usize = 256 * 1024;

/// The rustls session after its handshake: what weft's record layer still needs from it.
pub(crate) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    /// New keys for what we send (after we send a `KeyUpdate`).
    pub(crate) fn update_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Self::Client(k) => k.update_tx_secret(),
            Self::Server(k) => k.update_tx_secret(),
        }
    }

    /// New keys for what the peer sends (after it sent a `KeyUpdate`).
    pub(crate) fn update_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Self::Client(k) => k.update_rx_secret(),
            Self::Server(k) => k.update_rx_secret(),
        }
    }

    /// Whether this is the client's side (the side that may receive a `NewSessionTicket`).
    pub(crate) fn is_client(&self) -> bool {
        matches!(self, Self::Client(_))
    }
}

/// What the handshake leaves for the stream.
pub(crate) struct Established {
    pub(crate) secrets: ExtractedSecrets,
    pub(crate) kernel: Kernel,
    pub(crate) suite: SupportedCipherSuite,
    pub(crate) peer_certificates: Option<Vec<CertificateDer<'static>>>,
    pub(crate) alpn: Option<Vec<u8>>,
    /// Bytes read from the transport after the handshake's last record: the start of the protected stream.
    pub(crate) leftover: Vec<u8>,
}

/// One side of the handshake: rustls's client and server connections behind one interface.
pub(crate) trait Side:
    DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> + Sized
{
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

/// The two sides differ only in their types: rustls gives each its own `process_tls_records` and hand-over.
macro_rules! side {
    ($conn:ty, $data:ty, $kernel:ident) => {
        impl Side for $conn {
            type Data = $data;
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
                let (s, k) = self.dangerous_into_kernel_connection()?;
                Ok((s, Kernel::$kernel(k)))
            }
        }
    };
}

side!(UnbufferedClientConnection, ClientConnectionData, Client);
side!(UnbufferedServerConnection, ServerConnectionData, Server);

/// What to do once a state has been handled and its borrows released.
enum Next {
    Continue,
    Read,
    /// rustls allows application data: done if the handshake is over (a server may reach this after its own
    /// `Finished`, before the client's certificate and `Finished` arrived).
    MaybeDone,
}

/// Run the handshake of `conn` over `io`.
pub(crate) async fn drive<C: Side, IO>(mut conn: C, io: &mut IO) -> Result<Established, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut incoming = vec![0u8; HANDSHAKE_BUF];
    let mut filled = 0;
    let mut outgoing = vec![0u8; 4096];
    let mut queued = 0;
    loop {
        // rustls sees one record at a time, and none once the handshake is over: what follows the peer's last
        // handshake record (its first application data, a KeyUpdate, a ticket, a close_notify) is left to the
        // record layer, so no state of rustls's (a key it switched, a reply it queued, a message it half read) is
        // lost at the hand-over.
        let given = if conn.is_handshaking() {
            complete_record(&incoming[..filled]).unwrap_or(filled)
        } else {
            0
        };
        let UnbufferedStatus { discard, state } = conn.process(&mut incoming[..given]);
        let next = match state {
            Err(e) => {
                incoming.copy_within(discard..filled, 0);
                send_alert(&mut conn, io, &mut incoming[..filled - discard]).await;
                return Err(e.into());
            }
            Ok(ConnectionState::EncodeTlsData(mut enc)) => loop {
                match enc.encode(&mut outgoing[queued..]) {
                    Ok(n) => {
                        queued += n;
                        break Next::Continue;
                    }
                    Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                        outgoing.resize(queued + required_size, 0);
                    }
                    Err(EncodeError::AlreadyEncoded) => break Next::Continue,
                }
            },
            Ok(ConnectionState::TransmitTlsData(t)) => {
                io.write_all(&outgoing[..queued]).await?;
                io.flush().await?;
                queued = 0;
                t.done();
                Next::Continue
            }
            Ok(ConnectionState::BlockedHandshake) => Next::Read,
            Ok(ConnectionState::WriteTraffic(_)) => Next::MaybeDone,
            // Neither can come while rustls only sees handshake records (the peer's data and close_notify after
            // its last handshake record go to the record layer), and weft offers no early data.
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(Error::HandshakeEof);
            }
            Ok(_) => {
                return Err(Error::UnexpectedMessage(
                    "application data during the handshake",
                ));
            }
        };
        incoming.copy_within(discard..filled, 0);
        filled -= discard;
        let read = match next {
            Next::Continue => false,
            // rustls waits for more: from the transport unless a whole record is already here.
            Next::Read => complete_record(&incoming[..filled]).is_none(),
            Next::MaybeDone => conn.is_handshaking(),
        };
        if !read {
            if matches!(next, Next::MaybeDone) {
                break;
            }
            continue;
        }
        if filled == incoming.len() {
            if incoming.len() >= HANDSHAKE_BUF_MAX {
                return Err(Error::UnexpectedMessage(
                    "a handshake record larger than TLS allows",
                ));
            }
            incoming.resize(incoming.len() * 2, 0);
        }
        let n = io.read(&mut incoming[filled..]).await?;
        if n == 0 {
            return Err(Error::HandshakeEof);
        }
        filled += n;
    }
    if queued > 0 {
        io.write_all(&outgoing[..queued]).await?;
        io.flush().await?;
    }
    incoming.truncate(filled);
    let peer_certificates = conn.peer_certificates().map(<[_]>::to_vec);
    let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
    let suite = conn
        .negotiated_cipher_suite()
        .ok_or(Error::Tls(rustls::Error::HandshakeNotComplete))?;
    let (secrets, kernel) = conn.into_kernel()?;
    Ok(Established {
        secrets,
        kernel,
        suite,
        peer_certificates,
        alpn,
        leftover: incoming,
    })
}

/// The length of the first record in `buf` if all of it is there.
fn complete_record(buf: &[u8]) -> Option<usize> {
    let h = buf.get(..HEADER_LEN)?;
    let end = HEADER_LEN + usize::from(u16::from_be_bytes([h[3], h[4]]));
    (buf.len() >= end).then_some(end)
}

/// After rustls refused the handshake, send the alert it queued (if any), so the peer learns why. Best effort: the
/// connection is being abandoned either way. `incoming` is what is still buffered (rustls may refer to it).
async fn send_alert<C: Side, IO: AsyncWrite + Unpin>(
    conn: &mut C,
    io: &mut IO,
    incoming: &mut [u8],
) {
    let mut out = vec![0u8; 512];
    let mut queued = 0;
    // Only while rustls has records queued: with none, processing would go back to the record it refused.
    while conn.wants_write() && queued < out.len() {
        let UnbufferedStatus { state, .. } = conn.process(incoming);
        let Ok(ConnectionState::EncodeTlsData(mut enc)) = state else {
            break;
        };
        match enc.encode(&mut out[queued..]) {
            Ok(n) => queued += n,
            Err(_) => break,
        }
    }
    if queued > 0 {
        let _ = io.write_all(&out[..queued]).await;
        let _ = io.flush().await;
    }
}
