//! Where each Proxy's credential lives: made when its first instance is created, kept for the
//! Proxy's life (keyed by its UID, so a Proxy deleted and made again under the same name gets
//! a new one), read by the egress check and by discovery. The operator keeps them in a Secret
//! per Proxy; the CLI in a file beside its state ([`FileCredentials`]); a dry-run in memory.

use egress_core::Proxy;
use egress_core::credential::ProxyCredential;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A Proxy's credential, made on first use.
#[async_trait::async_trait]
pub trait CredentialSource: Send + Sync {
    /// The credential of `proxy`, made and stored if it has none. The error names what
    /// failed, never a password.
    async fn credential(&self, proxy: &Proxy) -> Result<ProxyCredential, String>;

    /// Forgets the credentials of every Proxy whose UID is not in `keep`, where the store
    /// is one a run owns (the CLI's file); a store shared with others ignores it.
    fn retain(&self, _keep: &std::collections::BTreeSet<String>) -> Result<(), String> {
        Ok(())
    }

    /// The htpasswd line of `credential` for a create of `proxy`: under a fresh salt.
    fn htpasswd(&self, _proxy: &Proxy, credential: &ProxyCredential) -> Option<String> {
        egress_runtime::capabilities::credentials::htpasswd(credential)
    }
}

/// A dry-run's: each Proxy's credential and salt derived from its UID, so a plan (which
/// records the bytes a seed volume holds by their digest) is the same on every run. Never
/// for proxies that exist: anyone who knows a UID knows the password.
///
/// Each htpasswd line is made once per Proxy and password, at crypt's fewest rounds (a password
/// derived from a UID gains nothing from more): the same UID and password give the same line,
/// and a create tried again (after a fault, or a kvm image still coming) asks for it again.
#[derive(Default)]
pub struct SimulatedCredentials {
    /// By UID: the password the line was made for, and the line.
    lines: Mutex<std::collections::HashMap<String, (String, String)>>,
}

fn derived<const N: usize>(what: &str, uid: &str) -> [u8; N] {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{what}/{uid}").as_bytes());
    let mut out = [0u8; N];
    for (o, d) in out.iter_mut().zip(digest.iter().cycle()) {
        *o = *d;
    }
    out
}

#[async_trait::async_trait]
impl CredentialSource for SimulatedCredentials {
    async fn credential(&self, proxy: &Proxy) -> Result<ProxyCredential, String> {
        Ok(ProxyCredential::from_entropy(
            &proxy.metadata.name,
            &derived("simulated-password", &proxy.uid()),
        ))
    }

    fn htpasswd(&self, proxy: &Proxy, credential: &ProxyCredential) -> Option<String> {
        let uid = proxy.uid();
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((password, line)) = lines.get(&uid)
            && *password == credential.password
            && line
                .strip_prefix(credential.username.as_str())
                .is_some_and(|rest| rest.starts_with(':'))
        {
            return Some(line.clone());
        }
        let line = credential.htpasswd_fewest_rounds(&derived("simulated-salt", &uid));
        lines.insert(uid, (credential.password.clone(), line.clone()));
        Some(line)
    }
}

/// `N` bytes of the operating system's randomness (a lease id's); the error says there was
/// none.
pub fn entropy<const N: usize>() -> Result<[u8; N], String> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|_| "the operating system gave no randomness".to_string())?;
    Ok(out)
}

/// A new random credential for `proxy`; the error says the system had no randomness.
pub fn fresh(proxy: &Proxy) -> Result<ProxyCredential, String> {
    egress_runtime::capabilities::credentials::fresh(&proxy.metadata.name)
        .ok_or_else(|| "the operating system gave no randomness for a password".to_string())
}

/// In memory only, random: a real run that keeps no state.
#[derive(Default)]
pub struct MemoryCredentials {
    by_uid: Mutex<BTreeMap<String, ProxyCredential>>,
}

#[async_trait::async_trait]
impl CredentialSource for MemoryCredentials {
    async fn credential(&self, proxy: &Proxy) -> Result<ProxyCredential, String> {
        let uid = proxy.uid();
        if let Some(c) = self.lock().get(&uid) {
            return Ok(c.clone());
        }
        let made = fresh(proxy)?;
        Ok(self.lock().entry(uid).or_insert(made).clone())
    }
}

impl MemoryCredentials {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ProxyCredential>> {
        self.by_uid.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One stored credential: the Proxy it belongs to (`namespace/name`, for people reading the
/// file) and the credential.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoredCredential {
    pub proxy: String,
    #[serde(flatten)]
    pub credential: ProxyCredential,
}

/// The CLI's credentials file, `STATE.credentials` beside the state file: YAML, by Proxy UID,
/// readable by its owner only, rewritten whole (a synced temporary file renamed into place)
/// whenever a credential is made or forgotten, which happens once per Proxy, not per step.
/// Apart from the state file so the state can be read, shared or attached to a report
/// without handing out working proxy passwords.
pub struct FileCredentials {
    path: PathBuf,
    by_uid: Mutex<BTreeMap<String, StoredCredential>>,
}

impl FileCredentials {
    /// The file beside `state`.
    pub fn path_for(state: &Path) -> PathBuf {
        let mut name = state.file_name().unwrap_or_default().to_os_string();
        name.push(".credentials");
        state.with_file_name(name)
    }

    /// Reads the file (none yet: empty). The error names the file.
    pub fn open(path: PathBuf) -> Result<Self, String> {
        let by_uid = match std::fs::read_to_string(&path) {
            Ok(text) => serde_yaml::from_str(&text)
                .map_err(|e| format!("{}: not a credentials file: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Ok(Self {
            path,
            by_uid: Mutex::new(by_uid),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The credential of the Proxy with `uid`, if one was made.
    pub fn get(&self, uid: &str) -> Option<ProxyCredential> {
        self.lock().get(uid).map(|s| s.credential.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, StoredCredential>> {
        self.by_uid.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, map: &BTreeMap<String, StoredCredential>) -> Result<(), String> {
        let text = serde_yaml::to_string(map).map_err(|e| format!("credentials: {e}"))?;
        crate::private_file::replace(&self.path, text.as_bytes())
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

#[async_trait::async_trait]
impl CredentialSource for FileCredentials {
    /// Those whose Proxies are gone with their instances.
    fn retain(&self, keep: &std::collections::BTreeSet<String>) -> Result<(), String> {
        let mut map = self.lock();
        let before = map.len();
        map.retain(|uid, _| keep.contains(uid));
        if map.len() == before {
            return Ok(());
        }
        self.write(&map)
    }

    async fn credential(&self, proxy: &Proxy) -> Result<ProxyCredential, String> {
        let uid = proxy.uid();
        let mut map = self.lock();
        if let Some(c) = map.get(&uid) {
            return Ok(c.credential.clone());
        }
        let made = fresh(proxy)?;
        map.insert(
            uid.clone(),
            StoredCredential {
                proxy: proxy.key(),
                credential: made.clone(),
            },
        );
        // Stored before any instance can hold it: a run cut off after the create still
        // knows the password of the proxy it made.
        if let Err(e) = self.write(&map) {
            map.remove(&uid);
            return Err(e);
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::credential_store::CredentialSource;

    fn proxy(name: &str) -> Proxy {
        serde_yaml::from_str(&format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{provider: p}}\n"
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn a_file_keeps_each_proxys_credential_private_and_across_opens() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = FileCredentials::path_for(&dir.path().join("state.yaml"));
        assert_eq!(path, dir.path().join("state.yaml.credentials"));
        let file = FileCredentials::open(path.clone()).unwrap();
        let a = file.credential(&proxy("a")).await.unwrap();
        let b = file.credential(&proxy("b")).await.unwrap();
        assert_ne!(a.password, b.password);
        assert_eq!(a.username, "a");
        assert_eq!(file.credential(&proxy("a")).await.unwrap(), a);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = FileCredentials::open(path.clone()).unwrap();
        assert_eq!(again.credential(&proxy("a")).await.unwrap(), a);
        assert_eq!(again.get(&proxy("b").uid()), Some(b));
        again
            .retain(&[proxy("a").uid()].into_iter().collect())
            .unwrap();
        let last = FileCredentials::open(path.clone()).unwrap();
        assert_eq!(last.get(&proxy("a").uid()), Some(a));
        assert_eq!(last.get(&proxy("b").uid()), None);
        std::fs::write(&path, "not: [a credentials file").unwrap();
        let e = FileCredentials::open(path.clone()).err().unwrap();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
    }

    /// A `.tmp` an earlier run left world-readable beside the file, or a symlink planted where
    /// the temporary file used to be (next test), changes nothing: the file is its owner's only
    /// from the start, and the link's target is neither written nor changed.
    #[tokio::test]
    async fn a_stale_world_readable_temporary_file_never_exposes_the_credentials() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = FileCredentials::path_for(&dir.path().join("state.yaml"));
        let tmp = dir.path().join("state.yaml.credentials.tmp");
        std::fs::write(&tmp, "stale\n").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = FileCredentials::open(path.clone()).unwrap();
        let a = file.credential(&proxy("a")).await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode(&path),
            0o600,
            "the credentials file is readable by others"
        );
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains(&a.password)
        );
    }

    #[tokio::test]
    async fn a_symlink_planted_at_the_temporary_path_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = FileCredentials::path_for(&dir.path().join("state.yaml"));
        let tmp = dir.path().join("state.yaml.credentials.tmp");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let file = FileCredentials::open(path.clone()).unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "untouched\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        let b = file.credential(&proxy("b")).await.unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
        assert_eq!(mode(&target), 0o644);
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(mode(&path), 0o600);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains(&b.password)
        );
    }

    #[tokio::test]
    async fn a_simulated_credential_is_the_same_on_every_run_and_distinct_per_proxy() {
        let s = SimulatedCredentials::default();
        let a = s.credential(&proxy("a")).await.unwrap();
        assert_eq!(
            SimulatedCredentials::default()
                .credential(&proxy("a"))
                .await
                .unwrap(),
            a
        );
        assert_ne!(s.credential(&proxy("b")).await.unwrap(), a);
        let line = s.htpasswd(&proxy("a"), &a).unwrap();
        assert_eq!(
            SimulatedCredentials::default()
                .htpasswd(&proxy("a"), &a)
                .unwrap(),
            line
        );
        // Asked again (a create tried again), the same line; for another password, its own.
        assert_eq!(s.htpasswd(&proxy("a"), &a).unwrap(), line);
        let other = ProxyCredential::from_entropy("a", &[5u8; 24]);
        let other_line = s.htpasswd(&proxy("a"), &other).unwrap();
        assert_ne!(other_line, line);
        assert!(egress_core::credential::htpasswd_accepts(
            &other_line,
            "a",
            &other.password
        ));
        assert!(egress_core::credential::htpasswd_accepts(
            &line,
            "a",
            &a.password
        ));
    }

    #[tokio::test]
    async fn memory_keeps_one_credential_per_proxy() {
        let m = MemoryCredentials::default();
        let a = m.credential(&proxy("a")).await.unwrap();
        assert_eq!(m.credential(&proxy("a")).await.unwrap(), a);
        assert_ne!(m.credential(&proxy("b")).await.unwrap(), a);
    }
}
