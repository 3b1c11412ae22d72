//! `socks5_request`: the bytes a client sends to the SOCKS5 listener (15080), through the listener's own request
//! parser over an in-memory stream. The first input byte picks the read size (1 to 16 bytes per read, so every
//! split of the request is seen); the rest is what the client sends.
//!
//! Invariants, checked against an independent slice decoder of RFC 1928 (CONNECT, no authentication): the same
//! destination or refusal, the same reply bytes, and not one byte read past the request (the bytes after it are
//! the client's payload and must reach the upstream).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::mem::MemStream;

/// What the listener should make of an input.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    /// The request names this destination; the request is `len` bytes long.
    Connect(SocketAddr, usize),
    /// Refused (with the reply bytes already written, if any).
    Refused,
    /// The input ends inside the request: an I/O error (unexpected EOF).
    Truncated,
}

/// RFC 1928 as weft implements it, on a slice; `out` gets the replies.
fn reference(b: &[u8], out: &mut Vec<u8>) -> Expect {
    let take = |at: usize, n: usize| b.get(at..at + n);
    let Some(head) = take(0, 2) else {
        return Expect::Truncated;
    };
    if head[0] != 5 {
        return Expect::Refused;
    }
    let n = usize::from(head[1]);
    let Some(methods) = take(2, n) else {
        return Expect::Truncated;
    };
    if !methods.contains(&0) {
        out.extend_from_slice(&[5, 0xff]);
        return Expect::Refused;
    }
    out.extend_from_slice(&[5, 0]);
    let mut at = 2 + n;
    let Some(req) = take(at, 4) else {
        return Expect::Truncated;
    };
    at += 4;
    if req[0] != 5 {
        return Expect::Refused;
    }
    let error_reply =
        |code: u8, out: &mut Vec<u8>| out.extend_from_slice(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
    let ip = match req[3] {
        1 => {
            let Some(a) = take(at, 4) else {
                return Expect::Truncated;
            };
            at += 4;
            IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
        }
        4 => {
            let Some(a) = take(at, 16) else {
                return Expect::Truncated;
            };
            at += 16;
            let mut o = [0u8; 16];
            o.copy_from_slice(a);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        3 => {
            let Some(len) = take(at, 1) else {
                return Expect::Truncated;
            };
            let len = usize::from(len[0]);
            let Some(name) = take(at + 1, len) else {
                return Expect::Truncated;
            };
            at += 1 + len;
            match std::str::from_utf8(name).ok().and_then(|n| n.parse().ok()) {
                Some(ip) => ip,
                None => {
                    if take(at, 2).is_none() {
                        return Expect::Truncated;
                    }
                    error_reply(8, out);
                    return Expect::Refused;
                }
            }
        }
        _ => {
            error_reply(8, out);
            return Expect::Refused;
        }
    };
    let Some(port) = take(at, 2) else {
        return Expect::Truncated;
    };
    at += 2;
    if req[1] != 1 {
        error_reply(7, out);
        return Expect::Refused;
    }
    Expect::Connect(
        SocketAddr::new(ip, u16::from_be_bytes([port[0], port[1]])),
        at,
    )
}

/// Feed one input.
pub fn run(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first % 16) + 1;
    let mut stream = MemStream::new(rest.to_vec(), chunk);
    let rt = crate::paused_runtime();
    let got = rt.block_on(weft_proxy::fuzzing::socks5_request(&mut stream));
    let mut replies = Vec::new();
    let want = reference(rest, &mut replies);
    match (&got, &want) {
        (Ok(Some(addr)), Expect::Connect(want_addr, len)) => {
            assert_eq!(addr, want_addr, "destination");
            assert_eq!(
                stream.consumed(),
                *len,
                "read past the request into the payload"
            );
        }
        (Ok(None), Expect::Refused) => {}
        (Err(e), Expect::Truncated) => {
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        }
        _ => panic!("listener says {got:?}, RFC 1928 says {want:?}"),
    }
    assert_eq!(stream.written, replies, "reply bytes");
}
