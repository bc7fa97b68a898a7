//! The egress check as the CLI and the operator run it: a probe through each running proxy
//! when its check is due, folded into the status by the core's decisions, with the checker's
//! own health and each provider's share of failing proxies taken into account. The probe is a
//! seam: the network one (egress-check) in real runs, [`SimEgress`] in simulated ones.
//!
//! What a check learns is kept here, fresh, for discovery; the status records it when
//! something changed and otherwise at most every [`STATUS_REFRESH`], so a fleet checked every
//! 30 s does not write every Proxy's status every 30 s.

use crate::capabilities::clock::ClockBackend;
use egress_core::egress::{self, CheckOutcome, CheckReason, CheckResult, Settings};
use egress_core::{Proxy, ProxyStatus};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How stale the recorded check time and latency may grow before a check that changed
/// nothing writes them anyway.
pub const STATUS_REFRESH: Duration = Duration::from_secs(300);
/// How long a direct look at the echo endpoints is trusted.
const ECHO_LOOK_TTL_MS: u64 = 10_000;

/// What a direct look (no proxy in between) at every echo endpoint found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoLook {
    /// Per configured URL, in the settings' order: it answered in the echo format.
    pub up: Vec<bool>,
    /// The checker's own addresses as the echoes that answered saw them (behind a NAT, its
    /// public ones): an echo seeing one of them through a proxy was not hidden from.
    pub origins: Vec<String>,
    /// Per URL that did not answer, why (for messages).
    pub why_down: Vec<String>,
}

/// The echoes a probe asks for: per scheme configured, the first that answered directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    pub urls: Vec<String>,
    /// More of the checker's own addresses: [`EchoLook::origins`].
    pub own_addresses: Vec<String>,
    /// The proxy's credential as a `Proxy-Authorization` value, which every generated Squid
    /// requires. Secret: a probe sends it to the proxy and quotes it nowhere.
    pub proxy_authorization: Option<String>,
}

fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
}

impl EchoLook {
    /// Per scheme among `urls` (http first, then https), the first that is up, in order;
    /// Err names the scheme with none up.
    pub fn choose(&self, urls: &[String]) -> Result<Chosen, String> {
        let mut chosen = Vec::new();
        for https in [false, true] {
            let of_scheme: Vec<(usize, &String)> = urls
                .iter()
                .enumerate()
                .filter(|(_, u)| is_https(u) == https)
                .collect();
            if of_scheme.is_empty() {
                continue;
            }
            match of_scheme
                .iter()
                .find(|(i, _)| self.up.get(*i).copied().unwrap_or(false))
            {
                Some((_, u)) => chosen.push((*u).clone()),
                None => {
                    let scheme = if https { "https" } else { "http" };
                    return Err(format!("no {scheme} echo answers the checker directly"));
                }
            }
        }
        if chosen.is_empty() {
            return Err("no echo URL is configured".into());
        }
        Ok(Chosen {
            urls: chosen,
            own_addresses: self.origins.clone(),
            proxy_authorization: None,
        })
    }
}

/// A check through one proxy, and a direct look at the echo endpoints.
#[async_trait::async_trait]
pub trait EgressProbe: Send + Sync {
    /// Asks for each of `echoes.urls` through the proxy at `ip:port` (the plain GET and the
    /// tunnel), judged together: verified only when every one verified.
    async fn probe(&self, ip: &str, port: u16, settings: &Settings, echoes: &Chosen)
    -> CheckResult;
    /// Asks every echo endpoint directly, without a proxy in between.
    async fn look(&self, settings: &Settings) -> EchoLook;
}

/// The Proxies' statuses as the outage rule counts them: each provider's (failing, checked)
/// Proxies, from what their statuses hold (see `egress_core::egress::outage_vote`), leaving
/// one Proxy out. The operator counts its watch of every Proxy, the CLI its tracked statuses;
/// so a new leader or a restarted run decides as the one before would have.
pub trait Fleet: Send + Sync {
    fn outage_counts(&self, provider: &str, except: &str) -> (usize, usize);
    /// Told of a Proxy's status by a caller that tracks them itself (or, with None, that it
    /// went); a fleet fed otherwise (a watch) ignores it.
    fn record(&self, _key: &str, _provider: &str, _status: Option<&ProxyStatus>) {}
    /// The other Ready Proxies (`namespace/name`, sorted, at most [`PEERS_SHOWN`]) whose last
    /// verified check came from `egress_ip`, leaving `key` out.
    fn egress_peers(&self, _key: &str, _egress_ip: &str) -> Vec<String> {
        Vec::new()
    }
    /// The Proxies whose peers changed since the last call.
    fn take_peers_changed(&self) -> Vec<String> {
        Vec::new()
    }
}

/// How many Proxies sharing an egress address a status names.
pub const PEERS_SHOWN: usize = 10;

/// A [`Fleet`] kept from the statuses it is told of (the CLI's tracked statuses, the
/// operator's watch of every Proxy), with each provider's counts kept as they change, so a
/// check of one of 10,000 Proxies costs no walk over the others.
#[derive(Default)]
pub struct StatusFleet {
    inner: Mutex<FleetInner>,
    /// Wakes whoever refreshes the statuses of Proxies whose egress peers changed.
    peers_changed: tokio::sync::Notify,
}

#[derive(Default)]
struct FleetInner {
    /// Each Proxy's provider and vote.
    votes: HashMap<String, (String, Option<bool>)>,
    /// Per provider: (failing, checked).
    counts: HashMap<String, (usize, usize)>,
    /// The keys a relist has seen so far, while one is under way.
    relist: Option<std::collections::HashSet<String>>,
    /// Each Ready Proxy's egress address, and the Proxies of each address: who shares one.
    egress_of: HashMap<String, String>,
    by_egress: HashMap<String, std::collections::BTreeSet<String>>,
    /// Proxies whose peers changed since the last [`StatusFleet::take_peers_changed`]: the
    /// others of an address a Proxy joined or left.
    peers_changed: std::collections::BTreeSet<String>,
}

impl FleetInner {
    fn count(&mut self, provider: &str, vote: Option<bool>, sign: bool) {
        let Some(failing) = vote else { return };
        let c = self.counts.entry(provider.to_string()).or_default();
        let step = |n: &mut usize| {
            *n = if sign {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        step(&mut c.1);
        if failing {
            step(&mut c.0);
        }
    }

    fn set(&mut self, key: &str, entry: Option<(String, Option<bool>)>) {
        if let Some((p, v)) = self.votes.remove(key) {
            self.count(&p, v, false);
        }
        if let Some((p, v)) = entry {
            self.count(&p, v, true);
            self.votes.insert(key.to_string(), (p, v));
        }
    }

    /// `key`'s egress address now: a Ready Proxy's last verified one, else none.
    fn set_egress(&mut self, key: &str, egress: Option<&str>) {
        if self.egress_of.get(key).map(String::as_str) == egress {
            return;
        }
        if let Some(old) = self.egress_of.remove(key)
            && let Some(keys) = self.by_egress.get_mut(&old)
        {
            keys.remove(key);
            self.peers_changed.extend(keys.iter().cloned());
            if keys.is_empty() {
                self.by_egress.remove(&old);
            }
        }
        if let Some(ip) = egress {
            self.egress_of.insert(key.to_string(), ip.to_string());
            let keys = self.by_egress.entry(ip.to_string()).or_default();
            self.peers_changed
                .extend(keys.iter().filter(|k| *k != key).cloned());
            keys.insert(key.to_string());
        }
    }
}

impl StatusFleet {
    fn inner(&self) -> std::sync::MutexGuard<'_, FleetInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a Proxy's status (or, with None, that it went).
    pub fn record(&self, key: &str, provider: &str, status: Option<&ProxyStatus>) {
        Fleet::record(self, key, provider, status)
    }

    /// The Proxies whose egress peers changed since the last call (another Proxy joined or
    /// left their address): their `egressSharedWith` is out of date until refreshed.
    pub fn take_peers_changed(&self) -> Vec<String> {
        std::mem::take(&mut self.inner().peers_changed)
            .into_iter()
            .collect()
    }

    /// Completes when [`Self::take_peers_changed`] has something (or had since the last
    /// wait).
    pub async fn peers_changed(&self) {
        self.peers_changed.notified().await
    }

    /// A watch lists everything again: what the list does not name by [`Self::end_relist`]
    /// went meanwhile.
    pub fn begin_relist(&self) {
        self.inner().relist = Some(Default::default());
    }

    pub fn end_relist(&self) {
        let mut inner = self.inner();
        let Some(seen) = inner.relist.take() else {
            return;
        };
        let gone: Vec<String> = inner
            .votes
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            inner.set(&k, None);
            inner.set_egress(&k, None);
        }
        let changed = !inner.peers_changed.is_empty();
        drop(inner);
        if changed {
            self.peers_changed.notify_one();
        }
    }
}

impl Fleet for StatusFleet {
    fn record(&self, key: &str, provider: &str, status: Option<&ProxyStatus>) {
        let mut inner = self.inner();
        if let Some(seen) = &mut inner.relist
            && status.is_some()
        {
            seen.insert(key.to_string());
        }
        inner.set(
            key,
            status.map(|s| (provider.to_string(), egress::outage_vote(s))),
        );
        let egress = status
            .filter(|s| egress_core::reconcile::ready_is_true(s))
            .and_then(|s| s.egress_ip.as_deref());
        inner.set_egress(key, egress);
        let changed = !inner.peers_changed.is_empty();
        drop(inner);
        if changed {
            self.peers_changed.notify_one();
        }
    }

    fn take_peers_changed(&self) -> Vec<String> {
        StatusFleet::take_peers_changed(self)
    }

    fn egress_peers(&self, key: &str, egress_ip: &str) -> Vec<String> {
        let inner = self.inner();
        inner
            .by_egress
            .get(egress_ip)
            .map_or_else(Vec::new, |keys| {
                keys.iter()
                    .filter(|k| *k != key)
                    .take(PEERS_SHOWN)
                    .cloned()
                    .collect()
            })
    }

    fn outage_counts(&self, provider: &str, except: &str) -> (usize, usize) {
        let inner = self.inner();
        let (mut failing, mut checked) = inner.counts.get(provider).copied().unwrap_or_default();
        if let Some((p, Some(f))) = inner.votes.get(except)
            && p == provider
        {
            checked = checked.saturating_sub(1);
            failing = failing.saturating_sub(usize::from(*f));
        }
        (failing, checked)
    }
}

/// Told of every check's result (the operator's metrics).
pub trait CheckObserver: Send + Sync {
    fn checked(&self, provider: &str, reason: CheckReason, latency_ms: Option<u64>);
}

/// The latest check of one Proxy, as discovery shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latest {
    pub provider: String,
    pub reason: CheckReason,
    pub egress_ip: Option<String>,
    pub latency_ms: Option<u64>,
    pub checked_at_ms: u64,
    pub verified_at_ms: Option<u64>,
}

#[derive(Default)]
struct Table {
    latest: HashMap<String, Latest>,
    /// When each Proxy's instance was last looked at (a Get), Unix ms.
    observed: HashMap<String, u64>,
    /// Proxies whose checks a loop runs in the background, for the instance it went through.
    running: HashMap<String, Running>,
    /// Numbers the loops, so one replaced by another (its instance replaced) knows to stop.
    loops: u64,
    /// Checks finished in the background, each waiting for its Proxy's next reconcile to fold
    /// it into the status.
    finished: HashMap<String, Finished>,
}

/// Which instance a check went through: a result folds only into the status of that instance,
/// never into one that replaced it meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probed {
    ip: String,
    port: u16,
    provider_id: Option<String>,
}

impl Probed {
    fn of(proxy: &Proxy, status: &ProxyStatus) -> Self {
        Self {
            ip: status.ip.clone().unwrap_or_default(),
            port: proxy.spec.port,
            provider_id: status.provider_id.clone(),
        }
    }
}

struct Finished {
    of: Probed,
    result: CheckResult,
    at_ms: u64,
}

/// A loop checking one Proxy's instance in the background.
struct Running {
    token: u64,
    of: Probed,
    /// It finished a probe since it started: the status it started from holds.
    probed: bool,
}

/// What a loop needs of the status it started from to tell a check that changes nothing (the
/// status would be written as it is) from one the status must take.
struct Quiet {
    /// Verified at the last check, not failing, not to be replaced.
    clean: bool,
    egress_ip: Option<String>,
    /// Unix ms of the recorded check (the status is rewritten once it is STATUS_REFRESH old).
    checked_at_ms: Option<u64>,
}

impl Quiet {
    fn of(status: &ProxyStatus) -> Self {
        let verified = status
            .condition(egress::EGRESS_VERIFIED)
            .is_some_and(|c| c.status == "True" && c.reason == CheckReason::Verified.as_str());
        Self {
            clean: verified && status.egress_failures == 0 && status.replace_requested.is_none(),
            egress_ip: status.egress_ip.clone(),
            checked_at_ms: status
                .egress_checked_at
                .as_deref()
                .and_then(egress_core::gc::parse_rfc3339)
                .map(|t| (t.max(0) as u64) * 1000),
        }
    }

    /// Whether folding `result` at `at_ms` would leave the status as it is (see
    /// [`quiet_refresh`]): verified again from the same address, within the refresh time.
    fn holds(&self, result: &CheckResult, at_ms: u64) -> bool {
        self.clean
            && result.reason == CheckReason::Verified
            && result.egress_ip == self.egress_ip
            && self
                .checked_at_ms
                .is_some_and(|t| at_ms.saturating_sub(t) < STATUS_REFRESH.as_millis() as u64)
    }
}

/// The last direct look at the echoes: when (Unix ms), its ticket, and what it found.
struct CachedLook {
    at_ms: u64,
    ticket: u64,
    look: EchoLook,
}

/// What a probe needs and what it leaves, shared with the checks under way in the background.
struct Probing {
    settings: Settings,
    probe: Arc<dyn EgressProbe>,
    clock: Arc<dyn ClockBackend>,
    table: Mutex<Table>,
    /// One direct look at a time, shared by every check that needs one then: the probe and
    /// the outage rule go by the same look, and checks failing together during an echo
    /// outage cost one look, not one each.
    look: tokio::sync::Mutex<Option<CachedLook>>,
    /// Orders probe starts and look starts: a look whose ticket is above a probe's began
    /// after that probe did.
    tickets: std::sync::atomic::AtomicU64,
    observer: Option<Arc<dyn CheckObserver>>,
}

/// Which Proxies have a check finished in the background, waiting to be folded: one per
/// process, shared by every checker it builds over its life (a reloaded config's too), so the
/// loop that reconciles them (the operator's controller, the CLI's run) listens in one place.
#[derive(Default)]
pub struct CheckWakes {
    keys: Mutex<Vec<String>>,
    notify: tokio::sync::Notify,
}

impl CheckWakes {
    fn wake(&self, key: String) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key);
        self.notify.notify_one();
    }

    /// Until a check finished since the last [`CheckWakes::take`].
    pub async fn wait(&self) {
        self.notify.notified().await;
    }

    /// The Proxies whose checks finished since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.keys.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Checks in the background: at most `slots` at once, each finished one told to `wakes`.
struct Background {
    slots: Arc<tokio::sync::Semaphore>,
    wakes: Arc<CheckWakes>,
}

/// What a reconcile learns from [`EgressChecker::check_if_due`].
#[derive(Debug)]
pub enum Due {
    /// No check is due and none finished.
    Not,
    /// A check of this instance, folded into its status.
    Checked(Box<CheckOutcome>),
    /// A check is under way in the background; the Proxy is woken when it finishes.
    Pending,
}

/// Runs checks and keeps their results.
pub struct EgressChecker {
    probing: Arc<Probing>,
    fleet: Option<Arc<dyn Fleet>>,
    background: Option<Background>,
}

/// The checker of real runs: a [`NetworkProbe`] with the config's settings and TLS trust.
/// Errors name the field at fault.
pub fn network_checker(
    config: &egress_core::config::EgressCheck,
    clock: Arc<dyn ClockBackend>,
) -> Result<EgressChecker, String> {
    let settings = Settings::from_config(config);
    let trust = trust_of(config.tls.as_ref())?;
    let probe = NetworkProbe::new(
        &settings,
        &config.client_addresses,
        config.source_address.as_deref(),
        &trust,
    )?;
    Ok(EgressChecker::new(settings, Arc::new(probe), clock))
}

/// What the https echoes are trusted by: `egressCheck.tls`, else the system's roots.
pub fn trust_of(
    tls: Option<&egress_core::config::EgressTls>,
) -> Result<egress_check::Trust, String> {
    let Some(tls) = tls else {
        return Ok(egress_check::Trust::System);
    };
    if let Some(Ok(pin)) = tls.pin() {
        return Ok(egress_check::Trust::Pinned(pin));
    }
    if let Some(Err(m)) = tls.pin() {
        return Err(format!("egressCheck.tls.certificateSHA256: {m}"));
    }
    match &tls.ca_file {
        Some(file) => egress_check::Trust::from_ca_file(std::path::Path::new(file))
            .map_err(|e| format!("egressCheck.tls.caFile: {e}")),
        None => Ok(egress_check::Trust::System),
    }
}

impl Probing {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ticket(&self) -> u64 {
        self.tickets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// One probe of the proxy at `ip:port`: the echoes to ask for from a direct look (per
    /// scheme, the first that answers, in the configured order; none answering makes the
    /// result CheckerUnavailable with no probe), the probe, and when it failed a look taken
    /// after it began (an echo that stopped answering meanwhile makes the result
    /// CheckerUnavailable: the proxy is not blamed).
    async fn probe_once(&self, ip: &str, port: u16, authorization: Option<String>) -> CheckResult {
        let unavailable = |message: String| CheckResult {
            reason: CheckReason::CheckerUnavailable,
            egress_ip: None,
            latency_ms: None,
            message,
        };
        let look = self.echo_look(None).await;
        match look.choose(&self.settings.urls) {
            Err(why) => unavailable(format!(
                "{why} ({}); the proxy is not blamed",
                look.why_down.join("; ")
            )),
            Ok(mut chosen) => {
                chosen.proxy_authorization = authorization;
                let ticket = self.ticket();
                let result = self.probe.probe(ip, port, &self.settings, &chosen).await;
                if !result.reason.is_failure() {
                    return result;
                }
                let after = self.echo_look(Some(ticket)).await;
                let gone: Vec<&String> = chosen
                    .urls
                    .iter()
                    .filter(|u| {
                        let i = self.settings.urls.iter().position(|c| c == *u);
                        !i.is_some_and(|i| after.up.get(i).copied().unwrap_or(false))
                    })
                    .collect();
                if gone.is_empty() {
                    result
                } else {
                    unavailable(format!(
                        "the echo {} stopped answering the checker directly during the check; the proxy is not blamed ({})",
                        gone.iter()
                            .map(|u| u.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        result.message
                    ))
                }
            }
        }
    }

    /// Keeps a check's result as the latest of its Proxy (what discovery shows, fresh) and
    /// tells the observer.
    fn record(&self, key: &str, provider: &str, result: &CheckResult, at_ms: u64) {
        if let Some(o) = &self.observer {
            o.checked(provider, result.reason, result.latency_ms);
        }
        let mut table = self.table();
        let verified_at_ms = match result.reason {
            CheckReason::Verified => Some(at_ms),
            _ => table.latest.get(key).and_then(|l| l.verified_at_ms),
        };
        table.latest.insert(
            key.to_string(),
            Latest {
                provider: provider.to_string(),
                reason: result.reason,
                egress_ip: result.egress_ip.clone(),
                latency_ms: result.latency_ms,
                checked_at_ms: at_ms,
                verified_at_ms,
            },
        );
    }

    /// A direct look at the echoes: the cached one while it is younger than the TTL, or, with
    /// `after` a probe's ticket, one that began after that probe did.
    async fn echo_look(&self, after: Option<u64>) -> EchoLook {
        let mut cached = self.look.lock().await;
        let now = self.clock.now_millis();
        if let Some(c) = cached.as_ref() {
            let fresh = match after {
                Some(ticket) => c.ticket > ticket,
                None => now.saturating_sub(c.at_ms) < ECHO_LOOK_TTL_MS,
            };
            if fresh {
                return c.look.clone();
            }
        }
        let ticket = self.ticket();
        let look = self.probe.look(&self.settings).await;
        *cached = Some(CachedLook {
            at_ms: self.clock.now_millis(),
            ticket,
            look: look.clone(),
        });
        look
    }
}

impl EgressChecker {
    pub fn new(
        settings: Settings,
        probe: Arc<dyn EgressProbe>,
        clock: Arc<dyn ClockBackend>,
    ) -> Self {
        Self {
            probing: Arc::new(Probing {
                settings,
                probe,
                clock,
                table: Mutex::new(Table::default()),
                look: tokio::sync::Mutex::new(None),
                tickets: std::sync::atomic::AtomicU64::new(0),
                observer: None,
            }),
            fleet: None,
            background: None,
        }
    }

    /// The same checker, counting the outage rule over `fleet` (the Proxies' statuses) rather
    /// than over the checks this process made.
    pub fn with_fleet(mut self, fleet: Arc<dyn Fleet>) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// The same checker, telling `observer` of every check. Before the checker is shared
    /// (it is built with its observer); on a shared one, nothing changes.
    pub fn with_observer(mut self, observer: Arc<dyn CheckObserver>) -> Self {
        if let Some(p) = Arc::get_mut(&mut self.probing) {
            p.observer = Some(observer);
        }
        self
    }

    /// The same checker, running its checks in the background, `egressCheck.concurrency` at
    /// once, each finished one told to `wakes` for its Proxy's reconcile to fold: a check
    /// neither waits for a reconcile slot nor holds one, so provider calls never queue behind
    /// proxies that time out, nor checks behind slow creates. Without it a check runs inside
    /// the reconcile that finds it due (a dry-run, whose virtual time a check does not take).
    pub fn in_background(mut self, wakes: Arc<CheckWakes>) -> Self {
        self.background = Some(Background {
            slots: Arc::new(tokio::sync::Semaphore::new(
                self.probing.settings.concurrency.max(1),
            )),
            wakes,
        });
        self
    }

    /// Where finished background checks are told, when checks run in the background.
    pub fn wakes(&self) -> Option<&Arc<CheckWakes>> {
        self.background.as_ref().map(|b| &b.wakes)
    }

    pub fn settings(&self) -> &Settings {
        &self.probing.settings
    }

    /// Unix ms on the checker's clock (virtual in simulated runs).
    pub fn now_ms(&self) -> u64 {
        self.probing.clock.now_millis()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.probing.table()
    }

    /// When the Proxy's next check is due (Unix ms): from what this process saw, else from
    /// the status (a restarted process goes on where the last left off); each on the Proxy's
    /// phase of the interval (see [`egress::due_after_ms`]). Never, for a reconcile, while a
    /// loop in the background checks this instance: it wakes the Proxy when there is
    /// something to fold.
    pub fn next_due_ms(&self, key: &str, status: &ProxyStatus) -> u64 {
        if self.background.is_some() {
            let table = self.table();
            if let Some(r) = table.running.get(key)
                && r.of.ip == status.ip.clone().unwrap_or_default()
                && r.of.provider_id == status.provider_id
            {
                return u64::MAX;
            }
        }
        self.due_from(key, status)
    }

    /// [`EgressChecker::next_due_ms`] by the checks alone.
    fn due_from(&self, key: &str, status: &ProxyStatus) -> u64 {
        if status.egress_checked_at.is_none() {
            // This instance was never checked (a new one, or one that replaced another).
            return 0;
        }
        let last = self.table().latest.get(key).map(|l| l.checked_at_ms);
        match last {
            Some(ms) => egress::due_after_ms(ms, key, &self.probing.settings),
            None => egress::next_due_ms(status, key, &self.probing.settings),
        }
    }

    /// How long a Proxy whose check is under way waits for it before its reconcile looks
    /// again, should the wake be lost: a probe (its plain request and its tunnel at once)
    /// and the direct look after a failure, each bounded by the timeout, and a second more.
    pub fn pending_wait(&self) -> Duration {
        self.probing.settings.timeout * 2 + Duration::from_secs(1)
    }

    /// Whether the provider's proxies fail less than `maxUnhealthy` (replacement allowed),
    /// and the counts: (failing, checked).
    pub fn provider_health(&self, provider: &str) -> (bool, usize, usize) {
        let (failing, checked) = match &self.fleet {
            Some(f) => f.outage_counts(provider, ""),
            None => self.own_counts(provider, ""),
        };
        (
            egress::replacement_allowed(failing, checked, &self.probing.settings.max_unhealthy),
            failing,
            checked,
        )
    }

    /// The other Ready Proxies whose egress address is `egress_ip`, as the fleet knows them
    /// (none without a fleet).
    pub fn egress_peers(&self, key: &str, egress_ip: &str) -> Vec<String> {
        self.fleet
            .as_ref()
            .map_or_else(Vec::new, |f| f.egress_peers(key, egress_ip))
    }

    /// The Proxies whose egress peers changed since the last call (see
    /// [`StatusFleet::take_peers_changed`]).
    pub fn take_peers_changed(&self) -> Vec<String> {
        self.fleet
            .as_ref()
            .map_or_else(Vec::new, |f| f.take_peers_changed())
    }

    /// Tells the fleet of a Proxy's status (or, with None, that it went), for a caller that
    /// tracks the statuses itself (the CLI).
    pub fn record_status(&self, key: &str, provider: &str, status: Option<&ProxyStatus>) {
        if let Some(f) = &self.fleet {
            f.record(key, provider, status);
        }
    }

    /// The outage rule over the checks this process made (no fleet given).
    fn own_counts(&self, provider: &str, except: &str) -> (usize, usize) {
        let table = self.table();
        let (mut failing, mut checked) = (0, 0);
        for (key, l) in table.latest.iter().filter(|(_, l)| l.provider == provider) {
            if l.reason == CheckReason::CheckerUnavailable || key == except {
                continue;
            }
            checked += 1;
            if l.reason.is_failure() {
                failing += 1;
            }
        }
        (failing, checked)
    }

    /// Checks one running Proxy now (see [`Probing::probe_once`]), then folds the result:
    /// the provider's short-circuit and the core's decisions.
    pub async fn check(&self, proxy: &Proxy, status: &ProxyStatus) -> CheckOutcome {
        self.check_as(proxy, status, None).await
    }

    /// [`EgressChecker::check`], presenting `authorization` (the proxy's credential as a
    /// `Proxy-Authorization` value) to the proxy.
    pub async fn check_as(
        &self,
        proxy: &Proxy,
        status: &ProxyStatus,
        authorization: Option<String>,
    ) -> CheckOutcome {
        let key = proxy.key();
        let ip = status.ip.clone().unwrap_or_default();
        let result = self
            .probing
            .probe_once(&ip, proxy.spec.port, authorization)
            .await;
        let at_ms = self.now_ms();
        self.probing
            .record(&key, &proxy.spec.provider, &result, at_ms);
        self.fold(proxy, status, &result, at_ms)
    }

    /// What a reconcile of a running Proxy does about its check: fold a check of this very
    /// instance that finished in the background; else, inline, run one when it is due; else
    /// make sure a loop in the background checks this instance, each check on its phase, for
    /// as long as its checks change nothing (verified again from the same address): it wakes
    /// the Proxy with the first that does, to be folded here, so a steady fleet is checked
    /// with no reconcile and no status write per check. `authorization` is asked for only
    /// when a probe or a loop starts.
    pub async fn check_if_due<F, Fut>(
        &self,
        proxy: &Proxy,
        status: &ProxyStatus,
        authorization: F,
    ) -> Due
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<String>>,
    {
        let key = proxy.key();
        let of = Probed::of(proxy, status);
        let finished = self.table().finished.remove(&key);
        if let Some(f) = finished.filter(|f| f.of == of) {
            return Due::Checked(Box::new(self.fold(proxy, status, &f.result, f.at_ms)));
        }
        let Some(bg) = &self.background else {
            if self.due_from(&key, status) > self.now_ms() {
                return Due::Not;
            }
            return Due::Checked(Box::new(
                self.check_as(proxy, status, authorization().await).await,
            ));
        };
        let first_due = self.due_from(&key, status);
        let token = {
            let mut table = self.table();
            match table.running.get(&key) {
                Some(r) if r.of == of => {
                    return if r.probed || first_due > self.now_ms() {
                        Due::Not
                    } else {
                        Due::Pending
                    };
                }
                // Another instance's loop, if any, stops at its next step.
                _ => {
                    table.loops += 1;
                    let token = table.loops;
                    table.running.insert(
                        key.clone(),
                        Running {
                            token,
                            of: of.clone(),
                            probed: false,
                        },
                    );
                    token
                }
            }
        };
        let authorization = authorization().await;
        tokio::spawn(check_loop(CheckLoop {
            probing: self.probing.clone(),
            slots: bg.slots.clone(),
            wakes: bg.wakes.clone(),
            key,
            provider: proxy.spec.provider.clone(),
            of,
            token,
            authorization,
            quiet: Quiet::of(status),
            first_due,
        }));
        if first_due > self.now_ms() {
            Due::Not
        } else {
            Due::Pending
        }
    }

    /// Folds a check's `result` (at `at_ms`) into the status: the outage rule over the
    /// others as their statuses (or this process's checks) hold them and this one as checked,
    /// then the core's decisions.
    fn fold(
        &self,
        proxy: &Proxy,
        status: &ProxyStatus,
        result: &CheckResult,
        at_ms: u64,
    ) -> CheckOutcome {
        let key = proxy.key();
        let (mut failing, mut checked) = match &self.fleet {
            Some(f) => f.outage_counts(&proxy.spec.provider, &key),
            None => self.own_counts(&proxy.spec.provider, &key),
        };
        if result.reason != CheckReason::CheckerUnavailable {
            checked += 1;
            failing += usize::from(result.reason.is_failure());
        }
        let settings = &self.probing.settings;
        let allowed = egress::replacement_allowed(failing, checked, &settings.max_unhealthy);
        let now = (at_ms / 1000) as i64;
        let mut out =
            egress::after_check(status, proxy.generation(), result, settings, allowed, now);
        quiet_refresh(status, &mut out.status, now);
        out
    }

    /// The checker's own addresses as the echoes last saw it directly.
    pub async fn learned_addresses(&self) -> Vec<String> {
        self.probing
            .look
            .lock()
            .await
            .as_ref()
            .map(|c| c.look.origins.clone())
            .unwrap_or_default()
    }

    /// Forgets a Proxy that went (deleted, or its instance replaced), with any check of it
    /// under way or waiting to be folded.
    pub fn forget(&self, key: &str) {
        let mut t = self.table();
        t.latest.remove(key);
        t.observed.remove(key);
        t.running.remove(key);
        t.finished.remove(key);
    }

    /// Records that the Proxy's instance was just looked at.
    pub fn observed(&self, key: &str) {
        let now = self.now_ms();
        self.table().observed.insert(key.to_string(), now);
    }

    /// Whether the Proxy's instance was looked at less than `within` ago.
    pub fn observed_within(&self, key: &str, within: Duration) -> bool {
        let now = self.now_ms();
        self.table()
            .observed
            .get(key)
            .is_some_and(|at| now.saturating_sub(*at) < within.as_millis() as u64)
    }

    /// How long until the Proxy's instance is due to be looked at again.
    pub fn until_resync(&self, key: &str, every: Duration) -> Duration {
        let now = self.now_ms();
        let at = self.table().observed.get(key).copied().unwrap_or(0);
        Duration::from_millis((at + every.as_millis() as u64).saturating_sub(now).max(1))
    }

    /// The latest check of every Proxy this process checked.
    pub fn latest(&self) -> BTreeMap<String, Latest> {
        self.table()
            .latest
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// One Proxy's checks in the background (see [`EgressChecker::check_if_due`]).
struct CheckLoop {
    probing: Arc<Probing>,
    slots: Arc<tokio::sync::Semaphore>,
    wakes: Arc<CheckWakes>,
    key: String,
    provider: String,
    of: Probed,
    token: u64,
    authorization: Option<String>,
    quiet: Quiet,
    first_due: u64,
}

async fn check_loop(l: CheckLoop) {
    let mine = |p: &Probing| {
        p.table()
            .running
            .get(&l.key)
            .is_some_and(|r| r.token == l.token)
    };
    let mut due = l.first_due;
    loop {
        let now = l.probing.clock.now_millis();
        if due > now {
            tokio::time::sleep(Duration::from_millis(due - now)).await;
        }
        if !mine(&l.probing) {
            return;
        }
        // The semaphore is never closed: a slot always comes.
        let Ok(slot) = l.slots.acquire().await else {
            return;
        };
        let result = l
            .probing
            .probe_once(&l.of.ip, l.of.port, l.authorization.clone())
            .await;
        drop(slot);
        let at_ms = l.probing.clock.now_millis();
        l.probing.record(&l.key, &l.provider, &result, at_ms);
        {
            let mut table = l.probing.table();
            // Forgotten meanwhile (the Proxy went, or its instance): nothing to fold.
            let Some(r) = table.running.get_mut(&l.key).filter(|r| r.token == l.token) else {
                return;
            };
            if l.quiet.holds(&result, at_ms) {
                r.probed = true;
            } else {
                table.running.remove(&l.key);
                table.finished.insert(
                    l.key.clone(),
                    Finished {
                        of: l.of,
                        result,
                        at_ms,
                    },
                );
                drop(table);
                l.wakes.wake(l.key);
                return;
            }
        }
        due = egress::due_after_ms(at_ms, &l.key, &l.probing.settings);
    }
}

/// Keeps a check that changed nothing from rewriting the status: the recorded time and
/// latency move only with a change of the condition or the egress address, or once the
/// recorded time is older than [`STATUS_REFRESH`].
fn quiet_refresh(before: &ProxyStatus, after: &mut ProxyStatus, now: i64) {
    let cond = |s: &ProxyStatus| {
        s.condition(egress::EGRESS_VERIFIED)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let changed = cond(before) != cond(after)
        || before.egress_ip != after.egress_ip
        || before.egress_failures != after.egress_failures
        || before.replace_requested != after.replace_requested;
    let recorded = before
        .egress_checked_at
        .as_deref()
        .and_then(egress_core::gc::parse_rfc3339);
    let stale = recorded.is_none_or(|t| now.saturating_sub(t) >= STATUS_REFRESH.as_secs() as i64);
    if !changed && !stale {
        after.egress_checked_at = before.egress_checked_at.clone();
        after.egress_latency_ms = before.egress_latency_ms;
        after.egress_verified_at = before.egress_verified_at.clone();
        // The condition's message may carry the same meaning in new words (a latency):
        // keep the recorded one.
        if let (Some(b), Some(a)) = (
            before.condition(egress::EGRESS_VERIFIED),
            after
                .conditions
                .iter_mut()
                .find(|c| c.type_ == egress::EGRESS_VERIFIED),
        ) {
            *a = b.clone();
        }
    }
}

/// The probe of real runs: through the proxy, a plain GET to the http echo and a CONNECT
/// tunnel with TLS to the https echo (egress-check), a fresh connection and a nonce each.
pub struct NetworkProbe {
    prober: egress_check::HttpProber,
    /// In the settings' order.
    echoes: Vec<(String, Arc<egress_check::EchoUrl>)>,
    nonces: Arc<dyn egress_check::NonceSource>,
}

impl NetworkProbe {
    /// Probes with the settings' timeout, counting the configured client addresses as the
    /// checker's own, trusting the https echoes by `trust`. Errors name the field at fault.
    pub fn new(
        settings: &Settings,
        client_addresses: &[String],
        source_address: Option<&str>,
        trust: &egress_check::Trust,
    ) -> Result<Self, String> {
        let echoes = settings
            .urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                u.parse::<egress_check::EchoUrl>()
                    .map(|e| (u.clone(), Arc::new(e)))
                    .map_err(|e| format!("egressCheck.urls[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let extra_own_addresses = client_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        let prober = egress_check::HttpProber::with_trust(
            egress_check::ProbeOptions {
                timeout: settings.timeout,
                extra_own_addresses,
                local_address: source_address.and_then(|a| a.parse().ok()),
                ..Default::default()
            },
            trust,
        )
        .map_err(|e| format!("egressCheck.tls: {e}"))?;
        Ok(Self {
            prober,
            echoes,
            nonces: Arc::new(egress_check::SeededNonces::from_entropy()),
        })
    }
}

fn reason_of(r: egress_check::Reason) -> CheckReason {
    use egress_check::Reason as R;
    match r {
        R::Verified => CheckReason::Verified,
        R::ProxyUnreachable => CheckReason::ProxyUnreachable,
        R::ProxyRefused => CheckReason::ProxyRefused,
        R::Timeout => CheckReason::Timeout,
        R::BadEcho => CheckReason::BadEcho,
        R::NotAnonymous => CheckReason::NotAnonymous,
        R::CheckerUnavailable => CheckReason::CheckerUnavailable,
        R::TunnelRefused => CheckReason::TunnelRefused,
        R::TlsFailed => CheckReason::TlsFailed,
    }
}

#[async_trait::async_trait]
impl EgressProbe for NetworkProbe {
    async fn probe(
        &self,
        ip: &str,
        port: u16,
        _settings: &Settings,
        chosen: &Chosen,
    ) -> CheckResult {
        let Ok(addr) = ip.parse::<std::net::IpAddr>() else {
            return CheckResult {
                reason: CheckReason::ProxyUnreachable,
                egress_ip: None,
                latency_ms: None,
                message: format!("{ip:?} is not an IP address"),
            };
        };
        let own: Vec<std::net::IpAddr> = chosen
            .own_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        let requests: Vec<egress_check::ProbeRequest> = chosen
            .urls
            .iter()
            .filter_map(|u| self.echoes.iter().find(|(text, _)| text == u))
            .map(|(_, echo)| egress_check::ProbeRequest {
                proxy: Some(std::net::SocketAddr::new(addr, port)),
                echo: echo.clone(),
                nonce: self.nonces.next_nonce(),
                client_addresses: own.clone(),
                proxy_authorization: chosen.proxy_authorization.clone(),
            })
            .collect();
        let out = egress_check::probe_all(&self.prober, &requests).await;
        CheckResult {
            reason: reason_of(out.reason),
            egress_ip: out.egress_ip.map(|a| a.to_string()),
            latency_ms: out.latency_ms,
            message: out.message,
        }
    }

    async fn look(&self, _settings: &Settings) -> EchoLook {
        let looks = self.echoes.iter().map(|(_, echo)| {
            let request =
                egress_check::ProbeRequest::new(None, echo.clone(), self.nonces.next_nonce());
            async move { egress_check::Prober::probe(&self.prober, &request).await }
        });
        let outcomes = futures::future::join_all(looks).await;
        let mut look = EchoLook::default();
        for ((url, _), out) in self.echoes.iter().zip(outcomes) {
            // Seeing the checker itself is expected without a proxy: answering is what counts.
            let up = out.is_verified() || out.reason == egress_check::Reason::NotAnonymous;
            look.up.push(up);
            if up {
                if let Some(ip) = out.egress_ip.map(|a| a.to_string())
                    && !look.origins.contains(&ip)
                {
                    look.origins.push(ip);
                }
            } else {
                look.why_down.push(format!("{url}: {}", out.message));
            }
        }
        look
    }
}

/// The simulated proxies' behaviour, from the world file's `egress` section.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimEgressSpec {
    /// The echo endpoints answer nothing, from `from` on (RFC 3339; default: always); with
    /// `urls`, only those.
    #[serde(default)]
    pub echo_down: Option<SimEchoDown>,
    /// The address the echoes see the checker come from when asked directly (a NAT's); a
    /// proxy whose egress is that address hides nothing (NotAnonymous). Default: one no
    /// proxy has.
    #[serde(default, rename = "checkerIP")]
    pub checker_ip: Option<String>,
    /// How particular proxies behave, by their address. Every other proxy forwards and
    /// tunnels, anonymously, and the echo sees its own address.
    #[serde(default)]
    pub proxies: Vec<SimProxy>,
}

#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimEchoDown {
    /// RFC 3339; default: from the start.
    #[serde(default)]
    pub from: Option<String>,
    /// RFC 3339; default: for ever.
    #[serde(default)]
    pub until: Option<String>,
    /// The echo URLs that are down, as the providers config writes them; default: all.
    #[serde(default)]
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimWindow {
    /// RFC 3339; default: from the start.
    #[serde(default)]
    pub from: Option<String>,
    /// RFC 3339; default: for ever.
    #[serde(default)]
    pub until: Option<String>,
}

/// What a simulated proxy does with the CONNECT tunnel to the https echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SimTunnel {
    /// Tunnels, as Squid does (the default).
    Forwards,
    /// Answers CONNECT 403 (TunnelRefused), though it forwards plain http.
    Refused,
    /// Opens the tunnel but breaks TLS inside it: its own certificate, or bytes of its own
    /// (TlsFailed).
    BreaksTls,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimProxy {
    /// The proxy's address (the instance's IP), or a CIDR range of them (`10.244.0.0/24`:
    /// every proxy with an address in it, such as the Pods behind one NAT).
    pub ip: String,
    /// Only this share of the proxies `ip` matches, in [0, 1], chosen from each address and
    /// the rule's place in the list (so two rules with a share pick different proxies, the
    /// same ones on every run): a blip that hits a tenth of all proxies is `{ip: 0.0.0.0/0,
    /// share: 0.1, serving: false, during: …}`. Default: all of them.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub share: Option<f64>,
    /// What the echo sees (a NAT address, the node's or the hypervisor's); default the
    /// proxy's own address.
    #[serde(default, rename = "egressIP")]
    pub egress_ip: Option<String>,
    /// The proxy does not answer (ProxyUnreachable).
    #[serde(default)]
    pub serving: Option<bool>,
    /// The proxy adds Via and X-Forwarded-For (NotAnonymous).
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// What it does with the CONNECT tunnel; default: forwards.
    #[serde(default)]
    pub tunnel: Option<SimTunnel>,
    /// When this behaviour holds; default: always.
    #[serde(default)]
    pub during: Option<SimWindow>,
}

/// The probe of simulated runs: answers from the world's `egress` section on the virtual
/// clock, deterministically, as the network probe would judge the real parts.
pub struct SimEgress {
    spec: SimEgressSpec,
    clock: Arc<dyn ClockBackend>,
    /// Each rule's `ip` as a range (an address is a range of one).
    ranges: Vec<Option<ipnet::IpNet>>,
    /// Each rule's `during`, and the echo outage's window, in Unix seconds: parsed once,
    /// not at each of a day's hundred thousand probes.
    windows: Vec<Window>,
    echo_window: Window,
}

/// A window's bounds in Unix seconds; an absent bound, or one that does not parse, is open.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    from: Option<i64>,
    until: Option<i64>,
}

impl Window {
    fn of(from: &Option<String>, until: &Option<String>) -> Self {
        let at = |t: &Option<String>| t.as_deref().and_then(egress_core::gc::parse_rfc3339);
        Self {
            from: at(from),
            until: at(until),
        }
    }

    fn holds(&self, now: i64) -> bool {
        self.from.is_none_or(|f| now >= f) && self.until.is_none_or(|u| now < u)
    }
}

/// A rule's `ip` as a range: a CIDR range, or an address as the range of one.
fn range_of(ip: &str) -> Option<ipnet::IpNet> {
    ip.parse::<ipnet::IpNet>()
        .or_else(|_| ip.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .ok()
}

/// Whether the rule at `index` with `share` picks the proxy at `ip`: a hash of both, so the
/// choice is the same on every run and independent between rules.
fn picked(index: usize, ip: &str, share: f64) -> bool {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update((index as u64).to_be_bytes())
        .chain_update(ip.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) as f64 / u64::MAX as f64) < share
}

impl SimEgress {
    pub fn new(spec: SimEgressSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let ranges = spec.proxies.iter().map(|p| range_of(&p.ip)).collect();
        let windows = spec
            .proxies
            .iter()
            .map(|p| {
                p.during
                    .as_ref()
                    .map_or_else(Window::default, |w| Window::of(&w.from, &w.until))
            })
            .collect();
        let echo_window = spec
            .echo_down
            .as_ref()
            .map_or_else(Window::default, |d| Window::of(&d.from, &d.until));
        Self {
            spec,
            clock,
            ranges,
            windows,
            echo_window,
        }
    }

    /// Checks the world's `egress` section: every rule's `ip` is an address or a range, and
    /// every share within [0, 1].
    pub fn check(spec: &SimEgressSpec) -> Result<(), egress_core::config::ConfigError> {
        use egress_core::config::ConfigError;
        for (i, p) in spec.proxies.iter().enumerate() {
            if range_of(&p.ip).is_none() {
                return Err(ConfigError::new(
                    format!("egress.proxies[{i}].ip"),
                    format!("{:?} is neither an IP address nor a CIDR range", p.ip),
                ));
            }
            if let Some(share) = p.share
                && !(0.0..=1.0).contains(&share)
            {
                return Err(ConfigError::new(
                    format!("egress.proxies[{i}].share"),
                    format!("{share} is not within [0, 1]"),
                ));
            }
        }
        Ok(())
    }

    /// The first rule that holds for the proxy at `ip` now.
    fn rule(&self, ip: &str) -> Option<&SimProxy> {
        let addr = ip.parse::<std::net::IpAddr>().ok();
        let now = self.now_secs();
        self.spec
            .proxies
            .iter()
            .zip(self.ranges.iter().zip(&self.windows))
            .enumerate()
            .find(|(i, (p, (range, window)))| {
                let matches = range.zip(addr).is_some_and(|(r, a)| r.contains(&a));
                // The window first: the share's hash is the dearest test.
                matches && window.holds(now) && p.share.is_none_or(|share| picked(*i, ip, share))
            })
            .map(|(_, (p, _))| p)
    }

    fn now_secs(&self) -> i64 {
        (self.clock.now_millis() / 1000) as i64
    }

    fn echo_down(&self, url: &str) -> bool {
        self.spec.echo_down.as_ref().is_some_and(|d| {
            self.echo_window.holds(self.now_secs())
                && (d.urls.is_empty() || d.urls.iter().any(|u| u == url))
        })
    }
}

#[async_trait::async_trait]
impl EgressProbe for SimEgress {
    async fn probe(
        &self,
        ip: &str,
        port: u16,
        _settings: &Settings,
        chosen: &Chosen,
    ) -> CheckResult {
        let rule = self.rule(ip);
        let latency = 15 + ip.bytes().map(u64::from).sum::<u64>() % 30;
        let fail = |reason, latency_ms, message: String| CheckResult {
            reason,
            egress_ip: None,
            latency_ms,
            message,
        };
        if rule.is_some_and(|r| r.serving == Some(false)) {
            return fail(
                CheckReason::ProxyUnreachable,
                None,
                format!("connecting to {ip}:{port}: connection refused"),
            );
        }
        // As every generated Squid: no credential, no service.
        if chosen.proxy_authorization.is_none() {
            return fail(
                CheckReason::ProxyRefused,
                Some(latency),
                format!(
                    "{ip}:{port} answered 407 Proxy Authentication Required: the check presented no credential"
                ),
            );
        }
        if let Some(url) = chosen.urls.iter().find(|u| self.echo_down(u)) {
            return fail(
                CheckReason::BadEcho,
                Some(latency),
                format!("{url} through {ip}:{port}: 502 Bad Gateway"),
            );
        }
        let egress_ip = rule
            .and_then(|r| r.egress_ip.clone())
            .unwrap_or_else(|| ip.to_string());
        let plain = chosen.urls.iter().find(|u| !is_https(u));
        let tls = chosen.urls.iter().find(|u| is_https(u));
        if let Some(url) = plain
            && rule.is_some_and(|r| r.anonymous == Some(false))
        {
            return CheckResult {
                reason: CheckReason::NotAnonymous,
                egress_ip: Some(egress_ip),
                latency_ms: Some(latency),
                message: format!("{url} through {ip}:{port}: the echo saw Via and X-Forwarded-For"),
            };
        }
        if let Some(url) = tls {
            match rule.and_then(|r| r.tunnel) {
                Some(SimTunnel::Refused) => {
                    return fail(
                        CheckReason::TunnelRefused,
                        Some(latency),
                        format!("{url} through {ip}:{port}: the proxy answered CONNECT with 403"),
                    );
                }
                Some(SimTunnel::BreaksTls) => {
                    return fail(
                        CheckReason::TlsFailed,
                        Some(latency),
                        format!(
                            "{url} through {ip}:{port}: TLS inside the tunnel failed: the certificate is not the echo's"
                        ),
                    );
                }
                Some(SimTunnel::Forwards) | None => {}
            }
        }
        if chosen.own_addresses.contains(&egress_ip) {
            return CheckResult {
                reason: CheckReason::NotAnonymous,
                egress_ip: Some(egress_ip.clone()),
                latency_ms: Some(latency),
                message: format!(
                    "through {ip}:{port}: the echo saw the client's own address {egress_ip} in origin"
                ),
            };
        }
        CheckResult {
            reason: CheckReason::Verified,
            egress_ip: Some(egress_ip),
            latency_ms: Some(latency),
            message: String::new(),
        }
    }

    async fn look(&self, settings: &Settings) -> EchoLook {
        let mut look = EchoLook::default();
        for url in &settings.urls {
            let up = !self.echo_down(url);
            look.up.push(up);
            if !up {
                look.why_down.push(format!("{url}: connection refused"));
            }
        }
        if look.up.iter().any(|u| *u)
            && let Some(ip) = &self.spec.checker_ip
        {
            look.origins.push(ip.clone());
        }
        look
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// What every check presents: the simulated proxies, as the generated Squids, want one.
    fn auth() -> Option<String> {
        Some("Basic c2ltOnNpbQ==".into())
    }
    use crate::capabilities::clock::VirtualClock;
    use egress_core::config::IntOrPercent;
    use egress_core::proxy::{ObjectMeta, ProxySpec};

    fn settings() -> Settings {
        Settings {
            urls: vec![
                "http://echo.test/anything".into(),
                "https://echo.test/anything".into(),
            ],
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            failure_threshold: 2,
            readiness_threshold: 2,
            startup_timeout: Duration::from_secs(600),
            max_unhealthy: IntOrPercent::Percent("50%".into()),
            concurrency: 16,
        }
    }

    fn proxy(name: &str) -> Proxy {
        Proxy {
            api_version: egress_core::proxy::API_VERSION.into(),
            kind: "Proxy".into(),
            metadata: ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                ..Default::default()
            },
            spec: ProxySpec {
                provider: "p".into(),
                port: 3128,
                ..Default::default()
            },
            status: None,
        }
    }

    fn running(ip: &str) -> ProxyStatus {
        ProxyStatus {
            provider_id: Some("x".into()),
            state: Some(egress_core::InstanceState::Running),
            ip: Some(ip.into()),
            ..Default::default()
        }
    }

    fn checker(world: &str, clock: Arc<VirtualClock>) -> EgressChecker {
        let spec: SimEgressSpec = serde_yaml::from_str(world).unwrap();
        EgressChecker::new(
            settings(),
            Arc::new(SimEgress::new(spec, clock.clone())),
            clock,
        )
    }

    /// Ready with a verified egress address (or not Ready).
    fn egress_status(ready: bool, egress: &str) -> ProxyStatus {
        ProxyStatus {
            egress_ip: Some(egress.into()),
            conditions: vec![egress_core::Condition {
                type_: egress_core::reconcile::READY.into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: "Verified".into(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: String::new(),
            }],
            ..Default::default()
        }
    }

    /// The fleet knows who shares an egress address: the Ready Proxies of it, the asker left
    /// out; a Proxy that stops being Ready, moves to another address or goes leaves the list,
    /// and a relist forgets one it no longer sees.
    #[test]
    fn the_fleet_names_who_shares_an_egress_address() {
        let fleet = StatusFleet::default();
        let peers = |k: &str, ip: &str| Fleet::egress_peers(&fleet, k, ip);
        for k in ["ns/a", "ns/b", "ns/c"] {
            fleet.record(k, "p", Some(&egress_status(true, "198.51.100.20")));
        }
        fleet.record("ns/d", "p", Some(&egress_status(true, "203.0.113.4")));
        assert_eq!(peers("ns/a", "198.51.100.20"), vec!["ns/b", "ns/c"]);
        assert!(peers("ns/d", "203.0.113.4").is_empty());
        // b joined a's address, then c joined a's and b's: their lists are out of date.
        assert_eq!(fleet.take_peers_changed(), vec!["ns/a", "ns/b"]);
        assert!(fleet.take_peers_changed().is_empty());
        // The same status again changes no one's peers.
        fleet.record("ns/a", "p", Some(&egress_status(true, "198.51.100.20")));
        assert!(fleet.take_peers_changed().is_empty());
        fleet.record("ns/b", "p", Some(&egress_status(false, "198.51.100.20")));
        fleet.record("ns/c", "p", Some(&egress_status(true, "203.0.113.4")));
        assert!(peers("ns/a", "198.51.100.20").is_empty());
        assert_eq!(peers("ns/d", "203.0.113.4"), vec!["ns/c"]);
        assert_eq!(fleet.take_peers_changed(), vec!["ns/a", "ns/c", "ns/d"]);
        fleet.begin_relist();
        fleet.record("ns/d", "p", Some(&egress_status(true, "203.0.113.4")));
        fleet.end_relist();
        assert!(peers("ns/d", "203.0.113.4").is_empty());
        // At most PEERS_SHOWN named.
        for n in 0..30 {
            fleet.record(
                &format!("ns/m{n:02}"),
                "p",
                Some(&egress_status(true, "192.0.2.1")),
            );
        }
        assert_eq!(peers("ns/x", "192.0.2.1").len(), PEERS_SHOWN);
    }

    /// A simulated proxy answers as a generated Squid does: 407 to a check without the
    /// proxy's credential, so a path that forgets to present it fails in a dry-run too.
    #[tokio::test]
    async fn a_simulated_proxy_refuses_a_check_without_a_credential() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let c = checker("{}", clock.clone());
        let out = c.check(&proxy("a"), &running("10.0.0.1")).await;
        assert_eq!(out.status.egress_failures, 1, "{:?}", out.status.conditions);
        assert!(!egress::verified(&out.status));
        let ok = c.check_as(&proxy("b"), &running("10.0.0.2"), auth()).await;
        assert!(egress::verified(&ok.status));
    }

    #[tokio::test]
    async fn a_check_that_changes_nothing_leaves_the_status_alone() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let c = checker("{}", clock.clone());
        let p = proxy("a");
        let first = c.check_as(&p, &running("10.0.0.1"), auth()).await.status;
        assert!(egress::verified(&first));
        clock.advance_to(1_767_225_630_000);
        let second = c.check_as(&p, &first, auth()).await.status;
        assert_eq!(second, first, "same result: same status");
        assert_eq!(
            c.latest()["ns/a"].checked_at_ms,
            1_767_225_630_000,
            "fresh in memory"
        );
        clock.advance_to(1_767_225_600_000 + STATUS_REFRESH.as_millis() as u64);
        let third = c.check_as(&p, &second, auth()).await.status;
        assert_ne!(
            third.egress_checked_at, first.egress_checked_at,
            "refreshed at last"
        );
    }

    #[tokio::test]
    async fn an_echo_outage_blames_no_proxy_and_a_provider_outage_replaces_none() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let c = checker(
            "echoDown: {from: '2026-01-01T00:01:00Z'}\nproxies: [{ip: 10.0.0.2, serving: false, during: {from: '2026-01-01T00:10:00Z'}}]\n",
            clock.clone(),
        );
        let (a, b) = (proxy("a"), proxy("b"));
        let sa = c.check_as(&a, &running("10.0.0.1"), auth()).await.status;
        let sb = c.check_as(&b, &running("10.0.0.2"), auth()).await.status;
        assert!(egress::verified(&sa) && egress::verified(&sb));
        clock.advance_to(1_767_225_660_000);
        let out = c.check_as(&a, &sa, auth()).await;
        let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
        assert_eq!(cond.reason, "CheckerUnavailable");
        assert_eq!(out.replace, None);
        // The echo is back; b stops serving; half of the provider fails: allowed at 50%.
        let c = checker(
            "proxies: [{ip: 10.0.0.2, serving: false}, {ip: 10.0.0.1, serving: false}]\n",
            clock.clone(),
        );
        let sa = c.check_as(&a, &sa, auth()).await.status;
        let sb = c.check_as(&b, &sb, auth()).await.status;
        let out = c.check_as(&b, &sb, auth()).await;
        assert_eq!(c.provider_health("p"), (false, 2, 2));
        assert_eq!(
            out.replace, None,
            "every proxy of the provider fails: an outage"
        );
        let _ = sa;
    }

    fn settings_with(urls: &[&str]) -> Settings {
        Settings {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            ..settings()
        }
    }

    /// Records what each check asked for, answering from a scripted look.
    struct Scripted {
        up: Mutex<Vec<bool>>,
        asked: Mutex<Vec<Vec<String>>>,
        looks: std::sync::atomic::AtomicUsize,
        /// Set the look's answer to this once a probe ran (an echo going down meanwhile).
        after_probe: Mutex<Option<Vec<bool>>>,
    }

    #[async_trait::async_trait]
    impl EgressProbe for Scripted {
        async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, e: &Chosen) -> CheckResult {
            self.asked.lock().unwrap().push(e.urls.clone());
            if let Some(next) = self.after_probe.lock().unwrap().take() {
                *self.up.lock().unwrap() = next;
                return CheckResult {
                    reason: CheckReason::BadEcho,
                    egress_ip: None,
                    latency_ms: Some(3),
                    message: "502 Bad Gateway".into(),
                };
            }
            CheckResult {
                reason: CheckReason::Verified,
                egress_ip: Some("203.0.113.7".into()),
                latency_ms: Some(3),
                message: String::new(),
            }
        }
        async fn look(&self, _s: &Settings) -> EchoLook {
            self.looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            EchoLook {
                up: self.up.lock().unwrap().clone(),
                origins: vec!["198.51.100.7".into()],
                why_down: vec![],
            }
        }
    }

    fn scripted(up: &[bool]) -> Arc<Scripted> {
        Arc::new(Scripted {
            up: Mutex::new(up.to_vec()),
            asked: Mutex::new(vec![]),
            looks: Default::default(),
            after_probe: Mutex::new(None),
        })
    }

    /// The docs say the URLs are tried in order: with the first down, the probe goes to the
    /// next of its scheme, and the proxies stay verified.
    #[tokio::test]
    async fn probes_go_to_the_first_echo_of_each_scheme_that_answers_directly() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let urls = ["http://a/x", "https://c/x", "http://b/x", "https://d/x"];
        let net = scripted(&[false, true, true, true]);
        let c = EgressChecker::new(settings_with(&urls), net.clone(), clock.clone());
        let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
        assert!(egress::verified(&out.status), "{:?}", out.status);
        let again = c.check_as(&proxy("b"), &running("10.0.0.2"), auth()).await;
        assert!(egress::verified(&again.status));
        assert_eq!(
            *net.asked.lock().unwrap(),
            [
                vec!["http://b/x", "https://c/x"],
                vec!["http://b/x", "https://c/x"]
            ]
        );
        assert_eq!(
            net.looks.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one look serves both checks within its TTL"
        );
        assert_eq!(c.learned_addresses().await, ["198.51.100.7"]);
        // No https echo answering: nothing is probed and no proxy is blamed.
        let net = scripted(&[true, false, true, false]);
        let c = EgressChecker::new(settings_with(&urls), net.clone(), clock.clone());
        let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
        let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
        assert_eq!(cond.reason, "CheckerUnavailable");
        assert!(cond.message.contains("no https echo"), "{}", cond.message);
        assert!(net.asked.lock().unwrap().is_empty());
    }

    /// A probe that failed because its echo went down meanwhile is not the proxy's fault: a
    /// look taken after the probe began says so.
    #[tokio::test]
    async fn an_echo_that_went_down_during_the_probe_blames_no_proxy() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let net = scripted(&[true, true]);
        *net.after_probe.lock().unwrap() = Some(vec![false, true]);
        let c = EgressChecker::new(settings(), net.clone(), clock.clone());
        let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
        let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
        assert_eq!(cond.reason, "CheckerUnavailable", "{}", cond.message);
        assert!(
            cond.message.contains("stopped answering"),
            "{}",
            cond.message
        );
        assert_eq!(out.status.egress_failures, 0);
        assert_eq!(net.looks.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn simulated_proxies_refuse_or_break_the_tunnel_and_share_the_checkers_nat() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let c = checker(
            "checkerIP: 198.51.100.7\nproxies: [{ip: 10.0.0.1, tunnel: refused}, {ip: 10.0.0.2, tunnel: breaksTls}, {ip: 10.0.0.3, egressIP: 198.51.100.7}]\n",
            clock.clone(),
        );
        for (name, ip, reason) in [
            ("a", "10.0.0.1", "TunnelRefused"),
            ("b", "10.0.0.2", "TlsFailed"),
            ("c", "10.0.0.3", "NotAnonymous"),
            ("d", "10.0.0.4", "Verified"),
        ] {
            let out = c.check_as(&proxy(name), &running(ip), auth()).await;
            let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
            assert_eq!(cond.reason, reason, "{ip}: {}", cond.message);
        }
        // One echo URL down: the next of its scheme serves.
        let c = EgressChecker::new(
            settings_with(&["http://a/x", "http://b/x", "https://c/x"]),
            Arc::new(SimEgress::new(
                serde_yaml::from_str("echoDown: {urls: ['http://a/x']}").unwrap(),
                clock.clone(),
            )),
            clock,
        );
        let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
        assert!(egress::verified(&out.status), "{:?}", out.status);
    }

    /// After a failover the outage rule counts what the Proxies' statuses hold: a new
    /// process whose first check is of a proxy at its threshold, in the middle of its
    /// provider's outage, holds the replacement back as the old one would have (without the
    /// statuses it would judge "1 failing of 1" and replace it).
    #[tokio::test]
    async fn a_new_process_counts_the_outage_from_the_statuses() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let world = "proxies: [{ip: 10.0.0.1, serving: false}, {ip: 10.0.0.2, serving: false}, {ip: 10.0.0.3, serving: false}]\n";
        // The old process: three proxies verified, then failing, two of them past the
        // threshold (held back: the provider is in an outage).
        let old = checker("{}", clock.clone());
        let fleet = Arc::new(StatusFleet::default());
        let mut statuses = Vec::new();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let s = old
                .check_as(&proxy(name), &running(&format!("10.0.0.{}", i + 1)), auth())
                .await
                .status;
            statuses.push(s);
        }
        let old = checker(world, clock.clone());
        for round in 0..2 {
            clock.advance_to(1_767_225_630_000 + round * 30_000);
            for (i, name) in ["a", "b", "c"].iter().enumerate() {
                if round == 1 && i == 2 {
                    continue;
                }
                let out = old.check_as(&proxy(name), &statuses[i], auth()).await;
                statuses[i] = out.status;
            }
        }
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            fleet.record(&format!("ns/{name}"), "p", Some(&statuses[i]));
        }
        assert_eq!(statuses[0].egress_failures, 2);
        assert_eq!(statuses[2].egress_failures, 1);
        // The new process checks c, which reaches the threshold of 2.
        clock.advance_to(1_767_225_700_000);
        let fresh = checker(world, clock.clone());
        let out = fresh.check_as(&proxy("c"), &statuses[2], auth()).await;
        assert_eq!(out.status.egress_failures, 2);
        assert!(out.replace.is_some(), "alone it sees one failing of one");
        let fresh = checker(world, clock.clone()).with_fleet(fleet.clone());
        let out = fresh.check_as(&proxy("c"), &statuses[2], auth()).await;
        assert_eq!(out.replace, None, "three of three fail: an outage");
        assert_eq!(fresh.provider_health("p"), (false, 3, 3));
    }

    /// A probe that holds every check until the test lets it go, counting how many it holds
    /// at once.
    struct Gated {
        held: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        started: std::sync::atomic::AtomicUsize,
        gate: tokio::sync::Semaphore,
    }

    /// What a stand-in probe answers for a proxy that forwards: verified from one address.
    fn verified() -> CheckResult {
        CheckResult {
            reason: CheckReason::Verified,
            egress_ip: Some("203.0.113.9".into()),
            latency_ms: Some(3),
            message: String::new(),
        }
    }

    /// What a stand-in direct look answers with every echo up.
    fn every_echo_up(s: &Settings) -> EchoLook {
        EchoLook {
            up: vec![true; s.urls.len()],
            ..EchoLook::default()
        }
    }

    #[async_trait::async_trait]
    impl EgressProbe for Gated {
        async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, _e: &Chosen) -> CheckResult {
            use std::sync::atomic::Ordering::SeqCst;
            self.started.fetch_add(1, SeqCst);
            let now = self.held.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            let _ = self.gate.acquire().await.map(|p| p.forget());
            self.held.fetch_sub(1, SeqCst);
            verified()
        }
        async fn look(&self, s: &Settings) -> EchoLook {
            every_echo_up(s)
        }
    }

    /// In the background, a due check returns at once (the reconcile that found it due holds
    /// nothing while it runs), at most `concurrency` probes run together, a Proxy has one
    /// check at a time, each finished one wakes its Proxy, and its result folds only into the
    /// status of the instance it went through.
    #[tokio::test]
    async fn background_checks_return_at_once_run_on_their_own_bound_and_fold_once_finished() {
        use std::sync::atomic::Ordering::SeqCst;
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let probe = Arc::new(Gated {
            held: 0.into(),
            most: 0.into(),
            started: 0.into(),
            gate: tokio::sync::Semaphore::new(0),
        });
        let wakes = Arc::new(CheckWakes::default());
        let checker = EgressChecker::new(
            Settings {
                concurrency: 3,
                ..settings()
            },
            probe.clone(),
            clock,
        )
        .in_background(wakes.clone());
        let keys: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
        for k in &keys {
            let due = tokio::time::timeout(
                Duration::from_secs(1),
                checker.check_if_due(&proxy(k), &running("10.0.0.1"), || async { auth() }),
            )
            .await
            .expect("a due check starts without waiting for it");
            assert!(matches!(due, Due::Pending), "{due:?}");
        }
        // The same Proxy again while its check runs: no second probe.
        let again = checker
            .check_if_due(&proxy("p0"), &running("10.0.0.1"), || async { auth() })
            .await;
        assert!(matches!(again, Due::Pending));
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            probe.held.load(SeqCst),
            3,
            "three slots, three probes under way"
        );
        probe.gate.add_permits(10);
        let mut woken = std::collections::BTreeSet::new();
        while woken.len() < keys.len() {
            tokio::time::timeout(Duration::from_secs(5), wakes.wait())
                .await
                .expect("every finished check wakes its Proxy");
            woken.extend(wakes.take());
        }
        assert_eq!(woken, keys.iter().map(|k| format!("ns/{k}")).collect());
        assert_eq!(probe.started.load(SeqCst), 10);
        assert_eq!(probe.most.load(SeqCst), 3, "never more than the bound");
        // Discovery's view is fresh before any fold.
        assert_eq!(
            checker.latest()["ns/p0"].egress_ip.as_deref(),
            Some("203.0.113.9")
        );

        let Due::Checked(out) = checker
            .check_if_due(&proxy("p0"), &running("10.0.0.1"), || async { auth() })
            .await
        else {
            panic!("a finished check folds at the next reconcile");
        };
        assert_eq!(out.status.egress_ip.as_deref(), Some("203.0.113.9"));
        assert!(egress::verified(&out.status));

        // p1's instance was replaced while its check ran: the result is not its, and the new
        // instance gets a check of its own.
        let replaced = ProxyStatus {
            provider_id: Some("y".into()),
            ..running("10.0.0.2")
        };
        let due = checker
            .check_if_due(&proxy("p1"), &replaced, || async { auth() })
            .await;
        assert!(matches!(due, Due::Pending), "{due:?}");
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(probe.started.load(SeqCst), 11);
    }

    /// Without the background, a due check runs inside the call (a dry-run's, whose virtual
    /// time it does not take).
    #[tokio::test]
    async fn inline_checks_run_in_the_call_that_finds_them_due() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let c = checker("{}", clock);
        let due = c
            .check_if_due(&proxy("a"), &running("10.0.0.1"), || async { auth() })
            .await;
        let Due::Checked(out) = due else {
            panic!("{due:?}");
        };
        assert!(egress::verified(&out.status), "{:?}", out.status);
        let again = c
            .check_if_due(&proxy("a"), &out.status, || async { auth() })
            .await;
        assert!(
            matches!(again, Due::Not),
            "checked: not due until its phase"
        );
    }

    /// Answers Verified from 203.0.113.9 until told to fail, counting its probes.
    struct Steady {
        probes: std::sync::atomic::AtomicUsize,
        failing: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl EgressProbe for Steady {
        async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, _e: &Chosen) -> CheckResult {
            use std::sync::atomic::Ordering::SeqCst;
            self.probes.fetch_add(1, SeqCst);
            if self.failing.load(SeqCst) {
                return CheckResult {
                    reason: CheckReason::ProxyUnreachable,
                    egress_ip: None,
                    latency_ms: None,
                    message: "connection refused".into(),
                };
            }
            verified()
        }
        async fn look(&self, s: &Settings) -> EchoLook {
            every_echo_up(s)
        }
    }

    /// A steady proxy is checked by its loop every interval with no reconcile: nothing wakes
    /// it while each check finds it verified from the same address, and reconciles are not
    /// asked to check it; the first check that changes something wakes it, and folds.
    #[tokio::test(start_paused = true)]
    async fn a_loop_checks_a_steady_proxy_without_waking_it_until_a_check_changes_something() {
        use std::sync::atomic::Ordering::SeqCst;
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let probe = Arc::new(Steady {
            probes: 0.into(),
            failing: false.into(),
        });
        let wakes = Arc::new(CheckWakes::default());
        let checker = EgressChecker::new(settings(), probe.clone(), clock.clone())
            .in_background(wakes.clone());
        let p = proxy("a");
        let first = checker.check_as(&p, &running("10.0.0.1"), auth()).await;
        let verified = first.status;
        assert!(egress::verified(&verified));
        let due = checker
            .check_if_due(&p, &verified, || async { auth() })
            .await;
        assert!(matches!(due, Due::Not), "checked just now: {due:?}");
        assert_eq!(
            checker.next_due_ms("ns/a", &verified),
            u64::MAX,
            "the loop's"
        );
        // Two and a half minutes on the clock the loop sleeps by: four or five checks, all
        // quiet, and the virtual clock is moved along so the status's time stays fresh.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(30)).await;
            clock.advance(Duration::from_secs(30));
        }
        let quiet = probe.probes.load(SeqCst);
        assert!(quiet >= 4, "{quiet} probes");
        assert!(wakes.take().is_empty(), "a quiet check wakes no one");
        let again = checker
            .check_if_due(&p, &verified, || async { auth() })
            .await;
        assert!(matches!(again, Due::Not));

        probe.failing.store(true, SeqCst);
        tokio::time::timeout(Duration::from_secs(60), wakes.wait())
            .await
            .expect("a failed check wakes its Proxy");
        assert_eq!(wakes.take(), vec!["ns/a".to_string()]);
        let Due::Checked(out) = checker
            .check_if_due(&p, &verified, || async { auth() })
            .await
        else {
            panic!("the failure folds");
        };
        assert_eq!(out.status.egress_failures, 1);
    }
}
