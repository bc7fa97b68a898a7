//! ProxyPools in the CLI: the core's pool decisions over the pool's Proxies as the run tracks
//! them, carried out as new tracked Proxies and deletions of old ones, with what the pool did
//! and the lowest Ready count it had, for the report.

use super::report::{PoolReport, PoolSample, ReportEvent};
use super::tracked::Tracked;
use egress_core::discovery::{CORDON_ANNOTATION, POOL_LABEL};
use egress_core::pool::{self, PoolStatus, ProxyPool, member_name, member_proxy};
use egress_runtime::Providers;
use std::collections::BTreeMap;

/// One pool through a run.
pub(super) struct PoolRun {
    pub pool: ProxyPool,
    /// Proxies made so far, for the next name.
    serial: u64,
    pub status: PoolStatus,
    pub events: Vec<ReportEvent>,
    /// The lowest Ready count once the pool had been Available.
    pub min_ready: Option<u32>,
    /// The lowest available count once the pool had been Available.
    pub min_available: Option<u32>,
    /// The pool's own deletions of available members that left fewer available than its
    /// floor (replicas − maxUnavailable): what the pool promises never to do.
    pub deletions_below_floor: u32,
    /// The last decision created and deleted nothing.
    pub settled: bool,
    /// When a rotation falls due next (Unix ms).
    pub next_at_ms: Option<u64>,
    /// One of its Proxies changed since the last decision (Ready, deletion, release).
    pub dirty: bool,
    /// Each placement's revision, for the providers' revisions it was worked out from.
    revisions: Option<(Vec<String>, Vec<String>)>,
    /// Its counts at each decision that changed them, for `-o html`.
    timeline: Vec<PoolSample>,
    /// What its crawlers ask of it now (the crawl's tunnels in a dry-run; the gateways' and
    /// the lease API's in a watch): the size of an autoscaled pool.
    pub demand: egress_core::autoscale::Demand,
    /// Unix seconds: since when its crawl has asked with no member to route to (an
    /// autoscaled pool waking), for how long the gateway holds its requests.
    pub cold_since: Option<i64>,
}

impl PoolRun {
    pub fn new(pool: ProxyPool, serial: u64, status: Option<PoolStatus>) -> Self {
        Self {
            pool,
            serial,
            status: status.unwrap_or_default(),
            events: Vec::new(),
            min_ready: None,
            min_available: None,
            deletions_below_floor: 0,
            settled: false,
            next_at_ms: None,
            dirty: true,
            revisions: None,
            timeline: Vec::new(),
            demand: egress_core::autoscale::Demand::default(),
            cold_since: None,
        }
    }

    /// A new demand: an autoscaled pool decides again when it changed.
    pub fn set_demand(&mut self, demand: egress_core::autoscale::Demand) {
        if demand != self.demand {
            self.demand = demand;
            if self.pool.spec.autoscale.is_some() {
                self.touch();
            }
        }
    }

    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.pool.metadata.namespace, self.pool.metadata.name
        )
    }

    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Whether a tracked Proxy is one of this pool's.
    pub fn owns(&self, t: &Tracked) -> bool {
        t.proxy.metadata.namespace == self.pool.metadata.namespace
            && t.proxy.metadata.labels.get(POOL_LABEL) == Some(&self.pool.metadata.name)
    }

    /// Something its decision reads changed outside the run (a lease released, a proxy
    /// cordoned): it decides again.
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// Whether a decision is due: a Proxy of the pool changed, or a rotation fell due.
    pub fn due(&self, now_ms: u64) -> bool {
        self.dirty || self.next_at_ms.is_some_and(|at| now_ms >= at)
    }

    /// Decides one step of the pool over its tracked Proxies and carries it out: new Proxies
    /// join `tracked` due now; deleted ones are marked for deletion.
    pub fn step(
        &mut self,
        providers: &Providers,
        egress: Option<egress_core::egress::Thresholds>,
        leases: Option<&crate::leases::Board>,
        tracked: &mut BTreeMap<String, Tracked>,
        now_ms: u64,
        seq: &mut dyn FnMut() -> u64,
    ) {
        let spec = &self.pool.spec;
        let provider_revisions: Vec<String> = spec
            .placements
            .iter()
            .map(|p| {
                providers
                    .get(&p.provider)
                    .map_or("missing", |p| p.revision.as_str())
                    .to_string()
            })
            .collect();
        let revisions = match &self.revisions {
            Some((of, r)) if *of == provider_revisions => r.clone(),
            _ => {
                let r = pool::revisions(spec, &provider_revisions);
                self.revisions = Some((provider_revisions, r.clone()));
                r
            }
        };
        self.dirty = false;
        // The leases the API granted on its members, and the cordons its holders' ban reports
        // made (kept on the member from now on, so the state file has them too).
        let mut held: BTreeMap<String, crate::state::ProxyLeases> = BTreeMap::new();
        if let Some(board) = leases {
            for (key, t) in tracked
                .iter_mut()
                .filter(|(_, t)| self.owns(t) && !t.released)
            {
                if let Some(l) = board.leases_of(key, &t.proxy.uid()) {
                    if l.cordoned {
                        t.proxy
                            .metadata
                            .annotations
                            .insert(CORDON_ANNOTATION.into(), "true".into());
                    }
                    held.insert(key.clone(), l);
                }
            }
        }
        let members: Vec<pool::Member> = tracked
            .iter()
            .filter(|(_, t)| self.owns(t) && !t.released)
            .map(|(key, t)| match held.get(key) {
                Some(l) => {
                    let status = egress_core::ProxyStatus {
                        leases: l.leases.clone(),
                        ban_reports: l.ban_reports,
                        ..t.status.clone()
                    };
                    member(&self.pool, t, &status, egress)
                }
                None => member(&self.pool, t, &t.status, egress),
            })
            .collect();
        let now = (now_ms / 1000) as i64;
        let d = egress_core::autoscale::decide(
            spec,
            &revisions,
            &members,
            &self.status,
            self.demand,
            now,
        );
        // Counted here from the members, apart from the decision, so the report shows what
        // the decision did rather than what it meant to do. An autoscaled pool's floor is
        // that of the size it decided.
        let (replicas, floor) = egress_core::autoscale::replicas_and_floor(spec, &d.status);
        // As the pool counts them: with distinctEgress, a member sharing an older one's
        // address does not count, so deleting it costs the floor nothing; a cordoned one that
        // serves counts until it is replaced.
        let counted = pool::counted_available(spec, &members);
        let mut available_now = counted.len() as u32;
        // A drain costs the floor as a deletion does.
        for name in d.deletes.iter().chain(&d.drains).map(|(n, _)| n) {
            if counted.contains(name.as_str()) {
                available_now = available_now.saturating_sub(1);
                if available_now < floor {
                    self.deletions_below_floor += 1;
                }
            }
        }
        let at = egress_core::egress::rfc3339_ms(now_ms);
        let mut say =
            |events: &mut Vec<ReportEvent>, warning: bool, reason: &str, message: String| {
                events.push(ReportEvent {
                    at: at.clone(),
                    at_ms: now_ms,
                    seq: seq(),
                    warning,
                    reason: reason.to_string(),
                    message,
                });
            };
        if let Some(c) =
            egress_core::target::newly_blocked(&self.status.conditions, &d.status.conditions)
        {
            say(
                &mut self.events,
                true,
                egress_core::target::TARGET_BLOCKED,
                c.message.clone(),
            );
        }
        for (name, why) in &d.deletes {
            let key = format!("{}/{name}", self.pool.metadata.namespace);
            if let Some(t) = tracked.get_mut(&key) {
                t.deleting = true;
                t.next_at_ms = now_ms;
                t.steady = false;
            }
            say(
                &mut self.events,
                false,
                why.as_str(),
                format!("deleting {name} ({})", why.as_str()),
            );
        }
        for (name, why) in &d.drains {
            let key = format!("{}/{name}", self.pool.metadata.namespace);
            if let Some(t) = tracked.get_mut(&key) {
                let a = &mut t.proxy.metadata.annotations;
                a.insert(
                    egress_core::discovery::RETIRE_AT_ANNOTATION.into(),
                    egress_core::gc::format_rfc3339(d.retire_at),
                );
                a.insert(
                    egress_core::discovery::RETIRE_REASON_ANNOTATION.into(),
                    why.as_str().into(),
                );
                // Stepped again, so the state records the drain before the run ends.
                t.next_at_ms = now_ms;
                t.steady = false;
            }
            say(
                &mut self.events,
                false,
                "Draining",
                format!("draining {name} ({}): a lease holds it", why.as_str()),
            );
        }
        for c in &d.creates {
            let name = loop {
                self.serial += 1;
                let n = member_name(&self.pool, self.serial);
                if !tracked.contains_key(&format!("{}/{n}", self.pool.metadata.namespace)) {
                    break n;
                }
            };
            let mut proxy = member_proxy(&self.pool, c, &name);
            proxy.metadata.uid = Some(proxy.uid());
            let placement = &spec.placements[c.placement];
            say(
                &mut self.events,
                false,
                "Created",
                format!(
                    "{name} on placements[{}] ({}){}{}",
                    c.placement,
                    placement.provider,
                    c.zone
                        .as_deref()
                        .map(|z| format!(" in {z}"))
                        .unwrap_or_default(),
                    if c.probe {
                        ", to see whether it creates again"
                    } else {
                        ""
                    }
                ),
            );
            let mut t = Tracked::new(proxy, Default::default(), false, now_ms);
            t.created_ms = now_ms;
            tracked.insert(format!("{}/{name}", self.pool.metadata.namespace), t);
        }
        let is_available =
            |s: &PoolStatus| s.condition("Available").is_some_and(|c| c.status == "True");
        let available = is_available(&d.status);
        let was_available = is_available(&self.status) || self.min_ready.is_some();
        if available || was_available {
            self.min_ready = Some(
                self.min_ready
                    .map_or(d.status.ready_replicas, |m| m.min(d.status.ready_replicas)),
            );
            self.min_available =
                Some(self.min_available.map_or(d.status.available_replicas, |m| {
                    m.min(d.status.available_replicas)
                }));
        }
        // A drain leaves nothing to wait for within the run: its end (the leases' end, or
        // retireAt) is a requeue, and a release wakes the pool.
        self.settled = d.creates.is_empty() && d.deletes.is_empty();
        self.next_at_ms = d
            .requeue_after
            .map(|r| now_ms.saturating_add(r.as_millis() as u64));
        // A demand lapses unless said again: an autoscaled pool with one looks again by then.
        if spec.autoscale.is_some() && !self.demand.is_zero() {
            let lapse = now_ms.saturating_add(egress_control::demand::TTL.as_millis() as u64);
            self.next_at_ms = Some(self.next_at_ms.map_or(lapse, |n| n.min(lapse)));
        }
        let sample = PoolSample {
            at_ms: now_ms,
            replicas,
            floor,
            ready: d.status.ready_replicas,
            available: d.status.available_replicas,
            placements: d
                .status
                .placements
                .iter()
                .map(|p| p.available_replicas)
                .collect(),
        };
        let changed = self.timeline.last().is_none_or(|last| {
            (
                last.replicas,
                last.floor,
                last.ready,
                last.available,
                &last.placements,
            ) != (
                sample.replicas,
                sample.floor,
                sample.ready,
                sample.available,
                &sample.placements,
            )
        });
        if changed {
            self.timeline.push(sample);
        }
        let mut status = d.status;
        status.observed_generation = Some(self.pool.metadata.generation.unwrap_or(1));
        status.member_serial = self.serial;
        self.status = status;
    }

    pub fn report(self) -> PoolReport {
        PoolReport {
            namespace: self.pool.metadata.namespace.clone(),
            name: self.pool.metadata.name.clone(),
            status: self.status,
            min_ready_replicas: self.min_ready,
            min_available_replicas: self.min_available,
            deletions_below_floor: self.deletions_below_floor,
            events: self.events,
            targets: Vec::new(),
            cost: None,
            timeline: self.timeline,
        }
    }
}

/// One tracked Proxy as the pool decisions see it, with `status` (its own, or with the
/// lease file's bindings).
fn member(
    pool: &pool::ProxyPool,
    t: &Tracked,
    status: &egress_core::ProxyStatus,
    egress: Option<egress_core::egress::Thresholds>,
) -> pool::Member {
    pool::member(
        pool,
        &t.proxy,
        status,
        Some((t.created_ms / 1000) as i64),
        t.deleting,
        egress,
    )
}
