//! The two ends of the differential harness: the attacker (a rustls connection for the handshake, then records
//! sealed and opened here with the traffic secrets it logs) and the victim (weft-tls or tokio-rustls), over an
//! in-memory transport.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hkdf;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, Connection, ConnectionTrafficSecrets, KeyLog, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::oneshot;

pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const DATA: u8 = 23;

/// The victim's side of the handshake; the attacker takes the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Who plays the victim, and how its transport and reads are shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victim {
    /// tokio-rustls, given one record per transport read (so it hands out the data before a record it refuses:
    /// given more at once, rustls drops plaintext it opened with a record it then refuses), 64 KiB reads.
    Rustls,
    /// weft-tls, given all the transport has, 64 KiB reads (records opened straight into the caller's buffer).
    Weft,
    /// weft-tls, one record per transport read, 100-byte reads (records opened in place, handed out in pieces).
    WeftTrickle,
}

/// How the victim's reads ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A read returned 0: the peer's close_notify.
    Closed,
    /// The handshake or a read failed.
    Failed(io::ErrorKind),
}

/// What the victim sent after the handshake, as the attacker opened it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Data(Vec<u8>),
    Alert(u8, u8),
    KeyUpdate(u8),
    Handshake(u8),
    Unreadable(&'static str),
}

/// One run of a sequence against one victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The plaintext the victim's application read.
    pub data: Vec<u8>,
    pub end: End,
    pub sent: Vec<Sent>,
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with SHA-256 and no context.
fn expand_label(secret: &[u8], label: &[u8], len: usize) -> Vec<u8> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let info: [&[u8]; 5] = [
        &(len as u16).to_be_bytes(),
        &[6 + label.len() as u8],
        b"tls13 ",
        label,
        &[0],
    ];
    let mut out = vec![0; len];
    prk.expand(&info, Len(len)).unwrap().fill(&mut out).unwrap();
    out
}

/// One direction's traffic protection, derived from its traffic secret (only TLS_AES_128_GCM_SHA256 is offered).
pub struct Dir {
    secret: Vec<u8>,
    key: LessSafeKey,
    iv: Vec<u8>,
    seq: u64,
}

impl Dir {
    fn new(secret: &[u8]) -> Self {
        let key = UnboundKey::new(&AES_128_GCM, &expand_label(secret, b"key", 16)).unwrap();
        Self {
            secret: secret.to_vec(),
            key: LessSafeKey::new(key),
            iv: expand_label(secret, b"iv", 12),
            seq: 0,
        }
    }

    /// The next generation of keys (after a `KeyUpdate`), from sequence number 0.
    pub fn update(&mut self) {
        *self = Self::new(&expand_label(&self.secret, b"traffic upd", 32));
    }

    fn nonce(&self) -> Nonce {
        let mut n: [u8; 12] = self.iv.clone().try_into().unwrap();
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }

    /// Seal `inner` (a whole `TLSInnerPlaintext`) as one record whose header starts with `head` (outer type and
    /// version) and whose AAD starts with `aad_head`.
    pub fn seal_as(&mut self, head: [u8; 3], aad_head: [u8; 3], inner: &[u8]) -> Vec<u8> {
        let [hi, lo] = u16::try_from(inner.len() + 16).unwrap().to_be_bytes();
        let mut body = inner.to_vec();
        let aad = [aad_head[0], aad_head[1], aad_head[2], hi, lo];
        self.key
            .seal_in_place_append_tag(self.nonce(), Aad::from(aad), &mut body)
            .unwrap();
        self.seq += 1;
        let mut rec = vec![head[0], head[1], head[2], hi, lo];
        rec.extend_from_slice(&body);
        rec
    }

    pub fn seal(&mut self, inner: &[u8]) -> Vec<u8> {
        self.seal_as([DATA, 3, 3], [DATA, 3, 3], inner)
    }

    /// Open a whole record: its `TLSInnerPlaintext`, or `None` if it does not authenticate.
    fn open(&mut self, rec: &[u8]) -> Option<Vec<u8>> {
        let mut body = rec[5..].to_vec();
        let aad: [u8; 5] = rec[..5].try_into().unwrap();
        let n = self
            .key
            .open_in_place(self.nonce(), Aad::from(aad), &mut body)
            .ok()?
            .len();
        self.seq += 1;
        body.truncate(n);
        Some(body)
    }
}

/// The traffic secrets the attacker's rustls logs (`SSLKEYLOGFILE` style): they let the attacker seal what it
/// likes, open what the victim sends, and follow key updates both ways.
#[derive(Debug, Default)]
struct Secrets(Mutex<Vec<(String, Vec<u8>)>>);

impl KeyLog for Secrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        self.0
            .lock()
            .unwrap()
            .push((label.to_string(), secret.to_vec()));
    }
}

impl Secrets {
    fn get(&self, label: &str) -> Option<Vec<u8>> {
        let log = self.0.lock().unwrap();
        log.iter().find(|(l, _)| l == label).map(|(_, s)| s.clone())
    }
}

struct Configs {
    client: ClientConfig,
    server: ServerConfig,
}

/// One certificate, and client and server configurations that trust it, offering TLS 1.3 with AES-128-GCM only.
/// The server sends two tickets after the handshake (rustls's default); both allow the secret extraction weft
/// needs.
fn configs() -> &'static Configs {
    static CONFIGS: OnceLock<Configs> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.cipher_suites =
            vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
        let provider = Arc::new(provider);
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        server.send_tls13_tickets = 2;
        server.enable_secret_extraction = true;
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        Configs { client, server }
    })
}

fn name() -> ServerName<'static> {
    ServerName::try_from("node.test").unwrap()
}

/// The victim's transport: the duplex as is, or one record (at most) per read.
struct Transport {
    io: DuplexStream,
    trickle: bool,
    buf: Vec<u8>,
    /// Bytes of the current record not yet handed out.
    left: usize,
    eof: bool,
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.trickle {
            return Pin::new(&mut this.io).poll_read(cx, out);
        }
        loop {
            if this.left == 0 && this.buf.len() >= 5 {
                this.left = 5 + usize::from(u16::from_be_bytes([this.buf[3], this.buf[4]]));
            }
            let avail = match (this.left, this.eof) {
                (0, true) => this.buf.len(),
                (0, false) => 0,
                (left, _) => left.min(this.buf.len()),
            };
            let n = avail.min(out.remaining());
            if n > 0 || this.eof || out.remaining() == 0 {
                out.put_slice(&this.buf[..n]);
                this.buf.drain(..n);
                this.left = this.left.saturating_sub(n);
                return Poll::Ready(Ok(()));
            }
            let mut tmp = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            this.eof = rb.filled().is_empty();
            this.buf.extend_from_slice(rb.filled());
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The victim: handshake, then read to the end; if that was the peer's close_notify, answer "bye" and close.
async fn victim(
    v: Victim,
    role: Role,
    io: DuplexStream,
    ready: oneshot::Sender<()>,
) -> (Vec<u8>, End) {
    let io = Transport {
        io,
        trickle: v != Victim::Weft,
        buf: Vec::new(),
        left: 0,
        eof: false,
    };
    let read_size = if v == Victim::WeftTrickle {
        100
    } else {
        64 * 1024
    };
    let c = configs();
    let (client, server) = (Arc::new(c.client.clone()), Arc::new(c.server.clone()));
    match (v, role) {
        (Victim::Rustls, Role::Client) => {
            let s = tokio_rustls::TlsConnector::from(client)
                .connect(name(), io)
                .await;
            serve(s, ready, read_size).await
        }
        (Victim::Rustls, Role::Server) => {
            let s = tokio_rustls::TlsAcceptor::from(server).accept(io).await;
            serve(s, ready, read_size).await
        }
        (_, Role::Client) => {
            let s = weft_tls::connect(client, name(), io).await;
            serve(s.map_err(io::Error::from), ready, read_size).await
        }
        (_, Role::Server) => {
            let s = weft_tls::accept(server, io).await;
            serve(s.map_err(io::Error::from), ready, read_size).await
        }
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    s: io::Result<S>,
    ready: oneshot::Sender<()>,
    read_size: usize,
) -> (Vec<u8>, End) {
    let mut s = match s {
        Ok(s) => s,
        Err(e) => return (Vec::new(), End::Failed(e.kind())),
    };
    let _ = ready.send(());
    let mut data = Vec::new();
    let mut buf = vec![0u8; read_size];
    let end = loop {
        match s.read(&mut buf).await {
            Ok(0) => break End::Closed,
            Ok(n) => data.extend_from_slice(&buf[..n]),
            Err(e) => break End::Failed(e.kind()),
        }
    };
    if end == End::Closed {
        let _ = s.write_all(b"bye").await;
        let _ = s.shutdown().await;
    }
    (data, end)
}

/// The bytes of the first whole record in `buf`, if there is one.
fn record_len(buf: &[u8]) -> Option<usize> {
    let h = buf.get(..5)?;
    let n = 5 + usize::from(u16::from_be_bytes([h[3], h[4]]));
    (buf.len() >= n).then_some(n)
}

/// A hostile sequence as the attacker writes it: records sealed under the attacker's sending key, in order.
pub struct Script {
    pub tx: Dir,
    pub bytes: Vec<u8>,
    /// The application data a victim that takes the sequence reads: what was sealed before a close_notify.
    pub data: Vec<u8>,
    /// The sequence ends without close_notify (the attacker just closes the transport).
    pub eof: bool,
    closed: bool,
}

/// A `TLSInnerPlaintext`: content, content type, `padding` zeros.
pub fn inner(typ: u8, content: &[u8], padding: usize) -> Vec<u8> {
    let mut v = content.to_vec();
    v.push(typ);
    v.resize(v.len() + padding, 0);
    v
}

impl Script {
    /// Append a record sealed from this `TLSInnerPlaintext`, as is.
    pub fn inner(&mut self, inner: &[u8]) {
        let rec = self.tx.seal(inner);
        self.bytes.extend_from_slice(&rec);
    }
    pub fn padded(&mut self, typ: u8, content: &[u8], padding: usize) {
        if typ == DATA && !self.closed {
            self.data.extend_from_slice(content);
        }
        self.inner(&inner(typ, content, padding));
    }
    pub fn record(&mut self, typ: u8, content: &[u8]) {
        self.padded(typ, content, 0);
    }
    pub fn data(&mut self, d: &[u8]) {
        self.record(DATA, d);
    }
    pub fn empty(&mut self, n: usize) {
        for _ in 0..n {
            self.record(DATA, &[]);
        }
    }
    pub fn alert(&mut self, level: u8, desc: u8) {
        self.record(ALERT, &[level, desc]);
        if desc == 0 && matches!(level, 1 | 2) {
            self.closed = true;
        }
    }
    pub fn handshake(&mut self, msgs: &[u8]) {
        self.record(HANDSHAKE, msgs);
    }
    /// A `KeyUpdate` alone in its record, then our next key.
    pub fn key_update(&mut self, request: u8) {
        self.handshake(&[24, 0, 0, 1, request]);
        self.tx.update();
    }
    /// Append a record of `content` under another header (`head`: outer type and version) and AAD (`aad_head`).
    pub fn record_as(&mut self, head: [u8; 3], aad_head: [u8; 3], typ: u8, content: &[u8]) {
        if typ == DATA && !self.closed {
            self.data.extend_from_slice(content);
        }
        let rec = self.tx.seal_as(head, aad_head, &inner(typ, content, 0));
        self.bytes.extend_from_slice(&rec);
    }
    /// A record sealed as usual but not appended (to tamper with).
    pub fn sealed(&mut self, typ: u8, content: &[u8]) -> Vec<u8> {
        self.tx.seal(&inner(typ, content, 0))
    }
    /// Bytes no record layer made.
    pub fn raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }
}

/// Run `script` against `v` playing `role`: handshake, the sequence (behind the attacker's last handshake flight
/// in the same write if `coalesced`, else once the victim's handshake returned), then the victim's answer.
/// Returns the outcome and the data the sequence delivers if taken.
pub async fn run(
    v: Victim,
    role: Role,
    coalesced: bool,
    script: fn(&mut Script),
) -> (Outcome, Vec<u8>) {
    let (mut io, theirs) = tokio::io::duplex(4 << 20);
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::spawn(victim(v, role, theirs, ready_tx));
    let log = Arc::new(Secrets::default());
    let (mine, theirs) = match role {
        Role::Server => ("CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"),
        Role::Client => ("SERVER_TRAFFIC_SECRET_0", "CLIENT_TRAFFIC_SECRET_0"),
    };
    let mut conn: Connection = match role {
        Role::Server => {
            let mut cfg = configs().client.clone();
            cfg.key_log = log.clone();
            rustls::ClientConnection::new(Arc::new(cfg), name())
                .unwrap()
                .into()
        }
        Role::Client => {
            let mut cfg = configs().server.clone();
            cfg.key_log = log.clone();
            // Tickets the attacker sends are a sequence's own (rustls would queue them before the hand-over).
            cfg.send_tls13_tickets = 0;
            rustls::ServerConnection::new(Arc::new(cfg)).unwrap().into()
        }
    };
    let new_script = |secret: Vec<u8>| {
        let mut s = Script {
            tx: Dir::new(&secret),
            bytes: Vec::new(),
            data: Vec::new(),
            eof: false,
            closed: false,
        };
        script(&mut s);
        if !s.eof {
            s.alert(1, 0);
        }
        s
    };

    // The handshake: the victim's records are fed to rustls one at a time, so it stops at the victim's last
    // handshake record and what follows stays in `inbox`.
    let mut inbox = Vec::new();
    let mut sequence: Option<Script> = None;
    let (pending, done) = loop {
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        if !conn.is_handshaking() {
            break (out, true);
        }
        // A server's flight ends with its Finished: a coalesced sequence goes with it (0.5-RTT).
        if coalesced
            && sequence.is_none()
            && let Some(secret) = log.get(mine)
        {
            let s = new_script(secret);
            out.extend_from_slice(&s.bytes);
            sequence = Some(s);
        }
        if !out.is_empty() {
            io.write_all(&out).await.unwrap();
        }
        let fed = loop {
            if let Some(n) = record_len(&inbox) {
                let mut rd = &inbox[..n];
                while !rd.is_empty() {
                    conn.read_tls(&mut rd).unwrap();
                }
                inbox.drain(..n);
                break conn.process_new_packets().is_ok();
            }
            let mut buf = [0u8; 8192];
            let k = io.read(&mut buf).await.unwrap();
            if k == 0 {
                break false;
            }
            inbox.extend_from_slice(&buf[..k]);
        };
        if !fed {
            break (Vec::new(), false);
        }
    };
    if done {
        // The keys rustls would hand over are the ones derived here from the logged secrets.
        let secrets = conn.dangerous_extract_secrets().unwrap();
        for ((seq, s), label) in [(secrets.tx, mine), (secrets.rx, theirs)] {
            let ConnectionTrafficSecrets::Aes128Gcm { key, iv } = s else {
                panic!("only AES-128-GCM is offered");
            };
            let secret = log.get(label).unwrap();
            assert_eq!(seq, 0);
            assert_eq!(key.as_ref(), &expand_label(&secret, b"key", 16)[..]);
            assert_eq!(iv.as_ref(), &expand_label(&secret, b"iv", 12)[..]);
        }
    }
    let s = match sequence {
        Some(s) => s,
        None => {
            let s = new_script(log.get(mine).unwrap());
            let mut first = pending;
            if !coalesced {
                io.write_all(&first).await.unwrap();
                first.clear();
                // Wait for the victim's handshake to return (or fail), so the sequence comes in reads of its own.
                let _ = ready_rx.await;
            }
            first.extend_from_slice(&s.bytes);
            let _ = io.write_all(&first).await;
            s
        }
    };
    let _ = io.shutdown().await;
    let _ = io.read_to_end(&mut inbox).await;
    let (data, end) = task.await.unwrap();

    // What the victim sent after its handshake, opened with its traffic secret.
    let mut rx = Dir::new(&log.get(theirs).unwrap());
    let mut sent = Vec::new();
    let mut rest = &inbox[..];
    while !rest.is_empty() {
        let Some(n) = record_len(rest) else {
            sent.push(Sent::Unreadable("a partial record"));
            break;
        };
        let (rec, tail) = rest.split_at(n);
        rest = tail;
        let Some(plain) = (rec[0] == DATA).then(|| rx.open(rec)).flatten() else {
            sent.push(Sent::Unreadable("a record that does not open"));
            break;
        };
        let Some(at) = plain.iter().rposition(|&b| b != 0) else {
            sent.push(Sent::Unreadable("a record with no content type"));
            break;
        };
        let content = &plain[..at];
        match plain[at] {
            DATA => match sent.last_mut() {
                Some(Sent::Data(d)) => d.extend_from_slice(content),
                _ => sent.push(Sent::Data(content.to_vec())),
            },
            ALERT if content.len() == 2 => sent.push(Sent::Alert(content[0], content[1])),
            HANDSHAKE => {
                let mut msgs = content;
                while let [typ, a, b, c, ..] = *msgs {
                    let len = 4 + (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c));
                    match (typ, msgs.get(4)) {
                        (24, Some(&r)) => {
                            sent.push(Sent::KeyUpdate(r));
                            rx.update();
                        }
                        _ => sent.push(Sent::Handshake(typ)),
                    }
                    msgs = msgs.get(len..).unwrap_or_default();
                }
            }
            _ => sent.push(Sent::Unreadable("a record of another content type")),
        }
    }
    (Outcome { data, end, sent }, s.data)
}
