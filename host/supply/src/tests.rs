#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use egress_core::config::VerificationKey;

fn private(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn private_pem(seed: u8) -> String {
    private(seed)
        .to_pkcs8_pem(Default::default())
        .unwrap()
        .to_string()
}

/// A policy of the keys made from `seeds`, their public halves written in `dir`.
fn policy(dir: &Path, seeds: &[u8], policy: SignaturePolicy) -> (ModuleVerification, Vec<Key>) {
    let mut keys = Vec::new();
    for s in seeds {
        let file = format!("k{s}.pub");
        let pem = private(*s)
            .verifying_key()
            .to_public_key_pem(Default::default())
            .unwrap();
        std::fs::write(dir.join(&file), pem).unwrap();
        keys.push(VerificationKey {
            name: format!("key-{s}"),
            public_key_file: file,
        });
    }
    let v = ModuleVerification { keys, policy };
    let read = read_keys(&v, dir).unwrap();
    (v, read)
}

fn signed(module: &[u8], seeds: &[u8]) -> Vec<u8> {
    let mut file = None;
    for s in seeds {
        file = Some(sign(&private_pem(*s), module, file).unwrap());
    }
    serde_json::to_vec(&file.unwrap()).unwrap()
}

const MODULE: &[u8] = b"\0asm a provider module";

#[test]
fn a_module_signed_by_a_key_of_the_policy_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (_, keys) = policy(dir.path(), &[1, 2], SignaturePolicy::AnyOf);
    let ok = verify(
        SignaturePolicy::AnyOf,
        &keys,
        MODULE,
        "m.sig",
        Some(&signed(MODULE, &[2])),
    );
    assert_eq!(ok, Ok(vec!["key-2".to_string()]));
}

#[test]
fn the_tamper_cases_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, keys) = policy(dir.path(), &[1], SignaturePolicy::AnyOf);
    let anyof = |module: &[u8], sig: Option<&[u8]>| {
        verify(SignaturePolicy::AnyOf, &keys, module, "m.sig", sig)
    };
    // Unsigned, or the signature stripped.
    assert_eq!(anyof(MODULE, None), Err(Refusal::Unsigned("m.sig".into())));
    // Signed by a key the policy does not name.
    assert!(matches!(
        anyof(MODULE, Some(&signed(MODULE, &[9]))),
        Err(Refusal::NotSatisfied { ref verified, ref missing, .. })
            if verified.is_empty() && missing == &["key-1".to_string()]
    ));
    // The module changed after it was signed.
    let other = b"\0asm another module";
    assert_eq!(
        anyof(other, Some(&signed(MODULE, &[1]))),
        Err(Refusal::OtherDigest {
            signed: module_digest(MODULE),
            found: module_digest(other),
        })
    );
    // ... and the file's digest edited to match it: the signature is over the old digest.
    let mut file: SignatureFile = serde_json::from_slice(&signed(MODULE, &[1])).unwrap();
    file.digest = module_digest(other);
    let edited = serde_json::to_vec(&file).unwrap();
    assert!(matches!(
        anyof(other, Some(&edited)),
        Err(Refusal::NotSatisfied { .. })
    ));
    // A signature of the right key over something else, or bits flipped.
    let mut file: SignatureFile = serde_json::from_slice(&signed(MODULE, &[1])).unwrap();
    let mut raw = BASE64.decode(&file.signatures[0].signature).unwrap();
    raw[0] ^= 1;
    file.signatures[0].signature = BASE64.encode(&raw);
    let flipped = serde_json::to_vec(&file).unwrap();
    assert!(matches!(
        anyof(MODULE, Some(&flipped)),
        Err(Refusal::NotSatisfied { .. })
    ));
    // Not a signature file at all; too many signatures.
    assert!(matches!(
        anyof(MODULE, Some(b"{}")),
        Err(Refusal::Unreadable { .. })
    ));
    let mut file: SignatureFile = serde_json::from_slice(&signed(MODULE, &[1])).unwrap();
    file.signatures = vec![file.signatures[0].clone(); MAX_SIGNATURES + 1];
    let many = serde_json::to_vec(&file).unwrap();
    assert!(matches!(
        anyof(MODULE, Some(&many)),
        Err(Refusal::Unreadable { .. })
    ));
}

#[test]
fn all_of_needs_every_key_and_any_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_, keys) = policy(dir.path(), &[1, 2], SignaturePolicy::AllOf);
    let one = signed(MODULE, &[1]);
    let err = verify(SignaturePolicy::AllOf, &keys, MODULE, "m.sig", Some(&one)).unwrap_err();
    assert_eq!(
        err,
        Refusal::NotSatisfied {
            policy: "allOf",
            verified: vec!["key-1".into()],
            missing: vec!["key-2".into()],
        }
    );
    assert!(
        err.to_string().contains("verified by key-1, not by key-2"),
        "{err}"
    );
    let both = signed(MODULE, &[1, 2]);
    assert_eq!(
        verify(SignaturePolicy::AllOf, &keys, MODULE, "m.sig", Some(&both)),
        Ok(vec!["key-1".into(), "key-2".into()])
    );
    assert!(verify(SignaturePolicy::AnyOf, &keys, MODULE, "m.sig", Some(&one)).is_ok());
}

#[test]
fn signing_again_replaces_that_keys_signature_and_a_new_module_starts_afresh() {
    let twice = sign(
        &private_pem(1),
        MODULE,
        Some(serde_json::from_slice(&signed(MODULE, &[1, 2])).unwrap()),
    )
    .unwrap();
    assert_eq!(twice.signatures.len(), 2);
    let other = sign(&private_pem(1), b"other", Some(twice)).unwrap();
    assert_eq!(other.digest, module_digest(b"other"));
    assert_eq!(other.signatures.len(), 1);
    assert!(matches!(
        sign("not a key", MODULE, None),
        Err(SupplyError::PrivateKey(_))
    ));
}

#[test]
fn a_key_file_that_is_no_ed25519_public_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.pub"), private_pem(1)).unwrap();
    let v = ModuleVerification {
        keys: vec![VerificationKey {
            name: "a".into(),
            public_key_file: "bad.pub".into(),
        }],
        policy: SignaturePolicy::AnyOf,
    };
    let err = read_keys(&v, dir.path()).unwrap_err();
    assert_eq!(err.path, "moduleVerification.keys[0].publicKeyFile");
    let v = ModuleVerification {
        keys: vec![VerificationKey {
            name: "a".into(),
            public_key_file: "absent.pub".into(),
        }],
        policy: SignaturePolicy::AnyOf,
    };
    assert!(
        read_keys(&v, dir.path())
            .unwrap_err()
            .message
            .contains("cannot read")
    );
}

#[test]
fn a_module_file_is_checked_with_the_signature_file_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let (v, _) = policy(dir.path(), &[1], SignaturePolicy::AnyOf);
    let module = dir.path().join("m.wasm");
    std::fs::write(&module, MODULE).unwrap();
    let err = check_module(
        &v,
        dir.path(),
        "providers[0]",
        &module,
        &module_digest(MODULE),
    )
    .unwrap_err();
    assert_eq!(err.path, "providers[0].module");
    assert!(err.message.contains("is not signed: no"), "{err}");
    std::fs::write(dir.path().join("k1.pem"), private_pem(1)).unwrap();
    let (path, digest) = sign_file(&module, &dir.path().join("k1.pem")).unwrap();
    assert_eq!(path, dir.path().join("m.wasm.sig"));
    assert_eq!(digest, module_digest(MODULE));
    assert_eq!(
        check_module(
            &v,
            dir.path(),
            "providers[0]",
            &module,
            &module_digest(MODULE)
        ),
        Ok(vec!["key-1".to_string()])
    );
}
