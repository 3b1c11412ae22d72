//! The label sets of connection opens already seen, by what determines their labels (see [`OpenCache`]).

use std::fmt::Write as _;

use weft_plugin_sdk::hash::FastMap;
use weft_plugin_sdk::{ConnectionInfo, Direction, WorkloadMeta};

/// What determines the labels of a connection's open, interned: (inbound, mutual TLS, source workload, destination
/// workload, peer identity, destination service). 0 stands for none.
pub(crate) type OpenKey = (bool, bool, u32, u32, u32, u32);

/// The label sets of connection opens already seen, by what determines their labels (a pure function of it: the
/// direction, mutual TLS, the peer identity, the destination service and the two workloads' label fields), so that
/// an open of a kind seen before costs a few small lookups instead of building and hashing 27 label values. A
/// workload is known by the values of the fields the labels use, not by its uid, so a workload whose metadata
/// changes gets new labels at once. Cleared whole when it holds [`OpenCache::MAX`] entries of a kind.
#[derive(Default)]
pub(crate) struct OpenCache {
    /// A workload's label fields (length-prefixed, concatenated) → id.
    workloads: FastMap<String, u32>,
    /// A peer identity or destination service → id.
    strings: FastMap<String, u32>,
    pub(crate) sets: FastMap<OpenKey, usize>,
    /// This batch's workloads, by their address in the batch (valid until its end) → id.
    pub(crate) batch: FastMap<usize, u32>,
    /// This batch's strings, by their position in the batch (see [`weft_plugin_sdk::BatchStrings`]) → id; 0: not seen yet.
    positions: Vec<u32>,
    scratch: String,
}

impl OpenCache {
    const MAX: usize = 10_000;
    /// Batch positions remembered (a batch lists far fewer distinct strings than this).
    const MAX_POSITIONS: usize = 4096;

    /// The batch is over: its workloads' addresses and its strings' positions mean nothing any more.
    pub(crate) fn end_batch(&mut self) {
        self.batch.clear();
        self.positions.clear();
    }

    pub(crate) fn key(&mut self, info: &ConnectionInfo<'_>) -> OpenKey {
        if self.sets.len() >= Self::MAX
            || self.workloads.len() >= Self::MAX
            || self.strings.len() >= Self::MAX
        {
            self.sets.clear();
            self.workloads.clear();
            self.strings.clear();
            self.batch.clear();
            self.positions.clear();
        }
        let conn = info.conn;
        let src = self.workload(info.source_workload);
        let dst = self.workload(info.destination_workload);
        let at = info.batch_strings;
        let peer = self.string_at(at.peer_identity, conn.peer_identity.as_deref());
        let service = self.string_at(at.destination_service, conn.destination_service.as_deref());
        (
            conn.direction == Direction::Inbound,
            conn.hbone,
            src,
            dst,
            peer,
            service,
        )
    }

    /// [`string`](Self::string), remembered by the string's position in the batch when it has one: equal positions
    /// in a batch are equal strings, so the string is hashed once per batch, not once per event.
    fn string_at(&mut self, at: Option<u32>, s: Option<&str>) -> u32 {
        let (Some(at), Some(_)) = (at.and_then(|a| usize::try_from(a).ok()), s) else {
            return self.string(s);
        };
        if let Some(&id) = self.positions.get(at)
            && id != 0
        {
            return id;
        }
        let id = self.string(s);
        if at < Self::MAX_POSITIONS {
            if self.positions.len() <= at {
                self.positions.resize(at + 1, 0);
            }
            self.positions[at] = id;
        }
        id
    }

    fn string(&mut self, s: Option<&str>) -> u32 {
        let Some(s) = s else { return 0 };
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = u32::try_from(self.strings.len() + 1).unwrap_or(u32::MAX);
        self.strings.insert(s.to_owned(), id);
        id
    }

    fn workload(&mut self, w: Option<&WorkloadMeta>) -> u32 {
        let Some(w) = w else { return 0 };
        let at = w as *const WorkloadMeta as usize;
        if let Some(&id) = self.batch.get(&at) {
            return id;
        }
        self.scratch.clear();
        for field in [
            &w.workload_name,
            &w.canonical_name,
            &w.canonical_revision,
            &w.namespace,
            &w.service_account,
            &w.trust_domain,
            &w.cluster_id,
            &w.region,
            &w.zone,
        ] {
            let _ = write!(self.scratch, "{}:", field.len());
            self.scratch.push_str(field);
        }
        let id = match self.workloads.get(self.scratch.as_str()) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.workloads.len() + 1).unwrap_or(u32::MAX);
                self.workloads.insert(self.scratch.clone(), id);
                id
            }
        };
        self.batch.insert(at, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use weft_plugin_sdk::{BatchStrings, Connection, IpAddress, SocketAddress};

    use super::*;

    fn conn(peer: Option<&str>) -> Connection {
        let at = SocketAddress {
            address: IpAddress::Ipv4(0x0a00_0002),
            port: 8080,
        };
        Connection {
            id: 1,
            direction: Direction::Inbound,
            source: at,
            destination: at,
            peer_identity: peer.map(str::to_owned),
            destination_service: None,
            hbone: true,
        }
    }

    fn key(cache: &mut OpenCache, peer: Option<&str>, at: Option<u32>) -> OpenKey {
        let c = conn(peer);
        cache.key(&ConnectionInfo {
            conn: &c,
            source_workload: None,
            destination_workload: None,
            batch_strings: BatchStrings {
                peer_identity: at,
                destination_service: None,
            },
        })
    }

    /// A string's position stands for it within a batch only: the same position in the next batch may name another
    /// string, and must get that string's key; keys by position agree with keys by content.
    #[test]
    fn positions_are_remembered_per_batch_and_agree_with_the_strings() {
        let (alice, bob) = (
            "spiffe://cluster.local/ns/shop/sa/alice",
            "spiffe://cluster.local/ns/shop/sa/bob",
        );
        let mut cache = OpenCache::default();
        let a = key(&mut cache, Some(alice), Some(0));
        let b = key(&mut cache, Some(bob), Some(1));
        assert_ne!(a, b);
        assert_eq!(key(&mut cache, Some(alice), Some(0)), a);
        assert_eq!(
            key(&mut cache, Some(alice), None),
            a,
            "by content, no position"
        );
        cache.end_batch();
        // Next batch: position 0 is bob now.
        assert_eq!(key(&mut cache, Some(bob), Some(0)), b);
        assert_eq!(key(&mut cache, Some(alice), Some(1)), a);
        // No identity: the same key with or without a position.
        assert_eq!(key(&mut cache, None, Some(5)), key(&mut cache, None, None));
    }
}
