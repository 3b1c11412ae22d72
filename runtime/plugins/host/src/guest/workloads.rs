//! The workload resources an instance lends its guest: kept in the store's table across calls, keyed so a key
//! never names two workloads.

use std::sync::Arc;

use wasmtime::component::Resource;

use crate::wit::bindings::WorkloadRes;

/// How many workload resources an instance keeps in its table between calls: the local workloads of a busy node
/// (as many as the SDK's `WorkloadCache` keeps by default). A workload evicted from here is lent again under a new
/// key, so a plugin's cache of it misses: too few entries would make every decision of a node with more
/// destinations than this ask the host again.
pub(crate) const WORKLOAD_CACHE: usize = 64;

/// The workload resources an instance keeps in its store's table across `authorize` calls, so a decision lends a
/// borrow of an entry already there instead of pushing one (an allocation) and deleting it on every call. Entries
/// are found by the address of the metadata's `Arc`; each entry holds a clone of that `Arc`, so the address cannot
/// be freed and reused while it is cached. At most [`WORKLOAD_CACHE`] entries: a new one evicts the least recently
/// used.
///
/// Each entry pushed gets the next key (`workload.key` to the guest), so a key names one `Arc`, whose metadata
/// never changes, and is never given again in this instance: a guest that keeps what it derived from a workload
/// under its key cannot be handed another workload's (or an older version's) metadata under it. A workload evicted
/// and lent again gets a new key (the guest misses its cache once).
#[derive(Default)]
pub(crate) struct WorkloadTable {
    /// `(Arc::as_ptr as usize, table rep)`, least recently used first.
    pub(crate) entries: std::collections::VecDeque<(usize, u32)>,
    /// Keys given so far.
    keys: u64,
}

impl WorkloadTable {
    /// The table rep of `w`'s resource, pushed (and the least recently used evicted) if it is not cached.
    pub fn rep(
        &mut self,
        table: &mut wasmtime::component::ResourceTable,
        w: &Arc<weft_hooks::WorkloadMeta>,
    ) -> Result<u32, wasmtime::component::ResourceTableError> {
        let key = Arc::as_ptr(w) as usize;
        if let Some(i) = self.entries.iter().position(|(k, _)| *k == key) {
            // Most recently used goes last: the other workload of the same call, if it misses, evicts the least
            // recently used entry, never this one (whose slot the new entry would take while this call lends it).
            let entry = self.entries[i];
            if i + 1 != self.entries.len() {
                self.entries.remove(i);
                self.entries.push_back(entry);
            }
            return Ok(entry.1);
        }
        if self.entries.len() >= WORKLOAD_CACHE
            && let Some((_, old)) = self.entries.pop_front()
        {
            table.delete(Resource::<WorkloadRes>::new_own(old))?;
        }
        self.keys += 1;
        let rep = table
            .push(WorkloadRes {
                meta: w.clone(),
                key: self.keys,
            })?
            .rep();
        self.entries.push_back((key, rep));
        Ok(rep)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    /// A key names one metadata `Arc` for as long as it is cached, and no key is ever given twice.
    #[test]
    fn every_workload_entry_gets_a_key_never_given_before_in_the_instance() {
        let mut table = wasmtime::component::ResourceTable::new();
        let mut cache = WorkloadTable::default();
        let mut key = |w: &Arc<weft_hooks::WorkloadMeta>| {
            let rep = cache.rep(&mut table, w).unwrap();
            table
                .get(&Resource::<WorkloadRes>::new_own(rep))
                .unwrap()
                .key
        };
        let a = crate::testing::workload("a", "ns", "sa");
        let ka = key(&a);
        assert_eq!(
            key(&a),
            ka,
            "the same metadata, still cached, keeps its key"
        );
        // A changed workload is another Arc: another key, even with equal contents.
        let a2 = Arc::new((*a).clone());
        let ka2 = key(&a2);
        assert_ne!(ka2, ka);
        let mut seen = std::collections::HashSet::from([ka, ka2]);
        for i in 0..WORKLOAD_CACHE {
            let w = crate::testing::workload(&format!("w{i}"), "ns", "sa");
            assert!(seen.insert(key(&w)), "workload {i} got a key given before");
        }
        // `a` was evicted: lent again, it gets a key never given before (its old one names nothing now).
        assert!(
            seen.insert(key(&a)),
            "an evicted workload came back with an old key"
        );
    }

    /// A cached workload keeps its rep; past the cap the oldest entry leaves the cache *and* the table, so the
    /// table never holds more than the cap however many workloads pass.
    #[test]
    fn the_workload_cache_reuses_entries_and_evicts_the_least_recently_used_from_the_table() {
        let mut table = wasmtime::component::ResourceTable::new();
        let mut cache = WorkloadTable::default();
        let ws: Vec<_> = (0..WORKLOAD_CACHE + 5)
            .map(|i| crate::testing::workload(&format!("w{i}"), "ns", "sa"))
            .collect();
        let first = cache.rep(&mut table, &ws[0]).unwrap();
        assert_eq!(cache.rep(&mut table, &ws[0]).unwrap(), first);
        let reps: Vec<u32> = ws
            .iter()
            .map(|w| cache.rep(&mut table, w).unwrap())
            .collect();
        assert_eq!(reps[0], first);
        assert_eq!(cache.entries.len(), WORKLOAD_CACHE);
        // The five oldest were evicted: deleted from the table (their slots may hold newer entries since), the
        // rest readable and naming their workload.
        for (i, rep) in reps.iter().enumerate() {
            let name = table
                .get(&Resource::<WorkloadRes>::new_own(*rep))
                .map(|w| w.meta.name.clone());
            if i < 5 {
                assert_ne!(
                    name.ok(),
                    Some(format!("w{i}")),
                    "entry {i} should have been deleted"
                );
            } else {
                assert_eq!(name.unwrap(), format!("w{i}"));
            }
        }
        // An evicted workload comes back as a new entry.
        let again = cache.rep(&mut table, &ws[0]).unwrap();
        assert_eq!(
            table
                .get(&Resource::<WorkloadRes>::new_own(again))
                .unwrap()
                .meta
                .name,
            "w0"
        );
        assert_eq!(cache.entries.len(), WORKLOAD_CACHE);
    }
}
