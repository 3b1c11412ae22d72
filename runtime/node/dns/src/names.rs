//! The names a query may mean, from the asking pod's point of view (its search domains and Kubernetes' name
//! forms), as ztunnel derives them; pure functions over lowercased labels.

/// A query name as lowercased labels, without the root.
pub(crate) type Labels = Vec<String>;

/// One name to look up for a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alias {
    /// The labels to look up.
    pub labels: Labels,
    /// When the alias came from stripping one of the client's search domains off the query: how many leading
    /// labels of the query remain (the answer then carries a CNAME from the query to that shorter name).
    pub stripped: Option<usize>,
}

/// The query name's labels, lowercased; `None` when a label is not plain ASCII or holds a dot (no mesh hostname
/// can match it, so the query is forwarded).
pub(crate) fn labels_of(name: &hickory_proto::rr::Name) -> Option<Labels> {
    name.iter()
        .map(|l| {
            let s = std::str::from_utf8(l).ok()?;
            (s.is_ascii() && !s.contains('.')).then(|| s.to_ascii_lowercase())
        })
        .collect()
}

fn join(parts: &[&[String]]) -> Labels {
    parts.iter().flat_map(|p| p.iter().cloned()).collect()
}

fn split(domain: &str) -> Labels {
    domain
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// The names a client in `namespace` may mean by `query`, in the order ztunnel tries them: the query itself, its
/// Kubernetes expansions, then for each search domain (`<ns>.svc.<domain>`, `svc.<domain>`, `<domain>`) the query
/// with that domain stripped and that name's expansions. Duplicates are dropped.
pub(crate) fn aliases(query: &[String], namespace: &str, cluster_domain: &str) -> Vec<Alias> {
    let domain = split(cluster_domain);
    let svc_domain = join(&[&["svc".to_owned()], &domain]);
    let ns_domain = join(&[&[namespace.to_ascii_lowercase()], &svc_domain]);
    let mut out: Vec<Alias> = Vec::new();
    let mut add = |labels: Labels, stripped: Option<usize>| {
        if !out.iter().any(|a| a.labels == labels) {
            out.push(Alias { labels, stripped });
        }
    };
    add(query.to_vec(), None);
    for fqdn in kube_fqdns(query, &domain, &svc_domain, &ns_domain) {
        add(fqdn, None);
    }
    for search in [&ns_domain, &svc_domain, &domain] {
        if let Some(stripped) = strip_domain(query, search) {
            let kept = stripped.len();
            add(stripped.clone(), Some(kept));
            for fqdn in kube_fqdns(&stripped, &domain, &svc_domain, &ns_domain) {
                add(fqdn, Some(kept));
            }
        }
    }
    out
}

/// `name` without the trailing `domain` labels, if it ends with them and something is left.
fn strip_domain(name: &[String], domain: &[String]) -> Option<Labels> {
    if domain.is_empty() || name.len() <= domain.len() || !name.ends_with(domain) {
        return None;
    }
    Some(name[..name.len() - domain.len()].to_vec())
}

/// The Kubernetes FQDNs a name can be short for: `<svc>` (same namespace), `<svc>.<ns>`, `<svc>.<ns>.svc`, and the
/// pod forms `<host>.<subdomain>[.<ns>[.svc]]`. Anything longer is already a full name or not a Kubernetes one.
fn kube_fqdns(
    name: &[String],
    domain: &[String],
    svc_domain: &[String],
    ns_domain: &[String],
) -> Vec<Labels> {
    let ends_with_svc = name.len() > 1 && name.last().is_some_and(|l| l == "svc");
    match name.len() {
        1 => vec![join(&[name, ns_domain])],
        2 => vec![join(&[name, svc_domain]), join(&[name, ns_domain])],
        3 => {
            let mut v = Vec::new();
            if ends_with_svc {
                v.push(join(&[name, domain]));
            }
            v.push(join(&[name, svc_domain]));
            v
        }
        4 if ends_with_svc => vec![join(&[name, domain])],
        _ => Vec::new(),
    }
}

/// The hostnames to try for one alias, most specific first: the name, then wildcards replacing ever more leading
/// labels (`a.b.c` → `a.b.c`, `*.b.c`, `*.c`), as ServiceEntry wildcard hosts are written.
pub(crate) fn wildcards(labels: &[String]) -> Vec<String> {
    let mut out = vec![labels.join(".")];
    for i in 1..labels.len() {
        out.push(format!("*.{}", labels[i..].join(".")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> Labels {
        split(s)
    }

    fn names(a: &[Alias]) -> Vec<(String, Option<usize>)> {
        a.iter().map(|a| (a.labels.join("."), a.stripped)).collect()
    }

    #[test]
    fn short_names_expand_like_kubernetes() {
        let a = aliases(&l("echo"), "ns1", "cluster.local");
        assert_eq!(
            names(&a),
            vec![
                ("echo".into(), None),
                ("echo.ns1.svc.cluster.local".into(), None)
            ]
        );
        let a = aliases(&l("echo.ns2"), "ns1", "cluster.local");
        assert_eq!(
            names(&a),
            vec![
                ("echo.ns2".into(), None),
                ("echo.ns2.svc.cluster.local".into(), None),
                ("echo.ns2.ns1.svc.cluster.local".into(), None),
            ]
        );
        let a = aliases(&l("echo.ns2.svc"), "ns1", "cluster.local");
        assert_eq!(
            names(&a),
            vec![
                ("echo.ns2.svc".into(), None),
                ("echo.ns2.svc.cluster.local".into(), None),
                ("echo.ns2.svc.svc.cluster.local".into(), None),
            ]
        );
        let a = aliases(&l("pod.sub.ns.svc"), "ns1", "cluster.local");
        assert_eq!(a[1].labels.join("."), "pod.sub.ns.svc.cluster.local");
    }

    #[test]
    fn search_domains_are_stripped_with_a_cname_mark() {
        // `echo.ns2` completed with the client's first search domain.
        let a = aliases(&l("echo.ns2.ns1.svc.cluster.local"), "ns1", "cluster.local");
        let n = names(&a);
        assert!(n.contains(&("echo.ns2".into(), Some(2))), "{n:?}");
        assert!(
            n.contains(&("echo.ns2.svc.cluster.local".into(), Some(2))),
            "{n:?}"
        );
        // An outside name completed with a search domain.
        let a = aliases(
            &l("www.example.com.ns1.svc.cluster.local"),
            "ns1",
            "cluster.local",
        );
        assert!(names(&a).contains(&("www.example.com".into(), Some(3))));
        // Nothing is left when the whole name is a search domain.
        assert_eq!(
            strip_domain(&l("svc.cluster.local"), &l("svc.cluster.local")),
            None
        );
        // Another namespace's search domain is not the client's.
        let a = aliases(&l("echo.ns2.svc.cluster.local"), "ns1", "cluster.local");
        assert!(!names(&a).iter().any(|(n, _)| n == "echo"));
    }

    #[test]
    fn wildcards_from_most_specific() {
        assert_eq!(
            wildcards(&l("svc1.ns1.svc.cluster.local")),
            vec![
                "svc1.ns1.svc.cluster.local",
                "*.ns1.svc.cluster.local",
                "*.svc.cluster.local",
                "*.cluster.local",
                "*.local"
            ]
        );
        assert_eq!(wildcards(&l("local")), vec!["local"]);
    }

    #[test]
    fn labels_are_lowercased_and_odd_ones_refused() {
        let n = hickory_proto::rr::Name::from_ascii("Echo.NS1.svc.cluster.local.").unwrap();
        assert_eq!(
            labels_of(&n).unwrap().join("."),
            "echo.ns1.svc.cluster.local"
        );
        let n = hickory_proto::rr::Name::from_ascii("a\\.b.svc.").unwrap();
        assert_eq!(labels_of(&n), None);
    }
}
