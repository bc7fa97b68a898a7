//! What the pool's spec resolves to in numbers: its surge and unavailability budgets, how long
//! a quota failure waits before the placement spills, how long a failed member is kept before
//! it is replaced, and how old a member grows before it is rotated.

use crate::model::pool::*;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The pool's `spillAfter`, parsed (its default when absent or unreadable).
pub fn spill_after(s: &PoolSpec) -> Duration {
    s.spill_after
        .as_deref()
        .and_then(|a| crate::config::parse_duration(a).ok())
        .unwrap_or(DEFAULT_SPILL_AFTER)
}

/// (maxSurge, maxUnavailable) against `replicas`: surge rounded up, unavailability down, as
/// Kubernetes' ResolveFenceposts.
pub fn budgets(s: &PoolSpec) -> (usize, usize) {
    let n = s.replicas as usize;
    (
        s.strategy.max_surge.resolve(n, true),
        s.strategy.max_unavailable.resolve(n, false),
    )
}

/// How old a member may grow before it is rotated: maxAge moved by a fixed share of ± jitter
/// drawn from its name.
pub fn age_limit(rotation: &Rotation, name: &str) -> Option<i64> {
    let max_age = crate::config::parse_duration(&rotation.max_age)
        .ok()?
        .as_secs() as i64;
    let jitter = rotation
        .jitter
        .as_deref()
        .and_then(|j| crate::config::parse_duration(j).ok())
        .map_or(0, |d| d.as_secs() as i64);
    if jitter == 0 {
        return Some(max_age);
    }
    let h = Sha256::digest(name.as_bytes());
    let unit = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    // A point in [-jitter, +jitter].
    let span = (2 * jitter + 1) as u64;
    let offset = (unit % span) as i64 - jitter;
    Some((max_age + offset).max(1))
}

/// How long the pool waits before replacing a member held in a permanent failure, after
/// `failures` such replacements in its placement in a row.
pub fn failed_replacement_backoff(failures: u32) -> Duration {
    FAILED_REPLACEMENT_BASE
        .saturating_mul(1u32 << failures.min(16))
        .min(FAILED_REPLACEMENT_MAX)
}
