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
