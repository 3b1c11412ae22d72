//! The PROXY protocol v2 header written to a workload whose application tunnel asks for it (HAProxy's
//! proxy-protocol.txt §2.2), as ztunnel writes it: command PROXY over STREAM, the HBONE client's address as the
//! source, the CONNECT authority as the destination, and TLV 0xD0 carrying the peer's SPIFFE id.

use std::net::SocketAddr;

/// The v2 signature.
pub const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];
/// ztunnel's TLV type for the peer's SPIFFE id (a type the spec leaves unassigned; its custom range is 0xE0-0xEF,
/// but 0xD0 is what ztunnel writes and what applications behind it read).
pub const TLV_PEER_IDENTITY: u8 = 0xD0;

/// The header for a connection from `src` to `dst`, with the peer's identity when it has one. Mixed address
/// families (which cannot share one address block) are sent as AF_UNSPEC with no addresses, TLVs kept.
pub fn v2_header(src: SocketAddr, dst: SocketAddr, identity: Option<&str>) -> Vec<u8> {
    let mut addrs = Vec::with_capacity(36);
    let family = match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            addrs.extend_from_slice(&s.ip().octets());
            addrs.extend_from_slice(&d.ip().octets());
            addrs.extend_from_slice(&s.port().to_be_bytes());
            addrs.extend_from_slice(&d.port().to_be_bytes());
            0x10
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            addrs.extend_from_slice(&s.ip().octets());
            addrs.extend_from_slice(&d.ip().octets());
            addrs.extend_from_slice(&s.port().to_be_bytes());
            addrs.extend_from_slice(&d.port().to_be_bytes());
            0x20
        }
        _ => 0x00,
    };
    let mut tlvs = Vec::new();
    // A SPIFFE id never comes near 64 KiB; one that did would be left out rather than overflow the length.
    if let Some(id) = identity
        && let Ok(len) = u16::try_from(id.len())
        && usize::from(len) + addrs.len() + 3 <= usize::from(u16::MAX)
    {
        tlvs.push(TLV_PEER_IDENTITY);
        tlvs.extend_from_slice(&len.to_be_bytes());
        tlvs.extend_from_slice(id.as_bytes());
    }
    let rest = u16::try_from(addrs.len() + tlvs.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(16 + usize::from(rest));
    out.extend_from_slice(&SIGNATURE);
    // Version 2, command PROXY.
    out.push(0x21);
    // Address family, transport STREAM.
    out.push(family | 0x01);
    out.extend_from_slice(&rest.to_be_bytes());
    out.extend_from_slice(&addrs);
    out.extend_from_slice(&tlvs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_bytes() {
        let h = v2_header(
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:8080".parse().unwrap(),
            Some("spiffe://td/ns/a/sa/b"),
        );
        let id = b"spiffe://td/ns/a/sa/b";
        let mut want = SIGNATURE.to_vec();
        want.extend_from_slice(&[0x21, 0x11]);
        want.extend_from_slice(&((12 + 3 + id.len()) as u16).to_be_bytes());
        want.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        want.extend_from_slice(&40000u16.to_be_bytes());
        want.extend_from_slice(&8080u16.to_be_bytes());
        want.push(0xD0);
        want.extend_from_slice(&(id.len() as u16).to_be_bytes());
        want.extend_from_slice(id);
        assert_eq!(h, want);
    }

    #[test]
    fn ipv6_and_mixed_families() {
        let h = v2_header(
            "[fd00::1]:1".parse().unwrap(),
            "[fd00::2]:2".parse().unwrap(),
            None,
        );
        assert_eq!(h[13], 0x21);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 36);
        assert_eq!(h.len(), 16 + 36);
        let h = v2_header(
            "10.0.0.1:1".parse().unwrap(),
            "[fd00::2]:2".parse().unwrap(),
            Some("x"),
        );
        assert_eq!(h[13], 0x01);
        assert_eq!(&h[14..], &[0, 4, 0xD0, 0, 1, b'x']);
    }
}
