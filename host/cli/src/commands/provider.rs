//! `provider test` and `provider new`: the conformance suite and the provider template, wired
//! to the command line.

use crate::cli::{
    ProviderNewArgs, ProviderPushArgs, ProviderSignArgs, ProviderTestArgs, TestFormat,
};
use egress_conformance::{
    BlockFile, Lifecycle, LifecycleError, LifecycleReport, ModuleSource, Suite, SuiteError,
    TapeMode, template,
};
use egress_control::world::World;
use egress_runtime::RuntimeOptions;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum ProviderCmdError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--type {0:?} has no built-in module; pass the module with --module")]
    UnknownType(String),
    #[error("{path}: {source}")]
    Suite {
        path: PathBuf,
        #[source]
        source: SuiteError,
    },
    #[error("world {path}: {source}")]
    World {
        path: PathBuf,
        #[source]
        source: egress_core::config::ConfigError,
    },
    #[error(transparent)]
    Conformance(#[from] SuiteError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Template(#[from] template::TemplateError),
    #[error("no guest-sdk found above the current directory; name it with --sdk PATH")]
    NoSdk,
    #[error("current directory: {0}")]
    Cwd(#[source] std::io::Error),
    #[error("{0}")]
    Reference(String),
    #[error(transparent)]
    Registry(#[from] egress_supply::oci::OciError),
}

fn read(path: &PathBuf) -> Result<String, ProviderCmdError> {
    std::fs::read_to_string(path).map_err(|source| ProviderCmdError::Read {
        path: path.clone(),
        source,
    })
}

/// The block file and the module of `provider test`.
fn block_and_module(a: &ProviderTestArgs) -> Result<(BlockFile, ModuleSource), ProviderCmdError> {
    let block =
        BlockFile::from_yaml(&read(&a.config)?).map_err(|source| ProviderCmdError::Suite {
            path: a.config.clone(),
            source,
        })?;
    let module = match (&a.module, &a.type_name) {
        (Some(path), _) => ModuleSource::File(path.clone()),
        (None, Some(t)) => ModuleSource::Embedded(
            egress_builtins::module_for_type(t)
                .ok_or_else(|| ProviderCmdError::UnknownType(t.clone()))?,
        ),
        (None, None) => return Err(ProviderCmdError::UnknownType(String::new())),
    };
    Ok((block, module))
}

/// `--record FILE` or `--replay FILE`: one instance's life against the real backends, its
/// calls written to the tape, or against the tape alone.
pub async fn test_tape(
    a: &ProviderTestArgs,
    mode: TapeMode,
) -> Result<LifecycleReport, ProviderCmdError> {
    let (block, module) = block_and_module(a)?;
    let run = Lifecycle {
        module,
        type_name: a.type_name.clone(),
        block,
        runtime: RuntimeOptions {
            max_concurrent_calls: 8,
            ..RuntimeOptions::default()
        },
        ready_timeout: a.ready_timeout,
        mode,
    };
    Ok(run.run().await?)
}

/// Runs the suite; the rendered report and whether a case failed.
pub async fn test(a: ProviderTestArgs) -> Result<(String, bool), ProviderCmdError> {
    let (block, module) = block_and_module(&a)?;
    let world = match &a.world {
        Some(path) => {
            Some(
                World::from_yaml(&read(path)?).map_err(|source| ProviderCmdError::World {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let mut suite = Suite::new(module, block);
    suite.type_name = a.type_name.clone();
    suite.world = world;
    suite.create_timeout = a.create_timeout;
    suite.runtime = RuntimeOptions {
        max_concurrent_calls: 8,
        ..RuntimeOptions::default()
    };
    let report = suite.run().await?;
    let text = match a.output {
        TestFormat::Text => report.to_text(),
        TestFormat::Json => report.to_json(),
    };
    Ok((text, report.failed()))
}

/// Writes the crate; what was written and what to do next.
pub fn new(a: ProviderNewArgs) -> Result<String, ProviderCmdError> {
    let cwd = std::env::current_dir().map_err(ProviderCmdError::Cwd)?;
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("provider-{}", a.name)));
    let dir = if dir.is_absolute() {
        dir
    } else {
        cwd.join(dir)
    };
    let sdk = match a.sdk {
        Some(p) if p.is_absolute() => p,
        Some(p) => cwd.join(p),
        None => template::find_sdk(&cwd).ok_or(ProviderCmdError::NoSdk)?,
    };
    let sdk = std::path::absolute(&sdk).unwrap_or(sdk);
    let written = template::write(&dir, &a.name, &sdk.display().to_string())?;
    let lib = format!("provider_{}", a.name.replace('-', "_"));
    Ok(format!(
        "wrote {} files to {}\n\nnext:\n  cd {}\n  cargo test\n  cargo build --target wasm32-wasip2 --release\n  egress-proxies provider test --module target/wasm32-wasip2/release/{lib}.wasm --config conformance.yaml\n",
        written.len(),
        dir.display(),
        dir.display(),
    ))
}

/// Runs `provider test`, printing the report: exit code 1 when a case failed or on an error.
/// With `--record` or `--replay`, prints the plan (what happened to stderr): exit code 1 when
/// the life failed, a replay on the first call its tape lacks.
pub async fn test_command(a: ProviderTestArgs) -> ExitCode {
    let mode = match (&a.record, &a.replay) {
        (Some(p), _) => Some(TapeMode::Record(p.clone())),
        (None, Some(p)) => Some(TapeMode::Replay(p.clone())),
        (None, None) => None,
    };
    if let Some(mode) = mode {
        return match test_tape(&a, mode).await {
            Ok(report) => {
                print!("{}", report.plan_json());
                for line in &report.log {
                    eprintln!("{line}");
                }
                match report.failure {
                    None => ExitCode::SUCCESS,
                    Some(f) => super::failed(f),
                }
            }
            Err(e) => super::failed(e),
        };
    }
    match test(a).await {
        Ok((text, failed)) => {
            print!("{text}");
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => super::failed(e),
    }
}

/// Runs `provider new`, printing what it wrote: exit code 1 on an error.
pub fn new_command(a: ProviderNewArgs) -> ExitCode {
    match new(a) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => super::failed(e),
    }
}

/// Runs `provider sign`, printing the signature file written and the digest signed: exit code
/// 1 on an error.
pub fn sign_command(a: ProviderSignArgs) -> ExitCode {
    match egress_supply::sign_file(&a.module, &a.key) {
        Ok((path, digest)) => {
            println!("signed {digest}: {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::failed(e),
    }
}

/// Pushes a module (and its signature file, when there is one) and says what to write in a
/// providers config.
pub async fn push(a: ProviderPushArgs) -> Result<String, ProviderCmdError> {
    use egress_core::config::ModuleRef;
    let to = match ModuleRef::parse(&a.reference) {
        Ok(ModuleRef::Oci(r)) => r,
        Ok(ModuleRef::File(_)) => {
            return Err(ProviderCmdError::Reference(format!(
                "{:?} is not an oci:// reference",
                a.reference
            )));
        }
        Err(why) => return Err(ProviderCmdError::Reference(why)),
    };
    let module = std::fs::read(&a.module).map_err(|source| ProviderCmdError::Read {
        path: a.module.clone(),
        source,
    })?;
    let sig_path = egress_supply::signature_path(&a.module);
    let signature = match std::fs::read(&sig_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ProviderCmdError::Read {
                path: sig_path,
                source,
            });
        }
    };
    let registry = egress_supply::oci::Registry::new(RuntimeOptions::default().registry)?;
    let pushed = registry.push(&module, signature.as_deref(), &to).await?;
    let mut out = format!("pushed {} as {}\n", a.module.display(), pushed.reference);
    if let Some(tag) = &pushed.signature_tag {
        out.push_str(&format!("pushed {} as tag {tag}\n", sig_path.display()));
    }
    out.push_str(&format!(
        "\nin a providers config:\n  module: {}\n  sha256: {}\n",
        pushed.reference, pushed.module_digest
    ));
    Ok(out)
}

/// Runs `provider push`: exit code 1 on an error.
pub async fn push_command(a: ProviderPushArgs) -> ExitCode {
    match push(a).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => super::failed(e),
    }
}
