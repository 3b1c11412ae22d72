//! Checks shared by every source (the local file and xDS alike), so a name refused in one is refused in the other,
//! with the same words. Names follow Kubernetes: a namespace is a DNS-1123 label, object names (workloads, services,
//! policies, service accounts, nodes) are DNS-1123 subdomains; service hostnames follow Istio (DNS-1123 labels of
//! either case, an optional wildcard first label, an optional trailing dot).

/// Longest DNS-1123 label.
const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain.
const SUBDOMAIN_MAX: usize = 253;
/// Longest service hostname (Istio's limit).
const HOSTNAME_MAX: usize = 255;

fn is_label(s: &str, allow_upper: bool) -> bool {
    let ok_char = |c: char| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || (allow_upper && c.is_ascii_uppercase())
    };
    !s.is_empty()
        && s.len() <= LABEL_MAX
        && s.chars().all(|c| ok_char(c) || c == '-')
        && s.chars().next().is_some_and(ok_char)
        && s.chars().last().is_some_and(ok_char)
}

/// A Kubernetes namespace: a DNS-1123 label (lowercase letters, digits, `-`; starts and ends alphanumeric; at most
/// 63 characters).
pub fn namespace(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("namespace must not be empty".to_owned());
    }
    if is_label(s, false) {
        Ok(())
    } else {
        Err(format!(
            "invalid namespace {s:?}: must be a DNS-1123 label (lowercase letters, digits and '-', starting and \
             ending with a letter or digit, at most {LABEL_MAX} characters)"
        ))
    }
}

/// A Kubernetes object name: a DNS-1123 subdomain (dot-separated labels, at most 253 characters). `what` names
/// the field in the message (e.g. `service account`).
pub fn name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if s.len() <= SUBDOMAIN_MAX && s.split('.').all(|l| is_label(l, false)) {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} {s:?}: must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', each \
             dot-separated part starting and ending with a letter or digit, at most {SUBDOMAIN_MAX} characters)"
        ))
    }
}

/// An optional object name: empty is fine, anything else must be a DNS-1123 subdomain.
pub fn optional_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() { Ok(()) } else { name(what, s) }
}

/// A service hostname, as Istio validates ServiceEntry hosts: at most 255 characters, dot-separated DNS-1123 labels
/// (either case), the first of which may be a wildcard (`*`, `*foo`, `*-foo`), an optional trailing dot, and a last
/// label that is not all digits.
pub fn hostname(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid hostname {s:?}: {why}"));
    if s.is_empty() {
        return Err("hostname must not be empty".to_owned());
    }
    if s.len() > HOSTNAME_MAX {
        return bad("longer than 255 characters");
    }
    let trimmed = s.strip_suffix('.').unwrap_or(s);
    let labels: Vec<&str> = trimmed.split('.').collect();
    for (i, label) in labels.iter().enumerate() {
        let ok = if i == 0 {
            *label == "*"
                || is_label(label, true)
                || label
                    .strip_prefix("*-")
                    .or_else(|| label.strip_prefix('*'))
                    .is_some_and(|rest| is_label(rest, true))
        } else {
            is_label(label, true)
        };
        if !ok {
            return bad(&format!(
                "label {label:?} is not a DNS-1123 label (letters, digits and '-', starting and ending with a \
                 letter or digit, at most {LABEL_MAX} characters)"
            ));
        }
    }
    if labels.len() > 1
        && labels
            .last()
            .is_some_and(|l| l.chars().all(|c| c.is_ascii_digit()))
    {
        return bad("the top-level label must not be all digits");
    }
    Ok(())
}

/// `namespace/hostname` (a workload's `services` keys, a waypoint by hostname): returns the two parts.
pub fn namespaced_hostname(s: &str) -> Result<(&str, &str), String> {
    let Some((ns, host)) = s.split_once('/') else {
        return Err(format!(
            "invalid service name {s:?} (expected \"namespace/hostname\")"
        ));
    };
    namespace(ns).map_err(|e| format!("service {s:?}: {e}"))?;
    hostname(host).map_err(|e| format!("service {s:?}: {e}"))?;
    Ok((ns, host))
}

/// `namespace/name` of an authorization policy (a workload's `authorizationPolicies`).
pub fn policy_key(s: &str) -> Result<(), String> {
    let Some((ns, n)) = s.split_once('/') else {
        return Err(format!(
            "invalid policy name {s:?} (expected \"namespace/name\")"
        ));
    };
    namespace(ns).map_err(|e| format!("policy {s:?}: {e}"))?;
    name("policy name", n).map_err(|e| format!("policy {s:?}: {e}"))
}

/// A SPIFFE trust domain: lowercase letters, digits, `.`, `-` and `_` (the SPIFFE spec), at most 255 characters.
pub fn trust_domain(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid trust domain {s:?}: only lowercase letters, digits, '.', '-' and '_' are allowed"
        ))
    }
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
    fn namespaces_are_labels() {
        for ok in ["default", "istio-system", "a", "a1", &"x".repeat(63)] {
            assert!(namespace(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Default",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "a/b",
            &"x".repeat(64),
        ] {
            assert!(namespace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_subdomains() {
        for ok in ["echo-1", "cart-7d9.v2", "sleep", "node-a"] {
            assert!(name("name", ok).is_ok(), "{ok}");
        }
        for bad in ["", "Echo", "a..b", ".a", "a.", "a b", "a_b", "é"] {
            assert!(name("name", bad).is_err(), "{bad}");
        }
        assert!(optional_name("node", "").is_ok());
    }

    #[test]
    fn hostnames_follow_istio() {
        for ok in [
            "echo.default.svc.cluster.local",
            "example.com",
            "Example.COM",
            "*.example.com",
            "*",
            "*-foo.example",
            "istio.io.",
            "localhost",
            "bare",
            "10.0.0.1.example",
        ] {
            assert!(hostname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a..b",
            "a.*.b",
            "-a.com",
            "a_b.com",
            "a/b",
            "10.0.0.1",
            "host name",
            &format!("{}.com", "x".repeat(64)),
        ] {
            assert!(hostname(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_and_ports() {
        assert_eq!(
            namespaced_hostname("shop/cart.shop.svc").unwrap(),
            ("shop", "cart.shop.svc")
        );
        assert!(namespaced_hostname("cart").is_err());
        assert!(namespaced_hostname("Shop/cart").is_err());
        assert!(policy_key("shop/allow-all").is_ok());
        assert!(policy_key("shop/Allow").is_err());
        assert!(trust_domain("cluster.local").is_ok());
        assert!(trust_domain("Cluster.local").is_err());
        assert_eq!(port("port", 80), Ok(80));
        assert!(port("port", 0).is_err() && port("port", 65536).is_err());
        assert_eq!(port_or_zero("target port", 0), Ok(0));
        assert!(port_or_zero("target port", 70000).is_err());
    }
}
