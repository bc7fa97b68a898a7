//! Where each probe's nonce comes from.
//!
//! The nonce proves the answer was made for this probe: a cache or a canned "proxy" answer
//! does not hold it. It does not have to be unguessable (a proxy that forges answers can copy
//! the query parameter whatever it is), only different each probe, so a seeded generator
//! serves production and keeps simulated runs reproducible.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Gives the nonce of each probe: URL-safe text (letters, digits, `-`, `_`).
pub trait NonceSource: Send + Sync {
    fn next_nonce(&self) -> String;
}

/// Any closure makes one: `|| format!("n{}", counter.fetch_add(1, ..))`.
impl<F> NonceSource for F
where
    F: Fn() -> String + Send + Sync,
{
    fn next_nonce(&self) -> String {
        self()
    }
}

/// SplitMix64 over a counter: the n-th nonce depends only on the seed and n, and taking one is
/// a single atomic add, so concurrent probes never wait on each other for it.
#[derive(Debug)]
pub struct SeededNonces {
    seed: u64,
    counter: AtomicU64,
}

impl SeededNonces {
    pub fn new(seed: u64) -> SeededNonces {
        SeededNonces {
            seed,
            counter: AtomicU64::new(0),
        }
    }

    /// A seed from the process's hash randomness (std seeds it from the OS), for a real run.
    pub fn from_entropy() -> SeededNonces {
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        SeededNonces::new(h.finish())
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl NonceSource for SeededNonces {
    fn next_nonce(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let x = self
            .seed
            .wrapping_add(n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        // Two rounds for 128 bits: wide enough that two probes never share one by chance.
        format!(
            "{:016x}{:016x}",
            splitmix64(x),
            splitmix64(x ^ 0x5851_f42d_4c95_7f2d)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_distinct_nonces() {
        let a = SeededNonces::new(7);
        let b = SeededNonces::new(7);
        let first: Vec<String> = (0..100).map(|_| a.next_nonce()).collect();
        let again: Vec<String> = (0..100).map(|_| b.next_nonce()).collect();
        assert_eq!(first, again);
        let unique: std::collections::HashSet<&String> = first.iter().collect();
        assert_eq!(unique.len(), 100);
        assert!(
            first
                .iter()
                .all(|n| n.len() == 32 && n.bytes().all(|c| c.is_ascii_hexdigit()))
        );
        assert_ne!(SeededNonces::new(8).next_nonce(), first[0]);
    }

    #[test]
    fn a_closure_is_a_source() {
        let n = AtomicU64::new(0);
        let source = move || format!("n{}", n.fetch_add(1, Ordering::Relaxed));
        assert_eq!(source.next_nonce(), "n0");
        assert_eq!(source.next_nonce(), "n1");
    }
}
