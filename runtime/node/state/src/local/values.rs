//! Typed scalars of the local config file (IPs, CIDRs, VIPs, ports, hashes, base64) that validate while serde_yaml
//! is still looking at them, so a bad value's error carries its own field path, line and column.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ipnet::IpNet;
use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::topology::GatewayDestination;
use crate::validate;

/// A visitor for string scalars that runs `parse` inside `visit_str`, i.e. while the deserializer still knows where
/// the value is.
struct StrVisitor<F> {
    expecting: &'static str,
    parse: F,
}

impl<T, F> Visitor<'_> for StrVisitor<F>
where
    F: FnOnce(&str) -> Result<T, String>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.parse)(v).map_err(E::custom)
    }
}

fn from_str_with<'de, D, T>(
    d: D,
    expecting: &'static str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    d.deserialize_str(StrVisitor { expecting, parse })
}

/// An IP address (`10.0.0.1`, `fd00::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct IpValue(pub IpAddr);

impl<'de> Deserialize<'de> for IpValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "an IP address", |s| {
            IpAddr::from_str(s.trim())
                .map(IpValue)
                .map_err(|_| format!("invalid IP address {s:?}"))
        })
    }
}

/// A CIDR range; a bare IP means the single address (`/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CidrValue(pub IpNet);

impl<'de> Deserialize<'de> for CidrValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a CIDR range or an IP address", |s| {
            let t = s.trim();
            let net = if t.contains('/') {
                IpNet::from_str(t)
                    .map_err(|_| format!("invalid CIDR {s:?} (expected e.g. 10.0.0.0/8)"))?
            } else {
                IpAddr::from_str(t)
                    .map(IpNet::from)
                    .map_err(|_| format!("invalid CIDR or IP address {s:?}"))?
            };
            Ok(CidrValue(net))
        })
    }
}

/// A service VIP, `network/IP`; the network may be empty (`/10.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VipValue {
    pub network: String,
    pub ip: IpAddr,
}

impl<'de> Deserialize<'de> for VipValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a VIP as network/IP", |s| {
            let bad = || {
                format!(
                    "invalid VIP {s:?} (expected \"network/IP\"; the network may be empty, as in \"/10.0.0.1\")"
                )
            };
            let (network, ip) = s.split_once('/').ok_or_else(bad)?;
            let ip = IpAddr::from_str(ip.trim()).map_err(|_| bad())?;
            Ok(VipValue {
                network: network.to_owned(),
                ip,
            })
        })
    }
}

/// `namespace/hostname`, naming a service (keys of a workload's `services`): both parts checked
/// ([`validate::namespaced_hostname`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct NamespacedHost(pub String);

impl<'de> Deserialize<'de> for NamespacedHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "namespace/hostname", |s| {
            validate::namespaced_hostname(s).map(|_| NamespacedHost(s.to_owned()))
        })
    }
}

/// A waypoint's or gateway's destination: `network/IP` when the part after the first `/` is an IP, else
/// `namespace/hostname` (ztunnel tries them in that order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GatewayDestinationValue(pub GatewayDestination);

impl<'de> Deserialize<'de> for GatewayDestinationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "network/IP or namespace/hostname", |s| {
            let Some((left, right)) = s.split_once('/') else {
                return Err(format!(
                    "invalid gateway {s:?} (expected \"network/IP\" or \"namespace/hostname\")"
                ));
            };
            if let Ok(ip) = IpAddr::from_str(right) {
                return Ok(GatewayDestinationValue(GatewayDestination::Address {
                    network: left.to_owned(),
                    ip,
                }));
            }
            validate::namespaced_hostname(s)?;
            Ok(GatewayDestinationValue(GatewayDestination::Hostname {
                namespace: left.to_owned(),
                hostname: right.to_owned(),
            }))
        })
    }
}

/// A service port: 1..=65535 (0 is refused; target ports may be 0, meaning "same as the service port").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ServicePort(pub u16);

struct ServicePortVisitor;

impl ServicePortVisitor {
    fn check<E: de::Error>(v: i128) -> Result<ServicePort, E> {
        match u16::try_from(v) {
            Ok(0) => Err(E::custom("service port 0 is not a valid port")),
            Ok(p) => Ok(ServicePort(p)),
            Err(_) => Err(E::custom(format!(
                "service port {v} is out of range (1-65535)"
            ))),
        }
    }
}

impl Visitor<'_> for ServicePortVisitor {
    type Value = ServicePort;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a port number (1-65535)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ServicePort, E> {
        Self::check(i128::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ServicePort, E> {
        Self::check(i128::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ServicePort, E> {
        match v.trim().parse::<i128>() {
            Ok(n) => Self::check(n),
            Err(_) => Err(E::custom(format!("invalid port {v:?}"))),
        }
    }
}

impl<'de> Deserialize<'de> for ServicePort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_u16(ServicePortVisitor)
    }
}

/// A sha256 digest in hex (64 digits), kept lowercase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sha256Hex(pub String);

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a sha256 digest in hex", |s| {
            let t = s.trim();
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(t, &mut bytes)
                .map_err(|e| format!("invalid sha256 {s:?}: expected 64 hex digits ({e})"))?;
            Ok(Sha256Hex(t.to_ascii_lowercase()))
        })
    }
}

/// Bytes given as base64 (standard alphabet, padding optional, whitespace and line breaks ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Base64Bytes(pub Vec<u8>);

const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

impl<'de> Deserialize<'de> for Base64Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "base64 text", |s| {
            let compact: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            BASE64
                .decode(compact.as_bytes())
                .map(Base64Bytes)
                .map_err(|e| format!("invalid base64: {e}"))
        })
    }
}

/// A label value: any scalar, kept as text (`version: 2` and `canary: true` are fine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LabelValue(pub String);

struct LabelVisitor;

impl Visitor<'_> for LabelVisitor {
    type Value = LabelValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a label value (string, number or boolean)")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<LabelValue, E> {
        Ok(LabelValue(v.to_owned()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<LabelValue, E> {
        Ok(LabelValue(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<LabelValue, E> {
        Ok(LabelValue(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<LabelValue, E> {
        Ok(LabelValue(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<LabelValue, E> {
        Ok(LabelValue(v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<LabelValue, E> {
        Ok(LabelValue(String::new()))
    }
}

impl<'de> Deserialize<'de> for LabelValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LabelVisitor)
    }
}

/// ztunnel's `StringMatch`, written with YAML tags: `!Exact a`, `!Prefix a`, `!Suffix a`, and `!Presence []` (ztunnel's
/// `Presence()` is an empty tuple variant, so its value is an empty list, or nothing: `!Presence`).
///
/// Hand-written rather than derived only so that an unknown tag is reported at the tagged value itself (serde_yaml
/// places a derived enum's unknown-variant error at the enclosing list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StringMatchWire {
    Prefix(String),
    Suffix(String),
    Exact(String),
    Presence(),
}

const STRING_MATCH_TAGS: &[&str] = &["Prefix", "Suffix", "Exact", "Presence"];

impl<'de> Deserialize<'de> for StringMatchWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_enum("StringMatch", STRING_MATCH_TAGS, StringMatchVisitor)
    }
}

struct StringMatchVisitor;

impl<'de> Visitor<'de> for StringMatchVisitor {
    type Value = StringMatchWire;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string match: !Exact, !Prefix, !Suffix or !Presence")
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<StringMatchWire, A::Error> {
        use de::VariantAccess as _;
        let (tag, variant): (String, _) = data.variant()?;
        match tag.as_str() {
            "Prefix" => variant.newtype_variant().map(StringMatchWire::Prefix),
            "Suffix" => variant.newtype_variant().map(StringMatchWire::Suffix),
            "Exact" => variant.newtype_variant().map(StringMatchWire::Exact),
            "Presence" => variant.tuple_variant(0, EmptyTupleVisitor),
            _ => variant.newtype_variant_seed(UnknownTag(tag)),
        }
    }
}

/// The value of `!Presence`: an empty tuple, like a derived `Presence()`.
struct EmptyTupleVisitor;

impl<'de> Visitor<'de> for EmptyTupleVisitor {
    type Value = StringMatchWire;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tuple variant StringMatch::Presence")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _seq: A) -> Result<StringMatchWire, A::Error> {
        Ok(StringMatchWire::Presence())
    }
}

/// Refuses the value of an unknown tag, from inside the value's own deserialization (so it is located there).
struct UnknownTag(String);

impl<'de> de::DeserializeSeed<'de> for UnknownTag {
    type Value = StringMatchWire;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<StringMatchWire, D::Error> {
        d.deserialize_any(self)
    }
}

impl UnknownTag {
    fn refuse<E: de::Error>(self) -> Result<StringMatchWire, E> {
        Err(E::unknown_variant(&self.0, STRING_MATCH_TAGS))
    }
}

impl<'de> Visitor<'de> for UnknownTag {
    type Value = StringMatchWire;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a known string match tag")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_unit<E: de::Error>(self) -> Result<StringMatchWire, E> {
        self.refuse()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<StringMatchWire, A::Error> {
        self.refuse()
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<StringMatchWire, A::Error> {
        self.refuse()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::StringMatchWire;

    /// The shape ztunnel derives (`rbac::StringMatch`); ours must accept exactly what it accepts.
    #[derive(Debug, serde::Deserialize)]
    enum Reference {
        Prefix(String),
        Suffix(String),
        Exact(String),
        Presence(),
    }

    fn same(r: Reference) -> StringMatchWire {
        match r {
            Reference::Prefix(s) => StringMatchWire::Prefix(s),
            Reference::Suffix(s) => StringMatchWire::Suffix(s),
            Reference::Exact(s) => StringMatchWire::Exact(s),
            Reference::Presence() => StringMatchWire::Presence(),
        }
    }

    #[test]
    fn string_match_accepts_what_a_derived_enum_accepts() {
        for text in [
            "!Presence []",
            "!Presence",
            "!Presence ''",
            "!Presence [a]",
            "!Presence null",
            "!Presence {}",
            "!Exact a",
            "!Exact ''",
            "!Exact 1",
            "!Exact [a]",
            "!Exact",
            "!Prefix team-",
            "!Suffix -prod",
            "Exact",
            "{Exact: a}",
            "!Regex a",
            "a",
        ] {
            let ours = serde_yaml::from_str::<StringMatchWire>(text);
            let reference = serde_yaml::from_str::<Reference>(text).map(same);
            match (&ours, &reference) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text:?}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{text:?}: ours {ours:?}, derived {reference:?}"),
            }
        }
    }
}
