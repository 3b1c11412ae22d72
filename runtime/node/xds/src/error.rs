//! Errors of the xDS client.

/// Why a stream could not be established or ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A setting is wrong (address, root file, server name).
    #[error("{0}")]
    Config(String),
    /// The root file or token file could not be read.
    #[error("{0}")]
    Credentials(String),
    /// The stream could not be opened (TCP, TLS, HTTP/2, or the server refused the call).
    #[error("cannot open the xDS stream to {address}: {message}")]
    Connect {
        /// The server.
        address: String,
        /// What went wrong.
        message: String,
    },
    /// The server ended the stream with a gRPC status.
    #[error("the server ended the stream: {code:?}: {message}")]
    Status {
        /// The gRPC code.
        code: tonic::Code,
        /// The status message and its sources.
        message: String,
    },
    /// The server closed the stream without an error.
    #[error("the server closed the stream")]
    Closed,
}

/// A status's message with the chain of sources (a transport error hides its cause there).
pub(crate) fn status_message(s: &tonic::Status) -> String {
    let mut message = s.message().to_owned();
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        message.push_str(": ");
        message.push_str(&e.to_string());
        src = e.source();
    }
    if message.contains("authentication failure") {
        message.push_str(" (hint: the control plane's log says why)");
    }
    message
}
