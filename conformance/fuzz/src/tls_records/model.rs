//! The model of the rules: from the exact bytes the attacker put on the wire, what the victim must deliver, how its
//! reads end, which alert it sends and what it writes.

use super::*;

/// How the victim's read side failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fail {
    /// A protocol error of the victim's own: it sends this fatal alert, then nothing more.
    Alert(u8),
    /// The attacker's fatal alert (or an error alert at warning level): the victim sends nothing more.
    PeerAlert(u8),
    /// The transport ended without `close_notify`: no alert (the victim may still write).
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadState {
    Open,
    /// `close_notify` received.
    Closed,
    Failed(Fail),
}

/// A record the attacker sealed: where it starts on the wire, the key and sequence number it was sealed under,
/// and its `TLSInnerPlaintext` (content, content type, padding).
pub(super) struct Sealed {
    pub(super) start: usize,
    pub(super) epoch: u32,
    pub(super) seq: u64,
    pub(super) inner: Vec<u8>,
}

/// What the victim writes, as the attacker will read it.
#[derive(Debug)]
pub(super) enum Up {
    Data(Vec<u8>),
    KeyUpdate,
    Alert(u8),
    CloseNotify,
}

impl Up {
    /// Bytes on the wire (data in records of 2^14 bytes).
    pub(super) fn wire_len(&self) -> usize {
        match self {
            Self::Data(d) => wire_cost(d.len(), d.len().div_ceil(MAX_PLAINTEXT)),
            Self::KeyUpdate => wire_cost(5, 1),
            Self::Alert(_) | Self::CloseNotify => ALERT_RECORD_LEN,
        }
    }
}

/// The rules, and where both ends are (see the module documentation).
pub(super) struct Model {
    pub(super) victim_is_client: bool,
    // The attacker's sending side.
    pub(super) wire_len: usize,
    pub(super) sealed: Vec<Sealed>,
    pub(super) epoch: u32,
    pub(super) seq: u64,
    pub(super) closed: bool,
    // The victim's receiving side.
    pub(super) pos: usize,
    pub(super) next: usize,
    pub(super) rx_epoch: u32,
    pub(super) rx_seq: u64,
    pub(super) hs: Vec<u8>,
    pub(super) empty_in_a_row: u32,
    pub(super) key_updates_in_a_row: u32,
    pub(super) warnings: u32,
    pub(super) tickets: u32,
    pub(super) read: ReadState,
    pub(super) delivered: Vec<u8>,
    /// Key updates the victim derived for its receiving side.
    pub(super) key_updates: u64,
    pub(super) records_opened: u64,
    /// Records the victim opened and took that delivered no data.
    pub(super) idle_records: u64,
    // The victim's sending side.
    pub(super) write_open: bool,
    pub(super) answer_owed: bool,
    pub(super) up: Vec<Up>,
    /// The victim's key updates since its last data, as the attacker counts them.
    pub(super) up_key_updates: u32,
    // Budgets.
    pub(super) wire_budget: usize,
    pub(super) data_budget: usize,
    pub(super) steps: usize,
}

impl Model {
    pub(super) fn new(victim_is_client: bool) -> Self {
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
    pub(super) fn spend(&mut self, bytes: usize) -> bool {
        let ok = bytes <= self.wire_budget;
        if ok {
            self.wire_budget -= bytes;
        }
        ok
    }

    // The attacker.

    /// The attacker sealed a record of `content_type` with `content` under its current key.
    pub(super) fn seal(&mut self, content_type: u8, content: &[u8]) {
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
    pub(super) fn seal_key_update(&mut self, request: bool) {
        self.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, u8::from(request)]);
        self.epoch += 1;
        self.seq = 0;
    }

    // The victim's reads.

    /// The victim reads everything on `wire` (the attacker's bytes after its handshake); `eof`: the attacker's
    /// transport has ended.
    pub(super) fn victim_reads(&mut self, wire: &[u8], eof: bool) {
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

    pub(super) fn fail(&mut self, f: Fail) {
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
    pub(super) fn next_record(&mut self, wire: &[u8]) -> Result<bool, Fail> {
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
    pub(super) fn open(&mut self, inner: &[u8]) -> Result<bool, Fail> {
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
    pub(super) fn handshake_messages(&mut self) -> Result<(), Fail> {
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
    pub(super) fn victim_writes(&mut self, data: &[u8]) {
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
    pub(super) fn victim_key_update(&mut self) {
        if self.write_open {
            self.answer_owed = false;
            self.up.push(Up::KeyUpdate);
            self.up_key_updates += 1;
        }
    }

    /// The victim closes its sending side.
    pub(super) fn victim_closes(&mut self) {
        self.victim_writes(&[]);
        if self.write_open {
            self.up.push(Up::CloseNotify);
            self.write_open = false;
        }
    }

    /// What the attacker reads of the victim's writes: the data, and how it ends.
    pub(super) fn attacker_reads(&self) -> (Vec<u8>, AttackerEnd) {
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
pub(super) enum AttackerEnd {
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
pub(super) fn ticket_verdict(body: &[u8]) -> Option<u8> {
    /// A vector with a length prefix of `width` bytes, and what follows it.
    pub(super) fn vector(b: &[u8], width: usize) -> Option<(&[u8], &[u8])> {
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
