//! Hashes every gateway replica computes alike, with nothing shared between them: a member's
//! and a session's place in rendezvous hashing, and the mixing of a counter into picks.

/// A stable 64-bit hash (the same on every replica and build): SHA-256's first eight bytes.
pub fn stable_hash(parts: &[&str]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// SplitMix64's finaliser: mixes a session's and a member's hashes into the member's score.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
