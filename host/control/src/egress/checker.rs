//! Checks when they are due, one loop per running Proxy in the background, their results
//! folded into the status by the core's decisions and kept fresh for discovery.

use super::fleet::Fleet;
use super::probe::{CheckObserver, ECHO_LOOK_TTL_MS, EchoLook, EgressProbe, STATUS_REFRESH};
use egress_core::egress::{self, CheckOutcome, CheckReason, CheckResult, Settings};
use egress_core::{Proxy, ProxyStatus};
use egress_runtime::capabilities::clock::ClockBackend;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The latest check of one Proxy, as discovery shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCheck {
    pub provider: String,
    pub reason: CheckReason,
    pub egress_ip: Option<String>,
    pub latency_ms: Option<u64>,
    pub checked_at_ms: u64,
    pub verified_at_ms: Option<u64>,
}

/// What the checker keeps of each Proxy: its latest check, the instance's last look, the loop
/// checking it and the results waiting to be folded.
#[derive(Default)]
struct CheckRecords {
    latest: HashMap<String, LastCheck>,
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
struct StatusBaseline {
    /// Verified at the last check, not failing, not to be replaced.
    clean: bool,
    egress_ip: Option<String>,
    /// Unix ms of the recorded check (the status is rewritten once it is STATUS_REFRESH old).
    checked_at_ms: Option<u64>,
}

impl StatusBaseline {
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
    table: Mutex<CheckRecords>,
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

impl Probing {
    fn table(&self) -> std::sync::MutexGuard<'_, CheckRecords> {
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
            LastCheck {
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
                table: Mutex::new(CheckRecords::default()),
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

    fn table(&self) -> std::sync::MutexGuard<'_, CheckRecords> {
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
            quiet: StatusBaseline::of(status),
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
    pub fn latest(&self) -> BTreeMap<String, LastCheck> {
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
    quiet: StatusBaseline,
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
