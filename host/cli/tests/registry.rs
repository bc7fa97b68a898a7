//! `provider push` and `module: oci://…` against a real OCI registry on loopback (Debian's
//! docker-registry over HTTPS with basic credentials): the binary pushes a module in the Wasm
//! OCI artifact layout (checked with curl as any client sees it), a dry-run loads it by the
//! digest push printed, and a module pushed by hand the way `oras push` lays it out (an empty
//! config) loads too. Credentials come from the file REGISTRY_AUTH_FILE names; without them
//! the load is refused, naming the entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_test_pki::registry::{self, TestRegistry};
use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
}

/// The dry-run of proxies.yaml under providers.yaml, in the directory the caller sets.
fn reconcile() -> Command {
    let mut c = bin();
    c.args([
        "reconcile",
        "--dry-run",
        "-f",
        "proxies.yaml",
        "--providers",
        "providers.yaml",
    ]);
    c
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// curl against the registry, as its users would: the CA, the credentials, JSON out.
fn curl(reg: &TestRegistry, args: &[&str]) -> Vec<u8> {
    let user = format!("{}:{}", registry::USER, reg.password);
    let out = Command::new("curl")
        .args([
            "-sSf",
            "--cacert",
            reg.ca_file.to_str().unwrap(),
            "-u",
            &user,
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Uploads a blob by the distribution API's monolithic POST-then-PUT.
fn upload(reg: &TestRegistry, repo: &str, data: &[u8], dir: &Path) -> String {
    let digest = sha256(data);
    let file = dir.join(digest.replace(':', "-"));
    std::fs::write(&file, data).unwrap();
    let head = curl(
        reg,
        &[
            "-X",
            "POST",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("https://{}/v2/{repo}/blobs/uploads/", reg.host),
        ],
    );
    let head = String::from_utf8(head).unwrap();
    let location = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
        })
        .map(|(_, v)| v.trim().to_string())
        .expect("no Location");
    let sep = if location.contains('?') { '&' } else { '?' };
    let url = if location.starts_with("http") {
        location
    } else {
        format!("https://{}{location}", reg.host)
    };
    curl(
        reg,
        &[
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("{url}{sep}digest={digest}"),
        ],
    );
    digest
}

#[test]
fn a_module_pushed_to_a_registry_loads_by_digest_and_one_laid_out_as_oras_does_loads_too() {
    if !registry::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("registry")).unwrap();
    let reg = TestRegistry::start(&d.join("registry"));
    std::fs::write(d.join("hostile.wasm"), egress_test_modules::HOSTILE).unwrap();
    let with_registry = |c: &mut Command| {
        c.current_dir(d)
            .env("REGISTRY_AUTH_FILE", &reg.auth_file)
            .env("EGRESS_PROXIES_REGISTRY_CA", &reg.ca_file)
            .env("EGRESS_PROXIES_CACHE_DIR", d.join("cache"));
    };

    // Push: the reference by digest and the module's pin, ready to paste.
    let mut push = bin();
    push.args([
        "provider",
        "push",
        "hostile.wasm",
        &format!("oci://{}/egress/hostile:v1", reg.host),
    ]);
    with_registry(&mut push);
    let out = push.output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let module_line = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("module: "))
        .expect("no module: line")
        .to_string();
    assert!(
        module_line.starts_with(&format!("oci://{}/egress/hostile@sha256:", reg.host)),
        "{said}"
    );
    assert!(
        said.contains(&format!("sha256: {}", sha256(egress_test_modules::HOSTILE))),
        "{said}"
    );

    // What any client sees: the Wasm OCI artifact layout.
    let accept = "Accept: application/vnd.oci.image.manifest.v1+json";
    let manifest: serde_json::Value = serde_json::from_slice(&curl(
        &reg,
        &[
            "-H",
            accept,
            &format!("https://{}/v2/egress/hostile/manifests/v1", reg.host),
        ],
    ))
    .unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    let config: serde_json::Value = serde_json::from_slice(&curl(
        &reg,
        &[&format!(
            "https://{}/v2/egress/hostile/blobs/{}",
            reg.host,
            manifest["config"]["digest"].as_str().unwrap()
        )],
    ))
    .unwrap();
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip2");
    assert_eq!(
        config["layerDigests"][0],
        sha256(egress_test_modules::HOSTILE)
    );
    let exports: Vec<&str> = config["component"]["exports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        exports.iter().any(|e| e.starts_with("egress:provider/")),
        "{exports:?}"
    );

    // By hand, as `oras push REF module.wasm:application/wasm` lays it out: an empty config.
    let empty = upload(&reg, "egress/byhand", b"{}", d);
    let variant = egress_test_modules::hostile_variant(1);
    let layer = upload(&reg, "egress/byhand", &variant, d);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.unknown.artifact.v1",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2},
        "layers": [{"mediaType": "application/wasm", "digest": layer, "size": variant.len(),
                    "annotations": {"org.opencontainers.image.title": "module.wasm"}}],
    });
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    std::fs::write(d.join("manifest.json"), &manifest_bytes).unwrap();
    curl(
        &reg,
        &[
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            &format!("@{}", d.join("manifest.json").display()),
            &format!("https://{}/v2/egress/byhand/manifests/v1", reg.host),
        ],
    );
    let by_hand = format!(
        "oci://{}/egress/byhand@{}",
        reg.host,
        sha256(&manifest_bytes)
    );

    std::fs::write(
        d.join("proxies.yaml"),
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: crawlers}\nspec: {provider: cluster}\n",
    )
    .unwrap();
    for module in [module_line.as_str(), by_hand.as_str()] {
        std::fs::write(
            d.join("providers.yaml"),
            format!(
                "providers:\n- {{name: cluster, type: kubernetes}}\n- {{name: h, type: hostile, module: '{module}', config: {{mode: ok}}}}\n"
            ),
        )
        .unwrap();
        let mut dry_run = reconcile();
        with_registry(&mut dry_run);
        let out = dry_run.output().unwrap();
        assert!(
            out.status.success(),
            "{module}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "a plan");

        // Without the credentials: refused, naming the entry, the password nowhere.
        let mut anonymous = reconcile();
        anonymous
            .current_dir(d)
            .env("EGRESS_PROXIES_REGISTRY_CA", &reg.ca_file)
            .env("EGRESS_PROXIES_CACHE_DIR", d.join("cache-anonymous"))
            .env_remove("REGISTRY_AUTH_FILE");
        let out = anonymous.output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("providers[1].module"), "{err}");
        assert!(!err.contains(&reg.password), "{err}");
        assert!(out.stdout.is_empty(), "nothing planned");
    }
}
