//! A policy's rules as the index evaluates them: the shape decided once, when the policy is indexed, so that a
//! decision only tests what a match constrains.
//!
//! A match lists twelve fields; most constrain one or two. Evaluating the written form checks all twelve for every
//! match of every policy on every decision (and skips a match whose twelve are empty only after looking at each);
//! here an all-empty match is gone, a clause that had only such matches is one that never passes, and a match is
//! the short list of its constrained kinds, cheapest first. The semantics are [`Policy::matches`]'s, which is this
//! evaluation of a policy compiled on the spot (the engine's tests go through it).

use super::{Conn, Match, Net, SaMatch, StrMatch, same};

/// Rules (OR) → clauses (AND) → matches (OR) → kinds (AND).
#[derive(Debug, Default)]
pub(super) struct Rules(Box<[Box<[Clause]>]>);

#[derive(Debug)]
enum Clause {
    /// A clause without matches: passes.
    Pass,
    /// The clause's matches that constrain something (none left: the clause never passes).
    Any(Box<[Box<[Kind]>]>),
}

/// One constrained field kind of a match: (positive empty or any matches) and (negative empty or none matches).
#[derive(Debug)]
enum Kind {
    Ports(Box<[u16]>, Box<[u16]>),
    DestinationIps(Box<[Net]>, Box<[Net]>),
    SourceIps(Box<[Net]>, Box<[Net]>),
    ServiceAccounts(Box<[SaMatch]>, Box<[SaMatch]>),
    Principals(Box<[StrMatch]>, Box<[StrMatch]>),
    Namespaces(Box<[StrMatch]>, Box<[StrMatch]>),
}

impl Rules {
    /// The evaluated form of a policy's rules.
    pub(super) fn compile(rules: Vec<Vec<Vec<Match>>>) -> Self {
        Rules(
            rules
                .into_iter()
                .map(|rule| rule.into_iter().map(clause).collect())
                .collect(),
        )
    }

    /// Whether the rules match the connection (no rules: never; a rule without clauses: always).
    #[inline]
    pub(super) fn matches(&self, c: &Conn<'_>) -> bool {
        self.0.iter().any(|rule| {
            rule.iter().all(|clause| match clause {
                Clause::Pass => true,
                Clause::Any(matches) => matches.iter().any(|m| m.iter().all(|k| k.passes(c))),
            })
        })
    }
}

fn clause(matches: Vec<Match>) -> Clause {
    if matches.is_empty() {
        return Clause::Pass;
    }
    Clause::Any(
        matches
            .into_iter()
            .map(kinds)
            .filter(|k| !k.is_empty())
            .collect(),
    )
}

/// A match's constrained kinds, cheapest first (the result does not depend on the order).
fn kinds(m: Match) -> Box<[Kind]> {
    fn pair<T>(pos: Vec<T>, neg: Vec<T>, make: fn(Box<[T]>, Box<[T]>) -> Kind) -> Option<Kind> {
        (!pos.is_empty() || !neg.is_empty()).then(|| make(pos.into(), neg.into()))
    }
    [
        pair(m.destination_ports, m.not_destination_ports, Kind::Ports),
        pair(
            m.destination_ips,
            m.not_destination_ips,
            Kind::DestinationIps,
        ),
        pair(m.source_ips, m.not_source_ips, Kind::SourceIps),
        pair(
            m.service_accounts,
            m.not_service_accounts,
            Kind::ServiceAccounts,
        ),
        pair(m.principals, m.not_principals, Kind::Principals),
        pair(m.namespaces, m.not_namespaces, Kind::Namespaces),
    ]
    .into_iter()
    .flatten()
    .collect()
}

impl Kind {
    #[inline]
    fn passes(&self, c: &Conn<'_>) -> bool {
        match self {
            Kind::Ports(pos, neg) => either(pos, neg, |p| *p == c.dst_port),
            Kind::DestinationIps(pos, neg) => either(pos, neg, |n| n.contains(&c.dst)),
            Kind::SourceIps(pos, neg) => either(pos, neg, |n| n.contains(&c.src)),
            Kind::ServiceAccounts(pos, neg) => either(pos, neg, |m| {
                c.peer.sa.is_some_and(|(ns, sa)| {
                    same(ns.as_bytes(), m.namespace.as_bytes())
                        && same(sa.as_bytes(), m.service_account.as_bytes())
                })
            }),
            Kind::Principals(pos, neg) => {
                either(pos, neg, |m| c.peer.principal.is_some_and(|p| m.matches(p)))
            }
            Kind::Namespaces(pos, neg) => either(pos, neg, |m| m.matches(c.peer.namespace)),
        }
    }
}

/// One kind: (positive empty or any matches) and (negative empty or none matches).
#[inline]
fn either<T>(positive: &[T], negative: &[T], mut f: impl FnMut(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&mut f)) && !negative.iter().any(f)
}
