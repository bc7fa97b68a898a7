//! The revision of what a placement makes: a Proxy of another revision is out of date.

use crate::model::pool::*;
use sha2::{Digest, Sha256};

/// The revision of what placement `i` makes: the template, the placement and its provider
/// entry's revision. A Proxy of another revision is out of date.
pub fn revision(spec: &PoolSpec, i: usize, provider_revision: &str) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(&spec.template).unwrap_or_default());
    h.update(serde_json::to_vec(&spec.placements.get(i)).unwrap_or_default());
    h.update(provider_revision.as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// Each placement's [`revision`], from its provider entry's revision (`missing` for an entry
/// the config does not have, so its Proxies are out of date until it appears).
pub fn revisions(spec: &PoolSpec, provider_revisions: &[String]) -> Vec<String> {
    (0..spec.placements.len())
        .map(|i| {
            let p = provider_revisions.get(i).map_or("missing", String::as_str);
            revision(spec, i, p)
        })
        .collect()
}
