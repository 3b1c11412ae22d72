//! The L4 authorization engine: Istio's `istio.security.Authorization` policies indexed by where they apply, and
//! the decision ztunnel makes for one inbound connection (`src/rbac.rs` and `assert_rbac` in `src/state.rs` of
//! istio/ztunnel).
//!
//! This module uses `std` only (no SDK types), so the host-side benchmark can compile the very same code natively
//! and compare it with the plugin running in the sandbox.
//!
//! Semantics, as ztunnel enforces them:
//! - Policies for a destination workload: the global ones, those of its namespace (scope NAMESPACE), and the ones
//!   the workload lists by `namespace/name` (any scope; unknown names are skipped). WORKLOAD_SELECTOR policies only
//!   apply through that list.
//! - Order: matching dry-run DENYs are reported; an enforced DENY that matches denies ("explicitly denied by:
//!   ns/name"); dry-run ALLOWs are reported; no enforced ALLOW → allow; an enforced ALLOW that matches → allow;
//!   otherwise deny ("allow policies exist, but none allowed").
//! - Matching: no rules → no match; rules OR; clauses in a rule AND (a rule without clauses matches, a clause
//!   without matches is true); matches in a clause OR, a match with every list empty is skipped; inside a match
//!   each field kind ANDs, the values of one kind OR; a kind passes when (positive empty or any matches) and
//!   (negative empty or none matches).
//! - Principals: the identity with `spiffe://` stripped (no identity, or no `spiffe://` prefix: no principal
//!   matches). Namespaces: the identity's namespace (empty without identity). Service accounts: namespace and
//!   name, trust domain ignored; no identity never matches. IPs: CIDR containment (IPv4-mapped IPv6 addresses
//!   count as IPv4). Ports: the destination (target) port.
//! - A policy key appearing twice: the last one wins (ztunnel's store is keyed by `namespace/name`).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The compiled form of a policy's rules (beside this file, so the host's native copy finds it too).
#[path = "rules.rs"]
mod rules;
use rules::Rules;

/// The index's maps: their keys (policy names, namespaces) come from the control plane, not from peers, so a
/// non-keyed hasher is safe, and SipHash would dominate a decision's cost. (`super::hash` is the SDK's `hash`
/// module in the plugin and the same file included natively by the host's tests.)
type FxMap<K, V> = super::hash::FastMap<K, V>;

/// Where a policy applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every workload (policies of the root namespace).
    Global,
    /// Every workload of the policy's namespace.
    Namespace,
    /// The workloads that list the policy.
    WorkloadSelector,
}

/// What a matching policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Allow (and deny what no ALLOW matches, once one applies).
    Allow,
    /// Deny.
    Deny,
}

impl Action {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

/// A string match on a principal or a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrMatch {
    /// Equal.
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Non-empty.
    Presence,
}

impl StrMatch {
    fn matches(&self, s: &str) -> bool {
        let s = s.as_bytes();
        match self {
            StrMatch::Exact(x) => same(s, x.as_bytes()),
            StrMatch::Prefix(x) => s.get(..x.len()).is_some_and(|h| same(h, x.as_bytes())),
            StrMatch::Suffix(x) => s
                .len()
                .checked_sub(x.len())
                .is_some_and(|at| same(&s[at..], x.as_bytes())),
            StrMatch::Presence => !s.is_empty(),
        }
    }
}

/// Byte equality, eight bytes at a time. (In the sandbox `==` on strings calls a `memcmp` that compares byte by
/// byte, a loop the engine's interruption check runs through on every byte; this is a few word compares.)
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (wa.remainder(), wb.remainder());
    wa.zip(wb).all(|(x, y)| word(x) == word(y)) && ra == rb
}

#[inline]
fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_ne_bytes(w)
}

/// A service-account match (trust domain ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaMatch {
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// An IP range, pre-masked for a cheap containment test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// IPv4 network and mask.
    V4(u32, u32),
    /// IPv6 network and mask.
    V6(u128, u128),
}

impl Net {
    /// A range from an address and a prefix length (clamped to the family's width).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Self {
        match addr {
            IpAddr::V4(a) => {
                let len = u32::from(prefix_len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                Net::V4(u32::from(a) & mask, mask)
            }
            IpAddr::V6(a) => {
                let len = u32::from(prefix_len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                Net::V6(u128::from(a) & mask, mask)
            }
        }
    }

    fn contains(&self, ip: &Ip) -> bool {
        match (*self, *ip) {
            (Net::V4(net, mask), Ip::V4(a)) => a & mask == net,
            (Net::V6(net, mask), Ip::V6(a)) => a & mask == net,
            _ => false,
        }
    }
}

/// One match: field kinds AND, values of one kind OR, empty lists pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    /// Source namespaces.
    pub namespaces: Vec<StrMatch>,
    /// Negated source namespaces.
    pub not_namespaces: Vec<StrMatch>,
    /// Source principals (without `spiffe://`).
    pub principals: Vec<StrMatch>,
    /// Negated source principals.
    pub not_principals: Vec<StrMatch>,
    /// Source service accounts.
    pub service_accounts: Vec<SaMatch>,
    /// Negated source service accounts.
    pub not_service_accounts: Vec<SaMatch>,
    /// Source IP ranges.
    pub source_ips: Vec<Net>,
    /// Negated source IP ranges.
    pub not_source_ips: Vec<Net>,
    /// Destination IP ranges.
    pub destination_ips: Vec<Net>,
    /// Negated destination IP ranges.
    pub not_destination_ips: Vec<Net>,
    /// Destination ports.
    pub destination_ports: Vec<u16>,
    /// Negated destination ports.
    pub not_destination_ports: Vec<u16>,
}

/// An authorization policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Scope.
    pub scope: Scope,
    /// Action.
    pub action: Action,
    /// Only report what it would do.
    pub dry_run: bool,
    /// Rules (OR) → clauses (AND) → matches (OR).
    pub rules: Vec<Vec<Vec<Match>>>,
}

impl Policy {
    /// Whether the policy matches the connection. (Compiles the rules first; the index keeps them compiled.)
    pub fn matches(&self, c: &Conn<'_>) -> bool {
        Rules::compile(self.rules.clone()).matches(c)
    }
}

/// A policy as indexed: its `namespace/name` key, what it does, and its rules compiled.
#[derive(Debug)]
struct Indexed {
    key: String,
    action: Action,
    dry_run: bool,
    rules: Rules,
}

/// The policies of one bucket (a namespace, or the global ones), split by what they do.
#[derive(Debug, Default)]
struct Group {
    deny: Vec<u32>,
    allow: Vec<u32>,
    dry_deny: Vec<u32>,
    dry_allow: Vec<u32>,
}

impl Group {
    fn is_empty(&self) -> bool {
        self.deny.is_empty()
            && self.allow.is_empty()
            && self.dry_deny.is_empty()
            && self.dry_allow.is_empty()
    }

    fn push(&mut self, i: u32, p: &Indexed) {
        match (p.action, p.dry_run) {
            (Action::Deny, false) => self.deny.push(i),
            (Action::Allow, false) => self.allow.push(i),
            (Action::Deny, true) => self.dry_deny.push(i),
            (Action::Allow, true) => self.dry_allow.push(i),
        }
    }
}

/// The peer identity as matching needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer<'a> {
    /// The identity without `spiffe://` (none: no identity, or not a `spiffe://` URI).
    pub principal: Option<&'a str>,
    /// The identity's namespace (empty without an Istio identity).
    pub namespace: &'a str,
    /// The identity's namespace and service account.
    pub sa: Option<(&'a str, &'a str)>,
}

impl<'a> Peer<'a> {
    /// Parses a peer identity (`spiffe://<td>/ns/<ns>/sa/<sa>`); `None` is a connection without identity.
    pub fn parse(identity: Option<&'a str>) -> Self {
        let Some(principal) = identity.and_then(|s| s.strip_prefix("spiffe://")) else {
            return Peer::default();
        };
        // One pass over the bytes for the slashes (the `split` iterator costs more than the parse in the sandbox):
        // `<td>/ns/<ns>/sa/<sa>` has exactly four.
        let mut slash = [0usize; 4];
        let mut n = 0;
        for (i, &b) in principal.as_bytes().iter().enumerate() {
            if b == b'/' {
                if n == slash.len() {
                    n += 1;
                    break;
                }
                slash[n] = i;
                n += 1;
            }
        }
        let sa = if n == 4 {
            let ([a, b, c, d], p) = (slash, principal);
            let (td, ns, sa) = (&p[..a], &p[b + 1..c], &p[d + 1..]);
            let tags = (&p[a + 1..b], &p[c + 1..d]) == ("ns", "sa");
            (tags && !td.is_empty() && !ns.is_empty() && !sa.is_empty()).then_some((ns, sa))
        } else {
            None
        };
        Peer {
            principal: Some(principal),
            namespace: sa.map_or("", |(ns, _)| ns),
            sa,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Ip {
    V4(u32),
    V6(u128),
}

impl From<IpAddr> for Ip {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Ip::V4(u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Ip::V4(u32::from(v4)),
                None => Ip::V6(u128::from(a)),
            },
        }
    }
}

/// A connection as matching needs it.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    src: Ip,
    dst: Ip,
    dst_port: u16,
    peer: Peer<'a>,
}

impl<'a> Conn<'a> {
    /// A connection from `src` to `dst` (the workload's real target address), with the peer's verified identity
    /// (none for plaintext).
    pub fn new(src: SocketAddr, dst: SocketAddr, identity: Option<&'a str>) -> Self {
        Conn {
            src: src.ip().into(),
            dst: dst.ip().into(),
            dst_port: dst.port(),
            peer: Peer::parse(identity),
        }
    }
}

/// Why a connection was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// An enforced DENY policy matched (its `namespace/name`).
    Explicit(String),
    /// ALLOW policies apply and none matched.
    NotAllowed,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // ztunnel's wording (`AuthorizationRejectionError`).
        match self {
            Denial::Explicit(key) => write!(f, "explicitly denied by: {key}"),
            Denial::NotAllowed => f.write_str("allow policies exist, but none allowed"),
        }
    }
}

/// Receives what dry-run policies would have done.
pub trait DryRun {
    /// A dry-run policy (`key`) with `action` matched the connection.
    fn matched(&mut self, key: &str, action: Action);
    /// Dry-run ALLOW policies apply, no enforced ALLOW does, and none of them matched: the connection is allowed
    /// but would be denied if they were enforced.
    fn no_allow_matched(&mut self);
}

/// Ignores dry-run results.
#[derive(Debug, Default, Clone, Copy)]
pub struct IgnoreDryRun;

impl DryRun for IgnoreDryRun {
    fn matched(&mut self, _key: &str, _action: Action) {}
    fn no_allow_matched(&mut self) {}
}

/// Which connections an [`Index`]'s policies reach (see [`Index::reach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Every connection (there are global policies).
    Everything,
    /// Connections whose destination workload is in one of `namespaces` or lists one of `policies`.
    Destinations {
        namespaces: Vec<String>,
        policies: Vec<String>,
    },
}

/// The policy set, indexed by where policies apply.
#[derive(Debug, Default)]
pub struct Index {
    policies: Vec<Indexed>,
    by_key: FxMap<String, u32>,
    global: Group,
    /// Namespace → its group in `groups`.
    by_namespace: FxMap<String, u32>,
    groups: Vec<Group>,
}

/// A destination workload resolved against one [`Index`] ([`Index::target`]): its namespace's policies and the
/// policies it lists, as positions. Valid for that index only: a new index needs new targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    group: Option<u32>,
    selected: Vec<u32>,
}

impl Index {
    /// Indexes a policy set (a later policy with the same `namespace/name` replaces an earlier one).
    pub fn build(policies: Vec<Policy>) -> Self {
        let mut index = Index {
            policies: Vec::with_capacity(policies.len()),
            by_key: FxMap::with_capacity_and_hasher(policies.len(), Default::default()),
            ..Index::default()
        };
        // Where each indexed policy applies: needed only to group them, once the last of each key is known.
        let mut placed: Vec<(Scope, String)> = Vec::with_capacity(policies.len());
        for policy in policies {
            let item = Indexed {
                key: format!("{}/{}", policy.namespace, policy.name),
                action: policy.action,
                dry_run: policy.dry_run,
                rules: Rules::compile(policy.rules),
            };
            let place = (policy.scope, policy.namespace);
            match index.by_key.get(&item.key) {
                Some(&i) => {
                    index.policies[i as usize] = item;
                    placed[i as usize] = place;
                }
                None => {
                    let i = index.policies.len() as u32;
                    index.by_key.insert(item.key.clone(), i);
                    index.policies.push(item);
                    placed.push(place);
                }
            }
        }
        for (i, (scope, namespace)) in placed.into_iter().enumerate() {
            let p = &index.policies[i];
            match scope {
                Scope::Global => index.global.push(i as u32, p),
                Scope::Namespace => {
                    let next = index.groups.len() as u32;
                    let g = *index.by_namespace.entry(namespace).or_insert(next);
                    if g == next {
                        index.groups.push(Group::default());
                    }
                    index.groups[g as usize].push(i as u32, p);
                }
                Scope::WorkloadSelector => {}
            }
        }
        index
    }

    /// How many policies are indexed.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether no policy is indexed (then every connection is allowed).
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// Whether the policy `key` (`namespace/name`) is known.
    pub fn contains(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// The connections whose decision any indexed policy takes part in; every other connection is allowed, with
    /// nothing matched, counted or logged (`decide` finds no applicable policy). Global policies reach every
    /// connection; otherwise a connection is reached through its destination's namespace or a policy its
    /// destination lists (any indexed key: `decide` applies a listed policy whatever its scope).
    pub fn reach(&self) -> Reach {
        if !self.global.is_empty() {
            return Reach::Everything;
        }
        let mut namespaces: Vec<String> = self.by_namespace.keys().cloned().collect();
        namespaces.sort_unstable();
        let mut policies: Vec<String> = self.by_key.keys().cloned().collect();
        policies.sort_unstable();
        Reach::Destinations {
            namespaces,
            policies,
        }
    }

    fn policy(&self, i: u32) -> &Indexed {
        &self.policies[i as usize]
    }

    /// The enforced and dry-run policies, of one action, that apply to a workload: its namespace's, the global
    /// ones, then those it lists.
    fn applicable<'s>(
        &'s self,
        ns: Option<&'s Group>,
        selected: &'s [u32],
        action: Action,
        dry_run: bool,
    ) -> impl Iterator<Item = &'s Indexed> + 's {
        let pick = move |g: &'s Group| -> &'s [u32] {
            match (action, dry_run) {
                (Action::Deny, false) => &g.deny,
                (Action::Allow, false) => &g.allow,
                (Action::Deny, true) => &g.dry_deny,
                (Action::Allow, true) => &g.dry_allow,
            }
        };
        ns.into_iter()
            .flat_map(move |g| pick(g).iter())
            .chain(pick(&self.global).iter())
            .map(move |&i| self.policy(i))
            .chain(
                selected
                    .iter()
                    .map(move |&i| self.policy(i))
                    .filter(move |p| p.action == action && p.dry_run == dry_run),
            )
    }

    /// A destination workload of namespace `namespace` (none: unknown, only global policies apply) that lists the
    /// policies `selected` (`namespace/name`; unknown names are skipped, as ztunnel does), resolved once so that
    /// deciding for it again looks nothing up.
    pub fn target(&self, namespace: Option<&str>, selected: &[String]) -> Target {
        Target {
            group: namespace.and_then(|n| self.by_namespace.get(n).copied()),
            selected: selected
                .iter()
                .filter_map(|k| self.by_key.get(k.as_str()).copied())
                .collect(),
        }
    }

    /// Decides on one inbound connection to a workload of namespace `namespace` (none: the destination workload
    /// is unknown, only global policies apply) that lists the policies `selected` (`namespace/name`).
    pub fn decide(
        &self,
        conn: &Conn<'_>,
        namespace: Option<&str>,
        selected: &[String],
        dry: &mut impl DryRun,
    ) -> Result<(), Denial> {
        let group = namespace
            .and_then(|n| self.by_namespace.get(n))
            .map(|&g| &self.groups[g as usize]);
        // The listed policies, resolved (on the stack unless there are many).
        let mut buf = [0u32; 16];
        let spilled: Vec<u32>;
        let selected: &[u32] = if selected.len() <= buf.len() {
            let mut n = 0;
            for &i in selected.iter().filter_map(|k| self.by_key.get(k.as_str())) {
                buf[n] = i;
                n += 1;
            }
            &buf[..n]
        } else {
            spilled = selected
                .iter()
                .filter_map(|k| self.by_key.get(k.as_str()).copied())
                .collect();
            &spilled
        };
        self.decide_in(conn, group, selected, dry)
    }

    /// [`decide`](Self::decide) for a destination already resolved against this index: nothing is looked up.
    pub fn decide_for(
        &self,
        conn: &Conn<'_>,
        target: &Target,
        dry: &mut impl DryRun,
    ) -> Result<(), Denial> {
        let group = target.group.map(|g| &self.groups[g as usize]);
        self.decide_in(conn, group, &target.selected, dry)
    }

    /// Both deciders' common part: the order of ztunnel's evaluation (see the module documentation).
    fn decide_in(
        &self,
        conn: &Conn<'_>,
        ns: Option<&Group>,
        selected: &[u32],
        dry: &mut impl DryRun,
    ) -> Result<(), Denial> {
        if self.policies.is_empty() {
            return Ok(());
        }
        for p in self.applicable(ns, selected, Action::Deny, true) {
            if p.rules.matches(conn) {
                dry.matched(&p.key, Action::Deny);
            }
        }
        if let Some(p) = self
            .applicable(ns, selected, Action::Deny, false)
            .find(|p| p.rules.matches(conn))
        {
            return Err(Denial::Explicit(p.key.clone()));
        }
        let mut dry_allow = false;
        let mut dry_allow_matched = false;
        for p in self.applicable(ns, selected, Action::Allow, true) {
            dry_allow = true;
            if p.rules.matches(conn) {
                dry_allow_matched = true;
                dry.matched(&p.key, Action::Allow);
            }
        }
        let mut allow = self
            .applicable(ns, selected, Action::Allow, false)
            .peekable();
        if allow.peek().is_none() {
            if dry_allow && !dry_allow_matched {
                dry.no_allow_matched();
            }
            return Ok(());
        }
        if allow.any(|p| p.rules.matches(conn)) {
            return Ok(());
        }
        Err(Denial::NotAllowed)
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
