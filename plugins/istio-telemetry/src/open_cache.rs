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
    scratch: String,
}

impl OpenCache {
    const MAX: usize = 10_000;

    pub(crate) fn key(&mut self, info: &ConnectionInfo<'_>) -> OpenKey {
        if self.sets.len() >= Self::MAX
            || self.workloads.len() >= Self::MAX
            || self.strings.len() >= Self::MAX
        {
            self.sets.clear();
            self.workloads.clear();
            self.strings.clear();
            self.batch.clear();
        }
        let conn = info.conn;
        let src = self.workload(info.source_workload);
        let dst = self.workload(info.destination_workload);
        let peer = self.string(conn.peer_identity.as_deref());
        let service = self.string(conn.destination_service.as_deref());
        (
            conn.direction == Direction::Inbound,
            conn.hbone,
            src,
            dst,
            peer,
            service,
        )
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
