//! The CLI's state file: each Proxy's status, written after every change (to a temporary file
//! renamed into place) so an interrupted run loses nothing, and read back so a Proxy removed
//! from the proxies file is deleted on the next run.

use egress_core::{Proxy, ProxyStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StateFile {
    pub installation: String,
    #[serde(default)]
    pub proxies: BTreeMap<String, StoredProxy>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoredProxy {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    pub provider: String,
    pub status: ProxyStatus,
}

impl StateFile {
    pub fn read(path: &Path) -> Result<Self, crate::CliError> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_yaml::from_str(&text).map_err(|e| crate::CliError::Input {
                what: format!("state file {}", path.display()),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(crate::CliError::Input {
                what: format!("state file {}", path.display()),
                message: e.to_string(),
            }),
        }
    }

    pub fn record(&mut self, key: &str, released: bool, proxy: &Proxy, status: &ProxyStatus) {
        if released {
            self.proxies.remove(key);
        } else {
            self.proxies.insert(
                key.to_string(),
                StoredProxy {
                    key: key.to_string(),
                    uid: proxy.uid(),
                    provider: proxy.spec.provider.clone(),
                    status: status.clone(),
                },
            );
        }
    }

    pub fn write(&self, path: &Path) -> Result<(), crate::CliError> {
        let err = |e: String| crate::CliError::Output {
            what: format!("state file {}", path.display()),
            message: e,
        };
        let text = serde_yaml::to_string(self).map_err(|e| err(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }
}
