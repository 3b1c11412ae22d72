//! DNS messages in and out: a request is checked before anything looks at it (too short or a response: dropped;
//! undecodable: FORMERR; not a one-question QUERY: FORMERR or NOTIMP), and responses are built and encoded to the
//! size the transport allows (UDP: 512 bytes or the client's EDNS size, truncated with TC set).

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::Record;

/// Largest UDP response weft sends, whatever EDNS size the client offers.
pub(crate) const MAX_UDP_RESPONSE: u16 = 4096;
/// A DNS header's size.
const HEADER_LEN: usize = 12;

/// What to do with a received message.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// Say nothing (too short to answer, or not a query: answering responses invites loops).
    Drop(&'static str),
    /// Answer at once with this (FORMERR, NOTIMP), for this reason.
    Reject(Vec<u8>, &'static str),
    /// A well-formed query with one question.
    Query(Box<Request>),
}

/// A decoded query.
#[derive(Debug)]
pub(crate) struct Request {
    /// The whole message.
    pub msg: Message,
    /// Its one question.
    pub query: Query,
}

impl Request {
    /// The largest response this client takes over UDP.
    pub(crate) fn udp_limit(&self) -> u16 {
        self.msg
            .edns
            .as_ref()
            .map_or(512, |e| e.max_payload())
            .clamp(512, MAX_UDP_RESPONSE)
    }
}

/// Check and decode a received message.
pub(crate) fn decode(bytes: &[u8]) -> Inbound {
    if bytes.len() < HEADER_LEN {
        return Inbound::Drop("shorter than a DNS header");
    }
    if bytes[2] & 0x80 != 0 {
        return Inbound::Drop("a response, not a query");
    }
    let msg = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return Inbound::Reject(raw_formerr(bytes), "undecodable"),
    };
    if msg.metadata.op_code != OpCode::Query {
        let r = error(&msg, ResponseCode::NotImp);
        return Inbound::Reject(encode(&r, u16::MAX), "not a QUERY");
    }
    let query = match msg.queries.as_slice() {
        [q] => q.clone(),
        _ => {
            let r = error(&msg, ResponseCode::FormErr);
            return Inbound::Reject(encode(&r, u16::MAX), "not exactly one question");
        }
    };
    Inbound::Query(Box::new(Request { msg, query }))
}

/// A FORMERR for a message that did not decode: its id, opcode and RD bit echoed, no sections.
fn raw_formerr(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    out[0] = bytes[0];
    out[1] = bytes[1];
    // QR=1, the opcode and RD as asked; RA=1; RCODE=1 (FORMERR).
    out[2] = 0x80 | (bytes[2] & 0x79);
    out[3] = 0x80 | ResponseCode::FormErr.low();
    out
}

/// The response skeleton for `req`: id, opcode, question and RD echoed, RA set, EDNS answered when the client
/// used it (its payload size, at least 512; version; DO bit).
pub(crate) fn response(req: &Message, code: ResponseCode, authoritative: bool) -> Message {
    let mut metadata = Metadata::response_from_request(&req.metadata);
    metadata.message_type = MessageType::Response;
    metadata.authoritative = authoritative;
    metadata.recursion_available = true;
    metadata.response_code = code;
    let mut m = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    m.metadata = metadata;
    m.add_queries(req.queries.iter().cloned());
    if let Some(e) = &req.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(e.max_payload().max(512));
        edns.set_version(e.version());
        edns.set_dnssec_ok(e.flags().dnssec_ok);
        m.set_edns(edns);
    }
    m
}

/// An error response (no records).
pub(crate) fn error(req: &Message, code: ResponseCode) -> Message {
    response(req, code, false)
}

/// A response with records.
pub(crate) fn with_records(
    req: &Message,
    code: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
) -> Message {
    let mut m = response(req, code, authoritative);
    m.insert_answers(answers);
    m.insert_authorities(authorities);
    m.insert_additionals(additionals);
    m
}

/// Encode `m` in at most `limit` bytes: when it does not fit, the authority and additional sections go, then as
/// many answers as needed, and TC is set so the client retries over TCP. A message that cannot be encoded at all
/// becomes a SERVFAIL with its header only.
pub(crate) fn encode(m: &Message, limit: u16) -> Vec<u8> {
    let limit = usize::from(limit);
    match m.to_vec() {
        Ok(v) if v.len() <= limit => return v,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "encoding a DNS response failed; answering SERVFAIL");
            return servfail_header(m);
        }
    }
    let mut t = m.clone();
    t.metadata.truncation = true;
    t.authorities.clear();
    t.additionals.clear();
    let all = std::mem::take(&mut t.answers);
    // The most answers that fit, by bisection (encoding is linear in the record count).
    let (mut lo, mut hi) = (0usize, all.len());
    let mut best = None;
    while lo <= hi {
        let mid = (lo + hi) / 2;
        t.answers = all[..mid].to_vec();
        match t.to_vec() {
            Ok(v) if v.len() <= limit => {
                best = Some(v);
                lo = mid + 1;
            }
            _ => {
                if mid == 0 {
                    break;
                }
                hi = mid - 1;
            }
        }
    }
    best.unwrap_or_else(|| servfail_header(m))
}

fn servfail_header(m: &Message) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    out[..2].copy_from_slice(&m.metadata.id.to_be_bytes());
    out[2] =
        0x80 | (u8::from(m.metadata.op_code) << 3 & 0x78) | u8::from(m.metadata.recursion_desired);
    out[3] = 0x80 | ResponseCode::ServFail.low();
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, RecordType};

    use super::*;

    fn query(name: &str, edns: Option<u16>) -> Message {
        let mut m = Message::query();
        m.metadata.id = 0x1234;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        if let Some(p) = edns {
            let mut e = Edns::new();
            e.set_max_payload(p);
            m.set_edns(e);
        }
        m
    }

    #[test]
    fn garbage_is_dropped_or_formerr() {
        assert!(matches!(decode(&[1, 2, 3]), Inbound::Drop(_)));
        // A response is never answered.
        let mut r = query("a.example.", None).to_vec().unwrap();
        r[2] |= 0x80;
        assert!(matches!(decode(&r), Inbound::Drop(_)));
        // Claims one question, has none.
        let bad = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff];
        let Inbound::Reject(reply, _) = decode(&bad) else {
            panic!("not rejected")
        };
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(m.metadata.id, 0xabcd);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert!(m.metadata.recursion_desired);
        // Two questions.
        let mut two = query("a.example.", None);
        two.add_query(Query::query(
            Name::from_ascii("b.example.").unwrap(),
            RecordType::A,
        ));
        let Inbound::Reject(reply, _) = decode(&two.to_vec().unwrap()) else {
            panic!("not rejected")
        };
        assert_eq!(
            Message::from_vec(&reply).unwrap().metadata.response_code,
            ResponseCode::FormErr
        );
        // Another opcode.
        let mut notify = query("a.example.", None);
        notify.metadata.op_code = OpCode::Notify;
        let Inbound::Reject(reply, _) = decode(&notify.to_vec().unwrap()) else {
            panic!("not rejected")
        };
        assert_eq!(
            Message::from_vec(&reply).unwrap().metadata.response_code,
            ResponseCode::NotImp
        );
    }

    #[test]
    fn big_answers_are_truncated_for_udp() {
        let q = query("big.example.", None);
        let Inbound::Query(req) = decode(&q.to_vec().unwrap()) else {
            panic!()
        };
        assert_eq!(req.udp_limit(), 512);
        let records: Vec<Record> = (0..=255u8)
            .map(|i| {
                Record::from_rdata(
                    Name::from_ascii("big.example.").unwrap(),
                    30,
                    RData::A(A(Ipv4Addr::new(240, 0, 0, i))),
                )
            })
            .collect();
        let r = with_records(
            &req.msg,
            ResponseCode::NoError,
            true,
            records,
            vec![],
            vec![],
        );
        let small = Message::from_vec(&encode(&r, req.udp_limit())).unwrap();
        assert!(small.metadata.truncation);
        assert!(!small.answers.is_empty() && small.answers.len() < 256);
        let full = Message::from_vec(&encode(&r, u16::MAX)).unwrap();
        assert!(!full.metadata.truncation);
        assert_eq!(full.answers.len(), 256);
        // A client's EDNS size raises the limit, up to weft's cap.
        let q = query("big.example.", Some(65000));
        let Inbound::Query(req) = decode(&q.to_vec().unwrap()) else {
            panic!()
        };
        assert_eq!(req.udp_limit(), MAX_UDP_RESPONSE);
    }
}
