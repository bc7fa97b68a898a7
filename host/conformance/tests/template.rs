//! `provider new`: the generated crate is the template with its name substituted, and it
//! builds standalone for wasm32-wasip2 and passes the suite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_conformance::template::{self, FILES, STANDALONE_TAIL, TEMPLATE_SDK_PATH};
use egress_conformance::{BlockFile, ModuleSource, Suite};
use std::path::Path;

const TEMPLATE_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/provider-template"
);

#[test]
fn the_embedded_files_are_the_template_on_disk() {
    for (path, text) in FILES {
        let on_disk = std::fs::read_to_string(Path::new(TEMPLATE_DIR).join(path)).unwrap();
        assert_eq!(&on_disk, text, "{path} is stale: rebuild");
    }
}

#[test]
fn generated_files_are_the_template_with_the_name_substituted() {
    // With the template's own name and SDK path, only the standalone tail and the snapshot's
    // crate-relative source differ.
    let same = template::render("examplecloud", TEMPLATE_SDK_PATH).unwrap();
    for ((path, text), (tpath, ttext)) in same.iter().zip(FILES) {
        assert_eq!(path, tpath);
        let expected = match *tpath {
            "Cargo.toml" => format!("{ttext}{STANDALONE_TAIL}"),
            "src/snapshots/create_request.snap" => ttext.replace(
                "source: examples/provider-template/src/tests.rs",
                "source: src/tests.rs",
            ),
            _ => ttext.to_string(),
        };
        assert_eq!(text, &expected, "{path}");
    }

    let acme = template::render("acme-cloud", "/opt/egress/guest-sdk").unwrap();
    for ((path, text), (_, ttext)) in acme.iter().zip(FILES) {
        assert!(
            !text.contains("examplecloud"),
            "{path} still names the template"
        );
        if *path != "Cargo.toml" && *path != "src/snapshots/create_request.snap" {
            let expected = ttext
                .replace("provider_examplecloud", "provider_acme_cloud")
                .replace("examplecloud", "acme-cloud");
            assert_eq!(text, &expected, "{path}");
        }
    }
    let cargo = &acme[0].1;
    assert!(cargo.contains("name = \"provider-acme-cloud\""));
    assert!(cargo.contains("guest-sdk = { path = \"/opt/egress/guest-sdk\" }"));
    assert!(cargo.contains("\n[workspace]\n"));
}

#[test]
fn names_are_checked_and_a_crate_is_never_written_over_files() {
    assert!(template::render("Acme", "x").is_err());
    assert!(template::render("acme-", "x").is_err());
    assert!(template::render("9acme", "x").is_err());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
    assert!(template::write(dir.path(), "acme", "/sdk").is_err());
    let fresh = dir.path().join("provider-acme");
    let written = template::write(&fresh, "acme", "/sdk").unwrap();
    assert_eq!(written.len(), FILES.len());
    assert!(fresh.join("src/snapshots/create_request.snap").is_file());
}

#[test]
fn the_sdk_is_found_from_inside_the_repository() {
    let sdk = template::find_sdk(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    assert!(sdk.join("Cargo.toml").is_file());
}

/// A generated crate built on its own (its own workspace and lock file, the registry cache
/// offline) for wasm32-wasip2, its own native tests run (the request snapshot included), then
/// the module run through the suite. The build goes to a directory under
/// the workspace's target, so a second run compiles only the crate itself.
#[tokio::test]
async fn a_generated_crate_builds_standalone_and_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("provider-acme");
    let sdk = template::find_sdk(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    template::write(&krate, "acme", &sdk.display().to_string()).unwrap();
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/generated-provider");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(&cargo)
        .current_dir(&krate)
        .args([
            "build",
            "--target",
            "wasm32-wasip2",
            "--release",
            "--offline",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .unwrap();
    assert!(status.success());
    // Its own tests, natively, with the snapshot it ships: passing as generated.
    let tested = std::process::Command::new(&cargo)
        .current_dir(&krate)
        .args(["test", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .env("INSTA_UPDATE", "no")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .unwrap();
    assert!(tested.success(), "the generated crate's own tests fail");
    let wasm = target.join("wasm32-wasip2/release/provider_acme.wasm");
    let block = std::fs::read_to_string(krate.join("conformance.yaml")).unwrap();
    let report = Suite::new(
        ModuleSource::File(wasm),
        BlockFile::from_yaml(&block).unwrap(),
    )
    .run()
    .await
    .unwrap();
    assert!(!report.failed(), "{}", report.to_text());
}
