//! What the fuzz target (`conformance/fuzz`, `tls_records`) needs to play a peer that breaks the rules: not part of
//! the API, and there only with the feature `fuzzing`.

use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::{Error, TlsStream};

/// Most content one raw record may carry: what the record's length field allows with the inner content type
/// and the tag.
pub const MAX_RAW_CONTENT: usize = crate::record::MAX_CIPHERTEXT - crate::record::TAG_LEN - 1;

/// Seal `content` as one record of any `content_type`, as is (no checks beyond the length field), and queue it.
/// A `content_type` of 0 with content ending in a type and zeros makes a padded record.
pub fn queue_raw_record<IO: AsyncRead + AsyncWrite + Unpin>(
    s: &mut TlsStream<IO>,
    content_type: u8,
    content: &[u8],
) -> Result<(), Error> {
    s.seal_record(
        content_type,
        &content[..content.len().min(MAX_RAW_CONTENT)],
        0,
    )
}

/// The transport under the session, to write bytes no TLS layer made.
pub fn transport_mut<IO>(s: &mut TlsStream<IO>) -> &mut IO {
    s.transport_mut()
}

/// The description of the fatal alert the peer sent, if `e` (returned by a read) says the read side failed on one.
/// A stream keeps a failure as its kind and text, to answer every later call, so the error a read returns no
/// longer holds an [`Error`]; it is matched by the text [`Error::PeerAlert`] displays.
pub fn peer_alert(e: &io::Error) -> Option<u8> {
    if let Some(Error::PeerAlert(d)) = e.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) {
        return Some(*d);
    }
    let text = e.get_ref()?.to_string();
    let zero = Error::PeerAlert(0).to_string();
    let d = text.strip_prefix(zero.strip_suffix('0')?)?.parse().ok()?;
    (Error::PeerAlert(d).to_string() == text).then_some(d)
}
