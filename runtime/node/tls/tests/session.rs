//! weft-tls against rustls's own record layer (tokio-rustls) and against itself, over real TCP sockets: data both
//! ways in every write shape, key updates from either side, close_notify, truncation, tampering and a refused
//! handshake.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::io::IoSlice;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft_tls::TlsStream;

struct Pki {
    roots: RootCertStore,
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["node.test".to_string()]).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca, &ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    Pki {
        roots,
        chain: vec![leaf_cert.der().clone()],
        key: PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
    }
}

fn provider(suite: SupportedCipherSuite) -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![suite];
    Arc::new(p)
}

fn configs(suite: SupportedCipherSuite) -> (Arc<ClientConfig>, Arc<ServerConfig>) {
    let pki = pki();
    let mut server = ServerConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(pki.roots.clone()),
                provider(suite),
            )
            .build()
            .unwrap(),
        )
        .with_single_cert(pki.chain.clone(), PrivateKeyDer::Pkcs8(pki.key.clone_key()))
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec()];
    server.send_tls13_tickets = 2;
    server.enable_secret_extraction = true;
    let mut client = ClientConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(pki.roots)
        .with_client_auth_cert(pki.chain, PrivateKeyDer::Pkcs8(pki.key))
        .unwrap();
    client.alpn_protocols = vec![b"h2".to_vec()];
    client.enable_secret_extraction = true;
    (Arc::new(client), Arc::new(server))
}

fn name() -> ServerName<'static> {
    ServerName::try_from("node.test").unwrap()
}

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
    (c.unwrap(), s.unwrap().0)
}

/// A weft-tls client and server, connected over TCP.
async fn weft_pair(suite: SupportedCipherSuite) -> (TlsStream<TcpStream>, TlsStream<TcpStream>) {
    let (client_cfg, server_cfg) = configs(suite);
    let (c, s) = tcp_pair().await;
    let (a, b) = tokio::join!(
        weft_tls::connect(client_cfg, name(), c),
        weft_tls::accept(server_cfg, s)
    );
    (a.unwrap(), b.unwrap())
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

/// Write `data` in writes of the given sizes, in turn (vectored pairs when `vectored`), then shut down.
async fn send<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8], sizes: &[usize], vectored: bool) {
    let mut at = 0;
    let mut k = 0;
    while at < data.len() {
        let n = sizes[k % sizes.len()].min(data.len() - at);
        k += 1;
        if vectored && n > 9 {
            let (a, b) = data[at..at + n].split_at(9);
            let mut done = 0;
            while done < n {
                let wrote = if done < 9 {
                    w.write_vectored(&[IoSlice::new(&a[done..]), IoSlice::new(b)])
                        .await
                        .unwrap()
                } else {
                    w.write(&b[done - 9..]).await.unwrap()
                };
                done += wrote;
            }
        } else {
            w.write_all(&data[at..at + n]).await.unwrap();
        }
        at += n;
    }
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
}

async fn receive<R: AsyncRead + Unpin>(r: &mut R) -> Vec<u8> {
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    got
}

const SUITES: [SupportedCipherSuite; 2] = [
    rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
    rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
];

#[tokio::test]
async fn data_crosses_both_ways_against_rustls_in_every_write_shape() {
    for suite in SUITES {
        for (sizes, vectored) in [
            (&[1usize, 7, 100][..], false),
            (&[16 * 1024, 16 * 1024 + 1, 3][..], false),
            (&[1024 * 1024][..], true),
            (&[65_000, 9, 300_000][..], true),
        ] {
            let (client_cfg, server_cfg) = configs(suite);
            let up = pattern(2 * 1024 * 1024 + 17, 1);
            let down = pattern(1024 * 1024 + 5, 2);

            // weft-tls client, rustls server.
            let (c, s) = tcp_pair().await;
            let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg.clone());
            let server = tokio::spawn({
                let down = down.clone();
                async move {
                    let tls = acceptor.accept(s).await.unwrap();
                    let (mut r, mut w) = tokio::io::split(tls);
                    let (got, ()) =
                        tokio::join!(receive(&mut r), send(&mut w, &down, &[50_000], false));
                    got
                }
            });
            let tls = weft_tls::connect(client_cfg.clone(), name(), c)
                .await
                .unwrap();
            assert_eq!(tls.negotiated_cipher_suite().suite(), suite.suite());
            assert_eq!(tls.alpn_protocol(), Some(&b"h2"[..]));
            assert!(tls.peer_certificates().is_some_and(|c| c.len() == 1));
            let (mut r, mut w) = tokio::io::split(tls);
            let (got_down, ()) = tokio::join!(receive(&mut r), send(&mut w, &up, sizes, vectored));
            assert!(
                got_down == down,
                "download through weft-tls client differs ({sizes:?})"
            );
            assert!(
                server.await.unwrap() == up,
                "upload from weft-tls client differs ({sizes:?})"
            );

            // rustls client, weft-tls server.
            let (c, s) = tcp_pair().await;
            let server = tokio::spawn({
                let up = up.clone();
                let sizes = sizes.to_vec();
                async move {
                    let tls = weft_tls::accept(server_cfg, s).await.unwrap();
                    assert!(tls.peer_certificates().is_some_and(|c| c.len() == 1));
                    let (mut r, mut w) = tokio::io::split(tls);
                    let (got, ()) =
                        tokio::join!(receive(&mut r), send(&mut w, &up, &sizes, vectored));
                    got
                }
            });
            let tls = tokio_rustls::TlsConnector::from(client_cfg)
                .connect(name(), c)
                .await
                .unwrap();
            let (mut r, mut w) = tokio::io::split(tls);
            let (got_up, ()) =
                tokio::join!(receive(&mut r), send(&mut w, &down, &[70_000, 1], false));
            assert!(
                got_up == up,
                "data from weft-tls server differs ({sizes:?})"
            );
            assert!(
                server.await.unwrap() == down,
                "data to weft-tls server differs ({sizes:?})"
            );
        }
    }
}

/// Exchange one message each way over an established pair and check it arrived.
async fn ping<A, B>(a: &mut A, b: &mut B, n: usize, seed: u8)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let msg = pattern(n, seed);
    a.write_all(&msg).await.unwrap();
    a.flush().await.unwrap();
    let mut got = vec![0u8; n];
    b.read_exact(&mut got).await.unwrap();
    assert!(got == msg);
    b.write_all(&msg).await.unwrap();
    b.flush().await.unwrap();
    a.read_exact(&mut got).await.unwrap();
    assert!(got == msg);
}

#[tokio::test]
async fn key_updates_from_either_side_keep_the_session_going() {
    let (client_cfg, server_cfg) = configs(SUITES[1]);
    let (c, s) = tcp_pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    let (ours, theirs) = tokio::join!(weft_tls::connect(client_cfg, name(), c), acceptor.accept(s));
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    ping(&mut ours, &mut theirs, 40_000, 1).await;

    // Our key update: the next record goes out under a new key (sequence back to 1 after it).
    ours.refresh_traffic_keys(false);
    ping(&mut ours, &mut theirs, 100, 2).await;
    assert_eq!(
        ours.sequence_numbers().0,
        1,
        "one record sent under the new key"
    );

    // Asking the peer to update too: rustls answers with its own KeyUpdate, which we follow.
    let rx_before = ours.sequence_numbers().1;
    ours.refresh_traffic_keys(true);
    ping(&mut ours, &mut theirs, 20_000, 3).await;
    assert!(
        ours.sequence_numbers().1 < rx_before,
        "the peer's records now count from its new key"
    );

    // rustls updating on its own.
    theirs.get_mut().1.refresh_traffic_keys().unwrap();
    ping(&mut theirs, &mut ours, 70_000, 4).await;
    let (tx, rx) = ours.sequence_numbers();
    assert!(rx <= 6, "received under the peer's third key: {rx}");
    ping(&mut ours, &mut theirs, 10, 5).await;
    assert_eq!(ours.sequence_numbers().0, tx + 1);
}

#[tokio::test]
async fn weft_tls_speaks_to_itself_and_a_requested_key_update_is_answered() {
    let (mut a, mut b) = weft_pair(SUITES[0]).await;
    ping(&mut a, &mut b, 3 * 16 * 1024 + 5, 1).await;
    a.refresh_traffic_keys(true);
    ping(&mut a, &mut b, 1000, 2).await;
    // b answered a's request before its own next record: both directions restarted their sequences.
    assert_eq!(a.sequence_numbers(), (1, 1));
    assert_eq!(b.sequence_numbers(), (1, 1));
    // Shutdown: close_notify reaches the other side as a clean end of stream.
    a.shutdown().await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(b.read_to_end(&mut rest).await.unwrap(), 0);
    b.write_all(b"still open the other way").await.unwrap();
    b.shutdown().await.unwrap();
    a.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"still open the other way");
}

#[tokio::test]
async fn a_quiet_connection_holds_no_buffers_after_bulk_data() {
    let (mut a, mut b) = weft_pair(SUITES[0]).await;
    let bulk = pattern(4 * 1024 * 1024, 9);
    let mut got = vec![0u8; bulk.len()];
    // Written, then flushed: what the last writes sealed may wait in the stream's queue until then.
    let (w, r) = tokio::join!(
        async {
            a.write_all(&bulk).await?;
            a.flush().await
        },
        b.read_exact(&mut got)
    );
    w.unwrap();
    r.unwrap();
    assert!(got == bulk);
    // A busy stream keeps its buffers through the ends of frames; a few quiet exchanges and they are gone.
    assert!(a.buffer_capacity() > 0 && b.buffer_capacity() > 0);
    for i in 0..4 {
        ping(&mut a, &mut b, 64, i).await;
    }
    assert_eq!(a.buffer_capacity(), 0);
    assert_eq!(b.buffer_capacity(), 0);
}

#[tokio::test]
async fn a_connection_cut_without_close_notify_is_an_unexpected_eof() {
    let (client_cfg, server_cfg) = configs(SUITES[0]);
    let (c, s) = tcp_pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    let (ours, theirs) = tokio::join!(weft_tls::connect(client_cfg, name(), c), acceptor.accept(s));
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    theirs.write_all(b"last words").await.unwrap();
    theirs.flush().await.unwrap();
    drop(theirs);
    let mut got = [0u8; 10];
    ours.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"last words");
    let err = ours.read(&mut got).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
}

/// A transport that flips one bit of what it writes, once armed.
struct Tamper {
    inner: TcpStream,
    armed: bool,
}

impl AsyncRead for Tamper {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tamper {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.armed && buf.len() > 10 {
            self.armed = false;
            let mut copy = buf.to_vec();
            copy[10] ^= 0x40;
            return std::pin::Pin::new(&mut self.inner).poll_write(cx, &copy);
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn an_altered_record_fails_authentication_and_the_sender_hears_why() {
    let (client_cfg, server_cfg) = configs(SUITES[1]);
    let (c, s) = tcp_pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    let (ours, theirs) = tokio::join!(
        weft_tls::connect(client_cfg, name(), c),
        acceptor.accept(Tamper {
            inner: s,
            armed: false
        })
    );
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    theirs.get_mut().0.armed = true;
    theirs.write_all(&pattern(5000, 1)).await.unwrap();
    theirs.flush().await.unwrap();
    let mut got = vec![0u8; 5000];
    let err = ours.read_exact(&mut got).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("bad_record_mac"), "{err}");
    // The error sticks, and the peer got a bad_record_mac alert.
    assert!(ours.read(&mut got).await.is_err());
    let err = theirs.read(&mut got).await.unwrap_err();
    assert!(err.to_string().contains("BadRecordMac"), "{err}");
}

#[tokio::test]
async fn a_refused_handshake_fails_on_both_sides_with_the_reason() {
    let (client_cfg, _) = configs(SUITES[0]);
    let (_, other_server) = configs(SUITES[0]); // another CA
    let (c, s) = tcp_pair().await;
    let (ours, theirs) = tokio::join!(
        weft_tls::connect(client_cfg, name(), c),
        weft_tls::accept(other_server, s)
    );
    let ours = ours.unwrap_err().to_string();
    assert!(
        ours.contains("UnknownIssuer") || ours.contains("certificate"),
        "{ours}"
    );
    let theirs = theirs.unwrap_err().to_string();
    assert!(
        theirs.contains("alert") || theirs.contains("Alert"),
        "{theirs}"
    );
}

#[tokio::test]
async fn a_config_without_secret_extraction_is_refused_with_a_clear_error() {
    let (client_cfg, server_cfg) = configs(SUITES[0]);
    let mut plain = (*client_cfg).clone();
    plain.enable_secret_extraction = false;
    let (c, s) = tcp_pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    let (ours, _theirs) = tokio::join!(
        weft_tls::connect(Arc::new(plain), name(), c),
        acceptor.accept(s)
    );
    let err = ours.unwrap_err().to_string();
    assert!(err.contains("extraction"), "{err}");
}
