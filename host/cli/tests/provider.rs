//! `provider test` and `provider new` through the binary: output formats and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
}

#[test]
fn provider_test_passes_a_builtin_and_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let block = dir.path().join("block.yaml");
    std::fs::write(&block, "image: docker.io/ubuntu/squid:6.10-24.10_beta\n").unwrap();
    let out = bin()
        .args([
            "provider",
            "test",
            "--type",
            "kubernetes",
            "-o",
            "json",
            "--config",
        ])
        .arg(&block)
        .env("EGRESS_PROXIES_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["type"], "kubernetes");
    assert!(
        report["cases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["outcome"] != "fail")
    );
}

#[test]
fn provider_test_exits_1_when_a_case_fails() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("hostile.wasm");
    std::fs::write(&module, egress_test_modules::HOSTILE).unwrap();
    let block = dir.path().join("block.yaml");
    std::fs::write(&block, "mode: ok\n").unwrap();
    let out = bin()
        .args(["provider", "test", "--module"])
        .arg(&module)
        .arg("--config")
        .arg(&block)
        .env("EGRESS_PROXIES_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL create/refuses-other-uid — "), "{text}");
}

#[test]
fn provider_new_writes_a_crate() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .current_dir(dir.path())
        .args(["provider", "new", "acme", "--sdk", "/opt/guest-sdk"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cargo = std::fs::read_to_string(dir.path().join("provider-acme/Cargo.toml")).unwrap();
    assert!(cargo.contains("guest-sdk = { path = \"/opt/guest-sdk\" }"));
}

/// `provider sign` with a key made by openssl, and a dry-run whose providers config requires
/// that key's signature: the signed module runs; unsigned, or signed by another key, the run
/// stops before anything is planned, naming the module.
#[test]
fn a_module_signed_with_an_openssl_key_runs_and_an_unsigned_one_is_refused() {
    let openssl = std::path::Path::new("/usr/bin/openssl");
    if !openssl.exists() {
        assert!(
            std::env::var_os("EGRESS_REQUIRE_REAL_BACKENDS").is_none(),
            "openssl is required (apt install openssl)"
        );
        eprintln!("skipped: no /usr/bin/openssl to make Ed25519 keys with");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sh = |args: &[&str]| {
        let out = Command::new(openssl)
            .args(args)
            .current_dir(d)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sh(&["genpkey", "-algorithm", "ed25519", "-out", "platform.pem"]);
    sh(&[
        "pkey",
        "-in",
        "platform.pem",
        "-pubout",
        "-out",
        "platform.pub",
    ]);
    sh(&["genpkey", "-algorithm", "ed25519", "-out", "stranger.pem"]);
    std::fs::write(d.join("hostile.wasm"), egress_test_modules::HOSTILE).unwrap();
    std::fs::write(
        d.join("providers.yaml"),
        "moduleVerification:\n  keys: [{name: platform, publicKeyFile: platform.pub}]\nproviders:\n- {name: cluster, type: kubernetes}\n- {name: h, type: hostile, module: hostile.wasm, config: {mode: ok}}\n",
    )
    .unwrap();
    std::fs::write(
        d.join("proxies.yaml"),
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: crawlers}\nspec: {provider: cluster}\n",
    )
    .unwrap();
    let dry_run = || {
        bin()
            .args([
                "reconcile",
                "--dry-run",
                "-f",
                "proxies.yaml",
                "--providers",
                "providers.yaml",
            ])
            .current_dir(d)
            .env("EGRESS_PROXIES_CACHE_DIR", d.join("cache"))
            .output()
            .unwrap()
    };
    let sign = |key: &str| {
        bin()
            .args(["provider", "sign", "hostile.wasm", "--key", key])
            .current_dir(d)
            .output()
            .unwrap()
    };

    let out = dry_run();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("providers[1].module") && err.contains("is not signed"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing planned");

    let out = sign("stranger.pem");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = dry_run();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("verified by no key, not by platform"), "{err}");

    let out = sign("platform.pem");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.starts_with("signed sha256:") && said.contains("hostile.wasm.sig"),
        "{said}"
    );
    let out = dry_run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("hostile.wasm.sig")).unwrap()).unwrap();
    assert_eq!(
        file["signatures"].as_array().map(Vec::len),
        Some(2),
        "both keys' signatures kept"
    );

    // A private key that is not one: a clear error, no file written over.
    std::fs::write(d.join("junk.pem"), "not a key").unwrap();
    let out = sign("junk.pem");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Ed25519 key in PEM"));
}

#[test]
fn record_and_replay_conflict_with_each_other_and_the_simulated_suites_flags() {
    let dir = tempfile::tempdir().unwrap();
    let block = dir.path().join("block.yaml");
    std::fs::write(&block, "{}\n").unwrap();
    for extra in [
        &["--replay", "b.json"][..],
        &["--world", "w.yaml"],
        &["--create-timeout", "1s"],
        &["-o", "json"],
    ] {
        let out = bin()
            .args(["provider", "test", "--type", "kvm2", "--record", "a.json"])
            .args(extra)
            .arg("--config")
            .arg(&block)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(
            stderr.contains("cannot be used with"),
            "{extra:?}: {stderr}"
        );
    }
    // --ready-timeout belongs to a recorded or replayed life.
    let out = bin()
        .args([
            "provider",
            "test",
            "--type",
            "kvm2",
            "--ready-timeout",
            "1m",
        ])
        .arg("--config")
        .arg(&block)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A tape that is not there is named.
    let missing = dir.path().join("missing.tape.json");
    let out = bin()
        .args(["provider", "test", "--type", "kvm2", "--replay"])
        .arg(&missing)
        .arg("--config")
        .arg(&block)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("error: tape {}: ", missing.display())),
        "{stderr}"
    );
}
