//! The CLI's state file: each Proxy's status, kept so an interrupted run loses nothing and a
//! Proxy removed from the proxies file is deleted on the next run.
//!
//! A run appends each change to a journal beside the file (`STATE.journal`, one JSON line per
//! change, synced before the next provider call of that Proxy) instead of rewriting the whole
//! file after every step, which grew quadratically with the Proxies; the file itself is
//! rewritten (a synced temporary file renamed into place) when the journal grows past the
//! number of Proxies it describes and at the end of a run. Reading replays the journal over
//! the file, ignoring a last line cut off by a crash.
//!
//! Written here rather than taken from a crate: an embedded database would hold the state in a
//! format users cannot read; the file stays plain YAML, the journal plain JSON lines.
//!
//! A pool's members keep their whole spec, cloud-init included (a later run may have to create
//! their instances again), so both files are created readable by their owner only.
//!
//! The lease file beside them (`STATE.leases`, [`LeaseFile`]) is here too: the API of
//! `reconcile --watch --listen` writes it ([`crate::leases`]) and discovery reads it with the
//! state.

use crate::error::CliError;
use egress_core::lease::{BanReport, LeaseBinding};
use egress_core::{Proxy, ProxyStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StateFile {
    pub installation: String,
    #[serde(default)]
    pub proxies: BTreeMap<String, StoredProxy>,
    /// Per ProxyPool (`namespace/name`): how many Proxies it made, for the next name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, StoredPool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoredPool {
    /// How many member names it handed out.
    pub serial: u64,
    /// Its last status: which placements are degraded since when, so a later run decides as
    /// this one would have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<egress_core::pool::PoolStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoredProxy {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    pub provider: String,
    /// What discovery lists besides the status: the port, the zone, the pool and the cordon.
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
    /// RFC 3339: when a draining pool member goes (`crawl.example.com/retire-at`), and why:
    /// a drain outlives the run that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire_reason: Option<String>,
    /// RFC 3339: when the run that first recorded it started tracking it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// A ProxyPool's Proxy: its placement index, revision and spec (its cloud-init too), so a
    /// later run knows it without the proxies file naming it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<egress_core::ProxySpec>,
    pub status: ProxyStatus,
}

fn default_port() -> u16 {
    egress_core::proxy::DEFAULT_PORT
}

impl StoredProxy {
    /// As discovery and the lease API see it at `now` (Unix seconds), with its credential
    /// when known. Its bindings are those of the lease file ([`LeaseFile`])
    /// once overlaid.
    pub fn candidate<'a>(
        &'a self,
        credential: Option<&'a egress_core::credential::ProxyCredential>,
        now: i64,
    ) -> egress_core::discovery::Candidate<'a> {
        let (namespace, name) = self.key.split_once('/').unwrap_or(("", &self.key));
        egress_core::discovery::Candidate {
            credential,
            namespace,
            name,
            provider: &self.provider,
            port: self.port,
            zone: self.zone.as_deref(),
            pool: self.pool.as_deref(),
            cordoned: self.cordoned,
            draining: self.retire_at.is_some(),
            exclusively_leased: egress_core::lease::exclusively_leased(
                &self.status.leases,
                self.status.ip.as_deref(),
                now,
            ),
            status: &self.status,
        }
    }

    /// When it goes and why, once it drains.
    pub fn retiring(&self) -> Option<(i64, egress_core::pool::DeleteReason)> {
        let at = self.retire_at.as_deref()?;
        let why = self
            .retire_reason
            .as_deref()
            .and_then(egress_core::pool::DeleteReason::parse)
            .unwrap_or(egress_core::pool::DeleteReason::Rotated);
        Some((egress_core::gc::parse_rfc3339(at).unwrap_or(i64::MIN), why))
    }
}

/// What discovery lists of `proxies` at `now`, each with its credential from `credentials`
/// when it has one.
pub fn discover<'a>(
    proxies: impl Iterator<Item = &'a StoredProxy>,
    credentials: &egress_control::credential_store::FileCredentials,
    filter: &egress_core::discovery::Filter,
    now: i64,
) -> Vec<egress_core::discovery::Discovered> {
    let proxies: Vec<&StoredProxy> = proxies.collect();
    let known: Vec<_> = proxies.iter().map(|p| credentials.get(&p.uid)).collect();
    egress_core::discovery::discover(
        proxies
            .iter()
            .zip(&known)
            .map(|(p, c)| p.candidate(c.as_ref(), now)),
        filter,
    )
}

impl StateFile {
    /// What discovery lists from this state now, with the leases of `leases` (the file beside
    /// the state, kept by `reconcile --watch --listen`): a proxy leased exclusively or
    /// draining is not listed.
    pub fn discover(
        &self,
        credentials: &egress_control::credential_store::FileCredentials,
        leases: &LeaseFile,
        filter: &egress_core::discovery::Filter,
    ) -> Vec<egress_core::discovery::Discovered> {
        let mut proxies: Vec<StoredProxy> = self.proxies.values().cloned().collect();
        for p in &mut proxies {
            leases.overlay(p);
        }
        discover(
            proxies.iter(),
            credentials,
            filter,
            egress_time::now::unix_now(),
        )
    }
}

/// The lease file: per Proxy (`namespace/name`), its bindings and what its holders reported.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseFile {
    #[serde(default)]
    pub proxies: BTreeMap<String, ProxyLeases>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyLeases {
    /// The Proxy these are of: a Proxy made again under the name has another.
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseBinding>,
    /// Holders that reported the proxy banned (each once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ban_reports: u32,
    /// Their reports: a digest of each holder, and when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ban_reporters: Vec<BanReport>,
    /// The targets that refused it lately (`egress_core::target`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantines: Vec<egress_core::target::Quarantine>,
    /// Cordoned for its ban reports (`leases.cordonAfterBans`) or its quarantines
    /// (`quarantine.replaceAfterTargets`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl LeaseFile {
    /// The lease file of state file `state`: `STATE.leases`.
    pub fn path_for(state: &Path) -> PathBuf {
        let mut name = state.file_name().unwrap_or_default().to_os_string();
        name.push(".leases");
        state.with_file_name(name)
    }

    /// The file; empty when there is none.
    pub fn read(path: &Path) -> Result<Self, CliError> {
        let what = || format!("lease file {}", path.display());
        match std::fs::read_to_string(path) {
            Ok(text) => serde_yaml::from_str(&text).map_err(|e| CliError::Input {
                what: what(),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(CliError::Input {
                what: what(),
                message: e.to_string(),
            }),
        }
    }

    pub(crate) fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_yaml::to_string(self).map_err(|e| e.to_string())?;
        egress_control::private_file::replace(path, text.as_bytes())
            .map_err(|e| format!("writing the lease file {}: {e}", path.display()))
    }

    /// The record of Proxy `key` if it is of the Proxy with `uid`.
    pub fn of(&self, key: &str, uid: &str) -> Option<&ProxyLeases> {
        self.proxies.get(key).filter(|l| l.uid == uid)
    }

    /// `p` as the lease API and discovery see it: with its bindings and ban reports in its
    /// status, and cordoned when its holders' reports cordoned it.
    pub fn overlay(&self, p: &mut StoredProxy) {
        match self.of(&p.key, &p.uid) {
            Some(l) => {
                p.status.leases = l.leases.clone();
                p.status.ban_reports = l.ban_reports;
                p.status.ban_reporters = l.ban_reporters.clone();
                p.status.quarantines = l.quarantines.clone();
                p.cordoned |= l.cordoned;
            }
            None => {
                p.status.leases.clear();
                p.status.ban_reports = 0;
                p.status.ban_reporters.clear();
                p.status.quarantines.clear();
            }
        }
    }
}

/// One journal line: the Proxy's record as it is now, or its removal; or a pool's record.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stored: Option<StoredProxy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool: Option<StoredPool>,
}

fn journal_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".journal");
    path.with_file_name(name)
}

fn input_error(path: &Path, message: impl std::fmt::Display) -> CliError {
    CliError::Input {
        what: format!("state file {}", path.display()),
        message: message.to_string(),
    }
}

fn output_error(path: &Path, message: impl std::fmt::Display) -> CliError {
    CliError::Output {
        what: format!("state file {}", path.display()),
        message: message.to_string(),
    }
}

impl StateFile {
    /// The file with its journal replayed; empty when neither exists.
    pub fn read(path: &Path) -> Result<Self, CliError> {
        let mut state = match std::fs::read_to_string(path) {
            Ok(text) => serde_yaml::from_str(&text).map_err(|e| input_error(path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(e) => return Err(input_error(path, e)),
        };
        let journal = journal_path(path);
        match std::fs::read_to_string(&journal) {
            Ok(text) => {
                let complete = text.ends_with('\n');
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    match serde_json::from_str::<Entry>(line) {
                        Ok(entry) => state.apply(entry),
                        // A crash mid-append leaves the last line cut short: it never happened.
                        Err(_) if i + 1 == lines.len() && !complete => {}
                        Err(e) => {
                            return Err(input_error(&journal, format!("line {}: {e}", i + 1)));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(input_error(&journal, e)),
        }
        Ok(state)
    }

    fn apply(&mut self, entry: Entry) {
        if let Some(pool) = entry.pool {
            self.pools.insert(entry.key, pool);
            return;
        }
        match entry.stored {
            Some(stored) => {
                self.proxies.insert(entry.key, stored);
            }
            None => {
                self.proxies.remove(&entry.key);
            }
        }
    }

    /// What the state holds for a Proxy now: its record, or None once released.
    pub fn record_of(
        released: bool,
        proxy: &Proxy,
        status: &ProxyStatus,
        created_ms: u64,
    ) -> Option<StoredProxy> {
        let pool = proxy
            .metadata
            .labels
            .get(egress_core::discovery::POOL_LABEL)
            .cloned();
        let member = pool.is_some();
        (!released).then(|| StoredProxy {
            key: proxy.key(),
            uid: proxy.uid(),
            provider: proxy.spec.provider.clone(),
            port: proxy.spec.port,
            zone: proxy.spec.placement.zone.clone(),
            pool,
            cordoned: proxy
                .metadata
                .annotations
                .get(egress_core::discovery::CORDON_ANNOTATION)
                .is_some_and(|v| v == "true"),
            retire_at: proxy
                .metadata
                .annotations
                .get(egress_core::discovery::RETIRE_AT_ANNOTATION)
                .cloned(),
            retire_reason: proxy
                .metadata
                .annotations
                .get(egress_core::discovery::RETIRE_REASON_ANNOTATION)
                .cloned(),
            created_at: Some(egress_core::egress::rfc3339_ms(created_ms)),
            placement: proxy
                .metadata
                .labels
                .get(egress_core::pool::PLACEMENT_LABEL)
                .and_then(|p| p.parse().ok())
                .filter(|_| member),
            revision: proxy
                .metadata
                .annotations
                .get(egress_core::pool::REVISION_ANNOTATION)
                .cloned()
                .filter(|_| member),
            spec: member.then(|| proxy.spec.clone()),
            status: status.clone(),
        })
    }

    /// Sets a Proxy's record in memory; true when it changed.
    pub fn set(&mut self, key: &str, stored: Option<StoredProxy>) -> bool {
        match stored {
            Some(s) if self.proxies.get(key) == Some(&s) => false,
            Some(s) => {
                self.proxies.insert(key.to_string(), s);
                true
            }
            None => self.proxies.remove(key).is_some(),
        }
    }

    /// Writes the whole file through a synced temporary file of a fresh name, its owner's only
    /// from the start, renamed into place ([`egress_control::private_file`]): a reader never
    /// sees half of it.
    pub fn write(&self, path: &Path) -> Result<(), CliError> {
        let text = serde_yaml::to_string(self).map_err(|e| output_error(path, e))?;
        egress_control::private_file::replace(path, text.as_bytes())
            .map_err(|e| output_error(path, e))
    }
}

/// Held while a process runs on a state file, so a second process on the same state (its
/// journal, credentials and leases) is refused rather than interleaving its writes with the
/// first's: an advisory lock (flock) on `STATE.lock`, which the kernel releases when the
/// process ends however it ends, so a crash leaves no stale lock behind.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
}

impl StateLock {
    pub fn acquire(state: &Path) -> Result<Self, CliError> {
        let mut name = state.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let path = state.with_file_name(name);
        let file =
            egress_control::private_file::open_append(&path).map_err(|e| output_error(&path, e))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(input_error(
                state,
                format!(
                    "in use by another egress-proxies process (it holds {})",
                    path.display()
                ),
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(output_error(&path, e)),
        }
    }
}

/// The state of a run being written: changes go to the journal, synced one by one; the file
/// is rewritten when the journal outgrows it and when the run ends.
pub struct StateWriter {
    path: PathBuf,
    state: StateFile,
    journal: Option<std::fs::File>,
    journal_lines: usize,
}

impl StateWriter {
    /// Starts from `state` (what [`StateFile::read`] gave, or a fresh one), rewriting the file
    /// at once so the journal starts empty.
    pub fn open(path: &Path, state: StateFile) -> Result<Self, CliError> {
        let mut w = Self {
            path: path.to_path_buf(),
            state,
            journal: None,
            journal_lines: 0,
        };
        w.compact()?;
        Ok(w)
    }

    pub fn state(&self) -> &StateFile {
        &self.state
    }

    pub fn state_mut(&mut self) -> &mut StateFile {
        &mut self.state
    }

    pub fn into_state(self) -> StateFile {
        self.state
    }

    /// Records one Proxy's change durably (journal appended and synced) before returning.
    pub fn record(&mut self, key: &str, stored: Option<StoredProxy>) -> Result<(), CliError> {
        if !self.state.set(key, stored.clone()) {
            return Ok(());
        }
        self.append(&Entry {
            key: key.to_string(),
            stored,
            pool: None,
        })
    }

    /// Records a pool's serial and status durably, before any name from the serial is used.
    pub fn record_pool(&mut self, key: &str, pool: StoredPool) -> Result<(), CliError> {
        if self.state.pools.get(key) == Some(&pool) {
            return Ok(());
        }
        self.state.pools.insert(key.to_string(), pool.clone());
        self.append(&Entry {
            key: key.to_string(),
            stored: None,
            pool: Some(pool),
        })
    }

    fn append(&mut self, entry: &Entry) -> Result<(), CliError> {
        let mut line = serde_json::to_string(entry).map_err(|e| output_error(&self.path, e))?;
        line.push('\n');
        let journal = match &mut self.journal {
            Some(f) => f,
            None => {
                let f = egress_control::private_file::open_append(&journal_path(&self.path))
                    .map_err(|e| output_error(&self.path, e))?;
                self.journal.insert(f)
            }
        };
        journal
            .write_all(line.as_bytes())
            .and_then(|()| journal.sync_data())
            .map_err(|e| output_error(&self.path, e))?;
        self.journal_lines += 1;
        if self.journal_lines > self.state.proxies.len().max(64) {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the file with everything recorded, then empties the journal. A crash between
    /// the two leaves journal lines the file already holds: replaying them changes nothing.
    pub fn compact(&mut self) -> Result<(), CliError> {
        self.state.write(&self.path)?;
        self.journal = None;
        match std::fs::remove_file(journal_path(&self.path)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(output_error(&self.path, e)),
        }
        self.journal_lines = 0;
        Ok(())
    }
}

impl StoredProxy {
    /// The Proxy as a later run knows it: a pool's with its spec, labels and revision;
    /// another with what its deletion needs.
    pub(crate) fn to_proxy(&self) -> Proxy {
        let (namespace, name) = self
            .key
            .split_once('/')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap_or_default();
        let mut labels = BTreeMap::new();
        let mut annotations = BTreeMap::new();
        if let Some(pool) = &self.pool {
            labels.insert(egress_core::discovery::POOL_LABEL.to_string(), pool.clone());
        }
        if let Some(p) = self.placement {
            labels.insert(
                egress_core::pool::PLACEMENT_LABEL.to_string(),
                p.to_string(),
            );
        }
        if let Some(r) = &self.revision {
            annotations.insert(
                egress_core::pool::REVISION_ANNOTATION.to_string(),
                r.clone(),
            );
        }
        // A cordon and a drain outlive the run that made them.
        if self.cordoned {
            annotations.insert(
                egress_core::discovery::CORDON_ANNOTATION.to_string(),
                "true".to_string(),
            );
        }
        if let Some(at) = &self.retire_at {
            annotations.insert(
                egress_core::discovery::RETIRE_AT_ANNOTATION.to_string(),
                at.clone(),
            );
        }
        if let Some(why) = &self.retire_reason {
            annotations.insert(
                egress_core::discovery::RETIRE_REASON_ANNOTATION.to_string(),
                why.clone(),
            );
        }
        Proxy {
            api_version: egress_core::proxy::API_VERSION.into(),
            kind: egress_core::proxy::KIND.into(),
            metadata: egress_core::proxy::ObjectMeta {
                name,
                namespace,
                uid: Some(self.uid.clone()),
                labels,
                annotations,
                ..Default::default()
            },
            spec: self.spec.clone().unwrap_or_else(|| egress_core::ProxySpec {
                provider: self.provider.clone(),
                port: self.port,
                ..Default::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn stored(key: &str, ip: &str) -> StoredProxy {
        StoredProxy {
            key: key.into(),
            uid: format!("uid-{key}"),
            provider: "p".into(),
            port: 3128,
            zone: None,
            pool: None,
            cordoned: false,
            retire_at: None,
            retire_reason: None,
            created_at: None,
            placement: None,
            revision: None,
            spec: None,
            status: ProxyStatus {
                ip: Some(ip.into()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn changes_are_journaled_and_read_back_before_any_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).unwrap();
        w.record("ns/b", Some(stored("ns/b", "10.0.0.2"))).unwrap();
        w.record("ns/a", Some(stored("ns/a", "10.0.0.3"))).unwrap();
        w.record("ns/b", None).unwrap();
        // The run dies here: the file is as it started, the journal holds the rest.
        let journal = std::fs::read_to_string(journal_path(&path)).unwrap();
        assert_eq!(journal.lines().count(), 4);
        let read = StateFile::read(&path).unwrap();
        assert_eq!(read.proxies.len(), 1);
        assert_eq!(read.proxies["ns/a"].status.ip.as_deref(), Some("10.0.0.3"));
        // Compacted: the same state from the file alone.
        w.compact().unwrap();
        assert!(!journal_path(&path).exists());
        assert_eq!(StateFile::read(&path).unwrap(), read);
    }

    #[test]
    fn an_unchanged_record_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).unwrap();
        w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).unwrap();
        w.record("ns/z", None).unwrap();
        let journal = std::fs::read_to_string(journal_path(&path)).unwrap();
        assert_eq!(journal.lines().count(), 1);
    }

    #[test]
    fn a_line_cut_off_by_a_crash_is_ignored_and_a_bad_line_elsewhere_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).unwrap();
        drop(w);
        let j = journal_path(&path);
        let mut text = std::fs::read_to_string(&j).unwrap();
        text.push_str("{\"key\":\"ns/b\",\"sto");
        std::fs::write(&j, &text).unwrap();
        let read = StateFile::read(&path).unwrap();
        assert_eq!(read.proxies.keys().collect::<Vec<_>>(), vec!["ns/a"]);
        std::fs::write(&j, format!("garbage\n{text}\n")).unwrap();
        let err = StateFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn the_journal_is_folded_into_the_file_once_it_outgrows_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        for i in 0..200 {
            w.record(
                "ns/a",
                Some(stored("ns/a", &format!("10.0.{}.{}", i / 256, i % 256))),
            )
            .unwrap();
        }
        let lines = std::fs::read_to_string(journal_path(&path))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        assert!(lines <= 65, "{lines} journal lines for one Proxy");
        assert_eq!(
            StateFile::read(&path).unwrap().proxies["ns/a"]
                .status
                .ip
                .as_deref(),
            Some("10.0.0.199")
        );
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn world_readable(p: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// The state holds cloud-init: a world-readable `.tmp` an earlier run left does not make
    /// the rewritten file world-readable, and a world-readable journal is its owner's once
    /// written to.
    #[test]
    fn stale_world_readable_files_leave_the_state_its_owners_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        world_readable(&dir.path().join("state.yaml.tmp"), "stale\n");
        world_readable(&journal_path(&path), "");
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        assert_eq!(mode(&path), 0o600, "the state file is readable by others");
        world_readable(&journal_path(&path), "");
        w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).unwrap();
        assert_eq!(
            mode(&journal_path(&path)),
            0o600,
            "the journal is readable by others"
        );
        w.compact().unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(StateFile::read(&path).unwrap().proxies.len(), 1);
    }

    /// A symlink planted where the temporary file or the journal goes is never written
    /// through: its target stays as it was.
    #[test]
    fn a_planted_symlink_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let target = dir.path().join("elsewhere");
        world_readable(&target, "untouched\n");
        std::os::unix::fs::symlink(&target, dir.path().join("state.yaml.tmp")).unwrap();
        let mut w = StateWriter::open(&path, StateFile::default()).unwrap();
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        std::os::unix::fs::symlink(&target, journal_path(&path)).unwrap();
        assert!(w.record("ns/a", Some(stored("ns/a", "10.0.0.1"))).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
        assert_eq!(mode(&target), 0o644);
    }

    /// One process at a time on a state file; the next one may once the first let go.
    #[test]
    fn a_second_process_on_the_state_is_refused_while_the_first_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let held = StateLock::acquire(&path).unwrap();
        let err = StateLock::acquire(&path).unwrap_err().to_string();
        assert!(
            err.contains("in use by another egress-proxies process"),
            "{err}"
        );
        assert!(err.contains("state.yaml.lock"), "{err}");
        drop(held);
        StateLock::acquire(&path).unwrap();
    }
}
