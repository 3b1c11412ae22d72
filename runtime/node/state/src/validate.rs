//! Checks shared by every source (the local file and xDS alike), so a value refused in one is refused in the other,
//! with the same words. Only what weft cannot use is refused: a service key or waypoint hostname without its
//! `namespace/` part, a port outside 16 bits. Names (workloads, services, policies, namespaces, service accounts,
//! nodes, trust domains, hostnames) are opaque text, as they are to ztunnel: istiod emits names that Kubernetes
//! would refuse (`istio_converted_static_strict`, `converted_peer_authentication_<name>`, a network gateway named
//! `NetworkGateway/<network>/<address>/<port>`), and a name is only ever compared, never parsed. Where a name does
//! become part of something with rules of its own (a SPIFFE identity for a certificate), that step checks it and
//! says so for that one workload.

/// `namespace/hostname` (a workload's `services` keys, a waypoint by hostname): split at the first `/`, as ztunnel
/// does; returns the two parts.
pub fn namespaced_hostname(s: &str) -> Result<(&str, &str), String> {
    s.split_once('/')
        .ok_or_else(|| format!("invalid service name {s:?} (expected \"namespace/hostname\")"))
}

/// A port a connection can be made to: 1..=65535.
pub fn port(what: &str, p: u32) -> Result<u16, String> {
    match u16::try_from(p) {
        Ok(0) => Err(format!("{what} 0 is not a valid port")),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("{what} {p} is out of range (1-65535)")),
    }
}

/// A port where 0 means "unset" (target ports, HBONE ports): 0..=65535.
pub fn port_or_zero(what: &str, p: u32) -> Result<u16, String> {
    u16::try_from(p).map_err(|_| format!("{what} {p} is out of range (0-65535)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_keys_split_at_the_first_slash() {
        assert_eq!(
            namespaced_hostname("shop/cart.shop.svc").unwrap(),
            ("shop", "cart.shop.svc")
        );
        // istiod's names are not Kubernetes names; ztunnel takes them as they are, and so does weft.
        assert_eq!(
            namespaced_hostname("Shop/*.Example.COM").unwrap(),
            ("Shop", "*.Example.COM")
        );
        assert_eq!(namespaced_hostname("/h").unwrap(), ("", "h"));
        assert!(namespaced_hostname("cart").is_err());
    }

    #[test]
    fn ports() {
        assert_eq!(port("port", 80), Ok(80));
        assert!(port("port", 0).is_err() && port("port", 65536).is_err());
        assert_eq!(port_or_zero("target port", 0), Ok(0));
        assert!(port_or_zero("target port", 70000).is_err());
    }
}
