//! The reconcile loop of the CLI: the shared decisions of `egress_core::reconcile` driven over
//! a proxies file, until every Proxy is steady or the time (or round) budget runs out, then a
//! sweep of this installation's orphans.

mod crawl;
pub mod lanes;
mod pools;
pub mod report;
mod status;
mod tracked;

pub use report::{
    Change, GcIncomplete, GcReport, GcVerdict, PoolReport, PoolSample, ProxyReport, Report,
    ReportEvent,
};

use crate::state::{StateFile, StateWriter, StoredProxy};
use egress_control::egress::{CheckWakes, EgressChecker};
use egress_control::reconciler::{InlineCloudInit, ReconcileEnv, Wait, reconcile_proxy};
use egress_core::config::ProvidersConfig;
use egress_core::gc::{self, Verdict};
use egress_core::pool::ProxyPool;
use egress_core::reconcile;
use egress_core::{Proxy, ProxyStatus};
use egress_runtime::capabilities::clock::{ClockBackend, VirtualClock};
use egress_runtime::{PlanRecorder, Providers};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pools::PoolRun;
use status::{StatusOutput, StatusStorage};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;
use tracked::Tracked;

/// How time passes: virtual in a dry-run (jumps to the next due Proxy), real otherwise.
pub enum Time {
    Virtual(Arc<VirtualClock>),
    Real(Arc<dyn ClockBackend>),
}

impl Time {
    fn now_ms(&self) -> u64 {
        match self {
            Time::Virtual(c) => c.now_millis(),
            Time::Real(c) => c.now_millis(),
        }
    }

    fn now_rfc3339(&self) -> String {
        gc::format_rfc3339((self.now_ms() / 1000) as i64)
    }
}

#[derive(Clone)]
pub struct DriverOptions {
    pub installation: String,
    /// Rounds of "run every due Proxy" before a dry-run gives up (real mode is bounded by
    /// `timeout`).
    pub max_rounds: u32,
    /// Wall-time budget in real mode.
    pub timeout: Duration,
    pub gc_grace: Duration,
    /// Where status is written after every change (real mode).
    pub state_path: Option<PathBuf>,
    /// Proxies reconciled at once in real mode. A dry-run steps one at a time on virtual
    /// time, so its plan is the same on every run.
    pub concurrency: usize,
    /// A dry-run goes on this long in simulated time even once steady, so rotations and
    /// rollouts show (`--for 24h`).
    pub run_for: Option<Duration>,
    /// `reconcile --watch --listen`: the API's view of the run, and the leases its pools'
    /// decisions read.
    pub leases: Option<Arc<crate::leases::Board>>,
    /// A dry-run's crawl (the world's `targets` and `crawl`), played with `run_for`.
    pub crawl: Option<egress_control::crawl::Crawl>,
}

/// The default for `--concurrency`: enough that a fleet of VMs boots together, few enough that
/// one host is not flooded with image fetches and defines at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

pub struct Driver<'a> {
    pub providers: &'a Providers,
    pub config: &'a ProvidersConfig,
    pub recorder: Arc<PlanRecorder>,
    pub time: Time,
    /// The egress check, when the providers config has one.
    pub egress: Option<Arc<EgressChecker>>,
    /// Each Proxy's credential: beside the state file in real mode, in memory in a dry-run.
    pub credentials: Arc<dyn egress_control::credential_store::CredentialSource>,
    pub options: DriverOptions,
}

impl Driver<'_> {
    pub async fn run(
        &self,
        proxies: Vec<Proxy>,
        prior: StateFile,
    ) -> Result<Report, crate::error::CliError> {
        self.run_with_state(proxies, prior).await.map(|(r, _)| r)
    }

    /// Like `run`, also handing back the statuses as they ended, for the next run.
    pub async fn run_with_state(
        &self,
        proxies: Vec<Proxy>,
        prior: StateFile,
    ) -> Result<(Report, StateFile), crate::error::CliError> {
        self.run_all(proxies, Vec::new(), prior).await
    }

    /// Proxies and ProxyPools: each pool's decisions make and delete Proxies as the run goes.
    pub async fn run_all(
        &self,
        proxies: Vec<Proxy>,
        pools: Vec<ProxyPool>,
        prior: StateFile,
    ) -> Result<(Report, StateFile), crate::error::CliError> {
        let started_ms = self.time.now_ms();
        let created = |s: &StoredProxy| {
            s.created_at
                .as_deref()
                .and_then(egress_core::gc::parse_rfc3339)
                .map_or(started_ms, |t| (t.max(0) as u64) * 1000)
        };
        let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
        for p in proxies {
            let key = p.key();
            let stored = prior.proxies.get(&key).filter(|s| s.uid == p.uid());
            let status = stored.map(|s| s.status.clone()).unwrap_or_default();
            let mut t = Tracked::new(p, status, false, started_ms);
            t.created_ms = stored.map_or(started_ms, created);
            tracked.insert(key, t);
        }
        let pool_names: BTreeSet<String> = pools
            .iter()
            .map(|p| format!("{}/{}", p.metadata.namespace, p.metadata.name))
            .collect();
        // Proxies in the state file but gone from the proxies file are being deleted, unless a
        // pool still in the file owns them.
        for (key, stored) in &prior.proxies {
            if tracked.contains_key(key) {
                continue;
            }
            let namespace = key.split_once('/').map_or("", |(n, _)| n);
            let owned = stored
                .pool
                .as_ref()
                .is_some_and(|p| pool_names.contains(&format!("{namespace}/{p}")));
            let mut t = Tracked::new(stored.to_proxy(), stored.status.clone(), !owned, started_ms);
            t.created_ms = created(stored);
            tracked.insert(key.clone(), t);
        }
        if let Some(c) = &self.egress {
            for (key, t) in &tracked {
                c.record_status(key, &t.proxy.spec.provider, Some(&t.status));
            }
        }
        let mut pool_runs: Vec<PoolRun> = pools
            .into_iter()
            .map(|p| {
                let key = format!("{}/{}", p.metadata.namespace, p.metadata.name);
                let stored = prior.pools.get(&key);
                PoolRun::new(
                    p,
                    stored.map_or(0, |s| s.serial),
                    stored.and_then(|s| s.status.clone()),
                )
            })
            .collect();
        let state = StateFile {
            installation: self.options.installation.clone(),
            proxies: prior.proxies,
            pools: prior.pools,
        };
        let mut sink = StatusOutput {
            store: match &self.options.state_path {
                Some(path) => StatusStorage::File(StateWriter::open(path, state)?),
                None => StatusStorage::Memory(state),
            },
            board: self.options.leases.clone(),
            unrecorded: Default::default(),
        };
        if let Some(b) = &self.options.leases {
            b.publish_pools(pool_runs.iter().map(|r| (r.key(), &r.pool.spec, &r.status)));
        }

        let deadline_ms = started_ms.saturating_add(self.options.timeout.as_millis() as u64);
        let mut crawl = self.options.crawl.clone();
        let rounds = match &self.time {
            Time::Virtual(clock) => {
                self.run_rounds(
                    clock,
                    &mut tracked,
                    &mut pool_runs,
                    &mut sink,
                    started_ms,
                    crawl.as_mut(),
                )
                .await?
            }
            Time::Real(_) => {
                self.run_concurrent(&mut tracked, &mut pool_runs, &mut sink, deadline_ms)
                    .await?
            }
        };

        let (gc, incomplete) = self.sweep(&tracked).await;
        for run in &pool_runs {
            sink.pool(run)?;
        }
        let state = sink.finish(&tracked)?;
        // A Proxy gone from the state has no instance left: its credential goes too.
        let keep: std::collections::BTreeSet<String> =
            state.proxies.values().map(|p| p.uid.clone()).collect();
        self.credentials
            .retain(&keep)
            .map_err(crate::error::CliError::Runtime)?;

        let mut by_subject: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        for step in self.recorder.take() {
            by_subject
                .entry(step.subject.clone())
                .or_default()
                .push(step.into());
        }
        let steady = tracked.values().all(|t| t.released || t.steady);
        let proxies: Vec<ProxyReport> = tracked
            .into_iter()
            .map(|(key, t)| ProxyReport {
                namespace: t.proxy.metadata.namespace.clone(),
                name: t.proxy.metadata.name.clone(),
                provider: t.proxy.spec.provider.clone(),
                pool: t
                    .proxy
                    .metadata
                    .labels
                    .get(egress_core::discovery::POOL_LABEL)
                    .cloned(),
                deleted: t.released,
                created_ms: t.created_ms,
                released_ms: t.released_ms,
                machine_type: t.proxy.spec.placement.machine_type.clone(),
                steady: t.released || t.steady,
                changes: by_subject.remove(&key).unwrap_or_default(),
                events: t.events,
                // The revision is the hold's bookkeeping (it changes with every module build);
                // the state file keeps it, the report leaves it out.
                status: ProxyStatus {
                    provider_revision: None,
                    ..t.status
                },
            })
            .collect();
        let next_due_ms = pool_runs.iter().filter_map(|r| r.next_at_ms).min();
        let end_ms = self.time.now_ms();
        let pools = pool_runs
            .into_iter()
            .map(|run| {
                let key = run.key();
                let mut r = run.report();
                if let Some(c) = &crawl {
                    r.targets = c.totals(&key);
                }
                r.cost = report::pool_cost(&r, &proxies, self.config, started_ms, end_ms);
                r
            })
            .collect();
        let report = Report {
            next_due_ms,
            proxies,
            pools,
            gc: GcReport {
                changes: by_subject.remove("gc").unwrap_or_default(),
                verdicts: gc,
                incomplete,
            },
            rounds,
            elapsed_seconds: (self.time.now_ms().saturating_sub(started_ms)) / 1000,
            steady,
            started_at: egress_core::egress::rfc3339_ms(started_ms),
            started_ms,
        };
        Ok((report, state))
    }

    /// A dry-run: rounds of "step every due Proxy in key order", virtual time jumping to the
    /// next due Proxy in between, so the plan is the same on every run. Pools decide at every
    /// round; with `run_for` the run goes on, steady or not, until that much time passed.
    async fn run_rounds(
        &self,
        clock: &VirtualClock,
        tracked: &mut BTreeMap<String, Tracked>,
        pools: &mut [PoolRun],
        sink: &mut StatusOutput,
        started_ms: u64,
        mut crawl: Option<&mut egress_control::crawl::Crawl>,
    ) -> Result<u32, crate::error::CliError> {
        let end_ms = self
            .options
            .run_for
            .map(|d| started_ms.saturating_add(d.as_millis() as u64));
        // A crawl plays minute by minute over a run of a set length only (a run that ends
        // once steady would never be, with requests arriving every minute).
        const MINUTE_MS: u64 = 60_000;
        let mut next_crawl_ms = end_ms
            .and(crawl.as_ref())
            .map(|_| started_ms.saturating_add(MINUTE_MS));
        let mut rounds = 0;
        loop {
            let now = clock.now_millis();
            if end_ms.is_some_and(|end| now >= end) {
                break;
            }
            if let (Some(c), Some(at)) = (crawl.as_deref_mut(), next_crawl_ms)
                && now >= at
            {
                crawl::minute(
                    c,
                    pools,
                    tracked,
                    now,
                    &egress_core::egress::rfc3339_ms(now),
                    &mut egress_runtime::plan::next_seq,
                );
                next_crawl_ms = Some(at.saturating_add(MINUTE_MS));
            }
            for run in pools.iter_mut().filter(|r| r.due(now)) {
                run.step(
                    self.providers,
                    self.thresholds(),
                    self.options.leases.as_deref(),
                    tracked,
                    now,
                    &mut egress_runtime::plan::next_seq,
                );
                sink.pool(run)?;
            }
            // One pass finds the due Proxies and, for when none is, the next one due: most
            // rounds of a long run step one or two Proxies out of hundreds.
            let mut due: Vec<String> = Vec::new();
            let mut next_tracked = u64::MAX;
            for (k, t) in tracked.iter().filter(|(_, t)| !t.released) {
                if t.next_at_ms <= now {
                    due.push(k.clone());
                } else {
                    next_tracked = next_tracked.min(t.next_at_ms);
                }
            }
            if due.is_empty() {
                let settled = tracked.values().all(|t| t.released || t.steady)
                    && pools.iter().all(|p| p.settled);
                if settled && end_ms.is_none() {
                    break;
                }
                let next = std::iter::once(next_tracked)
                    .chain(pools.iter().filter_map(|p| p.next_at_ms))
                    .chain(next_crawl_ms)
                    .chain(end_ms)
                    .min()
                    .unwrap_or(u64::MAX);
                if next == u64::MAX {
                    break;
                }
                clock.advance_to(next);
                continue;
            }
            rounds += 1;
            if end_ms.is_none() && rounds > self.options.max_rounds {
                break;
            }
            for key in due {
                if let Some(t) = tracked.get_mut(&key) {
                    let before = pool_view(t);
                    self.step(&key, t).await;
                    sink.record(&key, t)?;
                    mark_pool(pools, t, before);
                }
                self.refresh_peers(tracked, sink)?;
            }
        }
        Ok(if end_ms.is_some() {
            rounds
        } else {
            rounds.min(self.options.max_rounds)
        })
    }

    /// Real mode: up to `concurrency` Proxies stepped at once, each started as soon as it is
    /// due and a slot is free, its change recorded durably before it is stepped again. Past
    /// the deadline nothing new starts; steps under way finish (their calls are bounded).
    /// Returns the number of steps run.
    async fn run_concurrent(
        &self,
        tracked: &mut BTreeMap<String, Tracked>,
        pools: &mut [PoolRun],
        sink: &mut StatusOutput,
        deadline_ms: u64,
    ) -> Result<u32, crate::error::CliError> {
        let limit = self.options.concurrency.max(1);
        let mut in_flight = FuturesUnordered::new();
        // Proxies being stepped, with the pool (namespace/name) each belongs to.
        let mut flying: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut steps: u32 = 0;
        // Proxies whose background check finished while they were being stepped: stepped
        // again once they land, to fold it.
        let mut rewake: BTreeSet<String> = BTreeSet::new();
        let wakes = self.egress.as_ref().and_then(|c| c.wakes()).cloned();
        loop {
            let now = self.time.now_ms();
            if now < deadline_ms {
                // A pool decides over all of its Proxies: not while one of them is being
                // stepped (it is out of the map meanwhile).
                for run in pools.iter_mut() {
                    let pool = Some(run.key());
                    if let Some(b) = self.options.leases.as_deref() {
                        run.set_demand(b.demand_of(&run.key()));
                    }
                    let busy = flying.values().any(|p| *p == pool);
                    if !busy && run.due(now) {
                        run.step(
                            self.providers,
                            self.thresholds(),
                            self.options.leases.as_deref(),
                            tracked,
                            now,
                            &mut egress_runtime::plan::next_seq,
                        );
                        sink.pool(run)?;
                    }
                }
                let due: Vec<String> = tracked
                    .iter()
                    .filter(|(_, t)| !t.released && t.next_at_ms <= now)
                    .map(|(k, _)| k.clone())
                    .take(limit.saturating_sub(in_flight.len()))
                    .collect();
                for key in due {
                    // Out of the map while it runs: it is neither due nor counted as idle.
                    if let Some(mut t) = tracked.remove(&key) {
                        steps += 1;
                        let pool = t
                            .proxy
                            .metadata
                            .labels
                            .get(egress_core::discovery::POOL_LABEL)
                            .map(|p| format!("{}/{p}", t.proxy.metadata.namespace));
                        flying.insert(key.clone(), pool);
                        in_flight.push(async move {
                            let before = pool_view(&t);
                            self.step(&key, &mut t).await;
                            (key, t, before)
                        });
                    }
                }
            }
            let idle_next = tracked
                .values()
                .filter(|t| !t.released)
                .map(|t| t.next_at_ms)
                .min();
            // What the progress lines show (nothing listens otherwise): every pass, so the
            // counts are current; drawing is rate-limited there.
            tracing::trace!(
                target: crate::progress::RUN_TARGET,
                proxies = (tracked.values().filter(|t| !t.released).count() + in_flight.len()) as u64,
                steady = tracked.values().filter(|t| !t.released && t.steady).count() as u64,
                in_flight = in_flight.len() as u64,
                next_step_ms = idle_next
                    .filter(|&n| n != u64::MAX)
                    .map(|n| n.saturating_sub(now)),
                deadline_ms = deadline_ms.saturating_sub(now),
                "run"
            );
            if in_flight.is_empty() {
                let settled = tracked.values().all(|t| t.released || t.steady)
                    && pools.iter().all(|p| p.settled);
                let Some(next) = idle_next.filter(|_| !settled && now < deadline_ms) else {
                    break;
                };
                let wait = next.min(deadline_ms).saturating_sub(now);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait.max(1))) => {}
                    () = board_changed(self.options.leases.as_deref()) => {
                        pools.iter_mut().for_each(PoolRun::touch);
                    }
                    () = check_finished(wakes.as_deref()) => {
                        self.fold_due(wakes.as_deref(), tracked, &flying, &mut rewake);
                    }
                }
                continue;
            }
            // A slot is free: wake for the next due Proxy too, not only for a finished step.
            let wake = idle_next
                .filter(|_| in_flight.len() < limit && now < deadline_ms)
                .map(|next| {
                    Duration::from_millis(next.min(deadline_ms).saturating_sub(now).max(1))
                });
            tokio::select! {
                Some((key, mut t, before)) = in_flight.next() => {
                    sink.record(&key, &t)?;
                    flying.remove(&key);
                    mark_pool(pools, &t, before);
                    if rewake.remove(&key) {
                        t.next_at_ms = t.next_at_ms.min(self.time.now_ms());
                    }
                    tracked.insert(key, t);
                    self.refresh_peers(tracked, sink)?;
                }
                () = sleep_or_never(wake) => {}
                () = board_changed(self.options.leases.as_deref()) => {
                    pools.iter_mut().for_each(PoolRun::touch);
                }
                () = check_finished(wakes.as_deref()) => {
                    self.fold_due(wakes.as_deref(), tracked, &flying, &mut rewake);
                }
            }
        }
        Ok(steps)
    }

    /// Makes the Proxies whose background checks finished due now, so their next step folds
    /// the check; one being stepped is made due once it lands.
    fn fold_due(
        &self,
        wakes: Option<&CheckWakes>,
        tracked: &mut BTreeMap<String, Tracked>,
        flying: &BTreeMap<String, Option<String>>,
        rewake: &mut BTreeSet<String>,
    ) {
        let now = self.time.now_ms();
        for key in wakes.map(CheckWakes::take).unwrap_or_default() {
            if let Some(t) = tracked.get_mut(&key) {
                t.next_at_ms = t.next_at_ms.min(now);
            } else if flying.contains_key(&key) {
                rewake.insert(key);
            }
        }
    }

    /// Brings `egressSharedWith` up to date on the Proxies whose peers changed (another one
    /// joined or left their egress address), without a step: a status of what the fleet
    /// knows. One being stepped is out of the map; its step ends with its peers as they are.
    fn refresh_peers(
        &self,
        tracked: &mut BTreeMap<String, Tracked>,
        sink: &mut StatusOutput,
    ) -> Result<(), crate::error::CliError> {
        let Some(c) = &self.egress else {
            return Ok(());
        };
        for key in c.take_peers_changed() {
            let Some(t) = tracked.get_mut(&key).filter(|t| !t.released) else {
                continue;
            };
            let peers = match t.status.egress_ip.as_deref() {
                Some(ip) if reconcile::ready_is_true(&t.status) => c.egress_peers(&key, ip),
                _ => Vec::new(),
            };
            if peers != t.status.egress_shared_with {
                t.status.egress_shared_with = peers;
                sink.record(&key, t)?;
            }
        }
        Ok(())
    }

    /// The egress check's thresholds, when the run checks egress.
    fn thresholds(&self) -> Option<egress_core::egress::Thresholds> {
        self.egress.as_ref().map(|c| c.settings().thresholds())
    }

    /// Runs the decisions for one Proxy until it waits.
    async fn step(&self, key: &str, t: &mut Tracked) {
        let now = || self.time.now_rfc3339();
        let env = ReconcileEnv {
            providers: self.providers,
            installation: &self.options.installation,
            cloud_init: &InlineCloudInit,
            credentials: self.credentials.as_ref(),
            owner_references: false,
            now: &now,
            egress: self.egress.as_deref(),
        };
        // The status is replaced by the one the step returns, so it is moved in, not cloned.
        let r = reconcile_proxy(
            &env,
            &t.proxy,
            std::mem::take(&mut t.status),
            t.deleting,
            key,
        )
        .instrument(egress_control::reconciler::reconcile_span(
            &t.proxy, t.deleting,
        ))
        .await;
        let now_ms = self.time.now_ms();
        t.events.extend(r.events.into_iter().map(|e| ReportEvent {
            at_ms:
                egress_core::gc::parse_rfc3339(&e.at).map_or(now_ms, |s| (s.max(0) as u64) * 1000),
            at: e.at,
            seq: e.seq,
            warning: e.warning,
            reason: e.reason,
            message: e.message,
        }));
        t.status = r.status;
        t.steady = r.steady;
        if r.released && !t.released {
            t.released_ms = Some(now_ms);
        }
        t.released = r.released;
        if let Some(c) = &self.egress {
            c.record_status(
                key,
                &t.proxy.spec.provider,
                (!t.released).then_some(&t.status),
            );
        }
        match r.wait {
            Wait::After(d) => {
                t.attempts = 0;
                t.next_at_ms = now_ms + d.as_millis() as u64;
            }
            Wait::Backoff(class) => {
                t.attempts += 1;
                t.next_at_ms = now_ms + reconcile::backoff(class, t.attempts).as_millis() as u64;
            }
            Wait::AwaitChange => {
                t.attempts = 0;
                t.next_at_ms = u64::MAX;
            }
        }
    }

    /// Lists each provider's instances of this installation, page by page, and deletes those
    /// no Proxy in the file claims. A provider whose listing fails part way is reported
    /// incomplete, with the orphans of the pages it did list deleted; the others still sweep.
    /// One sweep is one trace, as in the operator.
    #[tracing::instrument(name = "gc", skip_all, fields(installation = %self.options.installation))]
    async fn sweep(
        &self,
        tracked: &BTreeMap<String, Tracked>,
    ) -> (Vec<GcVerdict>, Vec<GcIncomplete>) {
        let live: BTreeSet<String> = tracked
            .values()
            .filter(|t| !t.released)
            .map(|t| t.proxy.uid())
            .collect();
        let now_secs = (self.time.now_ms() / 1000) as i64;
        let grace = self.options.gc_grace.as_secs() as i64;
        let installation = &self.options.installation;
        let mut verdicts = Vec::new();
        let mut incomplete = Vec::new();
        for provider in self.providers.iter() {
            // Judged as each page comes, so only the verdicts outlive a page.
            let mut judged: Vec<(String, Verdict)> = Vec::new();
            let mut pages = 0u32;
            let listed = provider
                .list_pages("gc", installation, provider.list_page_size(), |page| {
                    pages += 1;
                    for inst in page {
                        let created = gc::parse_rfc3339(&inst.created_at);
                        let verdict =
                            gc::judge(&inst, &live, installation, created, now_secs, grace);
                        judged.push((inst.provider_id, verdict));
                    }
                })
                .await;
            if let Err(e) = listed {
                tracing::warn!(provider = %provider.name, pages, "sweep incomplete: {e}");
                incomplete.push(GcIncomplete {
                    provider: provider.name.clone(),
                    reason: e.reason.clone(),
                    message: e.message.clone(),
                    pages_listed: pages,
                });
            }
            for (provider_id, verdict) in judged {
                let mut label = format!("{verdict:?}");
                if verdict == Verdict::Orphan {
                    if let Err(e) = provider.delete("gc", &provider_id).await {
                        label = format!("DeleteFailed: {}", e.message);
                    } else {
                        label = "Deleted".into();
                    }
                }
                verdicts.push(GcVerdict {
                    provider: provider.name.clone(),
                    provider_id,
                    verdict: label,
                });
            }
        }
        (verdicts, incomplete)
    }
}

/// What a pool's decisions look at of one of its Proxies.
fn pool_view(t: &Tracked) -> (bool, bool, bool) {
    (reconcile::ready_is_true(&t.status), t.deleting, t.released)
}

/// Marks the Proxy's pool for a new decision when what the pool sees of it changed.
fn mark_pool(pools: &mut [PoolRun], t: &Tracked, before: (bool, bool, bool)) {
    if pool_view(t) != before {
        for run in pools.iter_mut().filter(|r| r.owns(t)) {
            run.dirty = true;
        }
    }
}

/// Until a background check finishes; never when checks run inline.
async fn check_finished(wakes: Option<&CheckWakes>) {
    match wakes {
        Some(w) => w.wait().await,
        None => std::future::pending().await,
    }
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Resolves when the board says a release or a cordon happened; never without a board.
pub(crate) async fn board_changed(board: Option<&crate::leases::Board>) {
    match board {
        Some(b) => b.changed().await,
        None => std::future::pending().await,
    }
}
