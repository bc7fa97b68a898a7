//! Hot reload under load: 1000 provider calls run while the module and its config are swapped
//! ten times, one of them a broken module. No call fails, and every call's answer comes from
//! the version it started on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::world::World;
use egress_core::{CreateRequest, Placement};
use egress_runtime::capabilities::clock::SystemClock;
use egress_runtime::{Backends, Reloader, Runtime, RuntimeOptions};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use egress_test_modules::hostile_variant as variant;

fn runtime() -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache"),
        ),
        ..Default::default()
    })
    .unwrap()
}

async fn reloader(path: &Path, backends: Backends) -> Reloader {
    Reloader::new(
        runtime(),
        path.to_path_buf(),
        backends,
        None,
        egress_builtins::module_for_type,
    )
    .await
    .unwrap()
}

fn config(version: &str) -> String {
    format!(
        "installation: test\nproviders:\n- name: p\n  type: hostile\n  module: m.wasm\n  config: {{mode: ok, version: {version}, sleepMs: 20}}\n"
    )
}

fn request(i: usize) -> CreateRequest {
    CreateRequest {
        name: format!("proxy-{i:04}"),
        namespace: "default".into(),
        uid: format!("uid-{i}"),
        port: 3128,
        placement: Placement::default(),
        cloud_init: None,
        installation: "test".into(),
        owner: None,
        htpasswd: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_ten_swaps_including_a_bad_module() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(dir.path().join("m.wasm"), variant(0)).unwrap();
    std::fs::write(&path, config("v0")).unwrap();
    let world = World::default().build().unwrap();
    // Real time, so calls overlap the swaps.
    let backends = Backends {
        clock: Arc::new(SystemClock::new()),
        ..world.backends
    };
    let reloader = Arc::new(reloader(&path, backends).await);
    assert!(!reloader.changed());

    let failures = Arc::new(AtomicUsize::new(0));
    let mismatches = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut calls = Vec::new();
    let mut spawn_wave = |wave: usize| {
        for j in 0..100 {
            let i = wave * 100 + j;
            let reloader = reloader.clone();
            let failures = failures.clone();
            let mismatches = mismatches.clone();
            let seen = seen.clone();
            calls.push(tokio::spawn(async move {
                let providers = reloader.current();
                let p = providers.get("p").unwrap().clone();
                let config: serde_json::Value = serde_json::from_str(&p.config).unwrap();
                let want = config["version"].as_str().unwrap().to_string();
                match p.create("load", &request(i)).await {
                    Ok(inst) => {
                        let got = inst.provider_id.split('/').nth(1).unwrap_or("").to_string();
                        if got != want {
                            mismatches.fetch_add(1, Ordering::SeqCst);
                        }
                        seen.lock().unwrap().insert(got);
                    }
                    Err(e) => {
                        eprintln!("call {i} failed: {e}");
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
    };

    let mut swapped = 0;
    let mut refused = 0;
    for k in 1..=10u8 {
        // A wave of 100 calls in flight while version k is compiled and swapped in.
        spawn_wave(usize::from(k) - 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        if k == 5 {
            // A broken module: refused, the old version serves on.
            std::fs::write(dir.path().join("m.wasm"), b"\0asm but not really").unwrap();
            let out = reloader.reload_if_changed().await.unwrap();
            assert_eq!(out.rejected.len(), 1, "{out:?}");
            assert_eq!(out.rejected[0].provider, "p");
            assert_eq!(out.rejected[0].error.path, "providers[0].module");
            assert!(out.swapped.is_empty());
            refused += 1;
            // Nothing changed since: no second attempt.
            assert!(reloader.reload_if_changed().await.is_none());
            continue;
        }
        std::fs::write(dir.path().join("m.wasm"), variant(k)).unwrap();
        std::fs::write(&path, config(&format!("v{k}"))).unwrap();
        let out = reloader.reload_if_changed().await.unwrap();
        assert_eq!(out.swapped, vec!["p".to_string()], "{out:?}");
        assert!(out.rejected.is_empty(), "{out:?}");
        assert_eq!(reloader.current().get("p").unwrap().module.digest, {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(variant(k)))
        });
        swapped += 1;
    }
    for c in calls {
        c.await.unwrap();
    }
    assert_eq!((swapped, refused), (9, 1));
    assert_eq!(failures.load(Ordering::SeqCst), 0, "calls failed");
    assert_eq!(
        mismatches.load(Ordering::SeqCst),
        0,
        "a call answered from another version"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.len() >= 3,
        "the calls did not overlap the swaps: versions seen {seen:?}"
    );
}

#[tokio::test]
async fn an_unchanged_provider_keeps_its_object_and_a_bad_config_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(dir.path().join("m.wasm"), variant(0)).unwrap();
    std::fs::write(
        &path,
        "providers:\n- {name: a, type: hostile, module: m.wasm, config: {mode: ok}}\n- {name: k, type: kubernetes}\n",
    )
    .unwrap();
    let world = World::default().build().unwrap();
    let reloader = reloader(&path, world.backends).await;
    let before = reloader.current();

    // Only the kubernetes entry changes.
    std::fs::write(
        &path,
        "providers:\n- {name: a, type: hostile, module: m.wasm, config: {mode: ok}}\n- {name: k, type: kubernetes, kubernetes: {image: 'squid:7'}}\n",
    )
    .unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.swapped, vec!["k".to_string()]);
    let after = reloader.current();
    assert!(Arc::ptr_eq(
        before.get("a").unwrap(),
        after.get("a").unwrap()
    ));
    assert!(!Arc::ptr_eq(
        before.get("k").unwrap(),
        after.get("k").unwrap()
    ));
    assert_ne!(
        before.get("k").unwrap().revision,
        after.get("k").unwrap().revision
    );

    // A config that does not parse: refused whole, everything serves on.
    std::fs::write(&path, "providers: [{name: a, colour: red}]\n").unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert!(out.config_error.is_some());
    assert!(Arc::ptr_eq(
        reloader.current().get("k").unwrap(),
        after.get("k").unwrap()
    ));
    assert!(
        reloader.reload_if_changed().await.is_none(),
        "the same bad file is refused once"
    );

    // An entry that asks for a capability its grant lacks: refused, the old one serves.
    std::fs::write(
        &path,
        "providers:\n- {name: a, type: hostile, module: m.wasm, config: {mode: ok}}\n- {name: k, type: kubernetes, kubernetes: {image: 'squid:7'}, grants: {}}\n",
    )
    .unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert!(
        out.rejected.is_empty(),
        "an empty grants block keeps the built-in grant: {out:?}"
    );
}

#[tokio::test]
async fn a_poll_loads_a_change_only_once_it_has_settled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(&path, "providers:\n- {name: k, type: kubernetes}\n").unwrap();
    let world = World::default().build().unwrap();
    let reloader = reloader(&path, world.backends).await;
    assert!(reloader.poll().await.is_none(), "nothing changed");

    // A writer caught between truncate and write: the empty file is never loaded.
    std::fs::write(&path, "").unwrap();
    assert!(reloader.poll().await.is_none(), "first sight of a change");
    let two = "providers:\n- {name: k, type: kubernetes}\n- {name: j, type: kubernetes}\n";
    std::fs::write(&path, two).unwrap();
    assert!(
        reloader.poll().await.is_none(),
        "the content moved since the last poll: wait again"
    );
    let out = reloader.poll().await.expect("settled: loaded");
    assert!(out.config_error.is_none(), "{:?}", out.config_error);
    assert_eq!(out.swapped, vec!["j".to_string()]);
    assert!(reloader.current().get("k").is_some());
    assert!(reloader.poll().await.is_none(), "loaded once");

    // An empty file that stays empty is refused, and the providers serve on.
    std::fs::write(&path, "").unwrap();
    assert!(reloader.poll().await.is_none());
    let out = reloader.poll().await.expect("settled: refused");
    let err = out.config_error.expect("an empty config is refused");
    assert!(err.message.contains("empty"), "{err}");
    assert_eq!(reloader.current().by_name.len(), 2);
}

/// The operator's config, read by the reloader, finds a relative `egressCheck.tls.caFile`
/// beside the providers file, as the CLI does.
#[tokio::test]
async fn a_relative_ca_file_is_found_beside_the_providers_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(dir.path().join("m.wasm"), variant(0)).unwrap();
    std::fs::write(
        &path,
        format!(
            "egressCheck: {{urls: ['http://198.51.100.1/', 'https://198.51.100.1/'], tls: {{caFile: ca.pem}}}}\n{}",
            config("v0")
        ),
    )
    .unwrap();
    let world = World::default().build().unwrap();
    let r = reloader(&path, world.backends).await;
    let config = r.config();
    let tls = config.egress_check.as_ref().unwrap().tls.as_ref().unwrap();
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(dir.path().join("ca.pem").display().to_string().as_str())
    );
}

/// A pinned module: the file of the pinned digest loads; a file of another digest is refused at
/// load (naming both digests) and at every reload, while the version loaded serves on; a
/// pin moved to the new file's digest loads it.
#[tokio::test]
async fn a_module_of_another_digest_than_its_pin_is_refused_at_load_and_reload() {
    use sha2::Digest;
    let digest = |b: &[u8]| format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)));
    let pinned = |pin: &str| {
        format!(
            "providers:\n- {{name: a, type: hostile, module: m.wasm, sha256: '{pin}', config: {{mode: ok}}}}\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    let (v0, v1) = (variant(0), variant(1));

    // At load: another file than the pinned one stops the start.
    std::fs::write(dir.path().join("m.wasm"), &v1).unwrap();
    std::fs::write(&path, pinned(&digest(&v0))).unwrap();
    let world = World::default().build().unwrap();
    let err = match Reloader::new(
        runtime(),
        path.clone(),
        world.backends.clone(),
        None,
        egress_builtins::module_for_type,
    )
    .await
    {
        Ok(_) => panic!("a module of another digest loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("providers[0].sha256"), "{err}");
    assert!(
        err.contains(&digest(&v0)) && err.contains(&digest(&v1)),
        "{err}"
    );

    // The pinned file loads.
    std::fs::write(dir.path().join("m.wasm"), &v0).unwrap();
    let rt = runtime();
    let reloader = Reloader::new(
        rt.clone(),
        path.clone(),
        world.backends.clone(),
        None,
        egress_builtins::module_for_type,
    )
    .await
    .unwrap();
    let serving = reloader.current().get("a").unwrap().clone();
    assert_eq!(format!("sha256:{}", serving.module.digest), digest(&v0));

    // At reload: the file replaced by another is refused, and the loaded version serves on;
    // the refused bytes were never compiled.
    std::fs::write(dir.path().join("m.wasm"), &v1).unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert!(out.swapped.is_empty(), "{out:?}");
    assert_eq!(out.rejected.len(), 1, "{out:?}");
    assert_eq!(out.rejected[0].provider, "a");
    assert_eq!(out.rejected[0].error.path, "providers[0].sha256");
    assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &serving));
    assert!(!rt.loaded_digests().contains(&digest(&v1)[7..].to_string()));

    // The pin moved to the new file: it loads.
    std::fs::write(&path, pinned(&digest(&v1))).unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.swapped, vec!["a".to_string()], "{out:?}");
    assert_eq!(
        format!(
            "sha256:{}",
            reloader.current().get("a").unwrap().module.digest
        ),
        digest(&v1)
    );
}

/// A signing key of its own for each seed, its public half written as `k{seed}.pub` in `dir`,
/// its private half returned as PEM.
fn signing_key(dir: &Path, seed: u8) -> String {
    use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let public = key
        .verifying_key()
        .to_public_key_pem(Default::default())
        .unwrap();
    std::fs::write(dir.join(format!("k{seed}.pub")), public).unwrap();
    key.to_pkcs8_pem(Default::default()).unwrap().to_string()
}

fn sign_module(dir: &Path, private_pem: &str) {
    let key = dir.join("signing.pem");
    std::fs::write(&key, private_pem).unwrap();
    egress_supply::sign_file(&dir.join("m.wasm"), &key).unwrap();
    std::fs::remove_file(key).unwrap();
}

/// With a verification policy, a module loads only with a signature by a key of the policy
/// over its own bytes; unsigned, signed by another key, changed after signing, or with its
/// signature stripped, it is refused at load and at reload, and the version loaded serves on.
#[tokio::test]
async fn a_module_not_signed_as_the_policy_requires_is_refused_at_load_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.yaml");
    let trusted = signing_key(dir.path(), 1);
    let stranger = signing_key(dir.path(), 2);
    std::fs::write(
        &path,
        "moduleVerification: {keys: [{name: platform, publicKeyFile: k1.pub}]}\nproviders:\n- {name: a, type: hostile, module: m.wasm, config: {mode: ok}}\n",
    )
    .unwrap();
    let world = World::default().build().unwrap();
    let rt = runtime();
    let start = || {
        Reloader::new(
            rt.clone(),
            path.clone(),
            world.backends.clone(),
            None,
            egress_builtins::module_for_type,
        )
    };

    // Unsigned: the start stops, naming the module.
    std::fs::write(dir.path().join("m.wasm"), variant(0)).unwrap();
    let err = start()
        .await
        .err()
        .expect("an unsigned module loaded")
        .to_string();
    assert!(
        err.contains("providers[0].module") && err.contains("is not signed"),
        "{err}"
    );

    // Signed by the policy's key: it loads.
    sign_module(dir.path(), &trusted);
    let reloader = start().await.unwrap();
    let serving = reloader.current().get("a").unwrap().clone();
    let refused = |out: &egress_runtime::ReloadOutcome, why: &str| {
        assert!(out.swapped.is_empty(), "{out:?}");
        assert_eq!(out.rejected.len(), 1, "{out:?}");
        let e = &out.rejected[0].error;
        assert_eq!(e.path, "providers[0].module");
        assert!(e.message.contains(why), "{e}");
    };

    // The module replaced after signing: its signature names the old digest.
    std::fs::write(dir.path().join("m.wasm"), variant(1)).unwrap();
    refused(
        &reloader.reload_if_changed().await.unwrap(),
        "was made for sha256:",
    );
    assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &serving));

    // Signed, but by a key the policy does not name.
    std::fs::remove_file(dir.path().join("m.wasm.sig")).unwrap();
    sign_module(dir.path(), &stranger);
    refused(
        &reloader.reload_if_changed().await.unwrap(),
        "verified by no key, not by platform",
    );
    assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &serving));

    // Neither refused version was compiled.
    let compiled = rt.loaded_digests();
    assert!(!compiled.contains(&egress_supply::module_digest(&variant(1))[7..].to_string()));

    // Signed by the policy's key: swapped in.
    sign_module(dir.path(), &trusted);
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.swapped, vec!["a".to_string()], "{out:?}");
    let now = reloader.current().get("a").unwrap().clone();

    // The signature stripped while verification is configured: refused, the signed one serves.
    std::fs::remove_file(dir.path().join("m.wasm.sig")).unwrap();
    refused(
        &reloader.reload_if_changed().await.unwrap(),
        "is not signed",
    );
    assert!(Arc::ptr_eq(reloader.current().get("a").unwrap(), &now));
}
