//! The handshake messages a session may receive after its handshake (RFC 8446 §4.6): `NewSessionTicket`, checked
//! and dropped, and `KeyUpdate`, which replaces the receiving key.

use super::{MAX_HANDSHAKE_BYTES, MAX_KEY_UPDATES_IN_A_ROW, MAX_SESSION_TICKETS, TlsStream};
use crate::Error;
use crate::record::OpenKeys;

/// Handshake message types (RFC 8446 §4).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// The one extension TLS 1.3 defines for a `NewSessionTicket` (RFC 8446 §4.2): a 4-byte `max_early_data_size`.
const EARLY_DATA: u16 = 42;

impl<IO> TlsStream<IO> {
    /// Act on the complete messages buffered in `hs` (handshake records' content, in order), and keep only an
    /// incomplete last one. The buffer is read with a cursor and shifted once, however many messages it holds.
    pub(super) fn handle_handshake(&mut self) -> Result<(), Error> {
        let mut at = 0;
        while let Some(&[typ, a, b, c]) = self.hs.get(at..at + 4) {
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            let end = at + 4 + len;
            let Some(body) = self.hs.get(at + 4..end) else {
                if 4 + len > MAX_HANDSHAKE_BYTES {
                    return Err(Error::UnexpectedMessage(
                        "a post-handshake message too large",
                    ));
                }
                break;
            };
            match typ {
                NEW_SESSION_TICKET => {
                    // weft's clients never resume: a ticket is checked and dropped, with no key derived for it and
                    // nothing kept. Servers send one or two; a flood is cut off.
                    if !self.kernel.is_client() {
                        return Err(Error::UnexpectedMessage("a NewSessionTicket from a client"));
                    }
                    self.session_tickets += 1;
                    if self.session_tickets > MAX_SESSION_TICKETS {
                        return Err(Error::UnexpectedMessage("too many NewSessionTickets"));
                    }
                    check_session_ticket(body)?;
                }
                KEY_UPDATE => {
                    let request = match *body {
                        [0] => false,
                        [1] => true,
                        [_] => {
                            return Err(Error::IllegalParameter(
                                "a KeyUpdate with an unknown request",
                            ));
                        }
                        _ => return Err(Error::DecodeError("a malformed KeyUpdate")),
                    };
                    if end != self.hs.len() {
                        // RFC 8446 §5.1: handshake messages must not span a key change.
                        return Err(Error::UnexpectedMessage(
                            "a KeyUpdate not at the end of its record",
                        ));
                    }
                    self.key_updates_in_a_row += 1;
                    if self.key_updates_in_a_row > MAX_KEY_UPDATES_IN_A_ROW {
                        return Err(Error::UnexpectedMessage("too many KeyUpdates without data"));
                    }
                    let (seq, secrets) = self.kernel.update_rx()?;
                    self.rx = OpenKeys::new(seq, secrets)?;
                    if request {
                        // Answered before our next record (RFC 8446 §4.6.3).
                        self.key_update.get_or_insert(false);
                    }
                }
                _ => {
                    return Err(Error::UnexpectedMessage(
                        "a handshake message after the handshake",
                    ));
                }
            }
            at = end;
        }
        if at == self.hs.len() {
            self.hs = Vec::new();
        } else {
            self.hs.drain(..at);
        }
        Ok(())
    }
}

/// A cursor over a message's body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    /// A vector's length prefix of `N` bytes, then that many bytes.
    fn vector<const N: usize>(&mut self) -> Option<&'a [u8]> {
        let len = self
            .array::<N>()?
            .iter()
            .fold(0, |n, &b| n << 8 | usize::from(b));
        self.take(len)
    }
}

/// Check that `body` is a well-formed `NewSessionTicket` (RFC 8446 §4.6.1), without keeping anything of it:
///
/// ```text
/// uint32 ticket_lifetime; uint32 ticket_age_add; opaque ticket_nonce<0..255>; opaque ticket<1..2^16-1>;
/// Extension extensions<0..2^16-2>;
/// ```
///
/// Unknown extensions are allowed (RFC 8446 §4.2 asks clients to ignore them), one type twice is not.
fn check_session_ticket(body: &[u8]) -> Result<(), Error> {
    let malformed = || Error::DecodeError("a malformed NewSessionTicket");
    let mut r = Reader(body);
    let extensions = (|| {
        r.array::<8>()?;
        r.vector::<1>()?;
        r.vector::<2>().filter(|t| !t.is_empty())?;
        r.vector::<2>()
    })()
    .filter(|_| r.0.is_empty())
    .ok_or_else(malformed)?;
    let mut exts = Reader(extensions);
    let mut seen = [0u64; 1024];
    while !exts.0.is_empty() {
        let typ = exts
            .array::<2>()
            .map(u16::from_be_bytes)
            .ok_or_else(malformed)?;
        let data = exts.vector::<2>().ok_or_else(malformed)?;
        let (word, bit) = (usize::from(typ / 64), 1u64 << (typ % 64));
        if seen[word] & bit != 0 {
            return Err(Error::IllegalParameter(
                "a NewSessionTicket with an extension twice",
            ));
        }
        seen[word] |= bit;
        if typ == EARLY_DATA && data.len() != 4 {
            return Err(malformed());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `NewSessionTicket` body with these parts.
    fn ticket(nonce: &[u8], ticket: &[u8], extensions: &[(u16, &[u8])]) -> Vec<u8> {
        let mut exts = Vec::new();
        for (typ, data) in extensions {
            exts.extend_from_slice(&typ.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(data);
        }
        let mut body = vec![0, 0, 0x0e, 0x10, 9, 9, 9, 9, nonce.len() as u8];
        body.extend_from_slice(nonce);
        body.extend_from_slice(&(ticket.len() as u16).to_be_bytes());
        body.extend_from_slice(ticket);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        body
    }

    #[test]
    fn well_formed_session_tickets_pass_and_malformed_ones_are_decode_errors() {
        let big = vec![7u8; 60_000];
        for good in [
            ticket(&[], &[1], &[]),
            ticket(&[0; 255], &big, &[]),
            ticket(
                &[1, 2],
                b"ticket",
                &[(EARLY_DATA, &[0, 0, 0x40, 0]), (0xfafa, &[])],
            ),
        ] {
            assert!(check_session_ticket(&good).is_ok(), "{good:?}");
        }
        let mut trailing = ticket(&[1], b"t", &[]);
        trailing.push(0);
        let whole = ticket(&[1], b"t", &[(0xfafa, &[1, 2, 3])]);
        for bad in [
            ticket(&[1], &[], &[]),
            ticket(&[1], b"t", &[(EARLY_DATA, &[0, 0, 1])]),
            trailing,
            whole[..whole.len() - 1].to_vec(),
            whole[..7].to_vec(),
            Vec::new(),
        ] {
            assert!(
                matches!(check_session_ticket(&bad), Err(Error::DecodeError(_))),
                "{bad:?}"
            );
        }
        let twice = ticket(&[1], b"t", &[(0xfafa, &[]), (0xfafa, &[1])]);
        assert!(matches!(
            check_session_ticket(&twice),
            Err(Error::IllegalParameter(_))
        ));
    }
}
