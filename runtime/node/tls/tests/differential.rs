//! Differential harness: the same hostile record sequences driven into weft-tls and into plain rustls
//! (tokio-rustls), each as client and as server, must be accepted, refused and alerted the same way.
//!
//! The attacker is a rustls connection for the handshake only; from the traffic secrets it logs, the test seals
//! whatever records a sequence asks for (any inner content type, padding, length, header; tampered with or cut
//! short) and opens what the victim sends back, following the victim's key updates (`differential/peer.rs`).
//! Per sequence and role it compares, between rustls and weft-tls (read in two shapes: all the transport has
//! into 64 KiB reads, and one record per transport read into 100-byte reads): the plaintext the victim's
//! application read, how its reads ended (the peer's close_notify, or the error's kind), and all the victim sent
//! after its handshake (its fatal alert, its own `KeyUpdate`, its tickets, its answer after close_notify). Each
//! sequence also states what rustls does, so that a change on either side shows. rustls is given one record per
//! read: given more, it drops the plaintext it opened along with a record it then refuses, which weft-tls hands
//! out first.
//!
//! Where weft-tls differs on purpose, the sequence says what weft-tls does instead (`.weft(…)`); these are all the
//! differences:
//!
//! | sequence | rustls 0.23 | weft-tls | why |
//! |---|---|---|---|
//! | 33 empty records, 5 warning alerts, 33 key updates in a row; a message split by another record | refuses, sends no alert | `unexpected_message` | RFC 8446 §6: a fatal error is told with an alert |
//! | an inner plaintext of zeros only | refuses, no alert | `unexpected_message` | RFC 8446 §5.4 asks for that alert |
//! | an inner plaintext of 0 bytes (a tag alone) | refuses, no alert | `unexpected_message` | opened, then refused for having no content type (RFC 8446 §5.4), as an all-zero one is |
//! | an unknown inner or outer content type | `decode_error` | `unexpected_message` | RFC 8446 §5: an unexpected record type is `unexpected_message` |
//! | a record with outer type 21 or 22 after the handshake | opens it as if it said 23 (`bad_record_mac` if it is plaintext) | `unexpected_message` | only type 23 may follow the handshake (RFC 8446 §5.1) |
//! | a length field of 2^14 + 2048 or more | `decode_error` | `record_overflow` | RFC 8446 §5.2 |
//! | a warning alert other than close_notify and user_canceled | answers `decode_error` | closes, no alert | RFC 8446 §6: it is the peer's error alert, and nothing is sent after one |
//! | a handshake message that may not come (a `CertificateRequest` that does not parse, type 254) | `decode_error` (it parses first) | `unexpected_message` | refused by its type, never parsed |
//! | an empty handshake record | ignores it | `unexpected_message` | RFC 8446 §5.1: no zero-length handshake fragments |
//! | a 17th `NewSessionTicket` | takes it (and stores it) | `unexpected_message` | weft never resumes: 16 per connection, then it is a flood |
//!
//! Two more differences were weft-tls's and are fixed (src/stream/read.rs), so those sequences now compare equal:
//! weft-tls authenticated a record's header version as received and took any version (rustls refuses one not
//! 3.x with `decode_error` and authenticates any 3.x as 3.3: `legacy_version_*`), and after a peer's
//! `KeyUpdate` request it sent its fatal alert without the `KeyUpdate` it owed first
//! (`key_update_requested_then_a_bad_record`).
#![allow(clippy::unwrap_used)] // a test panics to fail

#[path = "differential/peer.rs"]
mod peer;

use std::io::ErrorKind;

use peer::{ALERT, DATA, End, HANDSHAKE, Outcome, Role, Script, Sent, Victim};

/// How a victim dealt with a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It read all the data, then the close_notify as the end, and answered (data, then its close_notify).
    Accept,
    /// Its read failed, and it told the peer with this fatal alert.
    Alert(u8),
    /// Its read failed with this error kind, and it sent no alert.
    Quiet(ErrorKind),
}
use Verdict::Accept;

/// Refused with these alerts (RFC 8446 §6).
const UNEXPECTED_MESSAGE: Verdict = Verdict::Alert(10);
const BAD_RECORD_MAC: Verdict = Verdict::Alert(20);
const RECORD_OVERFLOW: Verdict = Verdict::Alert(22);
const ILLEGAL_PARAMETER: Verdict = Verdict::Alert(47);
const DECODE_ERROR: Verdict = Verdict::Alert(50);
/// Refused without an alert (and on the peer's own fatal alert): `InvalidData` from both.
const REFUSED: Verdict = Verdict::Quiet(ErrorKind::InvalidData);
/// The transport ended without close_notify.
const TRUNCATED: Verdict = Verdict::Quiet(ErrorKind::UnexpectedEof);

fn verdict(o: &Outcome) -> Option<Verdict> {
    let alert = |s: &&Sent| matches!(s, Sent::Alert(..));
    let alerts: Vec<_> = o.sent.iter().filter(alert).collect();
    let answered = o.sent.iter().any(|s| matches!(s, Sent::Data(_)));
    match (o.end, &alerts[..]) {
        (End::Closed, [Sent::Alert(1, 0)]) if answered => Some(Accept),
        (End::Failed(ErrorKind::InvalidData), [Sent::Alert(2, d)]) if !answered => {
            Some(Verdict::Alert(*d))
        }
        (End::Failed(kind), []) if !answered => Some(Verdict::Quiet(kind)),
        _ => None,
    }
}

struct Case {
    name: &'static str,
    roles: &'static [Role],
    /// What rustls does.
    rustls: Verdict,
    /// What weft-tls does instead, where it differs on purpose (the table in the module documentation).
    weft: Option<Verdict>,
    script: fn(&mut Script),
}

const BOTH: &[Role] = &[Role::Client, Role::Server];
/// Only a server may send it (a ticket).
const CLIENT: &[Role] = &[Role::Client];
const SERVER: &[Role] = &[Role::Server];

const fn case(
    name: &'static str,
    roles: &'static [Role],
    rustls: Verdict,
    script: fn(&mut Script),
) -> Case {
    Case {
        name,
        roles,
        rustls,
        weft: None,
        script,
    }
}

impl Case {
    /// weft-tls does `v` instead, on purpose.
    const fn weft(self, v: Verdict) -> Self {
        Self {
            weft: Some(v),
            ..self
        }
    }
}

/// A handshake message.
fn msg(typ: u8, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    [&[typ, len[1], len[2], len[3]], body].concat()
}

fn key_update(request: u8) -> Vec<u8> {
    msg(24, &[request])
}

/// A `NewSessionTicket` (lifetime, age_add, a 2-byte nonce) with this ticket and these encoded extensions.
fn ticket_with(ticket: &[u8], extensions: &[u8]) -> Vec<u8> {
    let len = |v: &[u8]| u16::try_from(v.len()).unwrap().to_be_bytes();
    let head = [0, 0, 0x0e, 0x10, 1, 2, 3, 4, 2, 7, 7];
    msg(
        4,
        &[
            &head,
            &len(ticket)[..],
            ticket,
            &len(extensions),
            extensions,
        ]
        .concat(),
    )
}

fn ticket() -> Vec<u8> {
    ticket_with(b"opaque ticket", &[])
}

/// Records: framing, content types, padding, limits, headers, the transport's end.
const RECORDS: &[Case] = &[
    case("application_data", BOTH, Accept, |s| {
        s.data(b"hello");
        s.data(&[7; 16384]);
    }),
    case("empty_records", BOTH, Accept, |s| {
        s.data(b"a");
        s.empty(3);
        s.data(b"b");
        s.empty(1);
    }),
    case("32_empty_records_in_a_row", BOTH, Accept, |s| {
        s.data(b"a");
        s.empty(32);
        s.data(b"b");
    }),
    case("33_empty_records_in_a_row", BOTH, REFUSED, |s| {
        s.data(b"a");
        s.empty(33);
        s.data(b"b");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("padded_records", BOTH, Accept, |s| {
        s.padded(DATA, b"pad", 100);
        s.padded(DATA, b"x", 16384 - 1); // 2^14 + 1 octets of inner plaintext: the most there may be
        s.padded(DATA, &[], 16384);
        s.padded(ALERT, &[1, 90], 7);
        s.padded(HANDSHAKE, &key_update(0), 30);
        s.tx.update();
        s.data(b"y");
    }),
    case("padding_only_inner_plaintext", BOTH, REFUSED, |s| {
        s.data(b"a");
        s.inner(&[0; 10]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("empty_inner_plaintext", BOTH, REFUSED, |s| {
        s.data(b"a");
        s.inner(&[]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("unknown_inner_content_type", BOTH, DECODE_ERROR, |s| {
        s.data(b"a");
        s.record(99, b"x");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("heartbeat_inner_content_type", BOTH, DECODE_ERROR, |s| {
        s.record(24, &[1, 0, 0]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case(
        "change_cipher_spec_inner_content_type",
        BOTH,
        UNEXPECTED_MESSAGE,
        |s| {
            s.data(b"a");
            s.record(20, &[1]);
        },
    ),
    case(
        "inner_plaintext_of_2_14_plus_2",
        BOTH,
        RECORD_OVERFLOW,
        |s| {
            s.data(b"a");
            s.padded(DATA, &[1; 16384], 1);
        },
    ),
    case("content_of_2_14_plus_1", BOTH, RECORD_OVERFLOW, |s| {
        s.record(DATA, &[1; 16385])
    }),
    case(
        "ciphertext_over_2_14_plus_256",
        BOTH,
        RECORD_OVERFLOW,
        |s| {
            let rec = s.sealed(DATA, &[1; 16641 - 17]);
            assert_eq!(rec.len(), 5 + 16641);
            s.raw(&rec);
        },
    ),
    case("length_field_of_2_14_plus_2048", BOTH, DECODE_ERROR, |s| {
        s.data(b"a");
        s.raw(&[DATA, 3, 3, 0x48, 0x00]);
        s.raw(&[0; 64]);
    })
    .weft(RECORD_OVERFLOW),
    case("flipped_tag_bit", BOTH, BAD_RECORD_MAC, |s| {
        s.data(b"a");
        let mut rec = s.sealed(DATA, b"tampered");
        *rec.last_mut().unwrap() ^= 0x10;
        s.raw(&rec);
    }),
    case("flipped_ciphertext_bit", BOTH, BAD_RECORD_MAC, |s| {
        let mut rec = s.sealed(DATA, b"tampered");
        rec[6] ^= 1;
        s.raw(&rec);
    }),
    case("record_shorter_than_a_tag", BOTH, BAD_RECORD_MAC, |s| {
        s.raw(&[DATA, 3, 3, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    }),
    // legacy_record_version: rustls takes any 3.x and authenticates the record as 3.3.
    case("legacy_version_0x0301", BOTH, Accept, |s| {
        s.record_as([DATA, 3, 1], [DATA, 3, 3], DATA, b"x");
    }),
    case(
        "legacy_version_0x0301_authenticated_as_such",
        BOTH,
        BAD_RECORD_MAC,
        |s| {
            s.record_as([DATA, 3, 1], [DATA, 3, 1], DATA, b"x");
        },
    ),
    case("legacy_version_0x0203", BOTH, DECODE_ERROR, |s| {
        s.record_as([DATA, 2, 3], [DATA, 2, 3], DATA, b"x");
    }),
    case("plaintext_handshake_record", BOTH, BAD_RECORD_MAC, |s| {
        s.data(b"a");
        s.raw(&[HANDSHAKE, 3, 3, 0, 5, 24, 0, 0, 1, 0]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("plaintext_alert_record", BOTH, BAD_RECORD_MAC, |s| {
        s.raw(&[ALERT, 3, 3, 0, 2, 1, 0]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case(
        "plaintext_change_cipher_spec_record",
        BOTH,
        UNEXPECTED_MESSAGE,
        |s| {
            s.raw(&[20, 3, 3, 0, 1, 1]);
        },
    ),
    case("sealed_record_with_outer_type_22", BOTH, Accept, |s| {
        s.record_as([HANDSHAKE, 3, 3], [DATA, 3, 3], DATA, b"x");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("unknown_outer_content_type", BOTH, DECODE_ERROR, |s| {
        s.record_as([99, 3, 3], [99, 3, 3], DATA, b"x");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("eof_without_close_notify", BOTH, TRUNCATED, |s| {
        s.data(b"a");
        s.eof = true;
    }),
    case("truncated_mid_record", BOTH, TRUNCATED, |s| {
        s.data(b"a");
        let rec = s.sealed(DATA, b"cut short");
        s.raw(&rec[..rec.len() / 2]);
        s.eof = true;
    }),
    case("truncated_mid_header", BOTH, TRUNCATED, |s| {
        s.data(b"a");
        s.raw(&[DATA, 3]);
        s.eof = true;
    }),
];

/// Alerts of each level and kind.
const ALERTS: &[Case] = &[
    case("close_notify", BOTH, Accept, |s| {
        s.data(b"a");
        s.alert(1, 0);
        s.data(b"after close_notify: never read");
        s.raw(b"nor this");
    }),
    case("close_notify_at_fatal_level", BOTH, Accept, |s| {
        s.data(b"a");
        s.alert(2, 0);
        s.data(b"never read");
    }),
    case("user_canceled_warning", BOTH, Accept, |s| {
        s.data(b"a");
        s.alert(1, 90);
        s.data(b"b");
    }),
    case("4_user_canceled_warnings", BOTH, Accept, |s| {
        (0..4).for_each(|_| s.alert(1, 90));
        s.data(b"b");
    }),
    case("5_user_canceled_warnings", BOTH, REFUSED, |s| {
        (0..5).for_each(|_| s.alert(1, 90));
        s.data(b"b");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("user_canceled_fatal", BOTH, REFUSED, |s| {
        s.data(b"a");
        s.alert(2, 90);
    }),
    case("fatal_alert", BOTH, REFUSED, |s| {
        s.data(b"a");
        s.alert(2, 40);
    }),
    case("fatal_alert_unknown_description", BOTH, REFUSED, |s| {
        s.alert(2, 200)
    }),
    case(
        "warning_alert_other_than_user_canceled",
        BOTH,
        DECODE_ERROR,
        |s| {
            s.data(b"a");
            s.alert(1, 42);
        },
    )
    .weft(REFUSED),
    case("unknown_level_close_notify", BOTH, ILLEGAL_PARAMETER, |s| {
        s.alert(3, 0)
    }),
    case(
        "unknown_level_user_canceled",
        BOTH,
        ILLEGAL_PARAMETER,
        |s| s.alert(0, 90),
    ),
    case(
        "unknown_level_handshake_failure",
        BOTH,
        ILLEGAL_PARAMETER,
        |s| s.alert(255, 40),
    ),
    case("alert_of_1_byte", BOTH, DECODE_ERROR, |s| {
        s.record(ALERT, &[2])
    }),
    case("alert_of_3_bytes", BOTH, DECODE_ERROR, |s| {
        s.record(ALERT, &[1, 90, 0])
    }),
    case("alert_of_0_bytes", BOTH, DECODE_ERROR, |s| {
        s.record(ALERT, &[])
    }),
];

/// Post-handshake handshake messages: `KeyUpdate`, `NewSessionTicket`, and those that may not come.
const MESSAGES: &[Case] = &[
    case("key_update", BOTH, Accept, |s| {
        s.data(b"a");
        s.key_update(0);
        s.data(b"b");
    }),
    case("key_update_requested", BOTH, Accept, |s| {
        s.data(b"a");
        s.key_update(1);
        s.data(b"b");
    }),
    case(
        "key_update_fragmented_over_two_records",
        BOTH,
        Accept,
        |s| {
            s.data(b"a");
            s.handshake(&[24, 0]);
            s.handshake(&[0, 1, 1]);
            s.tx.update();
            s.data(b"b");
        },
    ),
    case("key_update_split_by_application_data", BOTH, REFUSED, |s| {
        s.handshake(&[24, 0]);
        s.data(b"inside a message");
        s.handshake(&[0, 1, 0]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("key_update_split_by_an_empty_record", BOTH, REFUSED, |s| {
        s.handshake(&[24, 0, 0]);
        s.empty(1);
        s.handshake(&[1, 0]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("key_update_with_request_2", BOTH, ILLEGAL_PARAMETER, |s| {
        s.handshake(&key_update(2))
    }),
    case("key_update_of_2_bytes", BOTH, DECODE_ERROR, |s| {
        s.handshake(&msg(24, &[0, 0]))
    }),
    case("key_update_of_0_bytes", BOTH, DECODE_ERROR, |s| {
        s.handshake(&msg(24, &[]))
    }),
    case(
        "key_update_not_at_the_end_of_its_record",
        BOTH,
        UNEXPECTED_MESSAGE,
        |s| {
            s.handshake(&[key_update(0), key_update(0)].concat());
        },
    ),
    case(
        "key_update_then_a_partial_message",
        BOTH,
        UNEXPECTED_MESSAGE,
        |s| {
            s.handshake(&[&key_update(0)[..], &[24, 0]].concat());
        },
    ),
    case(
        "key_update_then_data_under_the_old_key",
        BOTH,
        BAD_RECORD_MAC,
        |s| {
            s.data(b"a");
            s.handshake(&key_update(0));
            s.data(b"old key");
        },
    ),
    case(
        "key_update_requested_then_a_bad_record",
        BOTH,
        BAD_RECORD_MAC,
        |s| {
            s.data(b"a");
            s.key_update(1);
            let mut rec = s.sealed(DATA, b"b");
            rec[9] ^= 4;
            s.raw(&rec);
        },
    ),
    case("32_key_updates_in_a_row", BOTH, Accept, |s| {
        (0..32).for_each(|i| s.key_update(i % 2));
        s.data(b"b");
    }),
    case("33_key_updates_in_a_row", BOTH, REFUSED, |s| {
        (0..33).for_each(|_| s.key_update(0));
        s.data(b"b");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("ticket", CLIENT, Accept, |s| {
        s.handshake(&ticket());
        s.data(b"b");
    }),
    case(
        "ticket_fragmented_over_three_records",
        CLIENT,
        Accept,
        |s| {
            let t = ticket();
            s.handshake(&t[..3]);
            s.handshake(&t[3..9]);
            s.handshake(&t[9..]);
            s.data(b"b");
        },
    ),
    case("ticket_with_extensions", CLIENT, Accept, |s| {
        // early_data (max_early_data_size 16384), and one rustls does not know.
        s.handshake(&ticket_with(
            b"t",
            &[0, 42, 0, 4, 0, 0, 0x40, 0, 0xfa, 0xfa, 0, 1, 9],
        ));
        s.data(b"b");
    }),
    case(
        "tickets_and_a_key_update_in_one_record",
        CLIENT,
        Accept,
        |s| {
            s.handshake(&[ticket(), ticket(), key_update(1)].concat());
            s.tx.update();
            s.data(b"b");
        },
    ),
    case("16_tickets", CLIENT, Accept, |s| {
        (0..16).for_each(|_| s.handshake(&ticket()));
        s.data(b"b");
    }),
    case("17_tickets", CLIENT, Accept, |s| {
        (0..17).for_each(|_| s.handshake(&ticket()));
        s.data(b"b");
    })
    .weft(UNEXPECTED_MESSAGE),
    case("ticket_empty", CLIENT, DECODE_ERROR, |s| {
        s.handshake(&ticket_with(b"", &[]))
    }),
    case("ticket_with_a_trailing_byte", CLIENT, DECODE_ERROR, |s| {
        let mut t = ticket();
        t[3] += 1;
        t.push(0);
        s.handshake(&t);
    }),
    case("ticket_truncated", CLIENT, DECODE_ERROR, |s| {
        s.handshake(&msg(4, &[0, 0, 0, 1, 0, 0]));
    }),
    case("ticket_early_data_of_3_bytes", CLIENT, DECODE_ERROR, |s| {
        s.handshake(&ticket_with(b"t", &[0, 42, 0, 3, 0, 0, 1]));
    }),
    case(
        "ticket_with_an_extension_twice",
        CLIENT,
        ILLEGAL_PARAMETER,
        |s| {
            s.handshake(&ticket_with(b"t", &[0xfa, 0xfa, 0, 0, 0xfa, 0xfa, 0, 0]));
        },
    ),
    case("ticket_split_by_application_data", CLIENT, REFUSED, |s| {
        let t = ticket();
        s.handshake(&t[..6]);
        s.data(b"inside a message");
        s.handshake(&t[6..]);
    })
    .weft(UNEXPECTED_MESSAGE),
    case("ticket_to_a_server", SERVER, UNEXPECTED_MESSAGE, |s| {
        s.handshake(&ticket())
    }),
    case("certificate_request", BOTH, UNEXPECTED_MESSAGE, |s| {
        // context "\x01", signature_algorithms: ecdsa_secp256r1_sha256.
        s.handshake(&msg(13, &[1, 1, 0, 8, 0, 13, 0, 4, 0, 2, 4, 3]));
    }),
    case(
        "certificate_request_that_does_not_parse",
        BOTH,
        DECODE_ERROR,
        |s| {
            s.handshake(&msg(13, &[9]));
        },
    )
    .weft(UNEXPECTED_MESSAGE),
    case(
        "finished_after_the_handshake",
        BOTH,
        UNEXPECTED_MESSAGE,
        |s| {
            s.handshake(&msg(20, &[0; 32]));
        },
    ),
    case("end_of_early_data", BOTH, UNEXPECTED_MESSAGE, |s| {
        s.handshake(&msg(5, &[]))
    }),
    case("hello_request", BOTH, UNEXPECTED_MESSAGE, |s| {
        s.handshake(&msg(0, &[]))
    }),
    case("unknown_handshake_type", BOTH, UNEXPECTED_MESSAGE, |s| {
        s.handshake(&msg(99, &[1, 2]))
    }),
    case("message_hash_type", BOTH, DECODE_ERROR, |s| {
        s.handshake(&msg(254, &[0; 32]));
    })
    .weft(UNEXPECTED_MESSAGE),
    case("empty_handshake_record", BOTH, Accept, |s| {
        s.data(b"a");
        s.handshake(&[]);
        s.data(b"b");
    })
    .weft(UNEXPECTED_MESSAGE),
];

/// Sequences in the same write as the attacker's last flight, which ends with its Finished: the records weft-tls
/// must take over from rustls's handshake. The client gets them behind the server's Finished (0.5-RTT).
const COALESCED: &[Case] = &[
    case("coalesced_data", BOTH, Accept, |s| s.data(b"first flight")),
    case(
        "coalesced_empty_records_and_user_canceled",
        BOTH,
        Accept,
        |s| {
            s.empty(2);
            s.alert(1, 90);
            s.data(b"a");
        },
    ),
    case("coalesced_key_update", BOTH, Accept, |s| {
        s.data(b"a");
        s.key_update(0);
        s.data(b"b");
    }),
    case("coalesced_key_update_requested", BOTH, Accept, |s| {
        s.key_update(1);
        s.data(b"b");
    }),
    case("coalesced_close_notify", BOTH, Accept, |s| {
        s.data(b"a");
        s.alert(1, 0);
        s.data(b"never read");
    }),
    case("coalesced_partial_key_update", BOTH, Accept, |s| {
        s.handshake(&[24, 0]);
        s.handshake(&[0, 1, 0]);
        s.tx.update();
        s.data(b"b");
    }),
    case(
        "coalesced_partial_key_update_then_data",
        BOTH,
        REFUSED,
        |s| {
            s.handshake(&[24, 0]);
            s.data(b"inside a message");
        },
    )
    .weft(UNEXPECTED_MESSAGE),
    case("coalesced_bad_record", BOTH, BAD_RECORD_MAC, |s| {
        s.data(b"a");
        let mut rec = s.sealed(DATA, b"b");
        rec[7] ^= 1;
        s.raw(&rec);
    }),
    case("coalesced_ticket", CLIENT, Accept, |s| {
        s.handshake(&ticket());
        s.data(b"b");
    }),
    case(
        "coalesced_ticket_to_a_server",
        SERVER,
        UNEXPECTED_MESSAGE,
        |s| s.handshake(&ticket()),
    ),
];

/// Run every case against rustls and both shapes of weft-tls; fail with every mismatch at once.
async fn check(cases: &[Case], coalesced: bool) {
    let mut failures = Vec::new();
    let mut runs = 0;
    for c in cases {
        for &role in c.roles {
            let at = format!("{} (victim {role:?})", c.name);
            let (r, data) = peer::run(Victim::Rustls, role, coalesced, c.script).await;
            runs += 1;
            if verdict(&r) != Some(c.rustls) {
                failures.push(format!("{at}: rustls: expected {:?}, got {r:?}", c.rustls));
            } else if c.rustls == Accept && r.data != data {
                failures.push(format!("{at}: rustls read {:?}, not {data:?}", r.data));
            }
            for v in [Victim::Weft, Victim::WeftTrickle] {
                let (w, _) = peer::run(v, role, coalesced, c.script).await;
                runs += 1;
                match c.weft {
                    None if w != r => failures.push(format!(
                        "{at}: {v:?} differs from rustls:\n  weft:   {w:?}\n  rustls: {r:?}"
                    )),
                    Some(expected) if verdict(&w) != Some(expected) => failures.push(format!(
                        "{at}: {v:?}: expected {expected:?} (unlike rustls, on purpose), got {w:?}"
                    )),
                    _ => {}
                }
            }
        }
    }
    let pairs: usize = cases.iter().map(|c| c.roles.len()).sum();
    eprintln!(
        "{} sequences, {pairs} sequence × role pairs, {runs} runs",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn records() {
    check(RECORDS, false).await;
}

#[tokio::test]
async fn alerts() {
    check(ALERTS, false).await;
}

#[tokio::test]
async fn post_handshake_messages() {
    check(MESSAGES, false).await;
}

#[tokio::test]
async fn coalesced_behind_finished() {
    check(COALESCED, true).await;
}
