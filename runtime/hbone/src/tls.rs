//! TLS-level tuning of HBONE connections (the layer under HTTP/2): figures the proxy applies to each rustls session
//! it opens or accepts for HBONE.

/// TLS bytes a session may hold for sending (rustls's `set_buffer_limit`; its default is 64 KiB). The TLS stream
/// encrypts what one write brings up to this limit and hands it to the socket in one `writev`, so a DATA frame of
/// up to 1 MiB goes out in a few large writes instead of one per 64 KiB. It bounds what waits while the socket is
/// full, per HBONE connection (not per stream). In the mesh bench (one flow, 6 rounds of 2 GiB, twice, against the
/// build before as `weft-base`), this with the relay's 1 MiB socket reads (256 KiB before): 1.08× and 1.07× the
/// throughput at 0.95× and 0.94× the CPU per GiB, 1.16× and 1.19× ztunnel's. Either alone measured within the
/// noise (0.98–1.15× and 1.00×).
pub const TLS_SEND_BUFFER: usize = 256 * 1024;
