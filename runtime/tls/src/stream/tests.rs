//! A weft-tls pair over an in-memory stream, for what only the stream's insides can show.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::sync::Arc;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

async fn pair() -> (
    TlsStream<tokio::io::DuplexStream>,
    TlsStream<tokio::io::DuplexStream>,
) {
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
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.enable_secret_extraction = true;
    let (c, s) = tokio::io::duplex(64 * 1024);
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
