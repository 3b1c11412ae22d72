//! A weft-tls pair over an in-memory stream, for what only the stream's insides can show.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};
use std::time::Duration;

use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::record::{APPLICATION_DATA, HANDSHAKE};

type Stream = TlsStream<tokio::io::DuplexStream>;

/// A client (first) and a server; the server sends two session tickets after the handshake, as rustls does by
/// default.
async fn pair() -> (Stream, Stream) {
    pair_with(|_| {}).await
}

async fn pair_with(client_config: impl FnOnce(&mut rustls::ClientConfig)) -> (Stream, Stream) {
    pair_over(64 * 1024, client_config).await
}

/// A pair over an in-memory stream that holds `capacity` bytes each way.
async fn pair_over(
    capacity: usize,
    client_config: impl FnOnce(&mut rustls::ClientConfig),
) -> (Stream, Stream) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.enable_secret_extraction = true;
    server.send_tls13_tickets = 2;
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.enable_secret_extraction = true;
    client_config(&mut client);
    let (c, s) = tokio::io::duplex(capacity);
    let name = ServerName::try_from("node.test").unwrap();
    let (a, b) = tokio::join!(
        crate::connect(Arc::new(client), name, c),
        crate::accept(Arc::new(server), s)
    );
    (a.unwrap(), b.unwrap())
}

#[tokio::test]
async fn the_sending_key_is_replaced_before_it_reaches_its_limit() {
    let (mut a, mut b) = pair().await;
    a.tx_limit = a.tx.seq + 4;
    let data: Vec<u8> = (0..10 * MAX_PLAINTEXT).map(|i| (i % 253) as u8).collect();
    let mut got = vec![0u8; data.len()];
    let (w, r) = tokio::join!(
        async {
            a.write_all(&data).await?;
            a.flush().await
        },
        b.read_exact(&mut got)
    );
    w.unwrap();
    r.unwrap();
    assert!(got == data);
    // 10 data records under a limit of 4 per key: the key was replaced three times (each KeyUpdate is the
    // last record under its key), and the peer followed every time.
    assert!(a.tx.seq < 4, "{:?}", a.tx);
    assert_eq!(b.rx.seq, a.tx.seq);
}

#[tokio::test]
async fn a_peer_that_floods_key_updates_without_data_is_cut_off() {
    let (mut a, mut b) = pair().await;
    for _ in 0..=MAX_KEY_UPDATES_IN_A_ROW {
        a.refresh_traffic_keys(false);
        a.flush().await.unwrap();
    }
    let err = b.read(&mut [0u8; 16]).await.unwrap_err();
    assert!(err.to_string().contains("too many KeyUpdates"), "{err}");
}

#[tokio::test]
async fn records_after_close_notify_are_ignored() {
    let (mut a, mut b) = pair().await;
    a.write_all(b"before").await.unwrap();
    a.shutdown().await.unwrap();
    let mut got = Vec::new();
    b.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"before");
    assert!(
        a.write_all(b"after").await.is_err(),
        "no data after our close_notify"
    );
}

/// Write `slices` as one vectored write (all of it taken), flush, and read it back through `b`, `read_size` bytes of
/// room per read; returns the records the write took (meaningless across a key update, which restarts the count).
async fn vectored_round_trip(
    a: &mut TlsStream<tokio::io::DuplexStream>,
    b: &mut TlsStream<tokio::io::DuplexStream>,
    slices: &[&[u8]],
    read_size: usize,
) -> u64 {
    let want: Vec<u8> = slices.concat();
    let before = a.tx.seq;
    let io: Vec<IoSlice<'_>> = slices.iter().map(|s| IoSlice::new(s)).collect();
    let mut got = Vec::new();
    let (w, r) = tokio::join!(
        async {
            let n = a.write_vectored(&io).await?;
            assert_eq!(n, want.len(), "one write takes it all");
            a.flush().await
        },
        async {
            let mut buf = vec![0u8; read_size];
            while got.len() < want.len() {
                let n = b.read(&mut buf).await?;
                assert!(n > 0, "early end");
                got.extend_from_slice(&buf[..n]);
            }
            Ok::<_, io::Error>(())
        }
    );
    w.unwrap();
    r.unwrap();
    assert!(got == want, "the bytes arrive as written");
    a.tx.seq.wrapping_sub(before)
}

#[tokio::test]
async fn a_frame_head_before_a_long_payload_is_not_sealed_with_a_copy_of_the_payload() {
    let (mut a, mut b) = pair().await;
    // h2's shape: its head buffer (9 bytes of frame head and the payload's first bytes, 256 together), then the rest.
    let head: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
    let payload: Vec<u8> = (0..4 * MAX_PLAINTEXT).map(|i| (i % 251) as u8).collect();
    let records = vectored_round_trip(&mut a, &mut b, &[&head, &payload], 1 << 20).await;
    // The head alone, then four full records straight from the payload. (Gathering made as many records, the
    // first with 16 KiB of the payload copied into it: the gather buffer's size tells the two apart.)
    assert_eq!(records, 5);
    assert!(
        a.gather.capacity() < GATHER_BELOW,
        "{}",
        a.gather.capacity()
    );
    // A long slice ending inside a record ends a shorter record; the next long slice starts its own.
    let first = vec![7u8; MAX_PLAINTEXT + 3000];
    let records = vectored_round_trip(&mut a, &mut b, &[&first, &payload], 1 << 20).await;
    assert_eq!(records, 2 + 4);
}

#[tokio::test]
async fn short_slices_are_gathered_into_full_records() {
    let (mut a, mut b) = pair().await;
    let small: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 512]).collect();
    let slices: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    // 32 KiB in 512-byte slices: two full records.
    assert_eq!(
        vectored_round_trip(&mut a, &mut b, &slices, 1 << 20).await,
        2
    );
    // Short pieces, then a long slice: the pieces go together, the long slice starts its own records.
    let long = vec![9u8; 20_000];
    let records =
        vectored_round_trip(&mut a, &mut b, &[&small[0], &small[1], &long], 1 << 20).await;
    assert_eq!(records, 1 + 2);
    // A short piece that completes a record is copied from a long slice; a long remainder is not.
    let nearly = vec![3u8; MAX_PLAINTEXT - 100];
    let records =
        vectored_round_trip(&mut a, &mut b, &[&small[2][..200], &nearly, &long], 1 << 20).await;
    assert_eq!(records, 1 + 1 + 2);
}

#[tokio::test]
async fn records_read_into_ample_or_scant_room_deliver_the_same_bytes() {
    let (mut a, mut b) = pair().await;
    let data: Vec<u8> = (0..3 * MAX_PLAINTEXT + 77)
        .map(|i| (i % 241) as u8)
        .collect();
    // Room for whole records: each is opened straight into the reader's buffer.
    vectored_round_trip(&mut a, &mut b, &[&data], MAX_PLAINTEXT + 64).await;
    assert!(b.plain.is_none());
    // Less room than a record: opened in place and handed out in pieces.
    vectored_round_trip(&mut a, &mut b, &[&data], 1000).await;
    vectored_round_trip(&mut a, &mut b, &[&data], 1).await;
    // A key update, then a close, each arriving in a record opened into the reader's buffer.
    a.refresh_traffic_keys(true);
    vectored_round_trip(&mut a, &mut b, &[&data], MAX_PLAINTEXT + 64).await;
    assert_eq!(b.rx.seq, a.tx.seq);
    a.shutdown().await.unwrap();
    let mut rest = vec![0u8; 4 * MAX_PLAINTEXT];
    assert_eq!(b.read(&mut rest).await.unwrap(), 0);
    assert!(b.read_closed);
}

/// Seal `records` (content type, content) at `s` as they are, and send them.
async fn send_records(s: &mut Stream, records: &[(u8, &[u8])]) {
    for (content_type, content) in records {
        s.seal_record(*content_type, content, 0).unwrap();
    }
    s.flush().await.unwrap();
}

/// What one read of `s` brings: bytes, or its error. A read that waits fails the test.
async fn read_once(s: &mut Stream) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the read waited for more")?;
    Ok(buf[..n].to_vec())
}

/// `s`'s read fails, and its error says `why`.
async fn read_fails(s: &mut Stream, why: &str) {
    match read_once(s).await {
        Err(e) => assert!(e.to_string().contains(why), "{e}, not {why}"),
        Ok(got) => panic!("read {got:?}, not an error saying {why}"),
    }
}

#[tokio::test]
async fn empty_records_pass_up_to_rustls_limit_in_a_row_and_no_further() {
    let (mut a, mut b) = pair().await;
    let empty = (APPLICATION_DATA, &[][..]);
    let mut records = vec![empty; MAX_EMPTY_RECORDS_IN_A_ROW as usize];
    records.push((APPLICATION_DATA, b"x"));
    send_records(&mut b, &records).await;
    assert_eq!(read_once(&mut a).await.unwrap(), b"x");
    // Data started the count again; one more than the limit in a row is refused, and the peer hears why.
    records.pop();
    records.push(empty);
    records.push((APPLICATION_DATA, b"y"));
    send_records(&mut b, &records).await;
    read_fails(&mut a, "too many empty records").await;
    read_fails(&mut b, "alert 10").await;
}

#[tokio::test]
async fn an_empty_record_does_not_reset_the_key_update_count() {
    let (mut a, mut b) = pair().await;
    // One more KeyUpdate than the limit, an empty record after each but the last.
    for i in 0..=MAX_KEY_UPDATES_IN_A_ROW {
        b.refresh_traffic_keys(false);
        b.flush().await.unwrap();
        if i < MAX_KEY_UPDATES_IN_A_ROW {
            send_records(&mut b, &[(APPLICATION_DATA, &[])]).await;
        }
    }
    send_records(&mut b, &[(APPLICATION_DATA, b"x")]).await;
    read_fails(&mut a, "too many KeyUpdates").await;
}

#[tokio::test]
async fn user_canceled_warnings_pass_up_to_rustls_limit_per_connection() {
    let (mut a, mut b) = pair().await;
    let warning = (ALERT, &[1, USER_CANCELED][..]);
    for _ in 0..MAX_WARNING_ALERTS {
        send_records(&mut b, &[warning, (APPLICATION_DATA, b"x")]).await;
        assert_eq!(read_once(&mut a).await.unwrap(), b"x");
    }
    // The limit is per connection: data in between does not start it again.
    send_records(&mut b, &[warning, (APPLICATION_DATA, b"y")]).await;
    read_fails(&mut a, "too many warning alerts").await;
}

#[tokio::test]
async fn a_fatal_alert_of_any_description_is_an_error() {
    for desc in [USER_CANCELED, 40, 255] {
        let (mut a, mut b) = pair().await;
        send_records(&mut b, &[(ALERT, &[2, desc]), (APPLICATION_DATA, b"x")]).await;
        read_fails(&mut a, &format!("alert {desc}")).await;
    }
}

#[tokio::test]
async fn an_alert_of_an_unknown_level_gets_illegal_parameter() {
    let (mut a, mut b) = pair().await;
    send_records(&mut b, &[(ALERT, &[3, USER_CANCELED])]).await;
    read_fails(&mut a, "alert").await;
    read_fails(&mut b, "alert 47").await;
}

#[tokio::test]
async fn after_a_fatal_alert_from_the_peer_writes_fail() {
    let (mut a, mut b) = pair().await;
    send_records(&mut b, &[(ALERT, &[2, 40])]).await;
    read_fails(&mut a, "alert 40").await;
    let err = a.write_all(b"too late").await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    // Nothing more reaches the peer: it sees the transport end without a record after the alert.
    a.shutdown().await.unwrap();
    read_fails(&mut b, "close_notify").await;
}

/// A waker that counts its wakes.
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_read_gives_way_after_a_run_of_records_that_deliver_nothing() {
    let (mut a, mut b) = pair().await;
    // Session tickets from the handshake are records that deliver nothing too: read past them first.
    send_records(&mut b, &[(APPLICATION_DATA, b"go")]).await;
    assert_eq!(read_once(&mut a).await.unwrap(), b"go");
    let mut records = vec![(APPLICATION_DATA, &[][..]); IDLE_RECORDS_PER_READ as usize];
    records.push((APPLICATION_DATA, b"x"));
    send_records(&mut b, &records).await;

    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut buf = [0u8; 64];
    let mut out = ReadBuf::new(&mut buf);
    // The first call opens a bounded run of records, delivers nothing, and asks to be polled again at once.
    let first = Pin::new(&mut a).poll_read(&mut cx, &mut out);
    assert!(first.is_pending(), "{first:?}: {:?}", out.filled());
    assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
    assert!(!a.rbuf.is_empty(), "records are left for the next call");
    let mut polls = 1;
    while Pin::new(&mut a).poll_read(&mut cx, &mut out).is_pending() {
        polls += 1;
        assert_eq!(
            wakes.0.load(Ordering::Relaxed),
            polls,
            "woken for every call"
        );
    }
    assert_eq!(out.filled(), b"x");
}

#[tokio::test]
async fn a_key_update_with_an_unknown_request_gets_illegal_parameter() {
    let (mut a, mut b) = pair().await;
    send_records(&mut b, &[(HANDSHAKE, &[24, 0, 0, 1, 2])]).await;
    read_fails(&mut a, "KeyUpdate").await;
    read_fails(&mut b, "alert 47").await;
    // One of the wrong length is malformed: decode_error.
    let (mut a, mut b) = pair().await;
    send_records(&mut b, &[(HANDSHAKE, &[24, 0, 0, 2, 0, 0])]).await;
    read_fails(&mut a, "KeyUpdate").await;
    read_fails(&mut b, "alert 50").await;
}

/// A NewSessionTicket message (RFC 8446 §4.6.1) carrying a ticket of `ticket_len` bytes and `extensions` (an
/// encoded extension list without its length).
fn session_ticket(ticket_len: usize, extensions: &[u8]) -> Vec<u8> {
    let mut body = vec![0, 0, 0x1c, 0x20, 1, 2, 3, 4, 1, 0];
    body.extend_from_slice(&u16::try_from(ticket_len).unwrap().to_be_bytes());
    body.extend((0..ticket_len).map(|i| i as u8));
    body.extend_from_slice(&u16::try_from(extensions.len()).unwrap().to_be_bytes());
    body.extend_from_slice(extensions);
    let mut msg = vec![4];
    msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    msg
}

#[tokio::test]
async fn a_malformed_session_ticket_gets_decode_error() {
    let mut ticket = session_ticket(32, &[]);
    ticket.truncate(ticket.len() - 1); // the extensions' length cut short
    ticket[3] -= 1;
    for body in [&[4, 0, 0, 3, 1, 2, 3][..], &ticket] {
        let (mut a, mut b) = pair().await;
        send_records(&mut b, &[(HANDSHAKE, body)]).await;
        read_fails(&mut a, "NewSessionTicket").await;
        read_fails(&mut b, "alert 50").await;
    }
}

#[tokio::test]
async fn session_tickets_are_dropped_without_reaching_rustls() {
    let store = Arc::new(ClientSessionMemoryCache::new(8));
    let (mut a, mut b) = pair_with(|c| c.resumption = Resumption::store(store.clone())).await;
    // The two tickets of the handshake, and one with an early_data extension and one the stream does not know.
    let ticket = session_ticket(100, &[0, 42, 0, 4, 0, 0, 0x40, 0, 0xfa, 0xfa, 0, 1, 7]);
    send_records(&mut b, &[(HANDSHAKE, &ticket), (APPLICATION_DATA, b"x")]).await;
    assert_eq!(read_once(&mut a).await.unwrap(), b"x");
    let name = ServerName::try_from("node.test").unwrap();
    assert!(
        store.take_tls13_ticket(&name).is_none(),
        "a ticket went to rustls's store"
    );
}

#[tokio::test]
async fn session_tickets_past_the_limit_per_connection_are_refused() {
    let (mut a, mut b) = pair().await;
    let ticket = session_ticket(64, &[]);
    // Two came with the handshake.
    let mut records = vec![(HANDSHAKE, &ticket[..]); MAX_SESSION_TICKETS as usize - 2];
    records.push((APPLICATION_DATA, b"x"));
    send_records(&mut b, &records).await;
    let mut got = Vec::new();
    while got.is_empty() {
        got = read_once(&mut a).await.unwrap();
    }
    assert_eq!(got, b"x");
    send_records(&mut b, &[(HANDSHAKE, &ticket), (APPLICATION_DATA, b"y")]).await;
    read_fails(&mut a, "too many NewSessionTickets").await;
}

#[tokio::test]
async fn handshake_messages_packed_into_and_split_across_records_are_all_taken() {
    let (mut a, mut b) = pair().await;
    let small = session_ticket(20, &[]);
    let large = session_ticket(40_000, &[]);
    // Two whole tickets and the start of a third in one record, its middle in the next, its end with a KeyUpdate
    // in the last; then data under the new key.
    let mut bytes = [small.clone(), small.clone(), large.clone()].concat();
    let first = 2 * small.len() + 1000;
    let second = first + MAX_PLAINTEXT;
    bytes.extend_from_slice(&[24, 0, 0, 1, 0]);
    send_records(
        &mut b,
        &[
            (HANDSHAKE, &bytes[..first]),
            (HANDSHAKE, &bytes[first..second]),
            (HANDSHAKE, &bytes[second..second + MAX_PLAINTEXT]),
            (HANDSHAKE, &bytes[second + MAX_PLAINTEXT..]),
        ],
    )
    .await;
    let (seq, secrets) = b.kernel.update_tx().unwrap();
    b.tx = crate::record::SealKeys::new(seq, secrets).unwrap();
    send_records(&mut b, &[(APPLICATION_DATA, b"x")]).await;
    assert_eq!(read_once(&mut a).await.unwrap(), b"x");
    assert!(a.hs.is_empty() && a.hs.capacity() == 0);
}

#[tokio::test]
async fn an_alert_on_an_error_path_goes_under_a_new_key_once_the_old_one_is_at_its_limit() {
    let (mut a, mut b) = pair().await;
    // The next record of `a`'s is the last its key may seal: that must be a KeyUpdate, whatever comes next.
    a.tx_limit = a.tx.seq + 1;
    send_records(&mut b, &[(99, b"?")]).await;
    read_fails(&mut a, "unknown content type").await;
    // The KeyUpdate went under the old key, the alert as the first record under the new one; `b` followed.
    assert_eq!(a.tx.seq, 1, "{:?}", a.tx);
    read_fails(&mut b, "alert 10").await;
    assert_eq!(b.rx.seq, 1, "{:?}", b.rx);
}

#[tokio::test]
async fn close_notify_goes_under_a_new_key_once_the_old_one_is_at_its_limit() {
    let (mut a, mut b) = pair().await;
    a.tx_limit = a.tx.seq + 1;
    a.shutdown().await.unwrap();
    assert_eq!(a.tx.seq, 1, "{:?}", a.tx);
    assert_eq!(b.read(&mut [0u8; 8]).await.unwrap(), 0);
    assert_eq!(b.rx.seq, 1, "{:?}", b.rx);
}

#[tokio::test]
async fn an_alert_the_transport_could_not_take_goes_out_with_later_reads() {
    // `b`'s way to `a` holds 1 KiB: 8 KiB of data from `b` (records of 512 bytes) wait in its queue when its read
    // fails.
    let (mut a, mut b) = pair_over(1024, |_| {}).await;
    let data: Vec<u8> = (0..8 * 1024u32).map(|i| (i % 251) as u8).collect();
    for chunk in data.chunks(512) {
        assert_eq!(b.write(chunk).await.unwrap(), chunk.len());
    }
    send_records(&mut a, &[(99, b"?")]).await;
    read_fails(&mut b, "unknown content type").await;
    assert!(b.queued > 0, "the alert waits behind the data");
    // `b`'s application only reads (each read fails again) and `a` drains: the data, then the alert.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let err = loop {
        assert!(b.read(&mut [0u8; 16]).await.is_err());
        match tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await {
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => break e,
            Err(_) => panic!("nothing more reached `a` after {} bytes", got.len()),
        }
    };
    assert!(got == data, "{} bytes of {}", got.len(), data.len());
    assert!(err.to_string().contains("alert 10"), "{err}");
}
