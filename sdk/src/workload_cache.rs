//! What a plugin derives from a workload, kept under the workload's key so a decision does not ask the host for the
//! same strings on every call.
//!
//! Each accessor of a [`Workload`] is a call into the host that copies its answer into the plugin's memory (a
//! namespace, a list of policy names): on a hot path that is most of a small plugin's cost. The host gives every
//! workload handle a key ([`Workload::key`], one number, nothing copied) that stands for exactly that metadata for
//! as long as the instance lives and is never reused for other metadata; changed metadata comes with a new key.
//! A value computed from a workload and kept under its key is so never served for another workload, nor for an
//! older version of the same one.

use crate::Workload;

/// Entries a cache keeps by default: more than the workloads a node usually serves.
pub const DEFAULT_CAPACITY: usize = 64;

/// Values derived from workloads, under their keys; at most `capacity` of them (a new key replaces the oldest
/// entry). Lookups scan the keys, which is faster than hashing for the few dozen entries a node's workloads need.
#[derive(Debug, Clone)]
pub struct WorkloadCache<T> {
    keys: Vec<u64>,
    values: Vec<T>,
    /// The entry the next new key replaces, once full.
    next: usize,
    capacity: usize,
}

impl<T> Default for WorkloadCache<T> {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl<T> WorkloadCache<T> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    /// The value kept for `workload`, made by `derive` (which may call the workload's accessors) when there is none.
    pub fn get_or_derive(
        &mut self,
        workload: &Workload,
        derive: impl FnOnce(&Workload) -> T,
    ) -> &T {
        self.get_or_insert_with(workload.key(), || derive(workload))
    }

    /// The value kept under `key` (a [`Workload::key`]), made by `make` when there is none.
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> T) -> &T {
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            return &self.values[i];
        }
        let value = make();
        let i = if self.keys.len() < self.capacity {
            self.keys.push(key);
            self.values.push(value);
            self.keys.len() - 1
        } else {
            let i = self.next;
            self.next = (i + 1) % self.capacity;
            self.keys[i] = key;
            self.values[i] = value;
            i
        };
        &self.values[i]
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets every entry (for values that also depend on something that changed, such as the plugin's state).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.values.clear();
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_derived_once_and_served_after() {
        let mut cache = WorkloadCache::new(4);
        let mut made = 0;
        for _ in 0..3 {
            let v = *cache.get_or_insert_with(7, || {
                made += 1;
                70
            });
            assert_eq!(v, 70);
        }
        assert_eq!(made, 1);
        assert_eq!(*cache.get_or_insert_with(8, || 80), 80);
        assert_eq!(*cache.get_or_insert_with(7, || 0), 70, "7 is still kept");
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_full_cache_replaces_its_oldest_entry_and_never_serves_a_replaced_value() {
        let mut cache = WorkloadCache::new(3);
        for k in 1..=3 {
            cache.get_or_insert_with(k, || k * 10);
        }
        // 4 replaces 1, the oldest; 1 asked again is made anew (and replaces 2).
        assert_eq!(*cache.get_or_insert_with(4, || 40), 40);
        assert_eq!(*cache.get_or_insert_with(1, || 11), 11);
        assert_eq!(*cache.get_or_insert_with(3, || 0), 30);
        assert_eq!(*cache.get_or_insert_with(2, || 22), 22);
        assert_eq!(cache.len(), 3);
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(*cache.get_or_insert_with(4, || 44), 44);
    }

    #[test]
    fn a_capacity_of_zero_keeps_one_entry() {
        let mut cache = WorkloadCache::new(0);
        assert_eq!(*cache.get_or_insert_with(1, || 1), 1);
        assert_eq!(*cache.get_or_insert_with(2, || 2), 2);
        assert_eq!(cache.len(), 1);
    }
}
