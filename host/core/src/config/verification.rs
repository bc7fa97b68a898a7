//! Which signatures a module loaded with `module` must carry before it is compiled.

use super::text::ConfigError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// At most this many keys in a policy: a policy is a few teams' keys, not a keyring.
pub const MAX_VERIFICATION_KEYS: usize = 16;

/// A verification policy for provider modules, in the shape Kubewarden gives its policies'
/// signatures: public keys, and whether one of them or every one must have signed. With it,
/// every module named by `module` needs a signature file beside it (`MODULE.sig`, written by
/// `egress-proxies provider sign`) that satisfies the policy, or it is refused before it is
/// compiled (at load and at every reload, the version serving keeps serving). Built-in
/// modules are part of the binary and need none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModuleVerification {
    /// The keys that may sign modules.
    pub keys: Vec<VerificationKey>,
    /// `anyOf` (default): a valid signature by at least one key; `allOf`: by every key.
    #[serde(default)]
    pub policy: SignaturePolicy,
}

/// One key that may sign modules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VerificationKey {
    /// A name for messages and conditions (a DNS label).
    pub name: String,
    /// An Ed25519 public key, PEM (SubjectPublicKeyInfo, as `openssl pkey -pubout` writes
    /// it); relative to the providers file.
    pub public_key_file: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SignaturePolicy {
    #[default]
    AnyOf,
    AllOf,
}

impl ModuleVerification {
    /// The structure, before any key file is read: one to 16 keys, named once each, each
    /// naming a file.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.keys.is_empty() {
            return Err(ConfigError::new(
                "moduleVerification.keys",
                "names no key: a policy that no signature can satisfy refuses every module (remove the block to verify none)",
            ));
        }
        if self.keys.len() > MAX_VERIFICATION_KEYS {
            return Err(ConfigError::new(
                "moduleVerification.keys",
                format!("at most {MAX_VERIFICATION_KEYS} keys"),
            ));
        }
        let mut names = BTreeSet::new();
        for (i, k) in self.keys.iter().enumerate() {
            let at = format!("moduleVerification.keys[{i}]");
            if !super::text::is_dns_label(&k.name) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("{:?} is not a DNS label (1-63 of [a-z0-9-])", k.name),
                ));
            }
            if !names.insert(k.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("duplicate key name {:?}", k.name),
                ));
            }
            if k.public_key_file.trim().is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.publicKeyFile"),
                    "must name a file",
                ));
            }
        }
        Ok(())
    }
}
