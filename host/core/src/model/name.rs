//! Names derived from identities, stable across retries so a repeated create adopts.

use sha2::{Digest, Sha256};

/// The instance name for a Proxy: `proxy-` and the first 12 hex characters of its UID without
/// dashes. Deterministic, a valid DNS label, a valid libvirt domain and GCE instance name.
pub fn instance_name(uid: &str) -> String {
    let compact: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .take(12)
        .collect();
    if compact.len() == 12 {
        format!("proxy-{compact}")
    } else {
        // A UID shorter than 12 alphanumerics is not a Kubernetes UID; hash it so the name
        // stays a fixed-width label whatever the input.
        let digest = hex::encode(Sha256::digest(uid.as_bytes()));
        format!("proxy-{}", &digest[..12])
    }
}

/// A UUID-shaped UID derived from namespace and name, for manifests without `metadata.uid`, so
/// dry-run plans are byte-for-byte stable.
pub fn derived_uid(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("egress-proxies/{namespace}/{name}").as_bytes());
    let h = hex::encode(&digest[..16]);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_name_uses_uid_prefix() {
        assert_eq!(
            instance_name("3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23"),
            "proxy-3f2b9c1e7a44"
        );
    }

    #[test]
    fn instance_name_hashes_short_uids() {
        let n = instance_name("abc");
        assert_eq!(n.len(), "proxy-".len() + 12);
        assert_ne!(n, instance_name("abd"));
    }

    #[test]
    fn derived_uid_is_stable_and_distinct() {
        let a = derived_uid("default", "p1");
        assert_eq!(a, derived_uid("default", "p1"));
        assert_ne!(a, derived_uid("default", "p2"));
        assert_ne!(a, derived_uid("other", "p1"));
        assert_eq!(a.len(), 36);
    }
}
