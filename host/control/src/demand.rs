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
//!
//! Several replicas of the API (the operator's) each keep a board of what reached them: a
//! gateway's report lands on whichever replica the Service picks, and a waiting lease request
//! on the one it reached. The replica that decides reads its peers' boards (`GET /v1/demand`,
//! [`Snapshot`]) and takes them in ([`DemandBoard::take_peer`]): a source said to two
//! replicas counts once, as the one said last; a peer's waiting lease requests add; a peer not
//! read again within [`TTL`] counts for nothing.

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
/// Sources kept at once over every pool, which bounds a board's [`Snapshot`] (a few MiB).
pub const MAX_ALL_SOURCES: usize = 16_384;
/// Peer boards taken in at once.
pub const MAX_PEERS: usize = 64;

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

/// One source's demand as a peer's board holds it (`GET /v1/demand`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceSaid {
    pub namespace: String,
    pub pool: String,
    /// The caller that said it.
    pub holder: String,
    /// The gateway replica it said it from.
    pub from: String,
    #[serde(default)]
    pub tunnels: u32,
    #[serde(default)]
    pub waiting_tunnels: u32,
    /// How long ago it was said, as the board read it (a duration, so clocks need not agree).
    pub age_ms: u64,
}

/// Proxies asked for by the lease requests waiting on one pool at one replica.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WaitingLeases {
    pub namespace: String,
    pub pool: String,
    pub leases: u32,
}

/// A board as its peers read it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Snapshot {
    /// The replica whose board it is: one that reads itself among its peers (a Service's
    /// addresses include its own) leaves it out.
    pub replica: String,
    pub sources: Vec<SourceSaid>,
    pub waiting: Vec<WaitingLeases>,
}

/// A peer's board as last read.
#[derive(Debug)]
struct Peer {
    read: Instant,
    pools: BTreeMap<PoolKey, Sources>,
    waiting: BTreeMap<PoolKey, u32>,
}

/// What was said: by pool and source, with how many sources each caller has.
#[derive(Debug, Default)]
struct Said {
    pools: BTreeMap<PoolKey, Sources>,
    by_holder: BTreeMap<String, usize>,
    /// Sources kept, over every pool.
    count: usize,
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
            self.count += 1;
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
        self.count = self.count.saturating_sub(1);
        if let Some(n) = self.by_holder.get_mut(holder) {
            *n -= 1;
            if *n == 0 {
                self.by_holder.remove(holder);
            }
        }
    }

    /// Drops what was not said again within TTL, at most once a [`SWEEP`]; the pools that
    /// lost a source.
    fn sweep(&mut self, now: Instant) -> Vec<PoolKey> {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP)
        {
            return Vec::new();
        }
        self.swept = Some(now);
        let mut gone = Vec::new();
        let mut pools = Vec::new();
        self.pools.retain(|key, sources| {
            let before = sources.len();
            sources.retain(|(holder, _), (_, at)| {
                let keep = fresh(*at, now);
                if !keep {
                    gone.push(holder.clone());
                }
                keep
            });
            if sources.len() != before {
                pools.push(key.clone());
            }
            !sources.is_empty()
        });
        for holder in &gone {
            self.forget(holder);
        }
        pools
    }
}

/// `sources`, each said within TTL of `now`, and `more` where said after what `sources`
/// holds of the same source (a source said to two replicas counts once, as said last).
fn newest<'a>(
    sources: Option<&'a Sources>,
    more: impl Iterator<Item = &'a Sources>,
    now: Instant,
) -> Demand {
    let mut merged: BTreeMap<&Source, (Demand, Instant)> = BTreeMap::new();
    for s in sources.into_iter().chain(more) {
        for (source, (d, at)) in s {
            if !fresh(*at, now) {
                continue;
            }
            match merged.get(source) {
                Some((_, seen)) if seen >= at => {}
                _ => {
                    merged.insert(source, (*d, *at));
                }
            }
        }
    }
    merged
        .values()
        .fold(Demand::default(), |a, (d, _)| a.plus(*d))
}

/// Said within TTL of `now`.
fn fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < TTL
}

/// The demands said, by pool and source, each with when it was said.
#[derive(Debug)]
pub struct DemandBoard {
    /// This replica's name in its [`Snapshot`].
    replica: String,
    said: Mutex<Said>,
    /// The peers' boards as last read, by where they were read.
    peers: Mutex<BTreeMap<String, Peer>>,
    /// Pools whose demand changed since [`DemandBoard::take_changed`] last took them.
    changed_pools: Mutex<std::collections::BTreeSet<PoolKey>>,
    pools_notify: tokio::sync::Notify,
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
        let mut nonce = [0u8; 8];
        // A name no other process has; a board whose name could not be drawn only fails to
        // recognise itself among its peers, which counts nothing twice but its own waiting
        // lease requests.
        let _ = getrandom::fill(&mut nonce);
        Self::named(&format!(
            "{}-{:016x}",
            std::process::id(),
            u64::from_le_bytes(nonce)
        ))
    }
}

impl DemandBoard {
    /// A board that calls itself `replica` in its snapshots (a Pod's name).
    pub fn named(replica: &str) -> Self {
        Self {
            replica: replica.to_string(),
            peers: Mutex::new(BTreeMap::new()),
            changed_pools: Mutex::new(std::collections::BTreeSet::new()),
            pools_notify: tokio::sync::Notify::new(),
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
        let mut changed = said.sweep(now);
        let key = (report.namespace.clone(), report.pool.clone());
        let before = self.merged(&said, &key, now);
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
                if said.count >= MAX_ALL_SOURCES {
                    return Err(format!(
                        "demand is kept for at most {MAX_ALL_SOURCES} callers and replicas in all"
                    ));
                }
            }
            said.insert(&key, source, (demand, now));
        }
        if before != self.merged(&said, &key, now) {
            changed.push(key);
        }
        drop(said);
        self.told_of(changed);
        Ok(())
    }

    /// Pool `key`'s demand said within TTL, here and at the peers, each source once, with
    /// the lease requests waiting on it at the peers (not the ones waiting here).
    fn merged(&self, said: &Said, key: &PoolKey, now: Instant) -> Demand {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let live = || peers.values().filter(|p| fresh(p.read, now));
        let mut d = newest(
            said.pools.get(key),
            live().filter_map(|p| p.pools.get(key)),
            now,
        );
        d.waiting_leases = live()
            .filter_map(|p| p.waiting.get(key))
            .fold(0u32, |a, n| a.saturating_add(*n));
        d
    }

    /// This board as its peers read it at `now`: what was said within TTL, and the lease
    /// requests waiting here.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let sources = said
            .pools
            .iter()
            .flat_map(|((namespace, pool), sources)| {
                sources.iter().filter(|(_, (_, at))| fresh(*at, now)).map(
                    move |((holder, from), (d, at))| SourceSaid {
                        namespace: namespace.clone(),
                        pool: pool.clone(),
                        holder: holder.clone(),
                        from: from.clone(),
                        tunnels: d.tunnels,
                        waiting_tunnels: d.waiting_tunnels,
                        age_ms: u64::try_from(now.saturating_duration_since(*at).as_millis())
                            .unwrap_or(u64::MAX),
                    },
                )
            })
            .collect();
        drop(said);
        let waiting = self
            .waiting_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((namespace, pool), n)| WaitingLeases {
                namespace: namespace.clone(),
                pool: pool.clone(),
                leases: *n,
            })
            .collect();
        Snapshot {
            replica: self.replica.clone(),
            sources,
            waiting,
        }
    }

    /// Takes in `snapshot`, peer `at`'s board as read at `now`, in place of what was last
    /// read there; the pools whose demand it changes are told. Its own snapshot (read through
    /// a Service that names this replica too) is left out. An error says why it is refused:
    /// more than a board keeps, or more peers than [`MAX_PEERS`].
    pub fn take_peer(&self, at: &str, snapshot: Snapshot, now: Instant) -> Result<(), String> {
        if snapshot.replica == self.replica {
            return Ok(());
        }
        if snapshot.sources.len() > MAX_ALL_SOURCES || snapshot.waiting.len() > MAX_POOLS {
            return Err(format!(
                "a board keeps at most {MAX_ALL_SOURCES} sources and {MAX_POOLS} pools' waiting leases"
            ));
        }
        let mut peer = Peer {
            read: now,
            pools: BTreeMap::new(),
            waiting: BTreeMap::new(),
        };
        for s in snapshot.sources {
            let said_at = now
                .checked_sub(Duration::from_millis(s.age_ms))
                .unwrap_or(now);
            let d = Demand {
                tunnels: s.tunnels,
                waiting_tunnels: s.waiting_tunnels,
                ..Demand::default()
            };
            peer.pools
                .entry((s.namespace, s.pool))
                .or_default()
                .insert((s.holder, s.from), (d, said_at));
        }
        for w in snapshot.waiting {
            let n = peer.waiting.entry((w.namespace, w.pool)).or_default();
            *n = n.saturating_add(w.leases);
        }
        let said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: std::collections::BTreeSet<PoolKey> = peer
            .pools
            .keys()
            .chain(peer.waiting.keys())
            .cloned()
            .collect();
        {
            let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            if !peers.contains_key(at)
                && peers.values().filter(|p| fresh(p.read, now)).count() >= MAX_PEERS
            {
                return Err(format!("at most {MAX_PEERS} peers are read"));
            }
            if let Some(old) = peers.get(at) {
                keys.extend(old.pools.keys().chain(old.waiting.keys()).cloned());
            }
        }
        let before: Vec<Demand> = keys.iter().map(|k| self.merged(&said, k, now)).collect();
        {
            let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            peers.retain(|_, p| fresh(p.read, now));
            peers.insert(at.to_string(), peer);
        }
        let changed: Vec<PoolKey> = keys
            .into_iter()
            .zip(before)
            .filter(|(k, b)| self.merged(&said, k, now) != *b)
            .map(|(k, _)| k)
            .collect();
        drop(said);
        self.told_of(changed);
        Ok(())
    }

    /// Pool `namespace/pool`'s demand at `now`: the sum of what was said within [`TTL`], and
    /// the lease requests waiting on it.
    pub fn demand(&self, namespace: &str, pool: &str, now: Instant) -> Demand {
        let key = (namespace.to_string(), pool.to_string());
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let swept = said.sweep(now);
        let mut d = self.merged(&said, &key, now);
        drop(said);
        self.told_of(swept);
        let here = self
            .waiting_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied()
            .unwrap_or(0);
        d.waiting_leases = d.waiting_leases.saturating_add(here);
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
        self.told_of(vec![key.clone()]);
    }

    /// Bumped when a pool's demand changes (a demand said, or one expired when read).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Resolves once a pool's demand changed since the last time it resolved (one waiter).
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    /// Resolves once a pool's demand changed since [`Self::take_changed`] last took them
    /// (one waiter).
    pub async fn pools_changed(&self) {
        self.pools_notify.notified().await
    }

    /// The pools whose demand changed since the last call: (namespace, name).
    pub fn take_changed(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.changed_pools.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .collect()
    }

    fn told_of(&self, pools: Vec<PoolKey>) {
        if pools.is_empty() {
            return;
        }
        self.changed_pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(pools);
        self.pools_notify.notify_one();
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

    /// Two replicas' boards: the decider reads its peer's and counts each source once (the
    /// one said last, wherever), adds the peer's waiting lease requests to its own, leaves its
    /// own snapshot out, and forgets a peer not read again within TTL.
    #[test]
    fn a_peers_board_adds_its_waiting_leases_and_counts_a_source_said_to_both_once() {
        let leader = std::sync::Arc::new(DemandBoard::named("op-0"));
        let standby = std::sync::Arc::new(DemandBoard::named("op-1"));
        let t0 = Instant::now();
        // gw-0's report reached the leader first, then (a new connection) the standby.
        leader.say("spider", &report("gw-0", 5, 0), t0).unwrap();
        standby
            .say("spider", &report("gw-0", 2, 1), t0 + TTL / 4)
            .unwrap();
        standby
            .say("crawler", &report("gw-1", 4, 0), t0 + TTL / 4)
            .unwrap();
        let _waits_there = standby.lease_waiting("spider", "ns", "web", 3).unwrap();
        let _waits_here = leader.lease_waiting("crawler", "ns", "web", 1).unwrap();
        assert!(leader.take_changed().contains(&("ns".into(), "web".into())));
        let now = t0 + TTL / 2;
        let snap = standby.snapshot(now);
        // Through JSON, as it is read.
        let snap: Snapshot = serde_json::from_slice(&serde_json::to_vec(&snap).unwrap()).unwrap();
        leader
            .take_peer("https://10.0.0.2:8443", snap, now)
            .unwrap();
        assert_eq!(leader.take_changed(), vec![("ns".into(), "web".into())]);
        let d = leader.demand("ns", "web", now);
        assert_eq!(
            (d.tunnels, d.waiting_tunnels, d.waiting_leases),
            (2 + 4, 1, 3 + 1),
            "gw-0 once, as said last; every waiting lease request"
        );
        // Its own snapshot, read through the Service, adds nothing.
        leader
            .take_peer("https://10.0.0.1:8443", leader.snapshot(now), now)
            .unwrap();
        assert_eq!(leader.demand("ns", "web", now), d);
        assert!(leader.take_changed().is_empty());
        // Said again to the leader: that one is now the newest.
        leader.say("spider", &report("gw-0", 7, 0), now).unwrap();
        assert_eq!(leader.demand("ns", "web", now).tunnels, 7 + 4);
        // The standby stops being read (it died): within TTL of its last read, nothing of
        // it counts.
        let later = now + TTL;
        let d = leader.demand("ns", "web", later);
        assert_eq!((d.tunnels, d.waiting_leases), (0, 1));
    }

    /// A peer's answer is bounded as a board is, and so is the number of peers.
    #[test]
    fn a_peer_answer_past_a_boards_bounds_is_refused() {
        let b = DemandBoard::named("op-0");
        let t0 = Instant::now();
        let one = |i: usize| SourceSaid {
            namespace: "ns".into(),
            pool: "web".into(),
            holder: format!("h{i}"),
            from: "gw".into(),
            tunnels: 1,
            waiting_tunnels: 0,
            age_ms: 0,
        };
        let big = Snapshot {
            replica: "op-1".into(),
            sources: (0..=MAX_ALL_SOURCES).map(one).collect(),
            waiting: vec![],
        };
        assert!(b.take_peer("p", big, t0).unwrap_err().contains("16384"));
        for i in 0..MAX_PEERS {
            let s = Snapshot {
                replica: format!("op-{}", i + 1),
                sources: vec![one(i)],
                waiting: vec![],
            };
            b.take_peer(&format!("p{i}"), s, t0).unwrap();
        }
        let s = Snapshot {
            replica: "late".into(),
            sources: vec![],
            waiting: vec![],
        };
        assert!(b.take_peer("late", s.clone(), t0).is_err());
        assert_eq!(b.demand("ns", "web", t0).tunnels, MAX_PEERS as u32);
        // Once the others lapse, a new one is read.
        b.take_peer("late", s, t0 + TTL).unwrap();
    }
}
