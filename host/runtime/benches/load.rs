//! What checking a module costs a load that finds it compiled in the disk cache: the same
//! providers config loaded by a fresh Runtime (as at a process start) with the module
//! unchecked, pinned (`sha256`), pinned and signed (`moduleVerification`, one Ed25519 key), and
//! named by digest in an OCI registry on loopback (pulled once; then from the cache, its
//! signature fetched at each load). Prints a markdown table of medians.
//!
//!     cargo bench -p egress-runtime --bench load
//!
//! The goal: verification adds at most 50 ms to a cached load. The Python and JavaScript
//! modules (providers-polyglot/, built by their build.sh) are measured when built: the
//! largest modules, hence the most bytes to hash.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::world::World;
use egress_core::config::{OciRef, ProvidersConfig};
use egress_runtime::{LoadOptions, Providers, Runtime, RuntimeOptions};
use egress_supply::oci::{Registry, RegistryOptions};
use std::path::Path;
use std::time::{Duration, Instant};

const RUNS: usize = 15;

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

async fn load_once(cache: &Path, registry: &RegistryOptions, dir: &Path, text: &str) -> Duration {
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.to_path_buf()),
        registry: registry.clone(),
        ..Default::default()
    })
    .unwrap();
    let world = World::default().build().unwrap();
    let t = Instant::now();
    let mut cfg = ProvidersConfig::from_yaml(text).unwrap();
    cfg.resolve_files(dir);
    Providers::load(
        &runtime,
        &cfg,
        LoadOptions {
            base_dir: dir,
            builtin: &egress_builtins::module_for_type,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
    .unwrap();
    t.elapsed()
}

fn signing_key(dir: &Path) -> std::path::PathBuf {
    use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    std::fs::write(
        dir.join("platform.pub"),
        key.verifying_key()
            .to_public_key_pem(Default::default())
            .unwrap(),
    )
    .unwrap();
    let private = dir.join("platform.pem");
    std::fs::write(
        &private,
        key.to_pkcs8_pem(Default::default()).unwrap().as_bytes(),
    )
    .unwrap();
    private
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let key = signing_key(d);
    let reg = egress_test_pki::registry::available().then(|| {
        std::fs::create_dir_all(d.join("registry")).unwrap();
        egress_test_pki::registry::TestRegistry::start(&d.join("registry"))
    });
    let no_registry = RegistryOptions::default();

    let mut rows = Vec::new();
    for (name, bytes) in egress_test_modules::example_cloud_modules() {
        let file = d.join("m.wasm");
        std::fs::write(&file, &bytes).unwrap();
        let sig = egress_supply::signature_path(&file);
        let _ = std::fs::remove_file(&sig);
        let digest = egress_supply::module_digest(&bytes);
        let entry = |module: &str, pin: bool| {
            format!(
                "- name: ec\n  type: examplecloud\n  module: '{module}'\n{}  config: {{project: proxies}}\n  grants: {{http: {{hosts: [api.examplecloud.test]}}}}\n",
                if pin {
                    format!("  sha256: '{digest}'\n")
                } else {
                    String::new()
                }
            )
        };
        let verification =
            "moduleVerification: {keys: [{name: platform, publicKeyFile: platform.pub}]}\n";
        // Warm the compiled-module cache.
        load_once(
            &cache,
            &no_registry,
            d,
            &format!("providers:\n{}", entry("m.wasm", false)),
        )
        .await;

        let measure = async |registry: &RegistryOptions, text: String| {
            let mut v = Vec::with_capacity(RUNS);
            for _ in 0..RUNS {
                v.push(load_once(&cache, registry, d, &text).await);
            }
            median(v)
        };
        let plain = measure(
            &no_registry,
            format!("providers:\n{}", entry("m.wasm", false)),
        )
        .await;
        let pinned = measure(
            &no_registry,
            format!("providers:\n{}", entry("m.wasm", true)),
        )
        .await;
        egress_supply::sign_file(&file, &key).unwrap();
        let signed = measure(
            &no_registry,
            format!("{verification}providers:\n{}", entry("m.wasm", true)),
        )
        .await;
        // The checks alone, as a load makes them: hash the bytes once, read the policy's key
        // and the signature file, verify.
        let policy = ProvidersConfig::from_yaml(&format!(
            "{verification}providers:\n{}",
            entry("m.wasm", true)
        ))
        .unwrap()
        .module_verification
        .unwrap();
        let mut alone = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let t = Instant::now();
            let digest = egress_supply::module_digest(&bytes);
            egress_supply::check_module(&policy, d, "providers[0]", &file, &digest).unwrap();
            alone.push(t.elapsed());
        }
        let alone = median(alone);
        let oci = match &reg {
            Some(reg) => {
                let opts = RegistryOptions {
                    auth_file: Some(reg.auth_file.clone()),
                    ca_files: vec![reg.ca_file.clone()],
                    cache_dir: None,
                };
                let pushed = Registry::new(opts.clone())
                    .unwrap()
                    .push(
                        &bytes,
                        Some(&std::fs::read(&sig).unwrap()),
                        &OciRef {
                            registry: reg.host.clone(),
                            repository: "bench/examplecloud".into(),
                            tag: Some("v1".into()),
                            digest: None,
                        },
                    )
                    .await
                    .unwrap();
                let text = format!(
                    "{verification}providers:\n{}",
                    entry(&pushed.reference.to_string(), true)
                );
                // The first load pulls into the cache; the measured ones read it.
                load_once(&cache, &opts, d, &text).await;
                format!("{:.1} ms", measure(&opts, text).await)
            }
            None => "(no registry)".into(),
        };
        rows.push(format!(
            "| {name} | {:.1} MiB | {plain:.1} ms | {pinned:.1} ms | {signed:.1} ms | {alone:.2} ms | {oci} |",
            bytes.len() as f64 / (1 << 20) as f64,
        ));
    }
    println!(
        "| module | size | cached load, unchecked | pinned | pinned and signed | the checks alone (hash, key, signature) | from a registry by digest, cached, pinned and signed |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
