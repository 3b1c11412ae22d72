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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_alert_reads_back_from_the_error_a_read_returns_and_from_its_copies() {
        for d in [0, 10, 40, 90, 255] {
            let e = io::Error::from(Error::PeerAlert(d));
            assert_eq!(peer_alert(&e), Some(d));
            // What a stream keeps and returns again: the kind and the text.
            let kept = io::Error::new(e.kind(), e.to_string());
            assert_eq!(peer_alert(&kept), Some(d));
        }
        for other in [
            io::Error::from(Error::UnexpectedMessage("peer sent TLS alert 7")),
            io::Error::from(Error::BadRecordMac),
            io::Error::new(io::ErrorKind::InvalidData, "peer sent TLS alert 256"),
            io::Error::new(io::ErrorKind::InvalidData, "peer sent TLS alert 07"),
            io::Error::from(io::ErrorKind::UnexpectedEof),
        ] {
            assert_eq!(peer_alert(&other), None, "{other}");
        }
    }
}
