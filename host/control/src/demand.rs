//! What the crawlers ask of each pool now, as the gateways tell it (`POST /v1/demand`): each
//! gateway replica says, per pool and per caller, how many tunnels it has in flight and how
//! many it holds for want of a member. An autoscaled pool's decision reads the sum
//! ([`egress_core::autoscale::decide`]), in the operator and in `reconcile --watch` alike.
//!
//! A gateway says it again while it has any (every [`REFRESH`]); what is not said again within
//! [`TTL`] counts for nothing, so a replica that died takes its demand with it. Bounded: at most
//! [`MAX_SOURCES`] (caller, replica) sources per pool, [`MAX_POOLS`] pools, and
//! [`MAX_PER_HOLDER`] sources of one caller (who names its replica and its pools: without it one
//! caller could fill the pools' bound with names of pools that do not exist); past any, a new
//! source is refused (the API answers 429), the ones already kept go on. A caller's waiting
//! lease requests are bounded too ([`MAX_WAITING_PER_HOLDER`]): each holds an API connection.

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
/// Sources one caller keeps at once, over every pool: its pools times the gateway replicas.
pub const MAX_PER_HOLDER: usize = 64;
/// Lease requests of one caller waiting on a waking pool at once; past them a request is
/// answered at once.
pub const MAX_WAITING_PER_HOLDER: u32 = 8;

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

/// What was said: by pool and source, with how many sources each caller has.
#[derive(Debug, Default)]
struct Said {
    pools: BTreeMap<PoolKey, Sources>,
    by_holder: BTreeMap<String, usize>,
    /// When lapsed sources were last dropped (reads leave out a lapsed one anyway).
    swept: Option<Instant>,
}

/// How often lapsed sources are dropped: at most once a second, not at every call.
const SWEEP: Duration = Duration::from_secs(1);

impl Said {
    fn insert(&mut self, key: &PoolKey, source: Source, said: (Demand, Instant)) {
        let holder = source.0.clone();
        if self
            .pools
            .entry(key.clone())
            .or_default()
            .insert(source, said)
            .is_none()
        {
            *self.by_holder.entry(holder).or_default() += 1;
        }
    }

    fn remove(&mut self, key: &PoolKey, source: &Source) {
        let Some(sources) = self.pools.get_mut(key) else {
            return;
        };
        let removed = sources.remove(source).is_some();
        if sources.is_empty() {
            self.pools.remove(key);
        }
        if removed {
            self.forget(&source.0);
        }
    }

    fn forget(&mut self, holder: &str) {
        if let Some(n) = self.by_holder.get_mut(holder) {
            *n -= 1;
            if *n == 0 {
                self.by_holder.remove(holder);
            }
        }
    }

    /// Drops what was not said again within TTL, at most once a [`SWEEP`]; whether anything
    /// was.
    fn sweep(&mut self, now: Instant) -> bool {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP)
        {
            return false;
        }
        self.swept = Some(now);
        let mut gone = Vec::new();
        self.pools.retain(|_, sources| {
            sources.retain(|(holder, _), (_, at)| {
                let keep = fresh(*at, now);
                if !keep {
                    gone.push(holder.clone());
                }
                keep
            });
            !sources.is_empty()
        });
        for holder in &gone {
            self.forget(holder);
        }
        !gone.is_empty()
    }

    /// Pool `key`'s sources said within TTL, added up.
    fn sum(&self, key: &PoolKey, now: Instant) -> Demand {
        self.pools
            .get(key)
            .into_iter()
            .flat_map(|s| s.values())
            .filter(|(_, at)| fresh(*at, now))
            .fold(Demand::default(), |a, (d, _)| a.plus(*d))
    }
}

/// Said within TTL of `now`.
fn fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < TTL
}

/// The demands said, by pool and source, each with when it was said.
#[derive(Debug)]
pub struct DemandBoard {
    said: Mutex<Said>,
    /// Bumped whenever a pool's demand changes, for the decisions that wait on one.
    changed: tokio::sync::watch::Sender<u64>,
    /// Told of the same changes, keeping one for a waiter that was busy when it came.
    notify: tokio::sync::Notify,
    /// Proxies asked for by lease requests waiting on each pool now (in this process: a
    /// waiting request is its own refresh, so these do not lapse).
    waiting_leases: Mutex<BTreeMap<PoolKey, u32>>,
    /// Lease requests waiting now, by caller.
    waiting_holders: Mutex<BTreeMap<String, u32>>,
}

/// A lease request waiting on a pool, counted in its demand until dropped.
#[derive(Debug)]
pub struct LeaseWaiting {
    board: std::sync::Arc<DemandBoard>,
    key: PoolKey,
    holder: String,
    count: u32,
}

impl Drop for LeaseWaiting {
    fn drop(&mut self) {
        self.board.wait_lease(&self.key, self.count, false);
        let mut holders = self
            .board
            .waiting_holders
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = holders.get_mut(&self.holder) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                holders.remove(&self.holder);
            }
        }
    }
}

impl Default for DemandBoard {
    fn default() -> Self {
        Self {
            said: Mutex::new(Said::default()),
            changed: tokio::sync::watch::Sender::new(0),
            notify: tokio::sync::Notify::new(),
            waiting_leases: Mutex::new(BTreeMap::new()),
            waiting_holders: Mutex::new(BTreeMap::new()),
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
        let swept = said.sweep(now);
        let key = (report.namespace.clone(), report.pool.clone());
        let before = said.sum(&key, now);
        let source = (holder.to_string(), report.from.clone());
        if demand.is_zero() {
            said.remove(&key, &source);
        } else {
            let pool = said.pools.get(&key);
            let known = pool.is_some_and(|s| s.contains_key(&source));
            if !known {
                if pool.is_none() && said.pools.len() >= MAX_POOLS {
                    return Err(format!("demand is kept for at most {MAX_POOLS} pools"));
                }
                if pool.is_some_and(|s| s.len() >= MAX_SOURCES) {
                    return Err(format!(
                        "demand is kept for at most {MAX_SOURCES} callers and replicas per pool"
                    ));
                }
                if said
                    .by_holder
                    .get(holder)
                    .is_some_and(|n| *n >= MAX_PER_HOLDER)
                {
                    return Err(format!(
                        "demand is kept for at most {MAX_PER_HOLDER} pools and replicas of one caller"
                    ));
                }
            }
            said.insert(&key, source, (demand, now));
        }
        if swept || before != said.sum(&key, now) {
            self.told();
        }
        Ok(())
    }

    /// Pool `namespace/pool`'s demand at `now`: the sum of what was said within [`TTL`], and
    /// the lease requests waiting on it.
    pub fn demand(&self, namespace: &str, pool: &str, now: Instant) -> Demand {
        let key = (namespace.to_string(), pool.to_string());
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.sweep(now) {
            self.told();
        }
        let mut d = said.sum(&key, now);
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

    /// A lease request of `holder` for `count` proxies of pool `namespace/pool` waits:
    /// counted until the returned value drops. None when `holder` has
    /// [`MAX_WAITING_PER_HOLDER`] waiting already (it is answered at once).
    pub fn lease_waiting(
        self: &std::sync::Arc<Self>,
        holder: &str,
        namespace: &str,
        pool: &str,
        count: u32,
    ) -> Option<LeaseWaiting> {
        {
            let mut holders = self
                .waiting_holders
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let n = holders.entry(holder.to_string()).or_default();
            if *n >= MAX_WAITING_PER_HOLDER {
                return None;
            }
            *n += 1;
        }
        let key = (namespace.to_string(), pool.to_string());
        self.wait_lease(&key, count, true);
        Some(LeaseWaiting {
            board: self.clone(),
            key,
            holder: holder.to_string(),
            count,
        })
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
        assert!(b.said.lock().unwrap().by_holder.is_empty());
        assert!(b.demand("ns", "other", t0).is_zero());
    }

    #[test]
    fn a_waiting_lease_request_counts_until_it_ends_and_never_lapses() {
        let b = std::sync::Arc::new(DemandBoard::default());
        let t0 = Instant::now();
        let first = b.lease_waiting("spider", "ns", "web", 2).unwrap();
        let second = b.lease_waiting("spider", "ns", "web", 1).unwrap();
        assert_eq!(b.demand("ns", "web", t0 + TTL * 10).waiting_leases, 3);
        drop(first);
        assert_eq!(b.demand("ns", "web", t0).waiting_leases, 1);
        drop(second);
        assert!(b.demand("ns", "web", t0).is_zero());
        // One caller's waiting requests are bounded; another's are not taken by them.
        let held: Vec<_> = (0..MAX_WAITING_PER_HOLDER)
            .map(|_| b.lease_waiting("spider", "ns", "web", 1).unwrap())
            .collect();
        assert!(b.lease_waiting("spider", "ns", "web", 1).is_none());
        assert!(b.lease_waiting("rival", "other", "web", 1).is_some());
        drop(held);
        assert!(b.lease_waiting("spider", "ns", "web", 1).is_some());
    }

    /// One caller naming pools that do not exist (or as many replicas as it likes) fills its
    /// own bound, not the board's: another caller's demand is still taken.
    #[test]
    fn one_caller_cannot_fill_the_board_for_the_others() {
        let b = DemandBoard::default();
        let t0 = Instant::now();
        let mut r = report("gw", 1, 0);
        for i in 0..MAX_PER_HOLDER {
            r.pool = format!("no-such-pool-{i}");
            b.say("flood", &r, t0).unwrap();
        }
        r.pool = "one-more".into();
        let e = b.say("flood", &r, t0).unwrap_err();
        assert!(e.contains("of one caller"), "{e}");
        // Said again, a kept source still counts; another caller is taken.
        r.pool = "no-such-pool-0".into();
        b.say("flood", &r, t0).unwrap();
        b.say("spider", &report("gw", 2, 0), t0).unwrap();
        assert_eq!(b.demand("ns", "web", t0).tunnels, 2);
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
