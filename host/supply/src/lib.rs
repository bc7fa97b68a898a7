#![doc = include_str!("../README.md")]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use egress_core::config::{ConfigError, ModuleVerification, SignaturePolicy};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

pub mod oci;

/// A module's signature file is the module's path with this appended (`acme.wasm.sig`).
pub const SIGNATURE_SUFFIX: &str = ".sig";
/// Largest signature file read: 32 signatures take under 8 KiB.
pub const MAX_SIGNATURE_FILE: u64 = 64 * 1024;
/// Most signatures in one file.
pub const MAX_SIGNATURES: usize = 32;
/// Largest key file read (an Ed25519 PEM is under 200 bytes).
const MAX_KEY_FILE: u64 = 16 * 1024;

/// What `provider sign` writes beside a module: the digest it signed and one signature per
/// key, each naming its key by fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// `sha256:` and the module's 64 hex digits.
    pub digest: String,
    pub signatures: Vec<Signed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signed {
    /// The signing key's fingerprint: `sha256:` and the hex of its 32 raw public bytes.
    pub key: String,
    /// The Ed25519 signature, base64, over [`signed_message`] of `digest`.
    pub signature: String,
}

/// A public key a policy names, read and ready to verify with.
#[derive(Debug, Clone)]
pub struct Key {
    pub name: String,
    pub fingerprint: String,
    key: VerifyingKey,
}

#[derive(Debug, thiserror::Error)]
pub enum SupplyError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error(
        "the private key is not an Ed25519 key in PEM (PKCS#8, as `openssl genpkey -algorithm ed25519` writes it): {0}"
    )]
    PrivateKey(String),
    #[error("{path}: {message}")]
    Existing { path: String, message: String },
}

/// Why a module's signatures do not satisfy the policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "is not signed: no {0} beside it, and the providers config's moduleVerification requires a signature"
    )]
    Unsigned(String),
    #[error("its signature file {path} cannot be read: {message}")]
    Unreadable { path: String, message: String },
    #[error("its signature file was made for {signed}, and the module is {found}")]
    OtherDigest { signed: String, found: String },
    #[error(
        "its signatures do not satisfy the policy ({policy}): verified by {}, not by {}",
        list(verified),
        list(missing)
    )]
    NotSatisfied {
        policy: &'static str,
        verified: Vec<String>,
        missing: Vec<String>,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "no key".into()
    } else {
        names.join(", ")
    }
}

/// `sha256:` and the hex digest of `bytes`: how pins, signature files and status name a
/// module.
pub fn module_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// What a signature signs: the module's digest under a domain tag, so a signature made for
/// anything else with the same key never verifies as a module's.
pub fn signed_message(digest: &str) -> Vec<u8> {
    format!("egress-proxies provider module v1\n{digest}\n").into_bytes()
}

/// The signature file of the module at `module`.
pub fn signature_path(module: &Path) -> PathBuf {
    let mut p = module.as_os_str().to_owned();
    p.push(SIGNATURE_SUFFIX);
    PathBuf::from(p)
}

fn fingerprint(key: &VerifyingKey) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// Reads at most `max` bytes of `path`; a longer file is an error, not a truncation.
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, std::io::Error> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!("longer than {max} bytes")));
    }
    Ok(out)
}

/// The policy's keys, read from their files (relative to `base_dir`, the providers file's
/// directory). Errors name the key's field.
pub fn read_keys(policy: &ModuleVerification, base_dir: &Path) -> Result<Vec<Key>, ConfigError> {
    let mut keys = Vec::with_capacity(policy.keys.len());
    for (i, k) in policy.keys.iter().enumerate() {
        let at = format!("moduleVerification.keys[{i}].publicKeyFile");
        let path = base_dir.join(&k.public_key_file);
        let text = read_bounded(&path, MAX_KEY_FILE)
            .map_err(|e| ConfigError::new(&at, format!("cannot read {}: {e}", path.display())))?;
        let text = String::from_utf8(text)
            .map_err(|_| ConfigError::new(&at, format!("{} is not PEM text", path.display())))?;
        let key = VerifyingKey::from_public_key_pem(&text).map_err(|e| {
            ConfigError::new(
                &at,
                format!(
                    "{} is not an Ed25519 public key in PEM (as `openssl pkey -pubout` writes it): {e}",
                    path.display()
                ),
            )
        })?;
        keys.push(Key {
            name: k.name.clone(),
            fingerprint: fingerprint(&key),
            key,
        });
    }
    Ok(keys)
}

/// Checks `module`'s signature file (`signatures`: its bytes, None when there is none, named
/// `sig_name` in messages) against `keys` under `policy`: the names of the keys whose
/// signature verified, or why the module is refused.
pub fn verify(
    policy: SignaturePolicy,
    keys: &[Key],
    module: &[u8],
    sig_name: &str,
    signatures: Option<&[u8]>,
) -> Result<Vec<String>, Refusal> {
    verify_digest(policy, keys, &module_digest(module), sig_name, signatures)
}

/// [`verify`] of a module whose digest (`sha256:…`, of the bytes in hand) is already known.
pub fn verify_digest(
    policy: SignaturePolicy,
    keys: &[Key],
    found: &str,
    sig_name: &str,
    signatures: Option<&[u8]>,
) -> Result<Vec<String>, Refusal> {
    let found = found.to_string();
    let Some(bytes) = signatures else {
        return Err(Refusal::Unsigned(sig_name.to_string()));
    };
    let unreadable = |message: String| Refusal::Unreadable {
        path: sig_name.to_string(),
        message,
    };
    let file: SignatureFile =
        serde_json::from_slice(bytes).map_err(|e| unreadable(e.to_string()))?;
    if file.signatures.len() > MAX_SIGNATURES {
        return Err(unreadable(format!("more than {MAX_SIGNATURES} signatures")));
    }
    if file.digest != found {
        return Err(Refusal::OtherDigest {
            signed: file.digest,
            found,
        });
    }
    // The message is built from the digest of the bytes in hand, never from the file's word.
    let message = signed_message(&found);
    let (mut verified, mut missing) = (Vec::new(), Vec::new());
    for key in keys {
        let ok = file.signatures.iter().any(|s| {
            s.key == key.fingerprint
                && BASE64
                    .decode(&s.signature)
                    .ok()
                    .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())
                    .is_some_and(|sig| key.key.verify(&message, &sig).is_ok())
        });
        if ok {
            verified.push(key.name.clone());
        } else {
            missing.push(key.name.clone());
        }
    }
    let satisfied = match policy {
        SignaturePolicy::AnyOf => !verified.is_empty(),
        SignaturePolicy::AllOf => missing.is_empty(),
    };
    if satisfied {
        Ok(verified)
    } else {
        Err(Refusal::NotSatisfied {
            policy: match policy {
                SignaturePolicy::AnyOf => "anyOf",
                SignaturePolicy::AllOf => "allOf",
            },
            verified,
            missing,
        })
    }
}

/// Signs `module` with the private key in `private_pem`, into `existing` (the module's
/// current signature file, if any): a file for the same digest keeps the other keys'
/// signatures and this key's is replaced; a file for another digest is started afresh.
pub fn sign(
    private_pem: &str,
    module: &[u8],
    existing: Option<SignatureFile>,
) -> Result<SignatureFile, SupplyError> {
    let key = SigningKey::from_pkcs8_pem(private_pem)
        .map_err(|e| SupplyError::PrivateKey(e.to_string()))?;
    let digest = module_digest(module);
    let signature = key.sign(&signed_message(&digest));
    let fingerprint = fingerprint(&key.verifying_key());
    let mut file = match existing {
        Some(f) if f.digest == digest => f,
        _ => SignatureFile {
            digest,
            signatures: Vec::new(),
        },
    };
    file.signatures.retain(|s| s.key != fingerprint);
    file.signatures.push(Signed {
        key: fingerprint,
        signature: BASE64.encode(signature.to_bytes()),
    });
    Ok(file)
}

/// `provider sign`: signs the module at `module` with the key at `key`, writing its signature
/// file beside it (kept signatures of other keys for the same bytes). Returns the file's path
/// and the digest signed.
pub fn sign_file(module: &Path, key: &Path) -> Result<(PathBuf, String), SupplyError> {
    let file_err = |path: &Path, e: &dyn std::fmt::Display| SupplyError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let bytes = std::fs::read(module).map_err(|e| file_err(module, &e))?;
    let pem = read_bounded(key, MAX_KEY_FILE).map_err(|e| file_err(key, &e))?;
    let pem = String::from_utf8(pem).map_err(|e| file_err(key, &e))?;
    let path = signature_path(module);
    let existing = match read_bounded(&path, MAX_SIGNATURE_FILE) {
        Ok(b) => Some(
            serde_json::from_slice(&b).map_err(|e| SupplyError::Existing {
                path: path.display().to_string(),
                message: format!("not a signature file ({e}); move it away to sign afresh"),
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(file_err(&path, &e)),
    };
    let file = sign(&pem, &bytes, existing)?;
    let text = serde_json::to_string_pretty(&file).map_err(|e| file_err(&path, &e))? + "\n";
    std::fs::write(&path, text).map_err(|e| file_err(&path, &e))?;
    Ok((path, file.digest))
}

/// The load-time check a runtime makes of a module read from `module_path` whose bytes have
/// `digest` (`sha256:…`),
/// under the config's policy: reads the policy's keys and the module's signature file, and
/// answers a refusal as the entry's `module` error.
pub fn check_module(
    policy: &ModuleVerification,
    base_dir: &Path,
    at: &str,
    module_path: &Path,
    digest: &str,
) -> Result<Vec<String>, ConfigError> {
    let keys = read_keys(policy, base_dir)?;
    let sig_path = signature_path(module_path);
    let sig_name = sig_path.display().to_string();
    let signatures = match read_bounded(&sig_path, MAX_SIGNATURE_FILE) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(ConfigError::new(
                format!("{at}.module"),
                Refusal::Unreadable {
                    path: sig_name,
                    message: e.to_string(),
                }
                .to_string(),
            ));
        }
    };
    check_signature(
        policy,
        &keys,
        at,
        &module_path.display().to_string(),
        digest,
        &sig_name,
        signatures.as_deref(),
    )
}

/// The same check of a module whose signature file came from elsewhere (a registry): `what`
/// names the module and `sig_name` its signature in the refusal.
pub fn check_signature(
    policy: &ModuleVerification,
    keys: &[Key],
    at: &str,
    what: &str,
    digest: &str,
    sig_name: &str,
    signatures: Option<&[u8]>,
) -> Result<Vec<String>, ConfigError> {
    verify_digest(policy.policy, keys, digest, sig_name, signatures)
        .map_err(|r| ConfigError::new(format!("{at}.module"), format!("the module {what} {r}")))
}

#[cfg(test)]
mod tests;
