//! What the crawlers ask of each pool now, as the gateways tell it (`POST /v1/demand`): each
//! gateway replica says, per pool and per caller, how many tunnels it has in flight and how
//! many it holds for want of a member. An autoscaled pool's decision reads the sum
//! ([`egress_core::autoscale::decide`]), in the operator and in `reconcile --watch` alike.
//!
//! A gateway says it again while it has any (every [`REFRESH`]); what is not said again within
//! [`TTL`] counts for nothing, so a replica that died takes its demand with it. Bounded: at most
//! [`MAX_SOURCES`] (caller, replica) sources per pool and [`MAX_POOLS`] pools; past either a
//! new source is refused (the API answers 429), the ones already kept go on.

use egress_core::autoscale::Demand;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a gateway says its demand again while it has any.
pub const REFRESH: Duration = Duration::from_secs(5);
/// How long a demand counts unless said again.
pub const TTL: Duration = Duration::from_secs(20);
/// Sources (caller, gateway replica) kept per pool.
pub const MAX_SOURCES: usize = 256;
/// Pools with a demand kept at once.
pub const MAX_POOLS: usize = 4096;
/// The longest name of a gateway replica a demand may carry.
pub const MAX_FROM: usize = 253;

/// `POST /v1/demand`'s body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DemandReport {
    pub namespace: String,
    pub pool: String,
    /// The gateway replica saying it (its Pod's name), so replicas do not overwrite one
    /// another.
    pub from: String,
    /// Its tunnels and plain requests in flight for this caller.
    #[serde(default)]
    pub tunnels: u32,
    /// Ones it holds for want of a member.
    #[serde(default)]
    pub waiting_tunnels: u32,
}

type PoolKey = (String, String);
type Source = (String, String);
/// Each source's demand with when it was said.
type Sources = BTreeMap<Source, (Demand, Instant)>;

/// The demands said, by pool and source, each with when it was said.
#[derive(Debug)]
pub struct DemandBoard {
    said: Mutex<BTreeMap<PoolKey, Sources>>,
    /// Bumped whenever a pool's demand changes, for the decisions that wait on one.
    changed: tokio::sync::watch::Sender<u64>,
    /// Told of the same changes, keeping one for a waiter that was busy when it came.
    notify: tokio::sync::Notify,
    /// Proxies asked for by lease requests waiting on each pool now (in this process: a
    /// waiting request is its own refresh, so these do not lapse).
    waiting_leases: Mutex<BTreeMap<PoolKey, u32>>,
}

/// A lease request waiting on a pool, counted in its demand until dropped.
#[derive(Debug)]
pub struct LeaseWaiting {
    board: std::sync::Arc<DemandBoard>,
    key: PoolKey,
    count: u32,
}

impl Drop for LeaseWaiting {
    fn drop(&mut self) {
        self.board.wait_lease(&self.key, self.count, false);
    }
}

impl Default for DemandBoard {
    fn default() -> Self {
        Self {
            said: Mutex::new(BTreeMap::new()),
            changed: tokio::sync::watch::Sender::new(0),
            notify: tokio::sync::Notify::new(),
            waiting_leases: Mutex::new(BTreeMap::new()),
        }
    }
}

impl DemandBoard {
    /// Takes `report` said by `holder` (the authenticated caller) at `now`; an error says why
    /// it is refused (a bound reached, a field out of range).
    pub fn say(&self, holder: &str, report: &DemandReport, now: Instant) -> Result<(), String> {
        if report.from.is_empty() || report.from.len() > MAX_FROM {
            return Err(format!("from: 1 to {MAX_FROM} characters"));
        }
        let demand = Demand {
            tunnels: report.tunnels,
            waiting_tunnels: report.waiting_tunnels,
            ..Demand::default()
        };
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        Self::expire(&mut said, now);
        let key = (report.namespace.clone(), report.pool.clone());
        if !said.contains_key(&key) && said.len() >= MAX_POOLS {
            return Err(format!("demand is kept for at most {MAX_POOLS} pools"));
        }
        let before = Self::sum(said.get(&key));
        let sources = said.entry(key.clone()).or_default();
        let source = (holder.to_string(), report.from.clone());
        if demand.is_zero() {
            sources.remove(&source);
        } else if sources.len() >= MAX_SOURCES && !sources.contains_key(&source) {
            return Err(format!(
                "demand is kept for at most {MAX_SOURCES} callers and replicas per pool"
            ));
        } else {
            sources.insert(source, (demand, now));
        }
        let after = Self::sum(said.get(&key));
        if said.get(&key).is_some_and(Sources::is_empty) {
            said.remove(&key);
        }
        if before != after {
            self.told();
        }
        Ok(())
    }

    /// Pool `namespace/pool`'s demand at `now`: the sum of what was said within [`TTL`], and
    /// the lease requests waiting on it.
    pub fn demand(&self, namespace: &str, pool: &str, now: Instant) -> Demand {
        let key = (namespace.to_string(), pool.to_string());
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        if Self::expire(&mut said, now) {
            self.told();
        }
        let mut d = Self::sum(said.get(&key));
        drop(said);
        d.waiting_leases = self
            .waiting_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied()
            .unwrap_or(0);
        d
    }

    /// A lease request for `count` proxies of pool `namespace/pool` waits: counted until the
    /// returned value drops.
    pub fn lease_waiting(
        self: &std::sync::Arc<Self>,
        namespace: &str,
        pool: &str,
        count: u32,
    ) -> LeaseWaiting {
        let key = (namespace.to_string(), pool.to_string());
        self.wait_lease(&key, count, true);
        LeaseWaiting {
            board: self.clone(),
            key,
            count,
        }
    }

    fn wait_lease(&self, key: &PoolKey, count: u32, up: bool) {
        let mut waiting = self
            .waiting_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = waiting.entry(key.clone()).or_default();
        *n = if up {
            n.saturating_add(count)
        } else {
            n.saturating_sub(count)
        };
        if *n == 0 {
            waiting.remove(key);
        }
        drop(waiting);
        self.told();
    }

    /// Bumped when a pool's demand changes (a demand said, or one expired when read).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Resolves once a pool's demand changed since the last time it resolved (one waiter).
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    fn told(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        self.notify.notify_one();
    }

    /// The soonest a kept demand lapses, if one is kept: a decision that read it looks again
    /// then.
    pub fn next_lapse(&self) -> Option<Instant> {
        let said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        said.values()
            .flat_map(|s| s.values())
            .map(|(_, at)| *at + TTL)
            .min()
    }

    fn sum(sources: Option<&Sources>) -> Demand {
        sources
            .into_iter()
            .flat_map(|s| s.values())
            .fold(Demand::default(), |a, (d, _)| a.plus(*d))
    }

    /// Drops what was not said again within TTL; whether anything was.
    fn expire(said: &mut BTreeMap<PoolKey, Sources>, now: Instant) -> bool {
        let mut dropped = false;
        said.retain(|_, sources| {
            sources.retain(|_, (_, at)| {
                let keep = now.saturating_duration_since(*at) < TTL;
                dropped |= !keep;
                keep
            });
            !sources.is_empty()
        });
        dropped
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn report(from: &str, tunnels: u32, waiting: u32) -> DemandReport {
        DemandReport {
            namespace: "ns".into(),
            pool: "web".into(),
            from: from.into(),
            tunnels,
            waiting_tunnels: waiting,
        }
    }

    #[test]
    fn replicas_and_callers_add_up_and_a_silent_one_lapses() {
        let b = DemandBoard::default();
        let t0 = Instant::now();
        let mut changes = b.changes();
        b.say("a", &report("gw-0", 3, 1), t0).unwrap();
        b.say("a", &report("gw-1", 2, 0), t0).unwrap();
        b.say("b", &report("gw-0", 1, 0), t0).unwrap();
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        let d = b.demand("ns", "web", t0);
        assert_eq!((d.tunnels, d.waiting_tunnels), (6, 1));
        // Said again: replaced, not added.
        b.say("a", &report("gw-0", 1, 0), t0 + TTL / 2).unwrap();
        assert_eq!(b.demand("ns", "web", t0 + TTL / 2).tunnels, 4);
        // gw-1 and b were not said again: gone at TTL, and the change is told.
        changes.mark_unchanged();
        assert_eq!(b.demand("ns", "web", t0 + TTL).tunnels, 1);
        assert!(changes.has_changed().unwrap());
        // A zero ends a source at once.
        b.say("a", &report("gw-0", 0, 0), t0 + TTL).unwrap();
        assert!(b.demand("ns", "web", t0 + TTL).is_zero());
        assert_eq!(b.next_lapse(), None);
        assert!(b.demand("ns", "other", t0).is_zero());
    }

    #[test]
    fn a_waiting_lease_request_counts_until_it_ends_and_never_lapses() {
        let b = std::sync::Arc::new(DemandBoard::default());
        let t0 = Instant::now();
        let first = b.lease_waiting("ns", "web", 2);
        let second = b.lease_waiting("ns", "web", 1);
        assert_eq!(b.demand("ns", "web", t0 + TTL * 10).waiting_leases, 3);
        drop(first);
        assert_eq!(b.demand("ns", "web", t0).waiting_leases, 1);
        drop(second);
        assert!(b.demand("ns", "web", t0).is_zero());
    }

    #[test]
    fn a_flood_of_sources_is_bounded_and_the_kept_ones_go_on() {
        let b = DemandBoard::default();
        let t0 = Instant::now();
        for i in 0..MAX_SOURCES {
            b.say(&format!("h{i}"), &report("gw", 1, 0), t0).unwrap();
        }
        let e = b.say("late", &report("gw", u32::MAX, 0), t0).unwrap_err();
        assert!(e.contains("256"), "{e}");
        b.say("h0", &report("gw", u32::MAX, u32::MAX), t0).unwrap();
        let d = b.demand("ns", "web", t0);
        assert_eq!(d.tunnels, u32::MAX, "saturates, never wraps");
        assert!(
            b.say("h1", &report("", 1, 0), t0)
                .unwrap_err()
                .starts_with("from")
        );
    }
}
