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

mod meter;
mod model;
mod steps;
mod tap;

use meter::*;
use model::*;
use steps::*;
use tap::*;

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
