//! The suite against every built-in module, the provider template and a module that breaks
//! the contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_conformance::{BlockFile, ModuleSource, Outcome, Report, Suite};
use std::time::Duration;

async fn run(module: &'static [u8], type_name: &str, block: &str) -> Report {
    run_source(ModuleSource::Embedded(module), Some(type_name), block).await
}

/// A module that is not built in is loaded from a file, as `--module` does.
async fn run_file(module: &[u8], block: &str) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("provider.wasm");
    std::fs::write(&path, module).unwrap();
    run_source(ModuleSource::File(path), None, block).await
}

async fn run_source(module: ModuleSource, type_name: Option<&str>, block: &str) -> Report {
    let mut suite = Suite::new(module, BlockFile::from_yaml(block).unwrap());
    suite.type_name = type_name.map(str::to_string);
    suite.create_timeout = Duration::from_secs(2);
    let report = suite.run().await.unwrap();
    println!("{}", report.to_text());
    report
}

fn assert_passes(report: &Report) {
    assert!(!report.failed(), "{}", report.to_text());
}

/// The module listed in pages of the size asked (not one page of everything).
fn assert_pages(report: &Report) {
    let c = case(report, "list-by-tag/pages");
    assert_eq!(c.outcome, Outcome::Pass, "{}", report.to_text());
    assert!(c.message.contains("listed once each in"), "{}", c.message);
}

const KVM_BLOCK: &str = r#"
sshKeyFile: /etc/egress-proxies/kvm/id_ed25519
insecureIgnoreHostKey: true
images:
  debian-12:
    url: https://images.example.com/debian-12-genericcloud-amd64.qcow2
    sha256: 8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b
    format: qcow2
    firmware: uefi
machineTypes:
  small: {vcpus: 1, memoryMiB: 1024}
hosts:
  - {name: rack1, address: 192.0.2.10:22, user: egress, pool: default, bridge: br0}
  - {name: rack2, address: 192.0.2.11:22, user: egress, pool: default, bridge: br0}
conformance:
  placement: {zone: rack1, machineType: small, image: debian-12}
"#;

#[tokio::test]
async fn kubernetes_passes() {
    let r = run(
        egress_builtins::KUBERNETES,
        "kubernetes",
        "image: docker.io/ubuntu/squid:6.10-24.10_beta\nallowedSourceCIDRs: [10.0.0.0/8]\n",
    )
    .await;
    assert_passes(&r);
    assert_pages(&r);
}

#[tokio::test]
async fn kvm2_passes() {
    let r = run(egress_builtins::LIBVIRT, "kvm2", KVM_BLOCK).await;
    assert_passes(&r);
    assert_pages(&r);
    assert_eq!(r.count(Outcome::Skip), 0, "{}", r.to_text());
}

#[tokio::test]
async fn kvm_passes() {
    let r = run(egress_builtins::LIBVIRT, "kvm", KVM_BLOCK).await;
    assert_passes(&r);
    assert_pages(&r);
}

#[tokio::test]
async fn gcp_passes() {
    let r = run(
        egress_builtins::GCP,
        "gcp",
        "project: example-proxies\nconformance:\n  placement: {zone: europe-west1-b, machineType: e2-small, image: projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64}\n",
    )
    .await;
    assert_passes(&r);
    assert_pages(&r);
    assert_eq!(r.count(Outcome::Skip), 0, "{}", r.to_text());
}

#[tokio::test]
async fn the_template_passes() {
    let r = run_file(
        egress_test_modules::EXAMPLE_TEMPLATE,
        include_str!("../../../examples/provider-template/conformance.yaml"),
    )
    .await;
    assert_passes(&r);
    assert_pages(&r);
    assert_eq!(r.count(Outcome::Skip), 0, "{}", r.to_text());
}

/// A module built against the first released contract still loads and passes: 0.1.1 and
/// 0.1.2 only added to 0.1.0 (see tests/fixtures/README.md). It has no `listing`, so the host
/// lists it through list-by-tag, in one page whatever page size is asked.
#[tokio::test]
async fn a_module_built_against_contract_0_1_0_still_passes() {
    let r = run_file(
        include_bytes!("fixtures/examplecloud-contract-0.1.0.wasm"),
        include_str!("../../../examples/provider-template/conformance.yaml"),
    )
    .await;
    assert_passes(&r);
    assert_eq!(r.count(Outcome::Skip), 0, "{}", r.to_text());
    let pages = case(&r, "list-by-tag/pages");
    assert!(
        pages
            .message
            .contains("in one page: the module predates `listing`"),
        "{}",
        pages.message
    );
}

#[tokio::test]
async fn a_module_that_never_adopts_correctly_fails() {
    let r = run_file(egress_test_modules::HOSTILE, "mode: ok\n").await;
    assert!(r.failed(), "{}", r.to_text());
    let failed: Vec<&str> = r
        .cases
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| c.name.as_str())
        .collect();
    for case in [
        "validate-config/unknown-field",
        "create/returns-gettable-id",
        "create/refuses-other-uid",
        "get/unknown-is-not-found",
    ] {
        assert!(
            failed.contains(&case),
            "{case} should fail:\n{}",
            r.to_text()
        );
    }
}

fn case<'r>(r: &'r Report, name: &str) -> &'r egress_conformance::CaseResult {
    r.cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}:\n{}", r.to_text()))
}

#[tokio::test]
async fn a_module_that_returns_its_cloud_init_in_the_instance_fails_the_secrets_case() {
    let r = run_file(egress_test_modules::HOSTILE, "mode: echo\n").await;
    let c = case(&r, "secrets/cloud-init-not-leaked");
    assert_eq!(c.outcome, Outcome::Fail, "{}", r.to_text());
    assert!(c.message.contains("appeared in"), "{}", c.message);
}

#[tokio::test]
async fn a_module_that_logs_its_cloud_init_is_redacted_by_the_host() {
    // The host redacts every log line and error of a create, so the leak never lands.
    let r = run_file(egress_test_modules::HOSTILE, "mode: leak\n").await;
    let c = case(&r, "secrets/cloud-init-not-leaked");
    assert_eq!(c.outcome, Outcome::Pass, "{}", r.to_text());
}
