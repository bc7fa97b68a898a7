//! Provider modules from a real OCI registry on loopback (Debian's docker-registry, the CNCF
//! distribution server, over HTTPS with basic credentials): pulled by digest and by tag (the tag
//! pinned at its first pull), cached so a restart needs no registry, and refused, with the
//! version loaded serving on, when the registry serves bytes other than the digests name, when
//! the credentials are wrong, or when the signature the policy requires is missing or stripped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::world::World;
use egress_core::config::OciRef;
use egress_runtime::{Backends, ReloadOutcome, Reloader, Runtime, RuntimeOptions};
use egress_supply::oci::{Registry, RegistryOptions};
use egress_test_modules::hostile_variant as variant;
use egress_test_pki::registry::{self, TestRegistry};
use std::path::Path;
use std::sync::Arc;

fn digest(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

fn runtime(cache: &Path, registry: RegistryOptions) -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.to_path_buf()),
        registry,
        ..Default::default()
    })
    .unwrap()
}

async fn start(runtime: Runtime, path: &Path, backends: Backends) -> Result<Reloader, String> {
    Reloader::new(
        runtime,
        path.to_path_buf(),
        backends,
        None,
        egress_builtins::module_for_type,
    )
    .await
    .map_err(|e| e.to_string())
}

fn entry(module: &str) -> String {
    format!("- {{name: a, type: hostile, module: '{module}', config: {{mode: ok}}}}\n")
}

fn refused(out: &ReloadOutcome, why: &str) {
    assert!(out.swapped.is_empty(), "{out:?}");
    assert_eq!(out.rejected.len(), 1, "{out:?}");
    let e = &out.rejected[0].error;
    assert_eq!(e.path, "providers[0].module", "{e}");
    assert!(e.message.contains(why), "{e}");
}

fn at(reg: &TestRegistry, repository: &str, tag: &str) -> OciRef {
    OciRef {
        registry: reg.host.clone(),
        repository: repository.into(),
        tag: Some(tag.into()),
        digest: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_come_from_a_registry_by_digest_and_tag_and_bytes_other_than_named_are_refused() {
    if !registry::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("registry")).unwrap();
    let mut reg = TestRegistry::start(&dir.path().join("registry"));
    let opts = RegistryOptions {
        auth_file: Some(reg.auth_file.clone()),
        ca_files: vec![reg.ca_file.clone()],
        cache_dir: None,
    };
    let client = Registry::new(opts.clone()).unwrap();
    let (v0, v1, v2) = (variant(0), variant(1), variant(2));
    let p0 = client
        .push(&v0, None, &at(&reg, "egress/hostile", "v0"))
        .await
        .unwrap();
    let p1 = client
        .push(&v1, None, &at(&reg, "egress/hostile", "v1"))
        .await
        .unwrap();
    assert_eq!(p0.module_digest, digest(&v0));
    assert!(p0.reference.digest.is_some() && p0.reference.tag.is_none());

    let path = dir.path().join("providers.yaml");
    let world = World::default().build().unwrap();
    let cache = dir.path().join("cache");

    // By digest, pinned to the module's own digest too: it loads, and says where from.
    std::fs::write(
        &path,
        format!(
            "providers:\n- {{name: a, type: hostile, module: '{}', sha256: '{}', config: {{mode: ok}}}}\n",
            p0.reference,
            digest(&v0)
        ),
    )
    .unwrap();
    let reloader = start(runtime(&cache, opts.clone()), &path, world.backends.clone())
        .await
        .unwrap();
    let serving = reloader.current().get("a").unwrap().clone();
    assert_eq!(format!("sha256:{}", serving.module.digest), digest(&v0));
    assert_eq!(
        serving.source.as_deref(),
        Some(p0.reference.to_string().as_str())
    );

    // By tag: resolved once, and the digest it named is what the status shows.
    std::fs::write(
        &path,
        format!(
            "providers:\n{}",
            entry(&at(&reg, "egress/hostile", "v1").to_string())
        ),
    )
    .unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.swapped, vec!["a".to_string()], "{out:?}");
    let by_tag = reloader.current().get("a").unwrap().clone();
    let pinned = at(&reg, "egress/hostile", "v1").pinned(p1.reference.digest.as_deref().unwrap());
    assert_eq!(by_tag.source.as_deref(), Some(pinned.to_string().as_str()));
    assert_eq!(format!("sha256:{}", by_tag.module.digest), digest(&v1));
    // The tag pushed again does not move a running process: the tag stays pinned.
    client
        .push(&v2, None, &at(&reg, "egress/hostile", "v1"))
        .await
        .unwrap();
    reloader.reload().await;
    let still = reloader.current().get("a").unwrap().clone();
    assert_eq!(format!("sha256:{}", still.module.digest), digest(&v1));

    // The registry down: a module named by digest loads from the cache at a new start.
    reg.stop();
    std::fs::write(
        &path,
        format!("providers:\n{}", entry(&p0.reference.to_string())),
    )
    .unwrap();
    let offline = start(runtime(&cache, opts.clone()), &path, world.backends.clone())
        .await
        .unwrap();
    assert_eq!(
        format!(
            "sha256:{}",
            offline.current().get("a").unwrap().module.digest
        ),
        digest(&v0)
    );
    // ... while a tag cannot be resolved without it.
    std::fs::write(
        &path,
        format!(
            "providers:\n{}",
            entry(&at(&reg, "egress/hostile", "v0").to_string())
        ),
    )
    .unwrap();
    let err = start(runtime(&cache, opts.clone()), &path, world.backends.clone())
        .await
        .err()
        .expect("a tag resolved with the registry down");
    assert!(
        err.contains("providers[0].module") && err.contains(":v0"),
        "{err}"
    );
    reg.resume();

    // Wrong credentials, and none: refused, naming the registry's answer, never the password.
    let wrong = reg.auth_file_with(dir.path(), registry::USER, "not-the-password");
    for auth in [Some(wrong), None] {
        let err = start(
            runtime(
                &dir.path().join(format!("cache-{}", auth.is_some())),
                RegistryOptions {
                    auth_file: auth,
                    ..opts.clone()
                },
            ),
            &path,
            world.backends.clone(),
        )
        .await
        .err()
        .expect("loaded with wrong credentials");
        assert!(err.contains("providers[0].module"), "{err}");
        assert!(
            ["unauthorized", "not authorized", "401"]
                .iter()
                .any(|w| err.to_ascii_lowercase().contains(w)),
            "{err}"
        );
        assert!(!err.contains(&reg.password), "{err}");
    }

    // A registry serving a different blob than its manifest names, and a different manifest
    // than the digest that names it: refused at reload before anything is compiled, and the
    // version loaded serves on.
    let v3 = variant(3);
    let p3 = client
        .push(&v3, None, &at(&reg, "egress/tampered", "layer"))
        .await
        .unwrap();
    std::fs::write(reg.blob_path(&p3.module_digest), variant(4)).unwrap();
    let v5 = variant(5);
    let p5 = client
        .push(&v5, None, &at(&reg, "egress/tampered", "manifest"))
        .await
        .unwrap();
    let manifest_blob = reg.blob_path(p5.reference.digest.as_deref().unwrap());
    let mut manifest = std::fs::read(&manifest_blob).unwrap();
    manifest.extend_from_slice(b"\n");
    std::fs::write(&manifest_blob, manifest).unwrap();
    let rt = runtime(&dir.path().join("cache-tamper"), opts.clone());
    std::fs::write(
        &path,
        format!("providers:\n{}", entry(&p0.reference.to_string())),
    )
    .unwrap();
    let reloader = start(rt.clone(), &path, world.backends.clone())
        .await
        .unwrap();
    let serving = reloader.current().get("a").unwrap().clone();
    for (p, why) in [
        (&p3, "a layer with digest"),
        (&p5, "a manifest with digest"),
    ] {
        std::fs::write(
            &path,
            format!("providers:\n{}", entry(&p.reference.to_string())),
        )
        .unwrap();
        refused(&reloader.reload_if_changed().await.unwrap(), why);
        assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &serving));
    }
    assert!(
        !rt.loaded_digests().iter().any(|d| *d == digest(&v3)[7..]
            || *d == digest(&variant(4))[7..]
            || *d == digest(&v5)[7..]),
        "a refused module was compiled: {:?}",
        rt.loaded_digests()
    );
}

fn signing_key(dir: &Path, seed: u8) -> std::path::PathBuf {
    use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let public = key
        .verifying_key()
        .to_public_key_pem(Default::default())
        .unwrap();
    std::fs::write(dir.join(format!("k{seed}.pub")), public).unwrap();
    let private = dir.join(format!("k{seed}.pem"));
    std::fs::write(
        &private,
        key.to_pkcs8_pem(Default::default()).unwrap().as_bytes(),
    )
    .unwrap();
    private
}

/// Under a verification policy, a registry's module loads with a signature by a policy key,
/// pushed beside it; unsigned, signed by another key, or with its signature deleted from the
/// registry, it is refused, and the version loaded serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_module_must_carry_the_signature_the_policy_requires() {
    if !registry::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("registry")).unwrap();
    let reg = TestRegistry::start(&d.join("registry"));
    let opts = RegistryOptions {
        auth_file: Some(reg.auth_file.clone()),
        ca_files: vec![reg.ca_file.clone()],
        cache_dir: None,
    };
    let client = Registry::new(opts.clone()).unwrap();
    let trusted = signing_key(d, 1);
    let stranger = signing_key(d, 2);
    let push_signed = |k: u8, key: Option<&Path>, tag: &str| {
        let module = d.join(format!("m{k}.wasm"));
        std::fs::write(&module, variant(k)).unwrap();
        let sig = key.map(|key| {
            let (sig_path, _) = egress_supply::sign_file(&module, key).unwrap();
            std::fs::read(sig_path).unwrap()
        });
        let client = &client;
        let to = at(&reg, "egress/signed", tag);
        async move { client.push(&variant(k), sig.as_deref(), &to).await.unwrap() }
    };
    let signed = push_signed(0, Some(&trusted), "good").await;
    assert!(signed.signature_tag.is_some());
    let unsigned = push_signed(1, None, "unsigned").await;
    let foreign = push_signed(2, Some(&stranger), "foreign").await;

    let path = d.join("providers.yaml");
    let config = |module: &str| {
        format!(
            "moduleVerification: {{keys: [{{name: platform, publicKeyFile: k1.pub}}]}}\nproviders:\n{}",
            entry(module)
        )
    };
    let world = World::default().build().unwrap();
    std::fs::write(&path, config(&signed.reference.to_string())).unwrap();
    let rt = runtime(&d.join("cache"), opts.clone());
    let reloader = start(rt.clone(), &path, world.backends.clone())
        .await
        .unwrap();
    let serving = reloader.current().get("a").unwrap().clone();
    assert_eq!(
        format!("sha256:{}", serving.module.digest),
        digest(&variant(0))
    );

    for (p, why) in [
        (&unsigned, "is not signed"),
        (&foreign, "verified by no key, not by platform"),
    ] {
        std::fs::write(&path, config(&p.reference.to_string())).unwrap();
        refused(&reloader.reload_if_changed().await.unwrap(), why);
        assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &serving));
    }

    // The signature deleted from the registry (its tag's manifest removed, as
    // `DELETE /v2/<name>/manifests/<digest>` does): the next load of the module is refused.
    std::fs::write(&path, config(&signed.reference.to_string())).unwrap();
    reloader.reload_if_changed().await.unwrap();
    let sig_tag = signed.signature_tag.as_deref().unwrap();
    std::fs::remove_dir_all(
        reg.storage
            .join("docker/registry/v2/repositories/egress/signed/_manifests/tags")
            .join(sig_tag),
    )
    .unwrap();
    refused(&reloader.reload().await, "is not signed");
    assert!(
        !rt.loaded_digests()
            .iter()
            .any(|d| *d == digest(&variant(1))[7..] || *d == digest(&variant(2))[7..]),
        "a refused module was compiled"
    );
}
