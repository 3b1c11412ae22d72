//! A fast, non-keyed hasher for a plugin's own maps, for keys that come from the host and the control plane
//! (connection ids, verified peer identities, workload fields, policy names), never from a party that could choose
//! keys to collide: they need no keyed (SipHash) hashing, and a multiply-rotate over 8-byte words is many times
//! cheaper in Wasm, where a map lookup per connection or per decision adds up. Keep `std`'s `HashMap` for keys a
//! peer chooses. `std` only, so native code can include this file as it is (`istio-authz`'s engine is checked and
//! benchmarked natively).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Folds each word in with a rotate, an xor and a multiply by an odd constant (the golden ratio's 64-bit
/// fraction), which spreads low-bit differences into the high bits the map's control bytes use.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // The length first: then zero padding of the last word is unambiguous (`ab` against `ab\0`).
        self.add(bytes.len() as u64);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.add(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // One more round, so the last word's bits reach the top too.
        (self.0 ^ (self.0 >> 29)).wrapping_mul(SEED)
    }
}
