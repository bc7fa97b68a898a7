//! Leases out of a cluster: `reconcile --watch --listen` serves the operator's HTTP API
//! (`/v1/proxies`, `/v1/leases`) from what the CLI's runs know, with the same rules
//! (`egress_core::lease`) and the same answers.
//!
//! The bindings are kept in a file beside the state (`STATE.leases`), not in the state's
//! journal: the API writes them while a run writes the state, and one writer per file keeps
//! either from overwriting the other's news. A run reads them when its pools decide (a leased
//! member drains rather than goes) and publishes every Proxy it records to the [`Board`], which
//! answers the API: it is the store the lease flow of `egress_control::leases` runs over. A
//! write of a Proxy's record lands only on the version of the record it was decided on (two
//! callers can never take one proxy), and the file is written (a synced temporary file renamed
//! into place) before the write answers: a granted lease survives a restart. A record of a
//! Proxy whose UID changed or that left the state is dropped with it.

use crate::error::CliError;
pub use crate::state::{LeaseFile, ProxyLeases};
use crate::state::{StateFile, StoredProxy};
use egress_control::credential_store::FileCredentials;
use egress_control::leases::{LeaseRefusal, LeaseStore, PoolFacts, Records};
use egress_core::discovery::{Discovered, Filter};
use egress_core::lease::{self, Held, LeasePolicy, LeaseRef, LostProxy};
use egress_core::target::QuarantinePolicy;
use egress_time::now::Clock;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the lease flow needs of a pool beyond its members.
#[derive(Debug, Clone, Default)]
pub struct KnownPool {
    policy: LeasePolicy,
    /// `spec.replicas`, which `leases.maxPerHolder` may be a percentage of.
    replicas: u32,
    /// `spec.quarantine`.
    quarantine: QuarantinePolicy,
    lost: Vec<LostProxy>,
    /// With `spec.autoscale`: its `coldStartWait`.
    cold_start_wait: Option<std::time::Duration>,
}

struct Inner {
    /// Every Proxy as last recorded, with the lease file overlaid.
    proxies: BTreeMap<String, StoredProxy>,
    /// The version of each Proxy's record: a lease write lands only on the version it was
    /// decided on.
    versions: BTreeMap<String, u64>,
    /// The last version given.
    version: u64,
    /// The pools of the run, by `namespace/name`.
    pools: BTreeMap<String, KnownPool>,
    file: LeaseFile,
    /// A run has told which pools there are.
    synced: bool,
}

impl Inner {
    /// Proxy `key` changed: a write decided on what it was is refused.
    fn touch(&mut self, key: &str) {
        self.version += 1;
        self.versions.insert(key.to_string(), self.version);
    }

    /// Sets the record of Proxy `key`, writes the lease file to `path`, and only then shows
    /// it: a write that fails changes nothing.
    fn commit(&mut self, path: &Path, key: &str, record: ProxyLeases) -> Result<(), String> {
        let before = self.file.proxies.insert(key.to_string(), record);
        if let Err(e) = self.file.write(path) {
            match before {
                Some(b) => self.file.proxies.insert(key.to_string(), b),
                None => self.file.proxies.remove(key),
            };
            return Err(e);
        }
        if let Some(p) = self.proxies.get_mut(key) {
            self.file.overlay(p);
        }
        self.touch(key);
        Ok(())
    }
}

/// What `reconcile --watch --listen` answers from: the Proxies its runs recorded, their pools'
/// lease settings, and the lease file, which it keeps (the [`LeaseStore`] the lease flow of
/// `egress_control` runs over).
pub struct Board {
    inner: Mutex<Inner>,
    /// A release or a cordon that a pool's decision may act on (a drain that may end).
    changed: tokio::sync::Notify,
    /// What the gateways say of the pools' demand (`POST /v1/demand`), for autoscaled pools.
    pub demand: Arc<egress_control::demand::DemandBoard>,
    path: PathBuf,
    credentials: Arc<FileCredentials>,
    now: Clock,
}

impl Board {
    /// The board of state file `state_path` as `state` holds it, with its lease file read (the
    /// records of Proxies no longer in the state dropped).
    pub fn open(
        state_path: &Path,
        state: &StateFile,
        credentials: Arc<FileCredentials>,
        now: Clock,
    ) -> Result<Self, CliError> {
        let path = LeaseFile::path_for(state_path);
        let mut file = LeaseFile::read(&path)?;
        file.proxies
            .retain(|key, l| state.proxies.get(key).is_some_and(|p| p.uid == l.uid));
        let proxies: BTreeMap<String, StoredProxy> = state
            .proxies
            .iter()
            .map(|(k, p)| {
                let mut p = p.clone();
                file.overlay(&mut p);
                (k.clone(), p)
            })
            .collect();
        Ok(Self {
            inner: Mutex::new(Inner {
                versions: proxies.keys().map(|k| (k.clone(), 0)).collect(),
                proxies,
                version: 0,
                pools: BTreeMap::new(),
                file,
                synced: false,
            }),
            changed: tokio::sync::Notify::new(),
            demand: Arc::default(),
            path,
            credentials,
            now,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once a release or a cordon happened, or a pool's demand changed, since the
    /// last time it resolved.
    pub async fn changed(&self) {
        tokio::select! {
            () = self.changed.notified() => {}
            () = self.demand.changed() => {}
        }
    }

    /// Pool `key`'s (`namespace/name`) demand as the gateways say it now.
    pub fn demand_of(&self, key: &str) -> egress_core::autoscale::Demand {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        self.demand
            .demand(namespace, name, std::time::Instant::now())
    }

    /// A run recorded Proxy `key` (None: it is gone). A record of a Proxy that is gone, or
    /// made again under its name, leaves the lease file.
    pub fn publish(&self, key: &str, stored: Option<&StoredProxy>) -> Result<(), CliError> {
        let mut inner = self.lock();
        let stale = inner
            .file
            .proxies
            .get(key)
            .is_some_and(|l| stored.is_none_or(|s| s.uid != l.uid));
        if stale {
            inner.file.proxies.remove(key);
            inner
                .file
                .write(&self.path)
                .map_err(|message| CliError::Output {
                    what: format!("lease file {}", self.path.display()),
                    message,
                })?;
        }
        match stored {
            Some(s) => {
                let mut s = s.clone();
                inner.file.overlay(&mut s);
                inner.proxies.insert(key.to_string(), s);
            }
            None => {
                inner.proxies.remove(key);
            }
        }
        inner.touch(key);
        Ok(())
    }

    /// A run's pools (`namespace/name`, spec, status): which there are, their lease settings
    /// and what their leases lost.
    pub fn publish_pools<'a>(
        &self,
        pools: impl IntoIterator<
            Item = (
                String,
                &'a egress_core::pool::PoolSpec,
                &'a egress_core::pool::PoolStatus,
            ),
        >,
    ) {
        let mut inner = self.lock();
        inner.pools = pools
            .into_iter()
            .map(|(key, spec, status)| {
                (
                    key,
                    KnownPool {
                        policy: spec.lease_policy(),
                        // An autoscaled pool's share per holder is of the most it may have.
                        replicas: spec.most_replicas(),
                        quarantine: spec.quarantine_policy(),
                        lost: status.lost_leases.clone(),
                        cold_start_wait: spec.autoscale.as_ref().map(|a| a.cold_start_wait()),
                    },
                )
            })
            .collect();
        inner.synced = true;
    }

    /// One pool's status changed: what its leases lost.
    pub fn publish_pool(&self, key: &str, status: &egress_core::pool::PoolStatus) {
        if let Some(p) = self.lock().pools.get_mut(key) {
            p.lost = status.lost_leases.clone();
        }
    }

    /// The record of Proxy `key` (of `uid`) in the lease file, for a pool's decision.
    pub fn leases_of(&self, key: &str, uid: &str) -> Option<ProxyLeases> {
        self.lock().file.of(key, uid).cloned()
    }

    /// Proxy `key` as the lease flow reads it, if it is still the one of `uid`.
    fn member(&self, inner: &Inner, key: &str, uid: &str) -> Option<Member> {
        let p = inner.proxies.get(key).filter(|p| p.uid == uid)?;
        Some(Member {
            credential: self.credentials.get(&p.uid),
            version: inner.versions.get(key).copied().unwrap_or_default(),
            proxy: p.clone(),
        })
    }
}

/// A Proxy as the lease flow read it: with the lease file overlaid, its credential, and the
/// version of its record.
#[derive(Clone)]
pub struct Member {
    proxy: StoredProxy,
    credential: Option<egress_core::credential::ProxyCredential>,
    version: u64,
}

#[async_trait::async_trait]
impl LeaseStore for Board {
    type Pool = KnownPool;
    type Member = Member;

    async fn pool(&self, at: &LeaseRef) -> Result<KnownPool, LeaseRefusal> {
        let key = format!("{}/{}", at.namespace, at.pool);
        self.lock()
            .pools
            .get(&key)
            .cloned()
            .ok_or_else(|| LeaseRefusal::NotFound(format!("no ProxyPool {key}")))
    }

    fn facts(pool: &KnownPool) -> PoolFacts<'_> {
        PoolFacts {
            policy: pool.policy.clone(),
            replicas: pool.replicas,
            quarantine: pool.quarantine.clone(),
            lost: &pool.lost,
            cold_start_wait: pool.cold_start_wait,
        }
    }

    async fn members(&self, at: &LeaseRef, _: &KnownPool) -> Result<Vec<Member>, LeaseRefusal> {
        let inner = self.lock();
        let prefix = format!("{}/", at.namespace);
        Ok(inner
            .proxies
            .values()
            .filter(|p| p.key.starts_with(&prefix) && p.pool.as_deref() == Some(at.pool.as_str()))
            .filter_map(|p| self.member(&inner, &p.key, &p.uid))
            .collect())
    }

    async fn namespace_members(&self, namespace: &str) -> Result<Vec<Member>, LeaseRefusal> {
        let inner = self.lock();
        let prefix = format!("{namespace}/");
        Ok(inner
            .proxies
            .values()
            .filter(|p| p.key.starts_with(&prefix) && p.pool.is_some())
            .filter_map(|p| self.member(&inner, &p.key, &p.uid))
            .collect())
    }

    /// None: out of a cluster no pool counts member-seconds, and `reconcile --listen`
    /// refuses a quotas file with `memberHoursPerDay`.
    async fn namespace_usage(
        &self,
        _: &str,
    ) -> Result<Vec<egress_core::quota::LeaseUsage>, LeaseRefusal> {
        Ok(Vec::new())
    }

    fn held(m: &Member, now: i64) -> Held<'_> {
        Held {
            proxy: m.proxy.candidate(m.credential.as_ref(), now),
            retiring: m.proxy.retiring(),
            created_at: m
                .proxy
                .created_at
                .as_deref()
                .and_then(egress_core::gc::parse_rfc3339),
        }
    }

    fn status(m: &Member) -> &egress_core::ProxyStatus {
        &m.proxy.status
    }

    fn cordoned(m: &Member) -> bool {
        m.proxy.cordoned
    }

    fn key(m: &Member) -> String {
        m.proxy.key.clone()
    }

    /// Lands when the Proxy's record is the version read, and the lease file is written
    /// (a synced temporary file renamed into place) before it answers: a granted lease
    /// survives a restart.
    async fn write(
        &self,
        m: &Member,
        records: Records,
        now: i64,
    ) -> Result<Option<Member>, LeaseRefusal> {
        let p = &m.proxy;
        let mut inner = self.lock();
        if inner.versions.get(&p.key) != Some(&m.version)
            || inner.proxies.get(&p.key).is_none_or(|s| s.uid != p.uid)
        {
            return Ok(None);
        }
        let prior = inner
            .file
            .of(&p.key, &p.uid)
            .cloned()
            .unwrap_or(ProxyLeases {
                uid: p.uid.clone(),
                leases: Vec::new(),
                ban_reports: 0,
                ban_reporters: Vec::new(),
                quarantines: Vec::new(),
                cordoned: false,
            });
        let (ban_reports, ban_reporters) = match records.bans {
            Some(b) => (b.len() as u32, b),
            None => (prior.ban_reports, prior.ban_reporters),
        };
        let record = ProxyLeases {
            uid: p.uid.clone(),
            leases: lease::with_replaced(
                &prior.leases,
                p.status.ip.as_deref(),
                records.bindings,
                now,
            ),
            ban_reports,
            ban_reporters,
            quarantines: records.quarantines.unwrap_or(prior.quarantines),
            cordoned: prior.cordoned,
        };
        inner
            .commit(&self.path, &p.key, record)
            .map_err(LeaseRefusal::Busy)?;
        Ok(self.member(&inner, &p.key, &p.uid))
    }

    async fn reread(&self, m: &Member) -> Result<Option<Member>, LeaseRefusal> {
        let inner = self.lock();
        Ok(self.member(&inner, &m.proxy.key, &m.proxy.uid))
    }

    /// Marks its record cordoned, which the next run of its pool acts on.
    async fn cordon(&self, m: &Member, why: &str) {
        let key = &m.proxy.key;
        let written = {
            let mut inner = self.lock();
            match inner.file.of(key, &m.proxy.uid).cloned() {
                Some(mut record) => {
                    record.cordoned = true;
                    inner.commit(&self.path, key, record)
                }
                None => Err(format!("Proxy {key} has no lease record")),
            }
        };
        match written {
            Ok(()) => {
                tracing::info!(proxy = %key, why, "cordoned");
                self.changed.notify_one();
            }
            Err(e) => tracing::warn!(proxy = %key, why, "cordoning failed: {e}"),
        }
    }

    /// A draining proxy may go now, and a cordoned one is to be replaced: the pool decides
    /// again.
    fn released(&self, m: &Member) {
        if m.proxy.retire_at.is_some() || m.proxy.cordoned {
            self.changed.notify_one();
        }
    }
}

impl egress_control::api::ProxySource for Board {
    fn discover(&self, filter: &Filter) -> Vec<Discovered> {
        let inner = self.lock();
        crate::state::discover(
            inner.proxies.values(),
            &self.credentials,
            filter,
            (self.now)(),
        )
    }

    /// Before a run has said which pools there are, a lease call would be told "no pool".
    fn synced(&self) -> bool {
        self.lock().synced
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use egress_control::api::ProxySource;
    use egress_control::leases::{LeaseBook, Leases};
    use egress_control::metrics::Metrics;
    use egress_core::lease::{LeaseBinding, LeaseRequest, ReleaseRequest};
    use std::sync::atomic::{AtomicI64, Ordering};

    const NOW: i64 = 1_800_000_000;

    fn member(name: &str, ip: &str) -> StoredProxy {
        StoredProxy {
            key: format!("ns/{name}"),
            uid: format!("uid-{name}"),
            provider: "p".into(),
            port: 3128,
            zone: None,
            pool: Some("web".into()),
            cordoned: false,
            retire_at: None,
            retire_reason: None,
            created_at: Some(egress_core::gc::format_rfc3339(NOW - 60)),
            placement: Some(0),
            revision: None,
            spec: None,
            status: egress_core::ProxyStatus {
                ip: Some(ip.into()),
                egress_ip: Some(ip.into()),
                conditions: vec![egress_core::Condition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: "Running".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: egress_core::gc::format_rfc3339(NOW - 30),
                }],
                ..Default::default()
            },
        }
    }

    fn state(members: &[StoredProxy]) -> StateFile {
        StateFile {
            installation: "t".into(),
            proxies: members.iter().map(|m| (m.key.clone(), m.clone())).collect(),
            pools: BTreeMap::new(),
        }
    }

    /// A pool of two with `leases` as its lease settings (YAML).
    fn pool(leases: &str) -> egress_core::pool::PoolSpec {
        serde_yaml::from_str(&format!(
            "replicas: 2\ntemplate: {{}}\nplacements: [{{provider: p}}]\nleases: {leases}\n"
        ))
        .unwrap()
    }

    struct Fixture {
        dir: tempfile::TempDir,
        clock: Arc<AtomicI64>,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
                clock: Arc::new(AtomicI64::new(NOW)),
            }
        }

        fn board(&self, members: &[StoredProxy], cordon_after_bans: u32) -> Leases<Board> {
            self.board_with(
                members,
                &format!("{{cordonAfterBans: {cordon_after_bans}}}"),
            )
        }

        fn board_with(&self, members: &[StoredProxy], leases: &str) -> Leases<Board> {
            let state_path = self.dir.path().join("state.yaml");
            let credentials =
                Arc::new(FileCredentials::open(FileCredentials::path_for(&state_path)).unwrap());
            let clock = self.clock.clone();
            let now: Clock = Arc::new(move || clock.load(Ordering::SeqCst));
            let b = Board::open(&state_path, &state(members), credentials, now.clone()).unwrap();
            let spec = pool(leases);
            let status = egress_core::pool::PoolStatus::default();
            b.publish_pools([("ns/web".to_string(), &spec, &status)]);
            Leases::with_store(Arc::new(b), now, Arc::new(Metrics::new()))
        }
    }

    fn ask(count: u32, mode: lease::LeaseMode) -> LeaseRequest {
        serde_json::from_value(serde_json::json!({
            "namespace": "ns", "pool": "web", "count": count, "mode": mode.as_str(), "ttl": "10m"
        }))
        .unwrap()
    }

    fn at() -> LeaseRef {
        LeaseRef {
            namespace: "ns".into(),
            pool: "web".into(),
        }
    }

    fn listed(b: &Leases<Board>) -> Vec<String> {
        b.store()
            .discover(&Filter::default())
            .into_iter()
            .map(|d| d.name)
            .collect()
    }

    /// Exclusive leases are all or none and leave discovery; the lease file keeps them for the
    /// next process, which refuses what this one granted; the end of the ttl frees the proxy.
    /// The lease file is written as the state is: a world-readable `.tmp` an earlier run left
    /// does not make it world-readable.
    #[test]
    fn a_stale_world_readable_temporary_file_leaves_the_lease_file_its_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = LeaseFile::path_for(&dir.path().join("state.yaml"));
        let tmp = dir.path().join("state.yaml.leases.tmp");
        std::fs::write(&tmp, "stale\n").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        LeaseFile::default().write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn exclusive_leases_are_kept_in_the_file_and_refused_to_a_second_taker() {
        let f = Fixture::new();
        let members = [member("a", "10.0.0.1"), member("b", "10.0.0.2")];
        // Each holder may hold the whole pool: what refuses the rival is the shortage.
        let b = f.board_with(&members, "{maxPerHolder: 2}");
        assert_eq!(listed(&b), vec!["a", "b"]);
        let first = b
            .acquire("spider", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
        assert_eq!(first.proxies.len(), 1);
        let taken = first.proxies[0].proxy.name.clone();
        assert_eq!(listed(&b).len(), 1);
        assert!(!listed(&b).contains(&taken));
        match b
            .acquire("rival", &ask(2, lease::LeaseMode::Exclusive))
            .await
        {
            Err(LeaseRefusal::Unavailable { retry_after, .. }) => {
                assert!(retry_after > std::time::Duration::ZERO)
            }
            other => panic!("{other:?}"),
        }
        // Nothing of the refused lease was written; the file is its owner's only.
        let path = LeaseFile::path_for(&f.dir.path().join("state.yaml"));
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let file = LeaseFile::read(&path).unwrap();
        assert_eq!(
            file.proxies.values().map(|l| l.leases.len()).sum::<usize>(),
            1
        );

        // Another process on the same state: the lease holds there too.
        let again = f.board_with(&members, "{maxPerHolder: 2}");
        let view = again.view("spider", &at(), &first.id).await.unwrap();
        assert_eq!(view.proxies[0].proxy.name, taken);
        // Another's lease reads as one that does not exist, naming no one.
        let unknown = format!("ns_web_l-{}", "a".repeat(24));
        for (id, r) in [
            (&first.id, again.view("rival", &at(), &first.id).await),
            (&unknown, again.view("rival", &at(), &unknown).await),
        ] {
            assert_eq!(
                r,
                Err(LeaseRefusal::NotFound(format!(
                    "lease {id} is not held (expired, released or unknown)"
                )))
            );
        }
        let other = again
            .acquire("rival", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
        assert_ne!(other.proxies[0].proxy.name, taken);

        // Their ttl over, both proxies are free again.
        f.clock.store(NOW + 11 * 60, Ordering::SeqCst);
        assert!(matches!(
            again.view("spider", &at(), &first.id).await,
            Err(LeaseRefusal::NotFound(_))
        ));
        assert_eq!(listed(&again), vec!["a", "b"]);
    }

    /// Ban reports count once per holder and proxy; at the pool's threshold of holders the
    /// proxy is cordoned (out of discovery and leases, and the pool told); one holder
    /// reporting again and again counts once; a Proxy made again under its name starts with
    /// no record.
    #[tokio::test]
    async fn ban_reports_cordon_at_the_threshold_and_a_new_uid_starts_clean() {
        let f = Fixture::new();
        let members = [member("a", "10.0.0.1")];
        let b = f.board(&members, 2);
        let banned: ReleaseRequest =
            serde_json::from_value(serde_json::json!({"outcome": "banned"})).unwrap();
        for (holder, reports) in [("spider", 1), ("spider", 1), ("spider", 1), ("rival", 2)] {
            let l = b
                .acquire(holder, &ask(1, lease::LeaseMode::Shared))
                .await
                .unwrap();
            b.release(holder, &at(), &l.id, &banned).await.unwrap();
            let record = b.store().leases_of("ns/a", "uid-a").unwrap();
            assert_eq!(record.ban_reports, reports, "{holder}");
            assert_eq!(record.cordoned, reports == 2, "after {reports} holders");
        }
        let file =
            std::fs::read_to_string(LeaseFile::path_for(&f.dir.path().join("state.yaml"))).unwrap();
        assert!(
            !file.contains("spider") && !file.contains("rival"),
            "the reports name no one: {file}"
        );
        assert!(listed(&b).is_empty(), "a cordoned proxy is not listed");
        assert!(matches!(
            b.acquire("spider", &ask(1, lease::LeaseMode::Shared)).await,
            Err(LeaseRefusal::Unavailable { .. })
        ));
        // The release that cordoned it woke the pool.
        tokio::time::timeout(std::time::Duration::from_secs(1), b.store().changed())
            .await
            .unwrap();

        // Replaced under its name (a new UID): its record goes, in the file too.
        let mut made_again = member("a", "10.0.0.9");
        made_again.uid = "uid-a2".into();
        b.store().publish("ns/a", Some(&made_again)).unwrap();
        assert!(b.store().leases_of("ns/a", "uid-a").is_none());
        assert_eq!(listed(&b), vec!["a"]);
        let file = LeaseFile::read(&LeaseFile::path_for(&f.dir.path().join("state.yaml"))).unwrap();
        assert!(file.proxies.is_empty(), "{file:?}");
    }

    /// A holder holds at most the pool's `leases.maxPerHolder` (default 50% of replicas,
    /// rounded up): beyond it, 429 naming the setting; another holder is served.
    #[tokio::test]
    async fn a_holder_holds_at_most_max_per_holder() {
        let f = Fixture::new();
        let members = [member("a", "10.0.0.1"), member("b", "10.0.0.2")];
        let b = f.board(&members, 3);
        b.acquire("spider", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
        for mode in [lease::LeaseMode::Exclusive, lease::LeaseMode::Shared] {
            match b.acquire("spider", &ask(1, mode)).await {
                Err(LeaseRefusal::TooMany(m)) => {
                    assert!(m.contains("leases.maxPerHolder is 1 (50%)"), "{m}")
                }
                other => panic!("{mode:?}: {other:?}"),
            }
        }
        b.acquire("rival", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
    }

    /// A lease on a proxy whose instance was replaced (a new address under the same Proxy):
    /// another lease's write keeps the old binding, so its holder is told it lost the proxy and
    /// why, where a write that dropped it would leave a bare 404.
    #[tokio::test]
    async fn a_lease_on_a_replaced_instance_is_told_its_loss_after_another_takes_the_proxy() {
        let f = Fixture::new();
        let b = f.board(&[member("a", "10.0.0.1")], 3);
        let first = b
            .acquire("spider", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
        b.store()
            .publish("ns/a", Some(&member("a", "10.0.0.9")))
            .unwrap();
        b.acquire("rival", &ask(1, lease::LeaseMode::Exclusive))
            .await
            .unwrap();
        let record = b.store().leases_of("ns/a", "uid-a").unwrap();
        assert_eq!(record.leases.len(), 2, "{record:?}");
        match b.view("spider", &at(), &first.id).await {
            Err(LeaseRefusal::NotFound(m)) => {
                assert!(m.contains("went (its instance was replaced"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A write lands only on the version of the record it was decided on: a second writer
    /// that read the same version (another call racing for the proxy), or a write decided
    /// before a run published the Proxy again, is refused and changes nothing; read again, it
    /// lands.
    #[tokio::test]
    async fn a_write_decided_on_an_older_version_is_refused() {
        let f = Fixture::new();
        let b = f.board(&[member("a", "10.0.0.1")], 3);
        let board = b.store();
        let pool = board.pool(&at()).await.unwrap();
        let read = board.members(&at(), &pool).await.unwrap();
        let binding = |holder: &str| LeaseBinding {
            id: format!("ns_web_l-{}", holder.repeat(24)),
            holder: holder.into(),
            mode: lease::LeaseMode::Exclusive,
            acquired_at: egress_core::gc::format_rfc3339(NOW),
            expires_at: egress_core::gc::format_rfc3339(NOW + 600),
            count: 1,
            ip: Some("10.0.0.1".into()),
        };
        let first = board
            .write(&read[0], Records::bindings(vec![binding("a")]), NOW)
            .await
            .unwrap();
        assert!(first.is_some());
        let rival = board
            .write(&read[0], Records::bindings(vec![binding("b")]), NOW)
            .await
            .unwrap();
        assert!(rival.is_none(), "a write on a version already written past");
        let record = board.leases_of("ns/a", "uid-a").unwrap();
        assert_eq!(record.leases, vec![binding("a")]);

        // A run publishes the Proxy again: what was read before is stale.
        let read = board.members(&at(), &pool).await.unwrap();
        board
            .publish("ns/a", Some(&member("a", "10.0.0.1")))
            .unwrap();
        assert!(
            board
                .write(&read[0], Records::bindings(vec![binding("b")]), NOW)
                .await
                .unwrap()
                .is_none()
        );
        let again = board.reread(&read[0]).await.unwrap().unwrap();
        assert!(
            board
                .write(&again, Records::bindings(vec![binding("b")]), NOW)
                .await
                .unwrap()
                .is_some()
        );
        let record = board.leases_of("ns/a", "uid-a").unwrap();
        assert_eq!(record.leases, vec![binding("b")]);
    }

    /// Before a run said which pools there are, the board is not synced (readiness waits);
    /// a pool it does not know is a 404 naming it.
    #[tokio::test]
    async fn an_unknown_pool_is_named() {
        let f = Fixture::new();
        let b = f.board(&[], 3);
        assert!(b.store().synced());
        let mut req = ask(1, lease::LeaseMode::Exclusive);
        req.pool = "nope".into();
        match b.acquire("spider", &req).await {
            Err(LeaseRefusal::NotFound(m)) => assert!(m.contains("ns/nope"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
