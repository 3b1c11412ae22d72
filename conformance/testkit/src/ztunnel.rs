//! Facts about ztunnel that tests of weft's compatibility check against, each from ztunnel's source.

/// Every field a ztunnel access line may carry besides the line's own (`level`, `time`, `scope`, `message`), in
/// ztunnel's order: `src/proxy/metrics.rs` (`ConnectionResult::record_internal` and the `access_log!` macro) at
/// commit 62d826530e5ce85764e309170205b293efcbc80b of github.com/istio/ztunnel. ztunnel logs it with target (JSON
/// `scope`) `access`, no parent span, the message "connection complete", at error level when the connection
/// failed and at info level otherwise; a field it does not know is left out.
pub const ACCESS_FIELDS: [&str; 17] = [
    "src.addr",
    "src.workload",
    "src.namespace",
    "src.identity",
    "src.cluster",
    "dst.addr",
    "dst.hbone_addr",
    "dst.service",
    "dst.workload",
    "dst.namespace",
    "dst.identity",
    "dst.cluster",
    "direction",
    "bytes_sent",
    "bytes_recv",
    "duration",
    "error",
];
