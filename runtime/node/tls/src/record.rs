//! TLS 1.3 record protection (RFC 8446 §5): one direction's key, IV and sequence number, sealing plaintext
//! straight from the caller's buffer into the outgoing one and opening records where they were read.

use aws_lc_rs::aead::{
    AES_128_GCM, AES_256_GCM, Aad, Algorithm, LessSafeKey, Nonce, TlsProtocolId,
    TlsRecordSealingKey, UnboundKey,
};
use rustls::ConnectionTrafficSecrets;

use crate::Error;

/// Bytes of a record header: content type, legacy version, length.
pub(crate) const HEADER_LEN: usize = 5;
/// Largest plaintext one record carries (2^14, RFC 8446 §5.1).
pub(crate) const MAX_PLAINTEXT: usize = 16 * 1024;
/// Largest `TLSCiphertext.length` a peer may send (2^14 + 256, RFC 8446 §5.2).
pub(crate) const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// AES-GCM's tag.
pub(crate) const TAG_LEN: usize = 16;
/// A record carrying `n` bytes of application data: header, data, inner content type, tag.
pub(crate) const fn record_len(n: usize) -> usize {
    HEADER_LEN + n + 1 + TAG_LEN
}

/// The content types a protected record can carry (RFC 8446 §5.1).
pub(crate) const ALERT: u8 = 21;
pub(crate) const HANDSHAKE: u8 = 22;
pub(crate) const APPLICATION_DATA: u8 = 23;

/// rustls's soft limit on a key's sequence numbers: a key is replaced before it (the suite's confidentiality limit
/// comes far sooner for AES-GCM), and a peer's key used this far ends the session.
pub(crate) const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;
/// No record is ever sealed or opened at or past this sequence number: the nonce would repeat after it.
pub(crate) const SEQ_HARD_LIMIT: u64 = 0xffff_ffff_ffff_fffe;

/// The sequence number at which our sending key must be replaced: the suite's confidentiality limit (2^24 records
/// for AES-GCM in rustls) or rustls's soft limit, whichever comes first.
pub(crate) fn seq_limit(confidentiality_limit: u64) -> u64 {
    confidentiality_limit.min(SEQ_SOFT_LIMIT)
}

/// The algorithm and key bytes of a traffic secret, and its IV.
fn key_material(
    secrets: &ConnectionTrafficSecrets,
) -> Result<(&'static Algorithm, &[u8], [u8; 12]), Error> {
    let (alg, key, iv): (&'static Algorithm, _, _) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
        _ => return Err(Error::UnsupportedSuite),
    };
    let iv: [u8; 12] = iv
        .as_ref()
        .try_into()
        .map_err(|_| Error::UnsupportedSuite)?;
    Ok((alg, key.as_ref(), iv))
}

/// The per-record nonce: the IV with the sequence number XORed into its last 8 bytes (RFC 8446 §5.3).
fn nonce(iv: &[u8; 12], seq: u64) -> Nonce {
    let mut n = *iv;
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    Nonce::assume_unique_for_key(n)
}

/// The AEAD key of what we send.
enum SealingKey {
    /// aws-lc's TLS 1.3 record key (what rustls seals with): it refuses a nonce that does not follow the last one,
    /// so a sequence number can never be used twice under this key, whatever a bug above it does.
    Tls13(TlsRecordSealingKey),
    /// A key rustls already sealed records with before the hand-over (a server's session tickets): aws-lc's TLS
    /// 1.3 key must start at sequence 0, so this one is a plain AEAD key, and the only guard is ours (the
    /// sequence number only moves forward, and stops before it wraps). weft's servers send no tickets, so weft's
    /// own sessions never have one; a KeyUpdate replaces it with a [`SealingKey::Tls13`].
    Resumed(LessSafeKey),
}

/// What we send: the key, its IV and the sequence number of the next record.
pub(crate) struct SealKeys {
    key: SealingKey,
    iv: [u8; 12],
    /// Sequence number of the next record.
    pub(crate) seq: u64,
}

impl std::fmt::Debug for SealKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let alg = match &self.key {
            SealingKey::Tls13(k) => k.algorithm(),
            SealingKey::Resumed(k) => k.algorithm(),
        };
        f.debug_struct("SealKeys")
            .field("algorithm", alg)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl SealKeys {
    /// Keys for the secrets rustls derived, starting at record `seq`.
    pub(crate) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Result<Self, Error> {
        let (alg, key, iv) = key_material(&secrets)?;
        let key = if seq == 0 {
            SealingKey::Tls13(
                TlsRecordSealingKey::new(alg, TlsProtocolId::TLS13, key)
                    .map_err(|_| Error::UnsupportedSuite)?,
            )
        } else {
            SealingKey::Resumed(LessSafeKey::new(
                UnboundKey::new(alg, key).map_err(|_| Error::UnsupportedSuite)?,
            ))
        };
        Ok(Self { key, iv, seq })
    }

    /// Seal `data` as one record of `content_type` into `out`, which must be exactly
    /// [`record_len`]`(data.len())` bytes; `data` is read where it is, never copied. weft sends at most
    /// [`MAX_PLAINTEXT`] bytes per record; more, up to what the length field allows, is sealed as asked (the fuzz
    /// target plays a peer that sends such records). Refused at [`SEQ_HARD_LIMIT`]: the key is worn out.
    pub(crate) fn seal(
        &mut self,
        content_type: u8,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<(), Error> {
        if out.len() != record_len(data.len()) || out.len() - HEADER_LEN > MAX_CIPHERTEXT {
            return Err(Error::Crypto);
        }
        if self.seq >= SEQ_HARD_LIMIT {
            return Err(Error::KeyExhausted);
        }
        let header = header(out.len() - HEADER_LEN);
        let (head, body) = out.split_at_mut(HEADER_LEN);
        head.copy_from_slice(&header);
        let (ciphertext, trailer) = body.split_at_mut(data.len());
        let nonce = nonce(&self.iv, self.seq);
        let aad = Aad::from(header);
        let sealed = match &mut self.key {
            SealingKey::Tls13(k) => {
                k.seal_out_of_place_scatter(nonce, aad, data, ciphertext, &[content_type], trailer)
            }
            SealingKey::Resumed(k) => {
                k.seal_out_of_place_scatter(nonce, aad, data, ciphertext, &[content_type], trailer)
            }
        };
        sealed.map_err(|_| Error::Crypto)?;
        self.seq += 1;
        Ok(())
    }
}

/// What the peer sends: the key, its IV and the sequence number of the next record. Opening needs no nonce guard
/// (a repeated nonce harms only the sender), so this is aws-lc's plain AEAD key, as in rustls.
pub(crate) struct OpenKeys {
    key: LessSafeKey,
    iv: [u8; 12],
    /// Sequence number of the next record.
    pub(crate) seq: u64,
}

impl std::fmt::Debug for OpenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenKeys")
            .field("algorithm", self.key.algorithm())
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl OpenKeys {
    /// Keys for the secrets rustls derived, starting at record `seq`.
    pub(crate) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Result<Self, Error> {
        let (alg, key, iv) = key_material(&secrets)?;
        let key = UnboundKey::new(alg, key).map_err(|_| Error::UnsupportedSuite)?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The nonce of the next record, refused once the peer used its key up to rustls's soft limit (a peer must
    /// replace its key long before: at 2^24 records for AES-GCM).
    fn next_nonce(&self) -> Result<Nonce, Error> {
        if self.seq >= SEQ_SOFT_LIMIT {
            return Err(Error::KeyExhausted);
        }
        Ok(nonce(&self.iv, self.seq))
    }

    /// Open the record whose header is `header` and whose body (`TLSCiphertext.encrypted_record`) is `body`, in
    /// place. Returns the inner content type and the length of its content, which starts at `body[0]`.
    pub(crate) fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> Result<(u8, usize), Error> {
        let plain = self
            .key
            .open_in_place(self.next_nonce()?, Aad::from(header), body)
            .map_err(|_| Error::BadRecordMac)?;
        self.seq += 1;
        inner_content(plain)
    }

    /// Open the record whose header is `header` and whose body is `body` into `out`, which must be exactly
    /// `body.len() - TAG_LEN` bytes: the AEAD reads the ciphertext where it is and writes the inner plaintext
    /// there, so application data opened into the reader's buffer is never copied again. Returns what
    /// [`open`](Self::open) does, the content starting at `out[0]`; after a failure `out` holds nothing usable.
    pub(crate) fn open_into(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &[u8],
        out: &mut [u8],
    ) -> Result<(u8, usize), Error> {
        let Some(at) = body.len().checked_sub(TAG_LEN) else {
            return Err(Error::BadRecordMac);
        };
        if out.len() != at {
            return Err(Error::Crypto);
        }
        let (ciphertext, tag) = body.split_at(at);
        self.key
            .open_separate_gather(self.next_nonce()?, Aad::from(header), ciphertext, tag, out)
            .map_err(|_| Error::BadRecordMac)?;
        self.seq += 1;
        inner_content(out)
    }
}

/// The content type and content length of a `TLSInnerPlaintext`: the content, then the content type, then zero
/// padding. The whole of it, padding included, is at most 2^14 + 1 bytes (RFC 8446 §5.4): the length field lets a
/// peer send up to 2^14 + 256 bytes of ciphertext, but only for expansion by the AEAD.
fn inner_content(plain: &[u8]) -> Result<(u8, usize), Error> {
    if plain.len() > MAX_PLAINTEXT + 1 {
        return Err(Error::RecordOverflow);
    }
    match plain.iter().rposition(|&b| b != 0) {
        Some(at) => Ok((plain[at], at)),
        None => Err(Error::UnexpectedMessage("a record with no content type")),
    }
}

/// The header of a protected record whose body is `len` bytes: always "application data, TLS 1.2" on the wire.
pub(crate) fn header(len: usize) -> [u8; HEADER_LEN] {
    let [hi, lo] = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    [APPLICATION_DATA, 0x03, 0x03, hi, lo]
}

/// The body length a received header announces, checked: only protected records may follow the handshake.
pub(crate) fn parse_header(h: [u8; HEADER_LEN]) -> Result<usize, Error> {
    if h[0] != APPLICATION_DATA {
        return Err(Error::UnexpectedMessage("a record that is not protected"));
    }
    let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(Error::RecordOverflow);
    }
    // A tag alone is opened (and then refused for having no content type, as an all-zero inner plaintext is);
    // less than a tag cannot be authenticated.
    if len < TAG_LEN {
        return Err(Error::BadRecordMac);
    }
    Ok(len)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn secrets() -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([7u8; 32]),
            iv: Iv::from([9u8; 12]),
        }
    }

    fn sealer(seq: u64) -> SealKeys {
        SealKeys::new(seq, secrets()).unwrap()
    }

    fn opener(seq: u64) -> OpenKeys {
        OpenKeys::new(seq, secrets()).unwrap()
    }

    #[test]
    fn a_sealed_record_opens_with_its_content_type_and_advances_both_sequences() {
        let (mut tx, mut rx) = (sealer(5), opener(5));
        let data = b"hello over hbone";
        let mut rec = vec![0u8; record_len(data.len())];
        tx.seal(APPLICATION_DATA, data, &mut rec).unwrap();
        assert_eq!(tx.seq, 6);
        let h: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().unwrap();
        assert_eq!(parse_header(h).unwrap(), rec.len() - HEADER_LEN);
        assert_ne!(&rec[HEADER_LEN..HEADER_LEN + data.len()], data);
        let (ct, n) = rx.open(h, &mut rec[HEADER_LEN..]).unwrap();
        assert_eq!(
            (ct, &rec[HEADER_LEN..HEADER_LEN + n]),
            (APPLICATION_DATA, &data[..])
        );
        assert_eq!(rx.seq, 6);
    }

    #[test]
    fn a_record_opened_into_another_buffer_gives_what_opening_in_place_gives() {
        let mut tx = sealer(3);
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 199) as u8).collect();
        let mut rec = vec![0u8; record_len(data.len())];
        tx.seal(APPLICATION_DATA, &data, &mut rec).unwrap();
        let h: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().unwrap();
        let mut out = vec![0xAAu8; rec.len() - HEADER_LEN - TAG_LEN];
        let mut rx = opener(3);
        let (ct, n) = rx.open_into(h, &rec[HEADER_LEN..], &mut out).unwrap();
        assert_eq!((ct, &out[..n]), (APPLICATION_DATA, &data[..]));
        assert_eq!(rx.seq, 4);
        let mut in_place = rec.clone();
        assert_eq!(
            opener(3).open(h, &mut in_place[HEADER_LEN..]).unwrap(),
            (ct, n)
        );
        // The wrong room, a wrong sequence, an altered body: refused, and the sequence stays.
        let mut short = vec![0u8; out.len() - 1];
        assert!(matches!(
            opener(3).open_into(h, &rec[HEADER_LEN..], &mut short),
            Err(Error::Crypto)
        ));
        let mut altered = rec.clone();
        altered[HEADER_LEN + 10] ^= 0x40;
        let mut rx = opener(3);
        assert!(matches!(
            rx.open_into(h, &altered[HEADER_LEN..], &mut out),
            Err(Error::BadRecordMac)
        ));
        assert!(matches!(
            opener(4).open_into(h, &rec[HEADER_LEN..], &mut out),
            Err(Error::BadRecordMac)
        ));
        assert_eq!(rx.seq, 3);
    }

    #[test]
    fn a_record_opened_at_another_sequence_or_altered_fails() {
        let mut tx = sealer(0);
        let mut rec = vec![0u8; record_len(3)];
        tx.seal(HANDSHAKE, b"abc", &mut rec).unwrap();
        let h: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().unwrap();
        let mut wrong_seq = rec.clone();
        assert!(matches!(
            opener(1).open(h, &mut wrong_seq[HEADER_LEN..]),
            Err(Error::BadRecordMac)
        ));
        let mut flipped = rec.clone();
        flipped[HEADER_LEN] ^= 1;
        assert!(matches!(
            opener(0).open(h, &mut flipped[HEADER_LEN..]),
            Err(Error::BadRecordMac)
        ));
        let mut other_header = h;
        other_header[4] ^= 1;
        assert!(matches!(
            opener(0).open(other_header, &mut rec[HEADER_LEN..]),
            Err(Error::BadRecordMac)
        ));
    }

    #[test]
    fn headers_that_cannot_start_a_protected_record_are_refused() {
        assert!(matches!(
            parse_header([22, 3, 3, 0, 40]),
            Err(Error::UnexpectedMessage(_))
        ));
        let [hi, lo] = u16::try_from(MAX_CIPHERTEXT + 1).unwrap().to_be_bytes();
        assert!(matches!(
            parse_header([23, 3, 3, hi, lo]),
            Err(Error::RecordOverflow)
        ));
        assert!(matches!(
            parse_header([23, 3, 3, 0, 15]),
            Err(Error::BadRecordMac)
        ));
        assert_eq!(parse_header([23, 3, 3, 0, 16]).unwrap(), 16);
    }

    /// Seal `inner` as a whole `TLSInnerPlaintext` (content, type, padding) and open it both ways.
    fn open_inner(inner: &[u8]) -> [Result<(u8, usize), Error>; 2] {
        // `seal` appends the content type: the last byte of `inner`, whatever it is, is sealed as that.
        let (&last, rest) = inner.split_last().unwrap();
        let mut rec = vec![0u8; record_len(rest.len())];
        sealer(0).seal(last, rest, &mut rec).unwrap();
        let h: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().unwrap();
        let mut out = vec![0u8; rec.len() - HEADER_LEN - TAG_LEN];
        let into = opener(0).open_into(h, &rec[HEADER_LEN..], &mut out);
        [opener(0).open(h, &mut rec[HEADER_LEN..]), into]
    }

    #[test]
    fn an_inner_plaintext_longer_than_2_14_plus_1_octets_is_a_record_overflow() {
        let inner = |content: usize, padding: usize| {
            let mut v = vec![0x5a; content];
            v.push(APPLICATION_DATA);
            v.resize(content + 1 + padding, 0);
            v
        };
        // 2^14 + 1 octets is the most: full content and no padding, or less content and padding.
        for (content, padding) in [
            (MAX_PLAINTEXT, 0),
            (100, MAX_PLAINTEXT - 100),
            (0, MAX_PLAINTEXT),
        ] {
            for r in open_inner(&inner(content, padding)) {
                assert_eq!(r.unwrap(), (APPLICATION_DATA, content));
            }
        }
        // One octet more is a record_overflow (RFC 8446 §5.4), however little of it is content, up to what the
        // length field allows.
        for (content, padding) in [
            (MAX_PLAINTEXT, 1),
            (100, MAX_PLAINTEXT - 99),
            (0, MAX_CIPHERTEXT - TAG_LEN - 1),
        ] {
            for r in open_inner(&inner(content, padding)) {
                assert!(matches!(r, Err(Error::RecordOverflow)), "{r:?}");
            }
        }
    }

    #[test]
    fn padding_and_an_empty_inner_plaintext_are_told_apart() {
        // A record whose inner plaintext is all zeros has no content type: a protocol error.
        let mut tx = sealer(0);
        let mut rec = vec![0u8; record_len(0)];
        // Seal "no content" with content type 0 to build such a record.
        tx.seal(0, &[], &mut rec).unwrap();
        let h: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().unwrap();
        assert!(matches!(
            opener(0).open(h, &mut rec[HEADER_LEN..]),
            Err(Error::UnexpectedMessage(_))
        ));
    }

    #[test]
    fn a_fresh_sending_key_never_seals_two_records_under_one_nonce() {
        // A key that starts at sequence 0 is aws-lc's TLS 1.3 record key: sealing at a sequence number already
        // used (a bug that moved `seq` back) is refused by the AEAD itself, and nothing is sealed.
        let mut tx = sealer(0);
        let mut rec = vec![0u8; record_len(3)];
        tx.seal(APPLICATION_DATA, b"one", &mut rec).unwrap();
        tx.seal(APPLICATION_DATA, b"two", &mut rec).unwrap();
        tx.seq = 1;
        let mut again = vec![0u8; record_len(3)];
        assert!(matches!(
            tx.seal(APPLICATION_DATA, b"two", &mut again),
            Err(Error::Crypto)
        ));
        assert!(again[HEADER_LEN..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_key_is_refused_before_its_sequence_numbers_wrap() {
        let mut rec = vec![0u8; record_len(1)];
        let mut tx = sealer(SEQ_HARD_LIMIT - 1);
        tx.seal(APPLICATION_DATA, b"x", &mut rec).unwrap();
        assert!(matches!(
            tx.seal(APPLICATION_DATA, b"x", &mut rec),
            Err(Error::KeyExhausted)
        ));
        // The peer's key: up to rustls's soft limit, not at it.
        let mut tx = sealer(SEQ_SOFT_LIMIT - 1);
        let mut last = vec![0u8; record_len(1)];
        tx.seal(APPLICATION_DATA, b"y", &mut last).unwrap();
        let h: [u8; HEADER_LEN] = last[..HEADER_LEN].try_into().unwrap();
        let mut rx = opener(SEQ_SOFT_LIMIT - 1);
        assert!(rx.open(h, &mut last.clone()[HEADER_LEN..]).is_ok());
        assert!(matches!(
            rx.open(h, &mut last[HEADER_LEN..]),
            Err(Error::KeyExhausted)
        ));
    }
}
