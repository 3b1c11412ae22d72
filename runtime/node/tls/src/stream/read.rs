//! The read side of a [`TlsStream`]: ciphertext read ahead, records opened in place and handed out, alerts and
//! post-handshake messages acted on.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::io::poll_read_buf;

use super::{
    CLOSE_NOTIFY, FIRST_READ, MAX_EMPTY_RECORDS_IN_A_ROW, MAX_HANDSHAKE_BYTES, MAX_WARNING_ALERTS,
    Plain, READ_AHEAD, Sticky, TlsStream, USER_CANCELED,
};
use crate::Error;
use crate::record::{ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, TAG_LEN, parse_header};

/// What [`TlsStream::next_record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opened {
    /// The next record is not all in the buffer yet.
    Incomplete,
    /// A record of application data, delivered into the caller's buffer or waiting to be handed out.
    Data,
    /// A record that delivers nothing: empty, an alert, post-handshake messages.
    Nothing,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Copy what is decrypted and waiting into `out`; false if nothing was waiting.
    pub(super) fn hand_out(&mut self, out: &mut ReadBuf<'_>) -> bool {
        let Some(p) = self.plain.as_mut() else {
            return false;
        };
        let n = out.remaining().min(p.end - p.start);
        out.put_slice(&self.rbuf[p.start..p.start + n]);
        p.start += n;
        if p.start == p.end {
            let end = p.record_end;
            self.plain = None;
            self.consume(end);
        }
        true
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.rbuf.advance(n);
        if self.rbuf.is_empty() && !self.read_ahead {
            // Give the buffer back: a quiet connection holds none. (A busy one keeps it: its next read reuses it.)
            self.rbuf = BytesMut::new();
        }
    }

    /// Open the next record if it is all in the buffer. Where `out` has room for the record's inner plaintext, the
    /// record is opened straight into it (application data is then delivered without a copy); otherwise in place,
    /// its content handed out from the buffer.
    pub(super) fn next_record(&mut self, out: &mut ReadBuf<'_>) -> Result<Opened, Error> {
        let Some(h) = self.rbuf.get(..HEADER_LEN) else {
            return Ok(Opened::Incomplete);
        };
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(h);
        let end = HEADER_LEN + parse_header(header)?;
        // legacy_record_version, as rustls takes it: a version other than 3.x does not parse, and the record is
        // authenticated as 3.3 (the only one a TLS 1.3 peer sends) whatever 3.x its header says.
        if header[1] != 3 {
            return Err(Error::DecodeError("a record of another protocol version"));
        }
        header[2] = 3;
        if self.rbuf.len() < end {
            return Ok(Opened::Incomplete);
        }
        let room = end - HEADER_LEN - TAG_LEN;
        let direct = out.remaining() >= room;
        let (content_type, n) = if direct {
            // Only bytes of `out` never written before are zeroed first (the AEAD takes initialised memory).
            let into = out.initialize_unfilled_to(room);
            self.rx
                .open_into(header, &self.rbuf[HEADER_LEN..end], into)?
        } else {
            self.rx.open(header, &mut self.rbuf[HEADER_LEN..end])?
        };
        if content_type != HANDSHAKE && !self.hs.is_empty() {
            return Err(Error::UnexpectedMessage(
                "a record inside a fragmented handshake message",
            ));
        }
        // Records that carry nothing cost a peer 22 bytes each: as rustls does, a run of them is cut short.
        if n == 0 {
            self.empty_in_a_row += 1;
            if self.empty_in_a_row > MAX_EMPTY_RECORDS_IN_A_ROW {
                return Err(Error::UnexpectedMessage("too many empty records in a row"));
            }
        } else {
            self.empty_in_a_row = 0;
        }
        let at = out.filled().len();
        let content = if direct {
            &out.initialized()[at..at + n]
        } else {
            &self.rbuf[HEADER_LEN..HEADER_LEN + n]
        };
        match content_type {
            APPLICATION_DATA if n == 0 => {
                // Not data: it leaves the count of KeyUpdates without data as it is.
                self.consume(end);
                return Ok(Opened::Nothing);
            }
            APPLICATION_DATA => {
                self.key_updates_in_a_row = 0;
                if direct {
                    out.advance(n);
                    self.consume(end);
                } else {
                    self.plain = Some(Plain {
                        start: HEADER_LEN,
                        end: HEADER_LEN + n,
                        record_end: end,
                    });
                }
                return Ok(Opened::Data);
            }
            HANDSHAKE => {
                if n == 0 {
                    return Err(Error::UnexpectedMessage("an empty handshake record"));
                }
                if self.hs.len() + n > MAX_HANDSHAKE_BYTES {
                    return Err(Error::UnexpectedMessage(
                        "a post-handshake message too large",
                    ));
                }
                self.hs.extend_from_slice(content);
                self.consume(end);
                self.handle_handshake()?;
            }
            ALERT => {
                let &[level, description] = content else {
                    return Err(Error::DecodeError("a malformed alert"));
                };
                self.consume(end);
                // RFC 8446 §6: every alert but close_notify and a warning user_canceled is an error, whatever
                // its level says; rustls refuses unknown levels first, and allows a few warnings per connection.
                match (level, description) {
                    (1 | 2, CLOSE_NOTIFY) => self.read_closed = true,
                    (1, USER_CANCELED) => {
                        self.warning_alerts += 1;
                        if self.warning_alerts > MAX_WARNING_ALERTS {
                            return Err(Error::UnexpectedMessage("too many warning alerts"));
                        }
                    }
                    (1 | 2, d) => return Err(Error::PeerAlert(d)),
                    _ => return Err(Error::IllegalParameter("an alert of an unknown level")),
                }
            }
            _ => {
                return Err(Error::UnexpectedMessage(
                    "a record of an unknown content type",
                ));
            }
        }
        Ok(Opened::Nothing)
    }

    /// Read more ciphertext; 0 at the transport's end.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let want = if self.read_ahead {
            READ_AHEAD
        } else {
            FIRST_READ
        };
        let record_rest = self.rbuf.get(..HEADER_LEN).map_or(0, |h| {
            usize::from(u16::from_be_bytes([h[3], h[4]])) + HEADER_LEN
        });
        let spare = self.rbuf.capacity() - self.rbuf.len();
        if spare < want / 4 || self.rbuf.len() + spare < record_rest {
            self.rbuf.reserve(want.max(record_rest));
        }
        let offered = self.rbuf.capacity() - self.rbuf.len();
        let n = ready!(poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf))?;
        self.read_ahead = n == offered || n >= FIRST_READ;
        Poll::Ready(Ok(n))
    }

    /// A fatal error on the read side: keep it, and tell the peer with an alert if we still may write.
    pub(super) fn fail_read(&mut self, e: Error, cx: &mut Context<'_>) {
        let alert = match &e {
            Error::BadRecordMac => Some(20),
            Error::RecordOverflow => Some(22),
            Error::UnexpectedMessage(_) => Some(10),
            Error::DecodeError(_) => Some(50),
            Error::IllegalParameter(_) => Some(47),
            Error::Tls(_) | Error::Crypto | Error::UnsupportedSuite | Error::KeyExhausted => {
                Some(80)
            }
            Error::Io(_) | Error::HandshakeEof | Error::PeerAlert(_) => None,
        };
        if let Error::PeerAlert(_) = e {
            // RFC 8446 §6.2: after a fatal alert the connection is closed at once: nothing more is sent, not even
            // what was queued.
            self.close_write();
        }
        let e = io::Error::from(e);
        self.read_error = Some(Sticky::of(&e));
        // A KeyUpdate the peer asked for goes first, as rustls sends it: the alert then comes under the new key.
        if let Some(desc) = alert
            && !self.write_closed
            && self.write_error.is_none()
            && self
                .maybe_update_keys()
                .and_then(|()| self.seal_record(ALERT, &[2, desc], 0))
                .is_ok()
        {
            self.write_closed = true;
            let _ = self.poll_write_out(cx);
        }
    }
}
