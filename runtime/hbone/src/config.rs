//! HTTP/2 tuning shared by the HBONE client and server, with ztunnel-compatible defaults.

use std::time::Duration;

/// HTTP/2 settings for one HBONE connection (client or server side).
///
/// The defaults match Istio ztunnel so that weft and ztunnel behave alike on the wire:
/// 4 MiB stream window, 16 MiB connection window, 1 MiB max frame, 200 concurrent streams
/// accepted by a server, 64 KiB header lists, and a keepalive PING every 10 s that must be
/// answered within 20 s.
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
    /// Streams a server lets its peer open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`). Also
    /// advertised by clients, where it is inert since HBONE servers never open streams.
    pub max_concurrent_streams: u32,
    /// Largest decoded header list accepted (`SETTINGS_MAX_HEADER_LIST_SIZE`), in bytes.
    pub max_header_list_size: u32,
    /// Most bytes one stream may have queued in h2 waiting to be written to the socket. This
    /// bounds per-stream send memory; writers wait (`poll_capacity`) once it is full. It does not
    /// limit bytes in flight on the wire (the peer's window does). Default 400 KiB (hyper's and
    /// ztunnel's server value): on loopback it was as fast as or faster than 1 MiB and 4 MiB.
    pub max_send_buffer_size: usize,
    /// Budget for DATA-frame overhead buffered but not yet read by the application; h2 closes the
    /// connection with `ENHANCE_YOUR_CALM` once exceeded. ztunnel disables it (`usize::MAX`),
    /// relying on flow control instead, and so do we by default.
    pub data_frame_budget: usize,
    /// Interval between keepalive PINGs; `None` disables keepalive.
    pub keepalive_interval: Option<Duration>,
    /// How long to wait for a PING acknowledgement before declaring the connection dead.
    pub keepalive_timeout: Duration,
}

impl H2Config {
    /// 4 MiB, ztunnel's default stream window.
    pub const DEFAULT_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
    /// 16 MiB, ztunnel's default connection window.
    pub const DEFAULT_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
    /// 1 MiB, ztunnel's default max frame size.
    pub const DEFAULT_MAX_FRAME: u32 = 1024 * 1024;

    pub(crate) fn client_builder(&self) -> h2::client::Builder {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(self.stream_window_size)
            .initial_connection_window_size(self.connection_window_size)
            .max_frame_size(self.max_frame_size)
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer_size)
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
            max_concurrent_streams: 200,
            max_header_list_size: 64 * 1024,
            max_send_buffer_size: 400 * 1024,
            data_frame_budget: usize::MAX,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_ztunnel() {
        let c = H2Config::default();
        assert_eq!(c.stream_window_size, 4 << 20);
        assert_eq!(c.connection_window_size, 16 << 20);
        assert_eq!(c.max_frame_size, 1 << 20);
        assert_eq!(c.max_concurrent_streams, 200);
        assert_eq!(c.max_header_list_size, 64 << 10);
        assert_eq!(c.keepalive_interval, Some(Duration::from_secs(10)));
        assert_eq!(c.keepalive_timeout, Duration::from_secs(20));
    }
}
