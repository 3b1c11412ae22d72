//! The SDK's fast hasher: close keys (sequential ids, near-identical identities) spread, and lengths and splits
//! count.
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::collections::HashSet;
use std::hash::{BuildHasher, Hash};

use std::hash::BuildHasherDefault;
use weft_plugin_sdk::hash::{FastHasher, FastMap};

fn hash<T: Hash + ?Sized>(v: &T) -> u64 {
    BuildHasherDefault::<FastHasher>::default().hash_one(v)
}

/// Sequential ids (connection ids) and near-identical identities land on distinct hashes whose top seven bits
/// (the map's control byte) vary too.
#[test]
fn close_keys_spread() {
    let ids: HashSet<u64> = (0..100_000u64).map(|i| hash(&i)).collect();
    assert_eq!(ids.len(), 100_000);
    let tops: HashSet<u64> = (0..1_000u64).map(|i| hash(&i) >> 57).collect();
    assert!(tops.len() > 100, "top bits barely vary: {}", tops.len());
    let names: HashSet<u64> = (0..10_000)
        .map(|i| hash(&format!("spiffe://cluster.local/ns/default/sa/client-{i}")))
        .collect();
    assert_eq!(names.len(), 10_000);
}

/// Strings that differ only in trailing zero bytes, in length where a shorter one's last word is padded, or in
/// where a tuple's fields split, hash apart.
#[test]
fn lengths_and_splits_count() {
    assert_ne!(hash("ab"), hash("ab\0"));
    // A 7-byte tail against a full word whose last byte is the tail's length (a tag in the word would clash).
    assert_ne!(hash("ent-100"), hash("ent-1008"));
    assert_ne!(hash(&("ab", "c")), hash(&("a", "bc")));
    let mut m: FastMap<String, u32> = FastMap::default();
    m.insert("x".into(), 1);
    assert_eq!(m.get("x"), Some(&1));
}
