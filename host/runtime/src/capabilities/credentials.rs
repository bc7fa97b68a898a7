//! The `credentials` import: the htpasswd of the proxy a create call makes. Granted to every
//! module without a grant, since it answers only inside a create and only with that proxy's own
//! line, which the module must write into the proxy it makes.

use crate::bindings::egress::provider::credentials as wit;
use crate::call::CallState;

impl wit::Host for CallState {
    async fn proxy_htpasswd(&mut self) -> Option<String> {
        self.htpasswd.clone()
    }
}

/// A fresh credential for the Proxy `name` and its htpasswd line, from the operating
/// system's randomness. None when the system has no randomness to give (then nothing is
/// created: a proxy with a guessable password is worse than none created).
pub fn fresh(name: &str) -> Option<egress_core::credential::ProxyCredential> {
    let mut entropy = [0u8; egress_core::credential::PASSWORD_BYTES];
    getrandom::fill(&mut entropy).ok()?;
    Some(egress_core::credential::ProxyCredential::from_entropy(
        name, &entropy,
    ))
}

/// The htpasswd line of `credential` under a fresh salt.
pub fn htpasswd(credential: &egress_core::credential::ProxyCredential) -> Option<String> {
    let mut salt = [0u8; egress_core::credential::SALT_BYTES];
    getrandom::fill(&mut salt).ok()?;
    Some(credential.htpasswd(&salt))
}
