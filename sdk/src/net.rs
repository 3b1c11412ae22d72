//! Addresses: conversions between the WIT forms and `std::net`, CIDR ranges and port sets.
//!
//! ```
//! use weft_plugin_sdk::net::{Cidr, PortSet};
//! let lan: Cidr = "10.0.0.0/8".parse().unwrap();
//! assert!(lan.contains("10.1.2.3".parse().unwrap()));
//! let ports: PortSet = "80, 443, 8000-8099".parse().unwrap();
//! assert!(ports.contains(8080) && !ports.contains(22));
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::bindings::weft::plugin::types::{self as wit, IpAddress, SocketAddress};

impl From<&IpAddress> for IpAddr {
    fn from(ip: &IpAddress) -> Self {
        match *ip {
            IpAddress::Ipv4(v) => IpAddr::V4(Ipv4Addr::from(v)),
            IpAddress::Ipv6((hi, lo)) => {
                IpAddr::V6(Ipv6Addr::from((u128::from(hi) << 64) | u128::from(lo)))
            }
        }
    }
}

impl From<IpAddr> for IpAddress {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v) => IpAddress::Ipv4(u32::from(v)),
            IpAddr::V6(v) => {
                let bits = u128::from(v);
                IpAddress::Ipv6(((bits >> 64) as u64, bits as u64))
            }
        }
    }
}

impl From<&SocketAddress> for SocketAddr {
    fn from(sa: &SocketAddress) -> Self {
        SocketAddr::new(IpAddr::from(&sa.address), sa.port)
    }
}

impl From<SocketAddr> for SocketAddress {
    fn from(sa: SocketAddr) -> Self {
        SocketAddress {
            address: sa.ip().into(),
            port: sa.port(),
        }
    }
}

/// An error parsing a [`Cidr`] or a [`PortSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// An IP range (`10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// A range; `prefix_len` is clamped to the address family's width.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Self {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        Self {
            addr,
            prefix_len: prefix_len.min(max),
        }
    }

    /// The range's first address as given.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` lies in the range (IPv4-mapped IPv6 addresses match IPv4 ranges).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl From<&wit::Cidr> for Cidr {
    fn from(c: &wit::Cidr) -> Self {
        Cidr::new(IpAddr::from(&c.address), c.prefix_len)
    }
}

impl FromStr for Cidr {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| ParseError(format!("bad IP address in CIDR `{s}`")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| ParseError(format!("bad prefix length in CIDR `{s}`")))?,
            None => max,
        };
        Ok(Cidr::new(addr, len))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// A set of TCP ports, parsed from `"80, 443, 8000-8099"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSet {
    ranges: Vec<(u16, u16)>,
}

impl PortSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the inclusive range `lo..=hi`.
    pub fn insert_range(&mut self, lo: u16, hi: u16) {
        self.ranges.push((lo.min(hi), lo.max(hi)));
    }

    /// Adds one port.
    pub fn insert(&mut self, port: u16) {
        self.insert_range(port, port);
    }

    /// Adds every port of `other`.
    pub fn extend(&mut self, other: &PortSet) {
        self.ranges.extend_from_slice(&other.ranges);
    }

    /// Whether the set holds `port`.
    pub fn contains(&self, port: u16) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= port && port <= hi)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl FromStr for PortSet {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = PortSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let port = |p: &str| {
                p.trim()
                    .parse::<u16>()
                    .map_err(|_| ParseError(format!("bad port `{p}`")))
            };
            match part.split_once('-') {
                Some((lo, hi)) => set.insert_range(port(lo)?, port(hi)?),
                None => set.insert(port(part)?),
            }
        }
        Ok(set)
    }
}

impl FromIterator<u16> for PortSet {
    fn from_iter<I: IntoIterator<Item = u16>>(iter: I) -> Self {
        let mut set = PortSet::new();
        for p in iter {
            set.insert(p);
        }
        set
    }
}
