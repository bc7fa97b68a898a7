//! Two provider entries that give the same host name their own connection details, against
//! the real libvirtd behind the real sshd of tests/libvirt-ssh/setup.sh: each entry dials with
//! its own known_hosts, whichever loads last. Skips without the env file of setup.sh, unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::libvirt_env;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

fn entry(name: &str, env: &HashMap<String, String>, known_hosts: &str) -> String {
    format!(
        r#"  - name: {name}
    type: kvm2
    kvm2:
      sshKeyFile: {key}
      knownHostsFile: {known_hosts}
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 128}}
      hosts:
        - {{name: lab1, address: "{addr}", user: {user}, socket: {socket}, pool: {pool}}}
"#,
        key = env["LIBVIRT_SSH_KEY"],
        addr = format_args!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
        user = env["LIBVIRT_SSH_USER"],
        socket = env["LIBVIRT_SOCKET"],
        pool = env["LIBVIRT_POOL"],
    )
}

/// `check -o json` of a providers file: the reason of each entry's only target.
fn check(dir: &Path, providers: &str) -> HashMap<String, serde_json::Value> {
    let file = dir.join("providers.yaml");
    std::fs::write(&file, providers).unwrap();
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(["check", "--providers", file.to_str().unwrap(), "-o", "json"])
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reports: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "check -o json: {e}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let targets = r["targets"].as_array().unwrap();
            assert_eq!(targets.len(), 1, "{r:#}");
            assert_eq!(targets[0]["target"], "lab1", "{r:#}");
            (
                r["provider"].as_str().unwrap().to_string(),
                targets[0].clone(),
            )
        })
        .collect()
}

#[test]
fn each_entry_dials_a_shared_host_name_with_its_own_known_hosts() {
    let Some(env) = libvirt_env() else { return };
    let dir = tempfile::tempdir().unwrap();
    let right = entry("lab", &env, &env["LIBVIRT_SSH_KNOWN_HOSTS"]);
    let wrong = entry("stranger", &env, &env["LIBVIRT_SSH_WRONG_KNOWN_HOSTS"]);
    for (order, text) in [
        (
            "right first",
            format!("installation: t\nproviders:\n{right}{wrong}"),
        ),
        (
            "wrong first",
            format!("installation: t\nproviders:\n{wrong}{right}"),
        ),
    ] {
        let by_entry = check(dir.path(), &text);
        assert_eq!(
            by_entry["lab"]["reason"], "Healthy",
            "{order}: {by_entry:#?}"
        );
        let refused = &by_entry["stranger"];
        assert_eq!(refused["reason"], "Unauthorized", "{order}: {by_entry:#?}");
        let message = refused["message"].as_str().unwrap().to_lowercase();
        assert!(
            message.contains("host key") || message.contains("host-key"),
            "{order}: the refusal names the host key: {refused:#}"
        );
    }
}
