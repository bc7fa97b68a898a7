//! `provider new`: a guest crate from examples/provider-template, the placeholder name
//! `examplecloud` replaced. The template's files are embedded, so the binary generates the
//! same crate the workspace builds and tests.

use std::path::{Path, PathBuf};

/// The template's name, replaced by the new provider's everywhere.
pub const PLACEHOLDER: &str = "examplecloud";
/// How the template, as a workspace member, reaches the SDK.
pub const TEMPLATE_SDK_PATH: &str = "../../guest-sdk";

/// The template's files: path in the crate, contents.
pub const FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../examples/provider-template/Cargo.toml"),
    ),
    (
        "README.md",
        include_str!("../../../examples/provider-template/README.md"),
    ),
    (
        "providers.yaml",
        include_str!("../../../examples/provider-template/providers.yaml"),
    ),
    (
        "conformance.yaml",
        include_str!("../../../examples/provider-template/conformance.yaml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../examples/provider-template/src/lib.rs"),
    ),
    (
        "src/config.rs",
        include_str!("../../../examples/provider-template/src/config.rs"),
    ),
    (
        "src/api.rs",
        include_str!("../../../examples/provider-template/src/api.rs"),
    ),
    (
        "src/tests.rs",
        include_str!("../../../examples/provider-template/src/tests.rs"),
    ),
    (
        "src/snapshots/create_request.snap",
        include_str!("../../../examples/provider-template/src/snapshots/create_request.snap"),
    ),
];

/// Appended to the generated Cargo.toml: the crate is its own workspace, so it builds outside
/// this repository, with the size settings the built-in guests use.
pub const STANDALONE_TAIL: &str = r#"
# Its own workspace: the crate builds on its own, outside the egress-proxies repository.
[workspace]

# The module is compiled at load; small is fast.
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
panic = "abort"
"#;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "{0:?} is not a provider name: 1-40 of [a-z0-9-], starting with a letter, not ending with '-'"
    )]
    Name(String),
    #[error("{0} exists and is not empty")]
    Exists(PathBuf),
    #[error("the guest SDK path {0:?} contains a quote or a newline")]
    SdkPath(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub fn check_name(name: &str) -> Result<(), TemplateError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 40
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(TemplateError::Name(name.to_string()))
    }
}

/// The crate's files for provider `name`, depending on the guest SDK at `sdk` (a path as
/// written in Cargo.toml, relative to the new crate or absolute).
///
/// Every file is the template's with `provider_examplecloud` (the library's name) replaced by
/// `provider_<name with _>` and then `examplecloud` by `name`; Cargo.toml also has the SDK
/// path replaced and [`STANDALONE_TAIL`] appended; the snapshot's `source:` is crate-relative.
pub fn render(name: &str, sdk: &str) -> Result<Vec<(String, String)>, TemplateError> {
    check_name(name)?;
    if sdk.contains(['"', '\n', '\\']) {
        return Err(TemplateError::SdkPath(sdk.to_string()));
    }
    let lib_name = format!("provider_{}", name.replace('-', "_"));
    Ok(FILES
        .iter()
        .map(|(path, text)| {
            let mut text = text
                .replace(&format!("provider_{PLACEHOLDER}"), &lib_name)
                .replace(PLACEHOLDER, name);
            match *path {
                "Cargo.toml" => {
                    text = text.replace(
                        &format!("path = \"{TEMPLATE_SDK_PATH}\""),
                        &format!("path = \"{sdk}\""),
                    );
                    text.push_str(STANDALONE_TAIL);
                }
                "src/snapshots/create_request.snap" => {
                    text = text.replace(
                        "source: examples/provider-template/src/tests.rs",
                        "source: src/tests.rs",
                    );
                }
                _ => {}
            }
            (path.to_string(), text)
        })
        .collect())
}

/// Writes the crate into `dir` (created; it must not exist or be empty).
pub fn write(dir: &Path, name: &str, sdk: &str) -> Result<Vec<PathBuf>, TemplateError> {
    let files = render(name, sdk)?;
    if dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        return Err(TemplateError::Exists(dir.to_path_buf()));
    }
    let mut written = Vec::new();
    for (path, text) in files {
        let full = dir.join(&path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TemplateError::Write {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&full, text).map_err(|source| TemplateError::Write {
            path: full.clone(),
            source,
        })?;
        written.push(full);
    }
    Ok(written)
}

/// This repository's guest-sdk when `start` is inside a checkout of it: the nearest ancestor
/// with `guest-sdk/Cargo.toml` and the contract next to it.
pub fn find_sdk(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let sdk = dir.join("guest-sdk");
        (sdk.join("Cargo.toml").is_file() && dir.join("schemas/wit/provider.wit").is_file())
            .then_some(sdk)
    })
}
