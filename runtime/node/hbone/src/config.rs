//! HTTP/2 tuning for the HBONE client and server, with ztunnel's figures as defaults.
//!
//! The figures are taken from istio/ztunnel at commit
//! `62d826530e5ce85764e309170205b293efcbc80b`:
//!
//! | setting | client (`src/proxy/h2/client.rs`, `spawn_connection`) | server (`src/proxy/h2/server.rs`, `serve_connection`) |
//! |---|---|---|
//! | `SETTINGS_INITIAL_WINDOW_SIZE` | `cfg.window_size`, 4 MiB (`src/config.rs`, `construct_config`) | same |
//! | connection window | `cfg.connection_window_size`, 16 MiB | same |
//! | `SETTINGS_MAX_FRAME_SIZE` | `cfg.frame_size`, 1 MiB | same |
//! | `SETTINGS_MAX_HEADER_LIST_SIZE` | `1024 * 16` (16 KiB) | `65536` (64 KiB) |
//! | h2 `max_send_buffer_size` | `cfg.window_size` (4 MiB) | `1024 * 400` (400 KiB, hyper's) |
//! | `SETTINGS_MAX_CONCURRENT_STREAMS` | not sent | `200` (hyper's) |
//! | `SETTINGS_ENABLE_PUSH` | `0` | not sent |
//! | keepalive PING | every 10 s, dead after 20 s without ACK (`src/proxy/h2.rs`, `do_ping_pong`) | same |
//!
//! ztunnel has no deadline for the client preface on inbound connections nor for the CONNECT
//! response on outbound ones; weft adds both ([`H2Config::handshake_timeout`],
//! [`H2Config::connect_response_timeout`]).

use std::time::Duration;

/// HTTP/2 settings for HBONE connections. One value serves both roles: the fields without a
/// prefix apply to both sides unless their documentation says otherwise, `client_*` fields only
/// to [`handshake`](crate::handshake) (outbound) and the server-only ones to
/// [`serve_connection`](crate::serve_connection) (inbound).
///
/// The defaults are ztunnel's (see the [module documentation](self) for where each figure comes
/// from), so that weft and ztunnel behave alike on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Config {
    /// Initial flow-control window of each stream, in bytes (`SETTINGS_INITIAL_WINDOW_SIZE`).
    pub stream_window_size: u32,
    /// Flow-control window of the whole connection, in bytes. Larger than the stream window so
    /// that one stalled stream cannot starve the others.
    pub connection_window_size: u32,
    /// Largest DATA frame payload we accept (`SETTINGS_MAX_FRAME_SIZE`). Writes through an
    /// [`H2Stream`](crate::H2Stream) are also cut into chunks no larger than this.
    pub max_frame_size: u32,
    /// Server only: streams a server lets its peer open at once
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`). Clients do not advertise it (as ztunnel's), since
    /// HBONE servers never open streams. Default 200.
    pub max_concurrent_streams: u32,
    /// Server only: largest decoded request header list accepted
    /// (`SETTINGS_MAX_HEADER_LIST_SIZE`), in bytes. A CONNECT over it is answered 431 and its
    /// stream reset (`REFUSED_STREAM`) by h2. Default 64 KiB.
    pub max_header_list_size: u32,
    /// Server only: most bytes one stream may have queued in h2 waiting to be written to the
    /// socket. This bounds per-stream send memory; writers wait (`poll_capacity`) once it is
    /// full. It does not limit bytes in flight on the wire (the peer's window does). Default
    /// 400 KiB (hyper's, and ztunnel's server value).
    pub max_send_buffer_size: usize,
    /// Client only: largest decoded response header list accepted
    /// (`SETTINGS_MAX_HEADER_LIST_SIZE`). A CONNECT response over it fails that stream (h2
    /// resets it with `PROTOCOL_ERROR`); the connection stays usable. Default 16 KiB.
    pub client_max_header_list_size: u32,
    /// Client only: like [`max_send_buffer_size`](Self::max_send_buffer_size) for outbound
    /// streams. Default 4 MiB (ztunnel aligns it with the stream window, so a writer can fill
    /// the window and flush it in one go).
    pub client_max_send_buffer_size: usize,
    /// Budget for DATA-frame overhead buffered but not yet read by the application; h2 closes the
    /// connection with `ENHANCE_YOUR_CALM` once exceeded. ztunnel disables it (`usize::MAX`),
    /// relying on flow control instead, and so do we by default.
    pub data_frame_budget: usize,
    /// Interval between keepalive PINGs; `None` disables keepalive.
    pub keepalive_interval: Option<Duration>,
    /// How long to wait for a PING acknowledgement before declaring the connection dead.
    pub keepalive_timeout: Duration,
    /// Server only: a peer must send the HTTP/2 client preface and its first SETTINGS frame
    /// within this time of [`serve_connection`](crate::serve_connection) being called, or the
    /// connection is closed with [`Error::HandshakeTimeout`](crate::Error::HandshakeTimeout).
    /// The caller bounds the TLS handshake before it. Default 10 s. ztunnel and h2 set no such
    /// deadline; hyper's HTTP/1 server bounds reading request headers to 30 s by default
    /// (`header_read_timeout`). A peer that sends nothing is cut off by this, not by
    /// keepalive (which starts only once the handshake is done).
    pub handshake_timeout: Duration,
    /// Client only: how long [`H2Client::connect`](crate::H2Client::connect) waits, from the
    /// moment it is called, for a stream slot and the server's answer to the CONNECT; then the
    /// stream is cancelled (`RST_STREAM CANCEL`) and the attempt fails with
    /// [`Error::ResponseTimeout`](crate::Error::ResponseTimeout). The connection stays usable
    /// for other streams. Default 15 s: longer than the time an HBONE server spends connecting
    /// to its workload before answering 503 (10 s in ztunnel's `CONNECTION_TIMEOUT` and weft's
    /// default), so a peer's own verdict arrives first.
    pub connect_response_timeout: Duration,
}

impl H2Config {
    /// 4 MiB, ztunnel's default stream window.
    pub const DEFAULT_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
    /// 16 MiB, ztunnel's default connection window.
    pub const DEFAULT_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
    /// 1 MiB, ztunnel's default max frame size.
    pub const DEFAULT_MAX_FRAME: u32 = 1024 * 1024;
    /// 200, ztunnel's (and hyper's) server `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub const DEFAULT_SERVER_MAX_CONCURRENT_STREAMS: u32 = 200;
    /// 64 KiB, ztunnel's server `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub const DEFAULT_SERVER_MAX_HEADER_LIST: u32 = 64 * 1024;
    /// 400 KiB, ztunnel's (and hyper's) server send buffer per stream.
    pub const DEFAULT_SERVER_SEND_BUFFER: usize = 400 * 1024;
    /// 16 KiB, ztunnel's client `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub const DEFAULT_CLIENT_MAX_HEADER_LIST: u32 = 16 * 1024;
    /// 4 MiB (the stream window), ztunnel's client send buffer per stream.
    pub const DEFAULT_CLIENT_SEND_BUFFER: usize = Self::DEFAULT_STREAM_WINDOW as usize;
    /// 10 s, the default [`handshake_timeout`](Self::handshake_timeout).
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
    /// 15 s, the default [`connect_response_timeout`](Self::connect_response_timeout).
    pub const DEFAULT_CONNECT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);

    pub(crate) fn client_builder(&self) -> h2::client::Builder {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(self.stream_window_size)
            .initial_connection_window_size(self.connection_window_size)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.client_max_header_list_size)
            .max_send_buffer_size(self.client_max_send_buffer_size)
            .data_frame_budget(self.data_frame_budget)
            .enable_push(false);
        b
    }

    pub(crate) fn server_builder(&self) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.stream_window_size)
            .initial_connection_window_size(self.connection_window_size)
            .max_frame_size(self.max_frame_size)
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer_size)
            .data_frame_budget(self.data_frame_budget);
        b
    }

    /// Largest chunk handed to h2 in one `send_data` call.
    pub(crate) fn write_chunk(&self) -> usize {
        (self.max_frame_size as usize).max(16 * 1024)
    }
}

impl Default for H2Config {
    fn default() -> Self {
        Self {
            stream_window_size: Self::DEFAULT_STREAM_WINDOW,
            connection_window_size: Self::DEFAULT_CONNECTION_WINDOW,
            max_frame_size: Self::DEFAULT_MAX_FRAME,
            max_concurrent_streams: Self::DEFAULT_SERVER_MAX_CONCURRENT_STREAMS,
            max_header_list_size: Self::DEFAULT_SERVER_MAX_HEADER_LIST,
            max_send_buffer_size: Self::DEFAULT_SERVER_SEND_BUFFER,
            client_max_header_list_size: Self::DEFAULT_CLIENT_MAX_HEADER_LIST,
            client_max_send_buffer_size: Self::DEFAULT_CLIENT_SEND_BUFFER,
            data_frame_budget: usize::MAX,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(20),
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
            connect_response_timeout: Self::DEFAULT_CONNECT_RESPONSE_TIMEOUT,
        }
    }
}
