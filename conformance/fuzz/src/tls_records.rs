//! `tls_records`: what a TLS peer sends after the handshake, through weft's own record layer (`weft-tls`), checked
//! against a model of the rules that predicts every outcome, failures included.
//!
//! A real TLS 1.3 handshake runs between two weft-tls ends over an in-memory stream (certificates made once per
//! process). The input's first byte picks the roles: bit 0 clear, the **attacker** (the end that may break the
//! rules) is the server and the **victim** (the end under test) the client; set, the attacker is the client. Then
//! the input is a script of steps. The attacker's: data (through the stream, or as records it seals itself),
//! records of any content type and length sealed with its current key (handshake messages, alerts, padding,
//! oversized content, no content type), alerts, `NewSessionTicket`s built from the input (well formed or broken
//! in one place), handshake messages of any type split across records (the last piece may be held back to start
//! the next message's first record), raw bytes no TLS layer made, key updates (asking for one back or not), its
//! `close_notify`; and the victim's: data, key updates, and reading what has arrived. A group of up to 4 steps may
//! be repeated (up to 4096 times) to build floods; an input runs at most 10,000 steps and puts at most 1 MiB on
//! the wire.
//!
//! **Across the hand-over**: with the attacker as client, its transport holds every write after its first flight
//! (the `ClientHello`). Its `connect` returns once it has written its `Finished` (a TLS 1.3 client needs nothing
//! after), so the attacker's steps up to the script's first victim step are queued behind the `Finished`, and all
//! of it reaches the victim server in one write: the victim's handshake reads its peer's last flight together
//! with whatever follows, which must be left whole to the record layer.
//!
//! **The model** (`Model`) holds the victim's read side as RFC 8446 and weft-tls's limits (rustls's, where rustls
//! has one) define it, written here from the RFC and not from weft-tls's code. It reads the bytes the attacker
//! actually wrote, record by record, as the victim will. The header: not application data `unexpected_message`,
//! a length past 2^14 + 256 `record_overflow`, under 16 (less than a tag) `bad_record_mac`, a version other than
//! 3.x `decode_error` (as rustls; any 3.x is authenticated as 3.3). Then the record: one the attacker sealed there
//! under the key the victim is at opens, anything else is `bad_record_mac` (raw bytes, a record after a KeyUpdate
//! the attacker sealed as a raw record and so did not follow itself, a header made of garbage and a record's first
//! bytes). An opened record: `TLSInnerPlaintext` over 2^14 + 1 bytes `record_overflow`; no content type (all
//! zeros) `unexpected_message`; a record other than handshake while a handshake message is incomplete
//! `unexpected_message`; more than 32 empty records in a row (of any type) `unexpected_message`; then by type:
//! application data is delivered (an empty one is not data); alert: not 2 bytes `decode_error`, unknown level
//! `illegal_parameter`, `close_notify` (either level) ends the stream and what follows is never read, a warning
//! `user_canceled` passes 4 times per connection and the 5th is `unexpected_message`, any other (fatal, or a
//! warning of another description: RFC 8446 §6 says to treat those as error alerts whatever their level) fails
//! the victim, which sends nothing more (it closes at once, dropping even a KeyUpdate it owes); handshake: empty
//! `unexpected_message`; more than 64 KiB buffered (a message left incomplete and the record's content, even where
//! that record ends the message and starts another: rustls is stricter still) `unexpected_message`; a message
//! announcing more than 64 KiB (header included) `unexpected_message`; each complete message in order:
//! `NewSessionTicket` to a server `unexpected_message`, the 17th on a connection `unexpected_message`, malformed
//! (RFC 8446 §4.6.1 structure: an empty ticket, trailing bytes, a broken extension, an `early_data` extension not
//! 4 bytes) `decode_error`, an extension type twice `illegal_parameter` (extensions checked in order, once the
//! whole message decoded); `KeyUpdate` not 1 byte `decode_error`, a request other than 0 or 1
//! `illegal_parameter`, followed by more handshake bytes in its record `unexpected_message`, the 33rd without data
//! in between (empty records are not data) `unexpected_message`, else the victim's receiving key moves on, and a
//! request is answered before the victim's next record of its own (its next data, key update, alert or
//! `close_notify`); any other handshake type `unexpected_message`; any other content type `unexpected_message`.
//! Where one record breaks two rules the first in that order is the one reported (weft-tls's order; rustls's
//! differs in places, e.g. it takes a duplicate `NewSessionTicket` extension before trailing bytes). The
//! transport ending without `close_notify` (inside a record or between records) fails the read with
//! `UnexpectedEof` and no alert. There are no wildcard outcomes: the one assumption is that bytes the attacker did
//! not seal under the victim's current key never authenticate (AES-GCM), which no input can defeat since the keys
//! are made after the input is fixed.
//!
//! **Invariants** beyond "no panic, no hang, no OOM", after every read of the victim's (which reads all that has
//! arrived) and at the end: the victim has received exactly the data the model says, no byte more or less (all
//! data before the first broken rule, nothing after it); its read is open, ended cleanly or failed exactly when
//! the model says, with the right kind of error (its own protocol error, the peer's alert with that description,
//! an unexpected end), and a failed read keeps failing; its receiving sequence number is the model's (so it
//! stopped at the very record the model says); on its own protocol error it wrote, during that read, the
//! KeyUpdate it owed and its alert, or nothing yet (a transport that takes nothing for the moment, as tokio's
//! cooperative budget does in a long script, delays them to the victim's next flush), and never anything else
//! while reading. Its writes fail once it sent or received a fatal alert, and not before. At the end it has
//! written exactly the bytes the model says (so nothing after a fatal alert, sent or received), and the attacker
//! reads all of it: exactly the victim's data, its key updates in order (more than 32 without data make the
//! attacker fail; the script lets the victim start no more than that itself, answers it owes can still get
//! there), then the right ending: the victim's `close_notify`, its fatal alert with the description the model
//! predicts (read back with `weft_tls::fuzzing::peer_alert`), or the transport ending without either (after the
//! attacker's fatal alert).
//!
//! **Work per byte** (`Meter`): the victim's reads are metered: `poll_read` calls, reads from its transport, and
//! the CPU time of the thread inside its `poll_read` (`CLOCK_THREAD_CPUTIME_ID`, so other processes on the machine
//! do not count). Each read of the script's takes at least one poll per 16 records that delivered nothing (no
//! read keeps its worker longer); the polls and transport reads are bounded linearly in the reads and records (a
//! read that gives its worker back too often, or never makes progress); the CPU time is bounded linearly in the
//! attacker's bytes on the wire, its records, the key updates it made the victim derive and the victim's polls
//! (a quadratic path, re-parsing a growing buffer per record or message, trips it on large inputs). The bounds
//! and the figures behind them are on `Meter::check`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use weft_tls::TlsStream;
use weft_tls::fuzzing::{MAX_RAW_CONTENT, peer_alert, queue_raw_record, transport_mut};

/// Bytes of data the victim may write, in all.
const MAX_DATA: usize = 512 * 1024;
/// Bytes the attacker may put on the wire after the handshake, in all (the transport holds 8 MiB each way, so no
/// write ever waits for a read).
const MAX_WIRE: usize = 1024 * 1024;
/// Steps one input may run, repeats included.
const MAX_STEPS: usize = 10_000;
/// Times one step may be repeated.
const MAX_REPEAT: usize = 4096;

/// RFC 8446 §5: records.
const HEADER_LEN: usize = 5;
const TAG_LEN: usize = 16;
const MAX_PLAINTEXT: usize = 16 * 1024;
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// RFC 8446 §4: post-handshake handshake messages.
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
const EARLY_DATA: u16 = 42;
/// RFC 8446 §6: alert descriptions.
const CLOSE_NOTIFY: u8 = 0;
const UNEXPECTED_MESSAGE: u8 = 10;
const BAD_RECORD_MAC: u8 = 20;
const RECORD_OVERFLOW: u8 = 22;
const ILLEGAL_PARAMETER: u8 = 47;
const DECODE_ERROR: u8 = 50;
const USER_CANCELED: u8 = 90;

/// Limits on what delivers nothing: rustls's (and BoringSSL's) on empty records and key updates in a row, and on
/// warning alerts per connection; weft-tls's own on tickets per connection and on one handshake message.
const MAX_EMPTY_IN_A_ROW: u32 = 32;
const MAX_KEY_UPDATES_IN_A_ROW: u32 = 32;
const MAX_WARNINGS: u32 = 4;
const MAX_TICKETS: u32 = 16;
const MAX_HANDSHAKE_MESSAGE: usize = 64 * 1024;

/// Records that deliver nothing one `poll_read` of weft-tls's takes before it gives its worker back.
const IDLE_RECORDS_PER_POLL: u64 = 16;

/// The alert record a victim sends on a protocol error: header, level and description, content type, tag.
const ALERT_RECORD_LEN: usize = HEADER_LEN + 2 + 1 + TAG_LEN;

fn configs() -> &'static (Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>) {
    static C: OnceLock<(Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>)> = OnceLock::new();
    C.get_or_init(|| {
        let fail =
            |what: &str, e: &dyn std::fmt::Display| -> ! { panic!("fuzz setup, {what}: {e}") };
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail("key", &e));
        let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
            .and_then(|p| p.self_signed(&key))
            .unwrap_or_else(|e| fail("certificate", &e));
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(cert.der().clone())
            .unwrap_or_else(|e| fail("roots", &e));
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

/// The input, read a step at a time. How much a step reads never depends on the state of the run, so a repeated
/// step reads the same bytes every time.
struct Script<'a> {
    data: &'a [u8],
    at: usize,
}

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at = (self.at + 1).min(self.data.len());
        b
    }
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    fn u16(&mut self) -> usize {
        usize::from(self.byte()) << 8 | usize::from(self.byte())
    }
    /// `n` bytes of content: the first 32 from the input (as [`bytes`](Self::bytes)), then zeros, so a short input
    /// makes long records (and long padding).
    fn content(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.bytes(n.min(32));
        v.resize(n, 0);
        v
    }
    /// `n` bytes: what the input has, then a pattern.
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let k = n.min(self.data.len() - self.at);
        let mut v = self.data[self.at..self.at + k].to_vec();
        self.at += k;
        v.extend((k..n).map(|i| (i as u8).wrapping_mul(13)));
        v
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// The steps (the step byte modulo [`STEPS`]).
mod op {
    pub const DATA: u8 = 0;
    pub const RAW_BYTES: u8 = 1;
    pub const RECORD: u8 = 2;
    pub const KEY_UPDATE: u8 = 3;
    pub const VICTIM_WRITE: u8 = 4;
    pub const VICTIM_KEY_UPDATE: u8 = 5;
    pub const CLOSE: u8 = 6;
    pub const DATA_RECORDS: u8 = 7;
    pub const VICTIM_READ: u8 = 8;
    pub const ALERT: u8 = 9;
    pub const TICKET: u8 = 10;
    pub const HANDSHAKE: u8 = 11;
    pub const REPEAT: u8 = 12;
    pub const STEPS: u8 = 13;

    pub fn of(b: u8) -> u8 {
        b % STEPS
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Transports.

/// What one end's transport saw.
#[derive(Default)]
struct TapLog {
    /// Every byte written, in the order the other end receives them (held bytes where they were written).
    written: Vec<u8>,
    /// Reads from the transport (`poll_read` calls).
    reads: u64,
    /// Writes held back (after the first flush, while `hold_after_first_flush` was set) until released.
    held: Option<Vec<u8>>,
    hold_after_first_flush: bool,
    shutdown_held: bool,
}

/// An end's transport: the duplex stream, seen (and for an attacker client, held back) on the way.
struct Tap {
    io: DuplexStream,
    log: Rc<RefCell<TapLog>>,
}

impl Tap {
    fn new(io: DuplexStream, hold_after_first_flush: bool) -> (Self, Rc<RefCell<TapLog>>) {
        let log = Rc::new(RefCell::new(TapLog {
            hold_after_first_flush,
            ..TapLog::default()
        }));
        (
            Self {
                io,
                log: log.clone(),
            },
            log,
        )
    }

    /// Send everything held in one write (then end the transport, if the session asked to meanwhile).
    async fn release(&mut self) {
        let (held, shutdown) = {
            let mut log = self.log.borrow_mut();
            (log.held.take(), std::mem::take(&mut log.shutdown_held))
        };
        if let Some(held) = held.filter(|h| !h.is_empty()) {
            let sent = self.io.write_all(&held).await.and(self.io.flush().await);
            assert!(sent.is_ok(), "the held flight was not written: {sent:?}");
        }
        if shutdown {
            let _ = self.io.shutdown().await;
        }
    }
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.log.borrow_mut().reads += 1;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut log = this.log.borrow_mut();
        let log = &mut *log;
        if let Some(held) = log.held.as_mut() {
            let mut n = 0;
            for b in bufs {
                held.extend_from_slice(b);
                log.written.extend_from_slice(b);
                n += b.len();
            }
            return Poll::Ready(Ok(n));
        }
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            let mut left = n;
            for b in bufs {
                let k = left.min(b.len());
                log.written.extend_from_slice(&b[..k]);
                left -= k;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.log.borrow().held.is_some() {
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut this.io).poll_flush(cx);
        let mut log = this.log.borrow_mut();
        if r.is_ready() && std::mem::take(&mut log.hold_after_first_flush) {
            log.held = Some(Vec::new());
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        {
            let mut log = this.log.borrow_mut();
            if log.held.is_some() {
                log.shutdown_held = true;
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The model.

/// How the victim's read side failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    /// A protocol error of the victim's own: it sends this fatal alert, then nothing more.
    Alert(u8),
    /// The attacker's fatal alert (or an error alert at warning level): the victim sends nothing more.
    PeerAlert(u8),
    /// The transport ended without `close_notify`: no alert (the victim may still write).
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadState {
    Open,
    /// `close_notify` received.
    Closed,
    Failed(Fail),
}

/// A record the attacker sealed: where it starts on the wire, the key and sequence number it was sealed under,
/// and its `TLSInnerPlaintext` (content, content type, padding).
struct Sealed {
    start: usize,
    epoch: u32,
    seq: u64,
    inner: Vec<u8>,
}

/// What the victim writes, as the attacker will read it.
#[derive(Debug)]
enum Up {
    Data(Vec<u8>),
    KeyUpdate,
    Alert(u8),
    CloseNotify,
}

impl Up {
    /// Bytes on the wire (data in records of 2^14 bytes).
    fn wire_len(&self) -> usize {
        match self {
            Self::Data(d) => wire_cost(d.len(), d.len().div_ceil(MAX_PLAINTEXT)),
            Self::KeyUpdate => wire_cost(5, 1),
            Self::Alert(_) | Self::CloseNotify => ALERT_RECORD_LEN,
        }
    }
}

/// The rules, and where both ends are (see the module documentation).
struct Model {
    victim_is_client: bool,
    // The attacker's sending side.
    wire_len: usize,
    sealed: Vec<Sealed>,
    epoch: u32,
    seq: u64,
    closed: bool,
    // The victim's receiving side.
    pos: usize,
    next: usize,
    rx_epoch: u32,
    rx_seq: u64,
    hs: Vec<u8>,
    empty_in_a_row: u32,
    key_updates_in_a_row: u32,
    warnings: u32,
    tickets: u32,
    read: ReadState,
    delivered: Vec<u8>,
    /// Key updates the victim derived for its receiving side.
    key_updates: u64,
    records_opened: u64,
    /// Records the victim opened and took that delivered no data.
    idle_records: u64,
    // The victim's sending side.
    write_open: bool,
    answer_owed: bool,
    up: Vec<Up>,
    /// The victim's key updates since its last data, as the attacker counts them.
    up_key_updates: u32,
    // Budgets.
    wire_budget: usize,
    data_budget: usize,
    steps: usize,
}

impl Model {
    fn new(victim_is_client: bool) -> Self {
        Self {
            victim_is_client,
            wire_len: 0,
            sealed: Vec::new(),
            epoch: 0,
            seq: 0,
            closed: false,
            pos: 0,
            next: 0,
            rx_epoch: 0,
            rx_seq: 0,
            hs: Vec::new(),
            empty_in_a_row: 0,
            key_updates_in_a_row: 0,
            warnings: 0,
            tickets: 0,
            read: ReadState::Open,
            delivered: Vec::new(),
            key_updates: 0,
            records_opened: 0,
            idle_records: 0,
            write_open: true,
            answer_owed: false,
            up: Vec::new(),
            up_key_updates: 0,
            wire_budget: MAX_WIRE - ALERT_RECORD_LEN,
            data_budget: MAX_DATA,
            steps: 0,
        }
    }

    /// Take `bytes` of wire from the budget; false (and nothing taken) if there is not that much left.
    fn spend(&mut self, bytes: usize) -> bool {
        let ok = bytes <= self.wire_budget;
        if ok {
            self.wire_budget -= bytes;
        }
        ok
    }

    // The attacker.

    /// The attacker sealed a record of `content_type` with `content` under its current key.
    fn seal(&mut self, content_type: u8, content: &[u8]) {
        let mut inner = content.to_vec();
        inner.push(content_type);
        let len = HEADER_LEN + inner.len() + TAG_LEN;
        self.sealed.push(Sealed {
            start: self.wire_len,
            epoch: self.epoch,
            seq: self.seq,
            inner,
        });
        self.seq += 1;
        self.wire_len += len;
    }

    /// The attacker sent a `KeyUpdate` and moved to its next key.
    fn seal_key_update(&mut self, request: bool) {
        self.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, u8::from(request)]);
        self.epoch += 1;
        self.seq = 0;
    }

    // The victim's reads.

    /// The victim reads everything on `wire` (the attacker's bytes after its handshake); `eof`: the attacker's
    /// transport has ended.
    fn victim_reads(&mut self, wire: &[u8], eof: bool) {
        while self.read == ReadState::Open {
            match self.next_record(wire) {
                Ok(true) => {}
                Ok(false) => {
                    if eof {
                        self.fail(Fail::Eof);
                    }
                    return;
                }
                Err(f) => self.fail(f),
            }
        }
    }

    fn fail(&mut self, f: Fail) {
        self.read = ReadState::Failed(f);
        match f {
            Fail::Alert(d) => {
                // The KeyUpdate the victim owes goes first (as rustls sends it), then the alert.
                self.victim_writes(&[]);
                if self.write_open {
                    self.up.push(Up::Alert(d));
                }
                self.write_open = false;
            }
            Fail::PeerAlert(_) => {
                self.write_open = false;
                self.answer_owed = false;
            }
            Fail::Eof => {}
        }
    }

    /// One record off the wire: false if it has not all arrived.
    fn next_record(&mut self, wire: &[u8]) -> Result<bool, Fail> {
        let Some(h) = wire.get(self.pos..self.pos + HEADER_LEN) else {
            return Ok(false);
        };
        if h[0] != APPLICATION_DATA {
            return Err(Fail::Alert(UNEXPECTED_MESSAGE));
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len > MAX_CIPHERTEXT {
            return Err(Fail::Alert(RECORD_OVERFLOW));
        }
        if len < TAG_LEN {
            return Err(Fail::Alert(BAD_RECORD_MAC));
        }
        // legacy_record_version: 3.x, as rustls takes it (any other does not parse); a record is authenticated as
        // 3.3 whatever minor version its header says.
        if h[1] != 3 {
            return Err(Fail::Alert(DECODE_ERROR));
        }
        if wire.len() < self.pos + HEADER_LEN + len {
            return Ok(false);
        }
        while self
            .sealed
            .get(self.next)
            .is_some_and(|r| r.start < self.pos)
        {
            self.next += 1;
        }
        let Some(rec) = self
            .sealed
            .get(self.next)
            .filter(|r| r.start == self.pos && (r.epoch, r.seq) == (self.rx_epoch, self.rx_seq))
        else {
            return Err(Fail::Alert(BAD_RECORD_MAC));
        };
        assert_eq!(
            rec.inner.len() + TAG_LEN,
            len,
            "the model's record and the wire disagree"
        );
        let inner = std::mem::take(&mut self.sealed[self.next].inner);
        self.next += 1;
        self.pos += HEADER_LEN + len;
        self.rx_seq += 1;
        self.records_opened += 1;
        let delivered = self.open(&inner)?;
        self.idle_records += u64::from(!delivered);
        Ok(true)
    }

    /// The rules for an opened record's `TLSInnerPlaintext`; true if it delivered data.
    fn open(&mut self, inner: &[u8]) -> Result<bool, Fail> {
        let unexpected = Err(Fail::Alert(UNEXPECTED_MESSAGE));
        if inner.len() > MAX_PLAINTEXT + 1 {
            return Err(Fail::Alert(RECORD_OVERFLOW));
        }
        let Some(at) = inner.iter().rposition(|&b| b != 0) else {
            return unexpected;
        };
        let (content_type, content) = (inner[at], &inner[..at]);
        if content_type != HANDSHAKE && !self.hs.is_empty() {
            return unexpected;
        }
        if content.is_empty() {
            self.empty_in_a_row += 1;
            if self.empty_in_a_row > MAX_EMPTY_IN_A_ROW {
                return unexpected;
            }
        } else {
            self.empty_in_a_row = 0;
        }
        match content_type {
            APPLICATION_DATA => {
                if !content.is_empty() {
                    self.key_updates_in_a_row = 0;
                    self.delivered.extend_from_slice(content);
                    return Ok(true);
                }
            }
            HANDSHAKE => {
                if content.is_empty() {
                    return unexpected;
                }
                // The message left incomplete and what this record adds are at most 64 KiB, even where the record
                // ends that message and starts another (rustls is stricter still: it refuses to buffer more than
                // 64 KiB of the wire, headers and tags included, while it joins a message).
                if self.hs.len() + content.len() > MAX_HANDSHAKE_MESSAGE {
                    return unexpected;
                }
                self.hs.extend_from_slice(content);
                self.handshake_messages()?;
            }
            ALERT => {
                let &[level, description] = content else {
                    return Err(Fail::Alert(DECODE_ERROR));
                };
                match (level, description) {
                    (1 | 2, CLOSE_NOTIFY) => self.read = ReadState::Closed,
                    (1, USER_CANCELED) => {
                        self.warnings += 1;
                        if self.warnings > MAX_WARNINGS {
                            return unexpected;
                        }
                    }
                    (1 | 2, d) => return Err(Fail::PeerAlert(d)),
                    _ => return Err(Fail::Alert(ILLEGAL_PARAMETER)),
                }
            }
            _ => return unexpected,
        }
        Ok(false)
    }

    /// Act on the complete handshake messages buffered.
    fn handshake_messages(&mut self) -> Result<(), Fail> {
        let unexpected = Err(Fail::Alert(UNEXPECTED_MESSAGE));
        while let Some(&[typ, a, b, c]) = self.hs.get(..4) {
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            if 4 + len > MAX_HANDSHAKE_MESSAGE {
                return unexpected;
            }
            if self.hs.len() < 4 + len {
                return Ok(());
            }
            let body: Vec<u8> = self.hs.drain(..4 + len).skip(4).collect();
            match typ {
                NEW_SESSION_TICKET => {
                    if !self.victim_is_client {
                        return unexpected;
                    }
                    self.tickets += 1;
                    if self.tickets > MAX_TICKETS {
                        return unexpected;
                    }
                    if let Some(alert) = ticket_verdict(&body) {
                        return Err(Fail::Alert(alert));
                    }
                }
                KEY_UPDATE => {
                    let request = match body[..] {
                        [0] => false,
                        [1] => true,
                        [_] => return Err(Fail::Alert(ILLEGAL_PARAMETER)),
                        _ => return Err(Fail::Alert(DECODE_ERROR)),
                    };
                    if !self.hs.is_empty() {
                        // RFC 8446 §5.1: a key change must come at a record's end.
                        return unexpected;
                    }
                    self.key_updates_in_a_row += 1;
                    if self.key_updates_in_a_row > MAX_KEY_UPDATES_IN_A_ROW {
                        return unexpected;
                    }
                    self.rx_epoch += 1;
                    self.rx_seq = 0;
                    self.key_updates += 1;
                    self.answer_owed |= request;
                }
                _ => return unexpected,
            }
        }
        Ok(())
    }

    // The victim's writes.

    /// The victim writes `data` (and flushes): the `KeyUpdate` it owes goes first.
    fn victim_writes(&mut self, data: &[u8]) {
        if !self.write_open {
            return;
        }
        if std::mem::take(&mut self.answer_owed) {
            self.up.push(Up::KeyUpdate);
            self.up_key_updates += 1;
        }
        if !data.is_empty() {
            self.up.push(Up::Data(data.to_vec()));
            self.up_key_updates = 0;
        }
    }

    /// The victim updates its sending key (one `KeyUpdate`, the answer it owes included).
    fn victim_key_update(&mut self) {
        if self.write_open {
            self.answer_owed = false;
            self.up.push(Up::KeyUpdate);
            self.up_key_updates += 1;
        }
    }

    /// The victim closes its sending side.
    fn victim_closes(&mut self) {
        self.victim_writes(&[]);
        if self.write_open {
            self.up.push(Up::CloseNotify);
            self.write_open = false;
        }
    }

    /// What the attacker reads of the victim's writes: the data, and how it ends.
    fn attacker_reads(&self) -> (Vec<u8>, AttackerEnd) {
        let mut data = Vec::new();
        let mut in_a_row = 0;
        for u in &self.up {
            match u {
                Up::Data(d) => {
                    data.extend_from_slice(d);
                    in_a_row = 0;
                }
                Up::KeyUpdate => {
                    in_a_row += 1;
                    if in_a_row > MAX_KEY_UPDATES_IN_A_ROW {
                        return (data, AttackerEnd::Flooded);
                    }
                }
                Up::Alert(d) => return (data, AttackerEnd::Alert(*d)),
                Up::CloseNotify => return (data, AttackerEnd::Clean),
            }
        }
        (data, AttackerEnd::Truncated)
    }
}

/// How the attacker's last read ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttackerEnd {
    Clean,
    Alert(u8),
    /// The victim's transport ended without `close_notify` or an alert.
    Truncated,
    /// The victim sent more than 32 key updates without data: the attacker fails on its own.
    Flooded,
}

/// RFC 8446 §4.6.1: a `NewSessionTicket`'s body, checked as the model says: `None` if well formed, else the
/// alert.
///
/// ```text
/// uint32 ticket_lifetime; uint32 ticket_age_add; opaque ticket_nonce<0..255>; opaque ticket<1..2^16-1>;
/// Extension extensions<0..2^16-2>;   (Extension: uint16 type; opaque data<0..2^16-1>)
/// ```
fn ticket_verdict(body: &[u8]) -> Option<u8> {
    /// A vector with a length prefix of `width` bytes, and what follows it.
    fn vector(b: &[u8], width: usize) -> Option<(&[u8], &[u8])> {
        let (len, rest) = b.split_at_checked(width)?;
        rest.split_at_checked(len.iter().fold(0, |n, &x| n << 8 | usize::from(x)))
    }
    let extensions = (|| {
        let (_, rest) = body.split_at_checked(8)?;
        let (_nonce, rest) = vector(rest, 1)?;
        let (ticket, rest) = vector(rest, 2)?;
        let (extensions, rest) = vector(rest, 2)?;
        (!ticket.is_empty() && rest.is_empty()).then_some(extensions)
    })();
    let Some(mut extensions) = extensions else {
        return Some(DECODE_ERROR);
    };
    let mut seen = HashSet::new();
    while !extensions.is_empty() {
        let Some((typ, rest)) = extensions.split_at_checked(2) else {
            return Some(DECODE_ERROR);
        };
        let Some((data, rest)) = vector(rest, 2) else {
            return Some(DECODE_ERROR);
        };
        let typ = u16::from_be_bytes([typ[0], typ[1]]);
        if !seen.insert(typ) {
            return Some(ILLEGAL_PARAMETER);
        }
        if typ == EARLY_DATA && data.len() != 4 {
            return Some(DECODE_ERROR);
        }
        extensions = rest;
    }
    None
}

// ---------------------------------------------------------------------------------------------------------------
// Metering the victim's reads.

/// CPU time this thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the C library knows.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The victim's reads: how many, and the CPU time spent inside them.
#[derive(Default)]
struct Meter {
    polls: u64,
    cpu_ns: u64,
    /// `read` calls the script made (each at least one poll).
    reads: u64,
}

/// The CPU bound's constants (see [`Meter::check`]). An unoptimised build (the CI smoke, with AddressSanitizer; the
/// stable seed replay) runs the same Rust code 10 to 45 times slower, so its bound is 40 times wider.
const CPU_SCALE: u64 = match env!("WEFT_FUZZ_OPT_LEVEL").as_bytes() {
    b"0" => 40,
    _ => 1,
};
const CPU_BASE_NS: u64 = 20_000_000;
/// Per byte on the wire, per record opened, per key update derived, per `poll_read`.
const CPU_PER_BYTE_NS: u64 = 20;
const CPU_PER_RECORD_NS: u64 = 2_000;
const CPU_PER_KEY_UPDATE_NS: u64 = 100_000;
const CPU_PER_POLL_NS: u64 = 20_000;
/// Runs of one input before a CPU time over the bound fails it: the time is measured, and a cold start or a
/// neighbour on the machine can inflate one run's; a path that is too slow is slow every time.
const CPU_ATTEMPTS: usize = 3;

/// The CPU time the victim's reads took, and what the bound allows.
#[derive(Debug)]
struct CpuUse {
    ns: u64,
    bound_ns: u64,
}

impl Meter {
    /// The victim's work, bounded linearly in what the attacker made it do. Deterministic counts:
    ///
    /// - `poll_read` calls ≤ 4 + 3 × reads + records / 8: a read returns when it has data, when the transport has
    ///   nothing, or after 16 records that deliver nothing (it wakes itself first); one read the script makes
    ///   polls until nothing has arrived, so once more than what delivered something. (And, checked after each
    ///   read, at least one poll per 16 records that delivered nothing: no read keeps the worker longer.)
    /// - reads from the transport ≤ 4 + 2 × polls + wire bytes / 1024 (a poll reads until a record is whole; a
    ///   read brings at least a byte, and at least 32 KiB while the peer sent that much).
    ///
    /// And the CPU time of the thread inside the victim's `poll_read` (returned, checked by [`run`] over up to 3
    /// runs): ≤ 20 ms + 20 ns × wire bytes + 2 µs × records + 100 µs × key updates + 20 µs × polls, all × 40 in an
    /// unoptimised build. Measured in the optimised fuzz build (AddressSanitizer and coverage on): about 0.25 ns
    /// per byte of bulk data, 0.5 µs per small record, 10 µs per key update with its data record, 3 µs per poll;
    /// the seeds' floods stay 6 to 15 times under the bound, and in a 60 s fuzz run no input used more than a fifth
    /// of its bound. A quadratic path injected to try the bound (a scan of the buffered handshake bytes per
    /// handshake record; of the read buffer per record) took 2 and 8 times the bound on the 64 KiB-message seed.
    /// A path quadratic in the bytes one read buffers (256 KiB) or in a handshake message (64 KiB) costs more than
    /// the bound allows on the large inputs the script can make (1 MiB on the wire, 10,000 steps).
    fn check(&self, transport_reads: u64, model: &Model) -> CpuUse {
        let wire = model.wire_len as u64;
        let records = model.records_opened;
        let polls_bound = 4 + 3 * self.reads + records / 8;
        assert!(
            self.polls <= polls_bound,
            "the victim was polled {} times to read {} records over {} reads (bound {polls_bound})",
            self.polls,
            records,
            self.reads
        );
        let reads_bound = 4 + 2 * self.polls + wire / 1024;
        assert!(
            transport_reads <= reads_bound,
            "the victim read its transport {transport_reads} times for {wire} bytes and {} polls (bound \
             {reads_bound})",
            self.polls
        );
        let bound_ns = CPU_SCALE
            * (CPU_BASE_NS
                + CPU_PER_BYTE_NS * wire
                + CPU_PER_RECORD_NS * records
                + CPU_PER_KEY_UPDATE_NS * model.key_updates
                + CPU_PER_POLL_NS * self.polls);
        if std::env::var_os("TLS_RECORDS_STATS").is_some() {
            eprintln!(
                "tls_records: victim {}, read {:?}; {wire} bytes, {records} records, {} key updates, {} reads, {} \
                 polls, {transport_reads} transport reads, {} µs CPU (bound {} µs)",
                if model.victim_is_client {
                    "client"
                } else {
                    "server"
                },
                model.read,
                model.key_updates,
                self.reads,
                self.polls,
                self.cpu_ns / 1000,
                bound_ns / 1000
            );
        }
        CpuUse {
            ns: self.cpu_ns,
            bound_ns,
        }
    }
}

/// A victim's `poll_read`, metered.
struct Metered<'a> {
    s: &'a mut TlsStream<Tap>,
    meter: &'a mut Meter,
}

impl AsyncRead for Metered<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let start = thread_cpu_ns();
        let r = Pin::new(&mut *this.s).poll_read(cx, buf);
        this.meter.cpu_ns += thread_cpu_ns().saturating_sub(start);
        this.meter.polls += 1;
        r
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The script's steps.

/// One step, its arguments read from the input.
#[derive(Debug)]
enum Action {
    /// Data through the attacker's stream (`write_all`), or as application-data records it seals itself.
    Data {
        data: Vec<u8>,
        as_records: bool,
    },
    /// Bytes written to the attacker's transport as they are.
    Raw(Vec<u8>),
    /// One record of any content type, sealed as is.
    Record(u8, Vec<u8>),
    /// The attacker updates its sending key (asking for the victim's too).
    KeyUpdate(bool),
    /// One handshake message of any type, after the bytes held back from the last one, in records of `split`
    /// bytes; with `more`, the last record's worth is held back, to go first in the next record the attacker seals.
    Handshake {
        typ: u8,
        body: Vec<u8>,
        split: usize,
        more: bool,
    },
    /// The attacker's `close_notify`, and the end of its transport.
    Close,
    /// The victim writes this many bytes of data.
    VictimWrite(usize, u8),
    VictimKeyUpdate(bool),
    /// The victim reads what has arrived.
    VictimRead,
    Nothing,
}

impl Action {
    fn is_victims(&self) -> bool {
        matches!(
            self,
            Self::VictimWrite(..) | Self::VictimKeyUpdate(_) | Self::VictimRead
        )
    }
}

/// The next step of the script (a repeat: its group of up to 4 steps), and how many times to run it.
fn next_step(input: &mut Script<'_>) -> (Vec<Action>, usize) {
    let step = input.byte();
    if op::of(step) != op::REPEAT {
        return (vec![action(step, input)], 1);
    }
    let times = input.u16() % MAX_REPEAT + 1;
    let group = (0..=input.byte() % 4)
        .map(|_| match input.byte() {
            step if op::of(step) == op::REPEAT => Action::Nothing,
            step => action(step, input),
        })
        .collect();
    (group, times)
}

fn action(step: u8, input: &mut Script<'_>) -> Action {
    match op::of(step) {
        op::DATA | op::DATA_RECORDS => Action::Data {
            data: pattern(input.u16(), step),
            as_records: op::of(step) == op::DATA_RECORDS,
        },
        op::RAW_BYTES => {
            let n = usize::from(input.byte());
            Action::Raw(input.bytes(n))
        }
        op::RECORD => {
            let content_type = input.byte();
            let n = input.u16().min(MAX_RAW_CONTENT);
            Action::Record(content_type, input.content(n))
        }
        op::ALERT => Action::Record(ALERT, vec![input.byte(), input.byte()]),
        op::KEY_UPDATE => Action::KeyUpdate(input.byte() & 1 == 1),
        op::TICKET => {
            let body = ticket(input);
            let (split, more) = split(input.byte());
            Action::Handshake {
                typ: NEW_SESSION_TICKET,
                body,
                split,
                more,
            }
        }
        op::HANDSHAKE => {
            let typ = input.byte();
            let (split, more) = split(input.byte());
            let n = input.u16();
            Action::Handshake {
                typ,
                split,
                more,
                body: input.content(n),
            }
        }
        op::CLOSE => Action::Close,
        op::VICTIM_WRITE => Action::VictimWrite(input.u16(), step ^ 0x5a),
        op::VICTIM_KEY_UPDATE => Action::VictimKeyUpdate(input.byte() & 1 == 1),
        op::VICTIM_READ => Action::VictimRead,
        _ => Action::Nothing,
    }
}

/// Record size for a handshake message (bits 0-6): 1 to 63 bytes, or multiples of 256 up to 2^14, or (0) 2^14;
/// and (bit 7) whether to hold back the last record's worth.
fn split(b: u8) -> (usize, bool) {
    let size = match b & 0x7f {
        0 => MAX_PLAINTEXT,
        v @ 1..64 => usize::from(v),
        v => usize::from(v - 63) * 256,
    };
    (size, b & 0x80 != 0)
}

/// A `NewSessionTicket` body from the input: nonce, ticket, up to 3 extensions, then one change that may break it.
fn ticket(input: &mut Script<'_>) -> Vec<u8> {
    let mut body = input.bytes(4);
    let nonce_len = input.byte();
    let ticket_len = input.u16() & 0x3ff;
    let mut extensions = Vec::new();
    for _ in 0..input.byte() % 4 {
        let typ = if input.byte() & 1 == 0 {
            EARLY_DATA.to_be_bytes().to_vec()
        } else {
            input.bytes(2)
        };
        let len = usize::from(input.byte() % 8);
        extensions.extend_from_slice(&typ);
        extensions.extend_from_slice(&(len as u16).to_be_bytes());
        extensions.extend(pattern(len, 0x42));
    }
    let change = input.byte();
    body.extend_from_slice(&[9, 9, 9, 9, nonce_len]);
    body.extend(pattern(usize::from(nonce_len), 1));
    body.extend_from_slice(&(ticket_len as u16).to_be_bytes());
    body.extend(pattern(ticket_len, 2));
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(&extensions);
    let k = usize::from(change >> 2);
    match change & 3 {
        1 => body.truncate(body.len().saturating_sub(k + 1)),
        2 => body.extend(std::iter::repeat_n(0, k + 1)),
        3 => {
            let i = k % body.len();
            body[i] ^= 0x80;
        }
        _ => {}
    }
    body
}

/// Wire bytes of `n` bytes of content in `records` records.
fn wire_cost(n: usize, records: usize) -> usize {
    n + records * (HEADER_LEN + 1 + TAG_LEN)
}

// ---------------------------------------------------------------------------------------------------------------
// The two ends.

/// The end that may break the rules.
struct Attacker {
    s: TlsStream<Tap>,
    log: Rc<RefCell<TapLog>>,
    /// Bytes the transport carried before the session began (the handshake).
    mark: usize,
    /// Handshake bytes held back, to start the next handshake record.
    held: Vec<u8>,
}

impl Attacker {
    fn wire(&self) -> std::cell::Ref<'_, [u8]> {
        std::cell::Ref::map(self.log.borrow(), |l| &l.written[self.mark..])
    }

    async fn flush(&mut self) {
        let r = self.s.flush().await;
        assert!(r.is_ok(), "the attacker's flush failed: {r:?}");
    }

    /// Seal one record as is.
    fn seal(&mut self, model: &mut Model, content_type: u8, content: &[u8]) {
        let r = queue_raw_record(&mut self.s, content_type, content);
        assert!(r.is_ok(), "the attacker could not seal a record: {r:?}");
        model.seal(content_type, content);
    }

    /// One of the attacker's steps.
    async fn act(&mut self, action: &Action, model: &mut Model) {
        if model.closed {
            return;
        }
        if !self.held.is_empty()
            && !matches!(action, Action::Handshake { .. })
            && !action.is_victims()
        {
            // The handshake bytes held back go first, as a record of their own (paid for when they were held).
            let held = std::mem::take(&mut self.held);
            self.seal(model, HANDSHAKE, &held);
            self.flush().await;
        }
        match action {
            Action::Data { data, as_records } => {
                if !model.spend(wire_cost(data.len(), data.len().div_ceil(MAX_PLAINTEXT))) {
                    return;
                }
                if *as_records {
                    for chunk in data.chunks(MAX_PLAINTEXT) {
                        self.seal(model, APPLICATION_DATA, chunk);
                    }
                } else {
                    let r = self.s.write_all(data).await;
                    assert!(r.is_ok(), "the attacker's write failed: {r:?}");
                    // The stream seals records of 2^14 bytes.
                    for chunk in data.chunks(MAX_PLAINTEXT) {
                        model.seal(APPLICATION_DATA, chunk);
                    }
                }
            }
            Action::Raw(raw) => {
                if !model.spend(raw.len()) {
                    return;
                }
                let r = transport_mut(&mut self.s).write_all(raw).await;
                assert!(r.is_ok(), "the attacker's raw write failed: {r:?}");
                model.wire_len += raw.len();
            }
            Action::Record(content_type, content) => {
                if !model.spend(wire_cost(content.len(), 1)) {
                    return;
                }
                self.seal(model, *content_type, content);
            }
            Action::KeyUpdate(request) => {
                if !model.spend(wire_cost(5, 1)) {
                    return;
                }
                self.s.refresh_traffic_keys(*request);
                model.seal_key_update(*request);
            }
            Action::Handshake {
                typ,
                body,
                split,
                more,
            } => {
                let mut msg = std::mem::take(&mut self.held);
                msg.push(*typ);
                msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
                msg.extend_from_slice(body);
                let mut chunks: Vec<&[u8]> = msg.chunks(*split).collect();
                let held = if *more {
                    chunks.pop().unwrap_or_default()
                } else {
                    &[]
                };
                // The held bytes are paid for now (as a record of their own).
                if !model.spend(wire_cost(
                    msg.len(),
                    chunks.len() + usize::from(!held.is_empty()),
                )) {
                    return;
                }
                for chunk in chunks {
                    self.seal(model, HANDSHAKE, chunk);
                }
                self.held = held.to_vec();
            }
            Action::Close => {
                // Never refused: the budget keeps room for it.
                let r = self.s.shutdown().await;
                assert!(r.is_ok(), "the attacker's shutdown failed: {r:?}");
                model.seal(ALERT, &[1, CLOSE_NOTIFY]);
                model.closed = true;
            }
            _ => return,
        }
        self.flush().await;
        assert_eq!(
            self.wire().len(),
            model.wire_len,
            "the attacker's wire and the model disagree after {action:?}"
        );
    }
}

/// The end under test.
struct Victim {
    s: TlsStream<Tap>,
    log: Rc<RefCell<TapLog>>,
    meter: Meter,
    /// The buffer reads go into (kept from one read to the next).
    buf: Vec<u8>,
    got: Vec<u8>,
    /// Bytes of `got` already checked against the model.
    checked: usize,
    /// Bytes the transport carried before the session began (the handshake).
    mark: usize,
}

/// How a read of the victim's ended.
#[derive(Debug)]
enum Observed {
    /// Nothing more has arrived.
    Waiting,
    Ended,
    Failed(io::Error),
}

impl Victim {
    fn new(s: TlsStream<Tap>, log: Rc<RefCell<TapLog>>) -> Self {
        let mark = log.borrow().written.len();
        Self {
            s,
            log,
            meter: Meter::default(),
            buf: Vec::new(),
            got: Vec::new(),
            checked: 0,
            mark,
        }
    }

    /// Bytes the victim has written since its handshake.
    fn written(&self) -> usize {
        self.log.borrow().written.len() - self.mark
    }

    /// Read what has arrived, without waiting for more (the paused clock ends the wait); with `to_end`, until the
    /// read side ends or fails.
    async fn read(&mut self, to_end: bool) -> Observed {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(64 * 1024, 0);
        let observed = loop {
            self.meter.reads += 1;
            let mut r = Metered {
                s: &mut self.s,
                meter: &mut self.meter,
            };
            let n = if to_end {
                r.read(&mut buf).await
            } else {
                match tokio::time::timeout(Duration::from_millis(1), r.read(&mut buf)).await {
                    Ok(n) => n,
                    Err(_) => break Observed::Waiting,
                }
            };
            match n {
                Ok(0) => break Observed::Ended,
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) => break Observed::Failed(e),
            }
        };
        self.buf = buf;
        observed
    }

    /// Let the model read what the attacker has sent, then read and check what the victim did against it.
    async fn read_and_check(&mut self, model: &mut Model, attacker: &Attacker, eof: bool) {
        let ups = model.up.len();
        let (polls, idle) = (self.meter.polls, model.idle_records);
        model.victim_reads(&attacker.wire(), eof);
        let before = self.written();
        let observed = self.read(eof).await;
        let wrote = self.written() - before;
        // No read keeps the worker for more than 16 records that deliver nothing (weft-tls gives way then).
        let (polls, idle) = (self.meter.polls - polls, model.idle_records - idle);
        assert!(
            polls >= idle.div_ceil(IDLE_RECORDS_PER_POLL),
            "the victim took {idle} records that deliver nothing in {polls} polls"
        );
        // (Bytes compared before are not compared again.)
        let from = self.checked.min(self.got.len());
        assert!(
            self.got.len() == model.delivered.len() && self.got[from..] == model.delivered[from..],
            "the victim received {} bytes, the model says {} (first difference at {:?}); read {observed:?}, model \
             {:?}",
            self.got.len(),
            model.delivered.len(),
            self.got
                .iter()
                .zip(&model.delivered)
                .position(|(a, b)| a != b),
            model.read
        );
        self.checked = self.got.len();
        // Where the victim stopped: the records it opened under its current key (a record refused for what it
        // holds was opened; one refused for its header or its tag was not).
        assert_eq!(
            self.s.sequence_numbers().1,
            model.rx_seq,
            "the victim's receiving sequence number (model: {:?})",
            model.read
        );
        match (model.read, &observed) {
            (ReadState::Open, Observed::Waiting) | (ReadState::Closed, Observed::Ended) => {}
            (ReadState::Failed(f), Observed::Failed(e)) => {
                let (kind, alert) = match f {
                    Fail::Alert(_) => (io::ErrorKind::InvalidData, None),
                    Fail::PeerAlert(d) => (io::ErrorKind::InvalidData, Some(d)),
                    Fail::Eof => (io::ErrorKind::UnexpectedEof, None),
                };
                assert!(
                    e.kind() == kind && peer_alert(e) == alert,
                    "the victim's read failed with {e:?} ({:?}, peer alert {:?}); the model says {f:?}",
                    e.kind(),
                    peer_alert(e)
                );
            }
            (m, o) => panic!("the victim's read: {o:?}; the model says {m:?}"),
        }
        // What the victim wrote while reading: when it failed on its own, the KeyUpdate it owed and its alert;
        // else nothing. They may also wait for the transport (one that takes nothing for now: tokio's cooperative
        // budget runs out in a long script), then go with the victim's next flush; the total is checked at the end.
        let want: usize = model.up[ups..].iter().map(Up::wire_len).sum();
        assert!(
            wrote == want || wrote == 0,
            "the victim wrote {wrote} bytes while reading, not {want} ({observed:?}; model: {:?}, {:?})",
            model.read,
            &model.up[ups..]
        );
    }

    /// One of the victim's steps.
    async fn act(&mut self, action: &Action, model: &mut Model, attacker: &Attacker) {
        match action {
            Action::VictimWrite(n, seed) => {
                let n = (*n).min(model.data_budget);
                model.data_budget -= n;
                let data = pattern(n, *seed);
                let w = self.s.write_all(&data).await;
                let f = self.s.flush().await;
                assert!(f.is_ok(), "the victim's flush failed: {f:?}");
                assert_eq!(
                    w.is_ok(),
                    model.write_open || n == 0,
                    "the victim's write: {w:?}; the model says its sending side is {}",
                    if model.write_open { "open" } else { "closed" }
                );
                model.victim_writes(&data);
            }
            // The victim keeps the rules: no more than 32 key updates of its own without data.
            Action::VictimKeyUpdate(request) if model.up_key_updates < MAX_KEY_UPDATES_IN_A_ROW => {
                self.s.refresh_traffic_keys(*request);
                let f = self.s.flush().await;
                assert!(f.is_ok(), "the victim's flush failed: {f:?}");
                model.victim_key_update();
            }
            Action::VictimRead => {
                self.read_and_check(model, attacker, model.closed).await;
            }
            _ => {}
        }
    }
}

/// Run `steps` `times` times over (within the budget of steps).
async fn run_times(
    steps: &[Action],
    times: usize,
    model: &mut Model,
    attacker: &mut Attacker,
    victim: &mut Victim,
) {
    for _ in 0..times {
        for action in steps {
            if model.steps >= MAX_STEPS {
                return;
            }
            model.steps += 1;
            if action.is_victims() {
                victim.act(action, model, attacker).await;
            } else {
                attacker.act(action, model).await;
            }
        }
    }
}

async fn script(data: &[u8]) -> CpuUse {
    let (client_cfg, server_cfg) = configs();
    let mut input = Script { data, at: 0 };
    let attacker_is_client = input.byte() & 1 == 1;
    let mut model = Model::new(!attacker_is_client);
    let (c, s) = tokio::io::duplex(8 * 1024 * 1024);
    let name = ServerName::try_from("node.test").unwrap_or_else(|e| panic!("name: {e}"));

    let mut first_victim_step = None;
    let (mut attacker, mut victim) = if attacker_is_client {
        // The attacker's writes after its ClientHello are held: its Finished and its steps up to the first of the
        // victim's go out as one write.
        let (a_tap, a_log) = Tap::new(c, true);
        let (v_tap, v_log) = Tap::new(s, false);
        let (victim, attacker) = tokio::join!(weft_tls::accept(server_cfg.clone(), v_tap), async {
            let a = weft_tls::connect(client_cfg.clone(), name, a_tap).await;
            let Ok(s) = a else {
                panic!("the attacker's handshake failed: {a:?}");
            };
            let mark = a_log.borrow().written.len();
            let mut attacker = Attacker {
                s,
                log: a_log,
                mark,
                held: Vec::new(),
            };
            while !input.done() {
                let (steps, times) = next_step(&mut input);
                if steps.iter().any(Action::is_victims) {
                    first_victim_step = Some((steps, times));
                    break;
                }
                for _ in 0..times {
                    for action in &steps {
                        if model.steps < MAX_STEPS {
                            model.steps += 1;
                            attacker.act(action, &mut model).await;
                        }
                    }
                }
            }
            transport_mut(&mut attacker.s).release().await;
            attacker
        });
        let Ok(s) = victim else {
            panic!("the victim's handshake failed: {victim:?}");
        };
        (attacker, Victim::new(s, v_log))
    } else {
        let (a_tap, a_log) = Tap::new(s, false);
        let (v_tap, v_log) = Tap::new(c, false);
        let (victim, attacker) = tokio::join!(
            weft_tls::connect(client_cfg.clone(), name, v_tap),
            weft_tls::accept(server_cfg.clone(), a_tap)
        );
        let (Ok(v), Ok(a)) = (victim, attacker) else {
            panic!("the handshake between two weft-tls ends failed");
        };
        let mark = a_log.borrow().written.len();
        (
            Attacker {
                s: a,
                log: a_log,
                mark,
                held: Vec::new(),
            },
            Victim::new(v, v_log),
        )
    };

    if let Some((steps, times)) = first_victim_step {
        run_times(&steps, times, &mut model, &mut attacker, &mut victim).await;
    }
    while !input.done() {
        let (steps, times) = next_step(&mut input);
        run_times(&steps, times, &mut model, &mut attacker, &mut victim).await;
    }

    // The attacker ends (close_notify, unless it did) with its transport; the victim reads to the end, twice (a
    // failed read keeps failing, an ended one stays ended).
    attacker.act(&Action::Close, &mut model).await;
    let _ = transport_mut(&mut attacker.s).io.shutdown().await;
    for _ in 0..2 {
        victim.read_and_check(&mut model, &attacker, true).await;
    }

    // The victim ends; the attacker reads everything it wrote.
    let r = victim.s.shutdown().await;
    assert!(r.is_ok(), "the victim's shutdown failed: {r:?}");
    model.victim_closes();
    // Exactly what the model says, so nothing after a fatal alert, sent or received.
    let want: usize = model.up.iter().map(Up::wire_len).sum();
    assert_eq!(
        victim.written(),
        want,
        "the victim wrote {} bytes, the model says {want}: {:?}",
        victim.written(),
        model.up
    );
    let transport_reads = victim.log.borrow().reads;
    let cpu = victim.meter.check(transport_reads, &model);
    drop(victim);

    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let end = loop {
        match attacker.s.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break Err(e),
        }
    };
    let (want, want_end) = model.attacker_reads();
    assert!(
        got == want,
        "the attacker received {} bytes of the victim's, the victim sent {}",
        got.len(),
        want.len()
    );
    let ok = match (&end, want_end) {
        (Ok(()), AttackerEnd::Clean) => true,
        (Err(e), AttackerEnd::Alert(d)) => peer_alert(e) == Some(d),
        (Err(e), AttackerEnd::Truncated) => e.kind() == io::ErrorKind::UnexpectedEof,
        (Err(e), AttackerEnd::Flooded) => {
            e.kind() == io::ErrorKind::InvalidData && peer_alert(e).is_none()
        }
        _ => false,
    };
    assert!(
        ok,
        "the attacker's read of the victim ended with {end:?} (peer alert {:?}); the model says {want_end:?}",
        end.as_ref().err().and_then(peer_alert)
    );
    cpu
}

/// One input: the script above (again, up to [`CPU_ATTEMPTS`] times, while the victim's reads take more CPU time
/// than the bound allows).
pub fn run(data: &[u8]) {
    let mut runs = Vec::new();
    for _ in 0..CPU_ATTEMPTS {
        let cpu = crate::paused_runtime().block_on(script(data));
        if cpu.ns <= cpu.bound_ns {
            return;
        }
        runs.push(cpu);
    }
    panic!("the victim's reads took more CPU time than the bound allows, in every run: {runs:?}");
}
