//! `tls_records`: what a TLS peer sends after the handshake, through weft's own record layer (`weft-tls`). A real
//! TLS 1.3 handshake runs between a weft-tls client and server over an in-memory stream (certificates made once per
//! process); then the input is a script of steps by the server, which plays a peer that may break the rules: data,
//! records of any content type and length sealed with the right keys (handshake messages, alerts, padding,
//! oversized content), raw bytes no TLS layer made, key updates (asking the client to update too or not), its
//! close_notify; and by the client: data, key updates, reading what has arrived.
//!
//! Invariants beyond "no panic, no hang, no OOM": while the server plays by the rules, the client receives exactly
//! the data sent and then a clean end of stream, and otherwise never data that differs from what was sent before
//! the first broken rule; a read that failed keeps failing; the server receives exactly what the client wrote, and a
//! clean end of stream, unless the client hit an error or flooded the server with key updates (then a prefix of
//! it). The rules include weft-tls's limits on records that deliver nothing, which are rustls's: more than 32 empty
//! records or 32 key updates in a row without data is a flood. The script takes a run that may reach a limit as a
//! broken rule, as it cannot see every key update sent to answer a request.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use weft_tls::TlsStream;

/// Bytes of data (both ways together) one input may ask for.
const MAX_DATA: usize = 2 * 1024 * 1024;

/// rustls's limits on empty records and on key updates in a row without data (weft-tls has the same).
const MAX_EMPTY_IN_A_ROW: usize = 32;
const MAX_KEY_UPDATES_IN_A_ROW: usize = 32;

fn configs() -> &'static (Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>) {
    static C: OnceLock<(Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>)> = OnceLock::new();
    C.get_or_init(|| {
        let fail = |what: &str, e: &dyn std::fmt::Display| -> ! { panic!("fuzz setup, {what}: {e}") };
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail("key", &e));
        let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
            .and_then(|p| p.self_signed(&key))
            .unwrap_or_else(|e| fail("certificate", &e));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap_or_else(|e| fail("roots", &e));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap_or_else(|e| fail("server config", &e))
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap_or_else(|e| fail("server config", &e));
        server.enable_secret_extraction = true;
        server.send_tls13_tickets = 0;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap_or_else(|e| fail("client config", &e))
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        (Arc::new(client), Arc::new(server))
    })
}

/// The input, read a step at a time.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> usize {
        usize::from(self.byte().unwrap_or(0)) << 8 | usize::from(self.byte().unwrap_or(0))
    }
    /// `n` bytes: what the input has, then a pattern.
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let k = n.min(self.0.len());
        let mut v = self.0[..k].to_vec();
        self.0 = &self.0[k..];
        v.extend((k..n).map(|i| (i as u8).wrapping_mul(13)));
        v
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// Read what has arrived, without waiting for more (the paused clock ends the wait); false once the read side
/// ended or failed.
async fn drain(s: &mut TlsStream<DuplexStream>, got: &mut Vec<u8>, failed: &mut bool) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            Err(_) => return true,
            Ok(Ok(0)) => return false,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(_)) => {
                *failed = true;
                return false;
            }
        }
    }
}

async fn script(input: &[u8]) {
    let (client_cfg, server_cfg) = configs();
    let (c, s) = tokio::io::duplex(8 * 1024 * 1024);
    let name = ServerName::try_from("node.test").unwrap_or_else(|e| panic!("name: {e}"));
    let (client, server) = tokio::join!(
        weft_tls::connect(client_cfg.clone(), name, c),
        weft_tls::accept(server_cfg.clone(), s)
    );
    let (Ok(mut client), Ok(mut server)) = (client, server) else {
        panic!("the handshake between two weft-tls ends failed");
    };

    let mut input = Script(input);
    let mut down_sent = Vec::new(); // data the server sent while it followed the rules
    let mut broke_rules = false;
    let mut server_closed = false;
    let mut up_sent = Vec::new();
    let mut down_got = Vec::new();
    let mut client_failed = false;
    let mut client_reading = true;
    let mut budget = MAX_DATA;
    // Since the last data each way: the server's empty records and key updates, and the client's key updates. The
    // client answers the server's requests for a key update once it has read them, before its next record.
    let mut empty_down = 0;
    let mut key_updates_down = 0;
    let mut key_updates_up = 0;
    let mut request_unread = false;
    let mut answer_owed = false;
    let mut client_flooded = false;
    while let Some(step) = input.byte() {
        match step % 9 {
            0 | 7 if !server_closed => {
                let n = input.u16().min(budget);
                budget -= n;
                let data = pattern(n, step);
                let ok = if step % 9 == 0 {
                    server.write_all(&data).await.is_ok()
                } else {
                    // The same data as records of at most 2^14 bytes, queued one by one.
                    data.chunks(16 * 1024).all(|c| weft_tls::fuzzing::queue_raw_record(&mut server, 23, c).is_ok())
                };
                if ok && server.flush().await.is_ok() && !broke_rules {
                    down_sent.extend_from_slice(&data);
                }
                if n > 0 {
                    (empty_down, key_updates_down) = (0, 0);
                }
            }
            1 if !server_closed => {
                let n = usize::from(input.byte().unwrap_or(0));
                let raw = input.bytes(n);
                let _ = server.flush().await;
                let _ = weft_tls::fuzzing::transport_mut(&mut server).write_all(&raw).await;
                broke_rules |= !raw.is_empty();
            }
            2 if !server_closed => {
                let content_type = input.byte().unwrap_or(0);
                let n = input.u16().min(weft_tls::fuzzing::MAX_RAW_CONTENT).min(budget);
                budget -= n;
                let content = input.bytes(n);
                if weft_tls::fuzzing::queue_raw_record(&mut server, content_type, &content).is_ok() {
                    let _ = server.flush().await;
                    let clean = content_type == 23 && n <= 16 * 1024;
                    if clean && !broke_rules {
                        down_sent.extend_from_slice(&content);
                    }
                    broke_rules |= !clean;
                    if n > 0 {
                        (empty_down, key_updates_down) = (0, 0);
                    } else {
                        empty_down += 1;
                        broke_rules |= empty_down > MAX_EMPTY_IN_A_ROW;
                    }
                }
            }
            3 if !server_closed => {
                let request = input.byte().unwrap_or(0) & 1 == 1;
                server.refresh_traffic_keys(request);
                let _ = server.flush().await;
                empty_down = 0;
                // The server answers a request of the client's at its end: one more it may send.
                key_updates_down += 1;
                broke_rules |= key_updates_down + 1 > MAX_KEY_UPDATES_IN_A_ROW;
                request_unread |= request;
            }
            4 if !client_failed => {
                let n = input.u16().min(budget);
                budget -= n;
                let data = pattern(n, step ^ 0x5a);
                // An answer owed goes first (the flush sends it even without data).
                key_updates_up += usize::from(std::mem::take(&mut answer_owed));
                client_flooded |= key_updates_up > MAX_KEY_UPDATES_IN_A_ROW;
                if client.write_all(&data).await.is_ok() && client.flush().await.is_ok() {
                    up_sent.extend_from_slice(&data);
                    if n > 0 {
                        key_updates_up = 0;
                    }
                }
            }
            5 if !client_failed => {
                // One KeyUpdate, the answer owed (if any) included.
                client.refresh_traffic_keys(input.byte().unwrap_or(0) & 1 == 1);
                let _ = client.flush().await;
                answer_owed = false;
                key_updates_up += 1;
            }
            6 if !server_closed => {
                let _ = server.shutdown().await;
                server_closed = true;
            }
            8 if client_reading => {
                client_reading = drain(&mut client, &mut down_got, &mut client_failed).await;
                answer_owed |= std::mem::take(&mut request_unread);
            }
            _ => {}
        }
        // The client's key updates so far, and one it may send at its end: more than the server takes is a flood.
        client_flooded |= key_updates_up + usize::from(answer_owed || request_unread) > MAX_KEY_UPDATES_IN_A_ROW;
    }

    // The client ends its side (and its transport, whatever state its TLS is in); the server reads everything the
    // client wrote.
    let _ = client.shutdown().await;
    let _ = weft_tls::fuzzing::transport_mut(&mut client).shutdown().await;
    let mut up_got = Vec::new();
    let up_end = server.read_to_end(&mut up_got).await;
    assert!(
        up_sent.starts_with(&up_got),
        "the server received data the client did not send ({} of {} bytes)",
        up_got.len(),
        up_sent.len()
    );
    if !client_failed && !client_flooded {
        assert!(up_end.is_ok(), "the client ended cleanly, the server read {up_end:?}");
        assert_eq!(up_got.len(), up_sent.len(), "the server lost client data");
    }

    // The server ends (close_notify if it still may), then goes away; the client reads to the end.
    if !server_closed {
        let _ = server.shutdown().await;
    }
    drop(server);
    let mut end = Ok(0);
    if client_reading {
        let mut rest = Vec::new();
        end = client.read_to_end(&mut rest).await;
        down_got.extend_from_slice(&rest);
        if end.is_err() {
            client_failed = true;
            assert!(client.read(&mut [0u8; 16]).await.is_err(), "a failed read side read again");
        }
    }
    let n = down_got.len().min(down_sent.len());
    assert!(
        down_got[..n] == down_sent[..n],
        "the client received data that differs from what the server sent"
    );
    if !broke_rules {
        // A client that flooded the server with key updates hears the server's alert after the data.
        assert!(
            client_flooded || !client_failed && end.is_ok(),
            "the server followed the rules, the client failed: {end:?}"
        );
        assert_eq!(down_got.len(), down_sent.len(), "the client lost server data");
    }
}

/// One input: the script above.
pub fn run(data: &[u8]) {
    crate::paused_runtime().block_on(script(data));
}
