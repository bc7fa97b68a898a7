//! The container image and the Deployment agree: the Deployment names the image the project
//! builds (its repository, tagged with the workspace version), runs it as the image's user, and
//! mounts an emptyDir where the image caches compiled modules; the Containerfile builds on the
//! pinned toolchain and lays the image out as examples/image/build.sh does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `name=value` at the start of a line of the build script.
fn script_var(name: &str) -> String {
    let script = read("examples/image/build.sh");
    let prefix = format!("{name}=");
    script
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("examples/image/build.sh sets no {name}"))
        .to_string()
}

/// The Containerfile's instructions of the final stage (after the last `FROM`), and its `ARG`s
/// before the first.
fn containerfile() -> (Vec<String>, Vec<String>) {
    let text = read("Containerfile");
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let first_from = lines.iter().position(|l| l.starts_with("FROM ")).unwrap();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    (lines[last_from..].to_vec(), lines[..first_from].to_vec())
}

fn deployment_container() -> (serde_yaml::Value, serde_yaml::Value) {
    let d: serde_yaml::Value =
        serde_yaml::from_str(&read("examples/deploy/deployment.yaml")).unwrap();
    let pod = d["spec"]["template"]["spec"].clone();
    let container = pod["containers"][0].clone();
    (pod, container)
}

#[test]
fn the_deployment_names_the_image_the_project_builds() {
    let image = format!("{}:{VERSION}", script_var("repository"));
    let (_, container) = deployment_container();
    assert_eq!(container["image"].as_str(), Some(image.as_str()));
    // The kustomization must not rename it.
    let k: serde_yaml::Value =
        serde_yaml::from_str(&read("examples/deploy/kustomization.yaml")).unwrap();
    assert!(
        k.get("images").is_none(),
        "kustomization.yaml overrides the image"
    );
    // Every mention of the image with a tag names this version.
    let repository = script_var("repository");
    for file in [
        "README.md",
        "Containerfile",
        "examples/deploy/deployment.yaml",
    ] {
        let text = read(file);
        for (at, _) in text.match_indices(&format!("{repository}:")) {
            let tag: String = text[at + repository.len() + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || ".-_".contains(*c))
                .collect();
            assert_eq!(tag, VERSION, "{file} names {repository}:{tag}");
        }
    }
}

#[test]
fn the_deployment_runs_the_image_as_built() {
    let (pod, container) = deployment_container();
    let (stage, _) = containerfile();
    let uid: u64 = script_var("uid").parse().unwrap();
    assert!(stage.contains(&format!("USER {uid}:{uid}")), "{stage:?}");
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(uid));
    assert_eq!(pod["securityContext"]["runAsGroup"].as_u64(), Some(uid));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );

    let bin = script_var("bin_path");
    assert!(
        stage.contains(&format!("ENTRYPOINT [\"{bin}\"]")),
        "{stage:?}"
    );
    assert_eq!(
        container.get("command"),
        None,
        "the Deployment must run the entrypoint"
    );

    // The module cache: the image's environment names it, the Deployment sets the same and
    // mounts an emptyDir there (the root filesystem is read-only).
    let cache = script_var("cache_path");
    assert!(
        stage.contains(&format!("ENV EGRESS_PROXIES_CACHE_DIR={cache}")),
        "{stage:?}"
    );
    let env = container["env"].as_sequence().unwrap();
    let set = env
        .iter()
        .find(|e| e["name"] == "EGRESS_PROXIES_CACHE_DIR")
        .and_then(|e| e["value"].as_str());
    assert_eq!(set, Some(cache.as_str()));
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(cache.as_str()))
        .expect("no volume mounted at the cache directory");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(volume.get("emptyDir").is_some(), "{volume:?}");
}

#[test]
fn the_containerfile_builds_on_the_pinned_toolchain() {
    let toolchain = read("rust-toolchain.toml");
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .unwrap()
        .trim_matches('"');
    let (stage, args) = containerfile();
    assert!(
        args.contains(&format!("ARG RUST_VERSION={channel}")),
        "the Containerfile's RUST_VERSION is not rust-toolchain.toml's {channel}: {args:?}"
    );
    let text = read("Containerfile");
    let target = script_var("target");
    assert!(text.contains(&format!("rustup target add wasm32-wasip2 {target}")));
    assert!(text.contains(&format!(
        "cargo build --release --locked -p egress-proxies --no-default-features --target {target}"
    )));
    assert_eq!(stage[0], "FROM scratch");
}
