//! The script: the input read a step at a time, and the steps it names.

use super::*;

/// The input, read a step at a time. How much a step reads never depends on the state of the run, so a repeated
/// step reads the same bytes every time.
pub(super) struct Script<'a> {
    pub(super) data: &'a [u8],
    pub(super) at: usize,
}

impl Script<'_> {
    pub(super) fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at = (self.at + 1).min(self.data.len());
        b
    }
    pub(super) fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    pub(super) fn u16(&mut self) -> usize {
        usize::from(self.byte()) << 8 | usize::from(self.byte())
    }
    /// `n` bytes of content: the first 32 from the input (as [`bytes`](Self::bytes)), then zeros, so a short input
    /// makes long records (and long padding).
    pub(super) fn content(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.bytes(n.min(32));
        v.resize(n, 0);
        v
    }
    /// `n` bytes: what the input has, then a pattern.
    pub(super) fn bytes(&mut self, n: usize) -> Vec<u8> {
        let k = n.min(self.data.len() - self.at);
        let mut v = self.data[self.at..self.at + k].to_vec();
        self.at += k;
        v.extend((k..n).map(|i| (i as u8).wrapping_mul(13)));
        v
    }
}

pub(super) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// The steps (the step byte modulo [`STEPS`]).
pub(super) mod op {
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
// The script's steps.

/// One step, its arguments read from the input.
#[derive(Debug)]
pub(super) enum Action {
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
    pub(super) fn is_victims(&self) -> bool {
        matches!(
            self,
            Self::VictimWrite(..) | Self::VictimKeyUpdate(_) | Self::VictimRead
        )
    }
}

/// The next step of the script (a repeat: its group of up to 4 steps), and how many times to run it.
pub(super) fn next_step(input: &mut Script<'_>) -> (Vec<Action>, usize) {
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

pub(super) fn action(step: u8, input: &mut Script<'_>) -> Action {
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
pub(super) fn split(b: u8) -> (usize, bool) {
    let size = match b & 0x7f {
        0 => MAX_PLAINTEXT,
        v @ 1..64 => usize::from(v),
        v => usize::from(v - 63) * 256,
    };
    (size, b & 0x80 != 0)
}

/// A `NewSessionTicket` body from the input: nonce, ticket, up to 3 extensions, then one change that may break it.
pub(super) fn ticket(input: &mut Script<'_>) -> Vec<u8> {
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
pub(super) fn wire_cost(n: usize, records: usize) -> usize {
    n + records * (HEADER_LEN + 1 + TAG_LEN)
}
