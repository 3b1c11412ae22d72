//! `istio.security.Authorization` → [`Policy`].

use ipnet::IpNet;
use weft_proto::istio::security::{
    Action, Address as PbCidr, Authorization as Pb, Match as PbMatch, Scope,
    ServiceAccountMatch as PbSa, StringMatch as PbString, string_match::MatchType,
};

use super::workload::unknown;
use super::{InvalidResource, check, ip};
use crate::model::{
    Policy, PolicyAction, PolicyMatch, PolicyScope, ServiceAccountMatch, StringMatch,
};
use crate::validate;

/// Convert and check an authorization policy (field paths relative to the Authorization message).
pub fn authorization(a: Pb) -> Result<Policy, InvalidResource> {
    let scope = match Scope::try_from(a.scope) {
        Ok(Scope::Global) => PolicyScope::Global,
        Ok(Scope::Namespace) => PolicyScope::Namespace,
        Ok(Scope::WorkloadSelector) => PolicyScope::WorkloadSelector,
        Err(_) => return Err(unknown("scope", a.scope)),
    };
    let action = match Action::try_from(a.action) {
        Ok(Action::Allow) => PolicyAction::Allow,
        Ok(Action::Deny) => PolicyAction::Deny,
        Err(_) => return Err(unknown("action", a.action)),
    };
    let mut rules = Vec::with_capacity(a.groups.len());
    for (g, group) in a.groups.iter().enumerate() {
        let mut clauses = Vec::with_capacity(group.rules.len());
        for (r, rule) in group.rules.iter().enumerate() {
            let mut matches = Vec::with_capacity(rule.matches.len());
            for (m, mt) in rule.matches.iter().enumerate() {
                matches.push(
                    policy_match(mt)
                        .map_err(|e| e.within(&format!("groups[{g}].rules[{r}].matches[{m}]")))?,
                );
            }
            clauses.push(matches);
        }
        rules.push(clauses);
    }
    Ok(Policy {
        name: a.name,
        namespace: a.namespace,
        scope,
        action,
        dry_run: a.dry_run,
        rules,
    })
}

fn policy_match(m: &PbMatch) -> Result<PolicyMatch, InvalidResource> {
    Ok(PolicyMatch {
        namespaces: strings("namespaces", &m.namespaces)?,
        not_namespaces: strings("not_namespaces", &m.not_namespaces)?,
        principals: strings("principals", &m.principals)?,
        not_principals: strings("not_principals", &m.not_principals)?,
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
        source_ips: cidrs("source_ips", &m.source_ips)?,
        not_source_ips: cidrs("not_source_ips", &m.not_source_ips)?,
        destination_ips: cidrs("destination_ips", &m.destination_ips)?,
        not_destination_ips: cidrs("not_destination_ips", &m.not_destination_ips)?,
        destination_ports: ports("destination_ports", &m.destination_ports)?,
        not_destination_ports: ports("not_destination_ports", &m.not_destination_ports)?,
    })
}

fn strings(field: &str, v: &[PbString]) -> Result<Vec<StringMatch>, InvalidResource> {
    v.iter()
        .enumerate()
        .map(|(i, s)| match &s.match_type {
            Some(MatchType::Exact(x)) => Ok(StringMatch::Exact(x.clone())),
            Some(MatchType::Prefix(x)) => Ok(StringMatch::Prefix(x.clone())),
            Some(MatchType::Suffix(x)) => Ok(StringMatch::Suffix(x.clone())),
            Some(MatchType::Presence(_)) => Ok(StringMatch::Presence),
            None => Err(InvalidResource::new(
                format!("{field}[{i}]"),
                "a string match with none of exact, prefix, suffix or presence",
            )),
        })
        .collect()
}

fn accounts(v: &[PbSa]) -> Vec<ServiceAccountMatch> {
    v.iter()
        .map(|s| ServiceAccountMatch {
            namespace: s.namespace.clone(),
            service_account: s.service_account.clone(),
        })
        .collect()
}

fn cidrs(field: &str, v: &[PbCidr]) -> Result<Vec<IpNet>, InvalidResource> {
    v.iter()
        .enumerate()
        .map(|(i, a)| {
            let f = format!("{field}[{i}]");
            let addr = check(&format!("{f}.address"), ip(&a.address))?;
            u8::try_from(a.length)
                .ok()
                .and_then(|l| IpNet::new(addr, l).ok())
                .ok_or_else(|| {
                    InvalidResource::new(
                        format!("{f}.length"),
                        format!("prefix length {} is too long for {addr}", a.length),
                    )
                })
        })
        .collect()
}

fn ports(field: &str, v: &[u32]) -> Result<Vec<u16>, InvalidResource> {
    v.iter()
        .enumerate()
        .map(|(i, p)| check(&format!("{field}[{i}]"), validate::port_or_zero("port", *p)))
        .collect()
}
