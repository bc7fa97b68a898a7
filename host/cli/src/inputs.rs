//! What a run reads: where each input comes from, the proxies file parsed into Proxies and
//! ProxyPools (errors naming the document and the field), the providers config, and the pools
//! checked against that config.

use crate::error::CliError;
use egress_core::Proxy;
use egress_core::config::ProvidersConfig;
use std::path::{Path, PathBuf};

/// Where the inputs of a run come from: files, or the examples embedded in the binary.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Embedded(&'static str, &'static str),
}

impl Source {
    pub(crate) fn read(&self) -> Result<(String, String), CliError> {
        match self {
            Source::File(p) => std::fs::read_to_string(p)
                .map(|t| (t, p.display().to_string()))
                .map_err(|e| CliError::Input {
                    what: p.display().to_string(),
                    message: e.to_string(),
                }),
            Source::Embedded(name, text) => Ok((text.to_string(), format!("embedded {name}"))),
        }
    }

    pub(crate) fn dir(&self) -> PathBuf {
        match self {
            Source::File(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
            Source::Embedded(..) => PathBuf::from("."),
        }
    }
}

/// What a proxies file holds: Proxies and ProxyPools.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub proxies: Vec<Proxy>,
    pub pools: Vec<egress_core::pool::ProxyPool>,
}

/// Parses a proxies file of Proxies only (see [`parse_inputs`]).
pub fn parse_proxies(text: &str, what: &str) -> Result<Vec<Proxy>, CliError> {
    let inputs = parse_inputs(text, what)?;
    if let Some(p) = inputs.pools.first() {
        return Err(CliError::Input {
            what: what.to_string(),
            message: format!(
                "ProxyPool {}/{} is not expected here",
                p.metadata.namespace, p.metadata.name
            ),
        });
    }
    Ok(inputs.proxies)
}

/// Parses a proxies file: one or more YAML documents, each a Proxy or a ProxyPool. Errors
/// name the document and the field.
pub fn parse_inputs(text: &str, what: &str) -> Result<Inputs, CliError> {
    let mut out: Vec<Proxy> = Vec::new();
    let mut pools: Vec<egress_core::pool::ProxyPool> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).map_err(|e| {
            CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: e.to_string(),
            }
        })?;
        if value.is_null() {
            continue;
        }
        if value.get("kind").and_then(|k| k.as_str()) == Some(egress_core::pool::KIND) {
            let pool: egress_core::pool::ProxyPool = serde_path_to_error::deserialize(value)
                .map_err(|e| CliError::Input {
                    what: format!("{what} document {}", i + 1),
                    message: format!("{}: {}", e.path(), e.inner()),
                })?;
            let key = format!("{}/{}", pool.metadata.namespace, pool.metadata.name);
            if let Some(p) = egress_core::pool::validate(&pool).first() {
                return Err(CliError::Input {
                    what: format!("{what} document {} (ProxyPool {key})", i + 1),
                    message: p.clone(),
                });
            }
            if pools.iter().any(|o| {
                o.metadata.namespace == pool.metadata.namespace
                    && o.metadata.name == pool.metadata.name
            }) {
                return Err(CliError::Input {
                    what: format!("{what} document {}", i + 1),
                    message: format!("ProxyPool {key} appears twice"),
                });
            }
            pools.push(pool);
            continue;
        }
        let proxy: Proxy =
            serde_path_to_error::deserialize(value).map_err(|e| CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: match egress_core::config::error_path(e.path()).as_str() {
                    "" => e.inner().to_string(),
                    path => format!("{path}: {}", e.inner()),
                },
            })?;
        let problems = egress_core::proxy::validate(&proxy);
        if let Some(p) = problems.first() {
            return Err(CliError::Input {
                what: format!("{what} document {} ({})", i + 1, proxy.key()),
                message: p.clone(),
            });
        }
        // The derived UID is a digest: worked out once here, not at every use.
        let mut proxy = proxy;
        if proxy.metadata.uid.is_none() {
            proxy.metadata.uid = Some(proxy.uid());
        }
        let key = proxy.key();
        if !seen.insert(key.clone()) {
            return Err(CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: format!("Proxy {key} appears twice"),
            });
        }
        out.push(proxy);
    }
    Ok(Inputs {
        proxies: out,
        pools,
    })
}

pub(crate) fn load_config(src: &Source) -> Result<(ProvidersConfig, String), CliError> {
    let (text, what) = src.read()?;
    let mut cfg = ProvidersConfig::from_yaml(&text).map_err(|source| CliError::Config {
        what: what.clone(),
        source,
    })?;
    cfg.resolve_files(&src.dir());
    Ok((cfg, what))
}

/// The image URLs the Proxies and pools of a run name, for the world a config describes.
pub(crate) fn image_urls(inputs: &Inputs) -> Vec<String> {
    inputs
        .proxies
        .iter()
        .filter_map(|p| p.spec.placement.image.clone())
        .chain(inputs.pools.iter().flat_map(|p| {
            p.spec
                .placements
                .iter()
                .filter_map(|pl| pl.image.clone())
                .chain(p.spec.template.placement.image.clone())
        }))
        .collect()
}

/// Checks each ProxyPool against the providers config it will run with and the run's bound
/// on replicas (`--max-replicas`): no more replicas than that, its placements name providers
/// the config has, and its rotation leaves a member time to serve. Errors name the pool and
/// the field.
pub fn check_pools(
    inputs: &Inputs,
    cfg: &ProvidersConfig,
    what: &str,
    max_replicas: u32,
) -> Result<(), CliError> {
    let providers: Vec<String> = cfg.providers.iter().map(|p| p.name.clone()).collect();
    let startup_timeout = cfg
        .egress_check
        .as_ref()
        .map(|c| egress_core::egress::Settings::from_config(c).startup_timeout);
    for pool in &inputs.pools {
        let problems = egress_core::pool::validate_in(
            pool,
            egress_core::pool::Environment {
                providers: &providers,
                startup_timeout,
                max_replicas,
            },
        );
        if let Some(p) = problems.first() {
            return Err(CliError::Input {
                what: format!(
                    "{what} (ProxyPool {}/{})",
                    pool.metadata.namespace, pool.metadata.name
                ),
                message: p.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn message(text: &str) -> String {
        match parse_proxies(text, "p.yaml") {
            Err(CliError::Input { message, .. }) => message,
            other => panic!("{other:?}"),
        }
    }

    /// A relative `egressCheck.tls.caFile` is found beside the providers file, as its
    /// modules are, whatever directory the process runs in; an absolute one stays.
    #[test]
    fn a_relative_ca_file_is_found_beside_the_providers_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("providers.yaml");
        let block = |ca: &str| {
            format!(
                "egressCheck: {{urls: ['http://198.51.100.1/', 'https://198.51.100.1/'], tls: {{caFile: {ca}}}}}\nproviders: []\n"
            )
        };
        let ca_of = |cfg: &ProvidersConfig| {
            cfg.egress_check
                .as_ref()
                .unwrap()
                .tls
                .as_ref()
                .unwrap()
                .ca_file
                .clone()
                .unwrap()
        };
        std::fs::write(&path, block("certs/ca.pem")).unwrap();
        let (cfg, _) = load_config(&Source::File(path.clone())).unwrap();
        assert_eq!(
            ca_of(&cfg),
            dir.path().join("certs/ca.pem").display().to_string()
        );
        std::fs::write(&path, block("/etc/echo/ca.pem")).unwrap();
        let (cfg, _) = load_config(&Source::File(path)).unwrap();
        assert_eq!(ca_of(&cfg), "/etc/echo/ca.pem");
    }

    /// A document that is not a manifest at all is named without a path (not `.`), a field by
    /// its path, and a key spelt `.` as itself.
    #[test]
    fn parse_errors_name_the_field_or_nothing_for_the_document() {
        assert_eq!(
            message("- a\n"),
            "invalid type: sequence, expected struct Proxy"
        );
        let m = message(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: p}\nspec: {provider: p, port: -1}\n",
        );
        assert!(m.starts_with("spec.port: "), "{m}");
        let m = message("'.': x\n");
        assert!(m.starts_with(".: unknown field `.`"), "{m}");
    }
}
