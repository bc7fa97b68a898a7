//! The members the gateway routes to: every Proxy of the pools it serves, as the Proxies'
//! statuses (in a cluster) or the CLI's state (outside) say they are now, kept in a
//! [`MemberTable`] that a source replaces whole whenever they change.
//!
//! Each member also has a [`Slot`] that outlives the snapshots: the tunnels open on it, and its
//! fate (serving, retiring at a time, gone), which its tunnels watch so a draining member's
//! tunnels close at its `retireAt` and a deleted member's at once.

use egress_core::credential::ProxyCredential;
use egress_core::discovery::Candidate;
use egress_core::lease::{LeaseBinding, LeaseMode};
use egress_core::target::{Hold, Quarantine, QuarantinePolicy};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A pool, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub namespace: String,
    pub name: String,
}

impl PoolKey {
    /// `NAMESPACE/NAME`, or what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not NAMESPACE/POOL")),
        }
    }
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One member as the gateway routes to it.
#[derive(Clone, PartialEq, Eq)]
pub struct Member {
    pub namespace: String,
    pub name: String,
    pub pool: String,
    /// Where its Squid listens: the instance's address and the port it serves.
    pub addr: SocketAddr,
    pub credential: Option<ProxyCredential>,
    pub egress_ip: Option<String>,
    pub zone: Option<String>,
    /// Ready: verified, where the egress check runs.
    pub ready: bool,
    pub cordoned: bool,
    /// Unix seconds: it drains, and its tunnels close then.
    pub retire_at: Option<i64>,
    /// Its lease bindings that hold on this instance (its address).
    pub leases: Vec<LeaseBinding>,
    /// The targets that refused it, as its status records them (`egress_core::target`).
    pub quarantines: Vec<Hold>,
}

/// Without the credential.
impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("egress_ip", &self.egress_ip)
            .field("ready", &self.ready)
            .field("cordoned", &self.cordoned)
            .field("retire_at", &self.retire_at)
            .finish_non_exhaustive()
    }
}

/// Which instance a member is: its Proxy and the address it serves on. An instance replaced
/// under its Proxy is another member, so a session pinned to the old one is not moved to the
/// new address in silence.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberKey {
    pub namespace: String,
    pub name: String,
    pub addr: SocketAddr,
}

impl MemberKey {
    /// The member's place in rendezvous hashing, from what identifies its instance.
    pub fn rendezvous_hash(&self) -> u64 {
        crate::hash::stable_hash(&[&self.namespace, &self.name, &self.addr.to_string()])
    }
}

impl std::fmt::Display for MemberKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Member {
    /// A member from what discovery reads of a Proxy, `retire_at` from its drain; None without
    /// an address, or outside any pool.
    pub fn from_candidate(c: &Candidate<'_>, retire_at: Option<i64>) -> Option<Member> {
        let ip: IpAddr = c.status.ip.as_deref()?.parse().ok()?;
        let served = c.status.instance_spec.as_ref();
        let port = served.map_or(c.port, |i| i.port);
        let zone = served
            .and_then(|i| i.placement.zone.as_deref())
            .or(c.zone)
            .map(str::to_string);
        Some(Member {
            namespace: c.namespace.to_string(),
            name: c.name.to_string(),
            pool: c.pool?.to_string(),
            addr: SocketAddr::new(ip, port),
            credential: c.credential.cloned(),
            egress_ip: c.status.egress_ip.clone(),
            zone,
            ready: egress_core::reconcile::ready_is_true(c.status),
            cordoned: c.cordoned,
            retire_at,
            leases: egress_core::lease::holding(&c.status.leases, c.status.ip.as_deref()),
            quarantines: c.status.quarantines.iter().map(Hold::of).collect(),
        })
    }

    /// `NAMESPACE/NAME`, as answers and headers name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn key(&self) -> MemberKey {
        MemberKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            addr: self.addr,
        }
    }

    pub fn pool_key(&self) -> PoolKey {
        PoolKey {
            namespace: self.namespace.clone(),
            name: self.pool.clone(),
        }
    }

    /// May take new connections of anyone's: Ready, not cordoned, not draining.
    pub fn usable(&self) -> bool {
        self.ready && !self.cordoned && self.retire_at.is_none()
    }

    /// The exclusive lease on it at `now`, if one holds it.
    pub fn exclusive_lease(&self, now: i64) -> Option<&LeaseBinding> {
        self.leases
            .iter()
            .find(|b| b.mode == LeaseMode::Exclusive && b.live(now))
    }

    /// Its live binding of lease `id`.
    pub fn lease(&self, id: &str, now: i64) -> Option<&LeaseBinding> {
        self.leases.iter().find(|b| b.id == id && b.live(now))
    }
}

/// What becomes of a member's tunnels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Serving,
    /// Drains: its tunnels close at this Unix second.
    RetireAt(i64),
    /// Left the table (its Proxy or instance is gone): its tunnels close now.
    Gone,
}

/// Passive health, as Envoy's outlier detection has it: a member that refuses or breaks off
/// connections leaves new routing at once, without waiting for its check to fail (up to a
/// minute and a half with the default check settings), for a time that doubles with each
/// ejection in a row; and no more than a share of a pool is ejected at once, so a network
/// blip that fails every member leaves the pool routing rather than empty.
#[derive(Debug, Clone, Copy)]
pub struct Outliers {
    /// Failures in a row that eject a member.
    pub consecutive: u32,
    /// The first ejection's length; each one after, with no success between, doubles it.
    pub base: Duration,
    pub max: Duration,
    /// The share of a pool's members that may be ejected at once, in percent (at least one
    /// member may always be).
    pub max_percent: usize,
}

impl Default for Outliers {
    fn default() -> Self {
        Self {
            consecutive: 1,
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            max_percent: 50,
        }
    }
}

/// A member's passive health.
#[derive(Debug, Default)]
struct Health {
    /// Failures since its last success.
    failures: u32,
    /// Ejected from new routing until then.
    ejected_until: Option<Instant>,
    /// Ejections since its last success: the next one lasts `base * 2^ejections`.
    ejections: u32,
}

/// A member's state that outlives snapshots.
pub struct Slot {
    /// Tunnels and requests under way on it: what least-loaded choice compares.
    pub active: AtomicUsize,
    fate: tokio::sync::watch::Sender<Fate>,
    health: Mutex<Health>,
    /// The quarantines this replica's own signals made (a crawler's report, a target's
    /// refusal it relayed), until the member's status carries them.
    local: Mutex<Vec<Quarantine>>,
    /// Whether `local` holds any record: routing reads it without the lock.
    has_local: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            fate: tokio::sync::watch::Sender::new(Fate::Serving),
            health: Mutex::default(),
            local: Mutex::default(),
            has_local: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The records this replica's own signals made.
    pub fn local_quarantines(&self) -> Vec<Quarantine> {
        if !self.has_local.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.local.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the records this replica's own signals made.
    pub fn set_local_quarantines(&self, records: Vec<Quarantine>) {
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        self.has_local.store(!records.is_empty(), Ordering::Release);
        *local = records;
    }

    /// Changes the records this replica's own signals made under their lock: `change` returns
    /// the records to keep (None: unchanged) and what it did.
    pub fn update_local<T>(
        &self,
        change: impl FnOnce(&[Quarantine]) -> (Option<Vec<Quarantine>>, T),
    ) -> T {
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        let (records, out) = change(&local);
        if let Some(r) = records {
            self.has_local.store(!r.is_empty(), Ordering::Release);
            *local = r;
        }
        out
    }

    /// Its quarantine for `target` that holds at `now`, by its status or by this replica's own
    /// signals (the one that ends later where both have one).
    pub fn hold(&self, member: &Member, target: &str, now: i64) -> Option<Hold> {
        let status = member
            .quarantines
            .iter()
            .find(|h| h.target == target && h.until > now)
            .cloned();
        let local = if self.has_local.load(Ordering::Acquire) {
            self.local
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(Hold::of)
                .find(|h| h.target == target && h.until > now)
        } else {
            None
        };
        match (status, local) {
            (Some(a), Some(b)) => Some(if b.until > a.until { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it is out of new routing at `now`.
    pub fn ejected(&self, now: Instant) -> bool {
        self.health().ejected_until.is_some_and(|until| now < until)
    }

    /// It served: its failures and ejections are forgotten.
    pub fn served(&self) {
        let mut h = self.health();
        if h.failures != 0 || h.ejections != 0 {
            *h = Health::default();
        }
    }

    /// It refused or broke off a connection at `now`: ejected when that makes `policy`'s
    /// failures in a row and `pool` (the entries of its pool, itself among them) has room for
    /// one more ejected member. True when this ejected it.
    pub fn failed(&self, now: Instant, pool: &[Entry], policy: &Outliers) -> bool {
        {
            let mut h = self.health();
            h.failures += 1;
            if h.failures < policy.consecutive || h.ejected_until.is_some_and(|u| now < u) {
                return false;
            }
        }
        // Counted outside this slot's lock: every slot's lock is taken in turn.
        let ejected = pool.iter().filter(|e| e.slot.ejected(now)).count();
        let room = (pool.len() * policy.max_percent / 100).max(1);
        if ejected >= room {
            return false;
        }
        let mut h = self.health();
        let factor = 1u32.checked_shl(h.ejections.min(16)).unwrap_or(u32::MAX);
        let length = policy.base.saturating_mul(factor).min(policy.max);
        h.ejected_until = Some(now + length);
        h.ejections = h.ejections.saturating_add(1);
        h.failures = 0;
        true
    }

    /// What its tunnels watch.
    pub fn fate(&self) -> tokio::sync::watch::Receiver<Fate> {
        self.fate.subscribe()
    }

    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    fn set(&self, fate: Fate) {
        self.fate.send_if_modified(|f| {
            let changed = *f != fate;
            *f = fate;
            changed
        });
    }
}

/// A member in a snapshot, with its slot.
#[derive(Clone)]
pub struct Entry {
    pub member: Arc<Member>,
    pub slot: Arc<Slot>,
    /// [`MemberKey::rendezvous_hash`] of its key, once per snapshot rather than per session.
    pub hash: u64,
}

/// The members of every pool served, at one moment.
#[derive(Default)]
pub struct Snapshot {
    pub pools: BTreeMap<PoolKey, Vec<Entry>>,
    /// The source has read every Proxy once: before that an empty pool would be a lie.
    pub synced: bool,
}

impl Snapshot {
    pub fn find(&self, pool: &PoolKey, key: &MemberKey) -> Option<&Entry> {
        self.pools.get(pool)?.iter().find(|e| {
            e.member.namespace == key.namespace
                && e.member.name == key.name
                && e.member.addr == key.addr
        })
    }
}

/// The members now, replaced whole by the source; readers take the snapshot of the moment.
pub struct MemberTable {
    served: Vec<PoolKey>,
    now: RwLock<Arc<Snapshot>>,
    slots: Mutex<HashMap<MemberKey, Arc<Slot>>>,
    changed: tokio::sync::watch::Sender<u64>,
    policies: RwLock<BTreeMap<PoolKey, QuarantinePolicy>>,
    politeness: RwLock<BTreeMap<PoolKey, Arc<egress_core::politeness::Politeness>>>,
    /// The autoscaled pools, each with its `coldStartWait`.
    autoscaled: RwLock<BTreeMap<PoolKey, std::time::Duration>>,
}

impl MemberTable {
    /// A table of the pools `served` (every pool when empty).
    pub fn new(served: Vec<PoolKey>) -> Self {
        Self {
            served,
            now: RwLock::new(Arc::new(Snapshot::default())),
            slots: Mutex::new(HashMap::new()),
            changed: tokio::sync::watch::Sender::new(0),
            policies: RwLock::new(BTreeMap::new()),
            politeness: RwLock::new(BTreeMap::new()),
            autoscaled: RwLock::new(BTreeMap::new()),
        }
    }

    /// Pool `pool`'s `spec.quarantine` (its defaults until a source says).
    pub fn quarantine_policy(&self, pool: &PoolKey) -> QuarantinePolicy {
        self.policies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(pool)
            .cloned()
            .unwrap_or_default()
    }

    /// The pools' `spec.quarantine`, as their source read them.
    pub fn set_quarantine_policies(&self, policies: BTreeMap<PoolKey, QuarantinePolicy>) {
        *self.policies.write().unwrap_or_else(|p| p.into_inner()) = policies;
    }

    /// Pool `pool`'s `spec.politeness`, parsed, where it has rules.
    pub fn politeness(&self, pool: &PoolKey) -> Option<Arc<egress_core::politeness::Politeness>> {
        let all = self.politeness.read().unwrap_or_else(|p| p.into_inner());
        if all.is_empty() {
            return None;
        }
        all.get(pool).cloned()
    }

    /// The pools' `spec.politeness`, as their source read them (a pool's that cannot be read
    /// enforces nothing, and the log says why).
    pub fn set_politeness_policies(
        &self,
        policies: BTreeMap<PoolKey, egress_core::politeness::PolitenessPolicy>,
    ) {
        let parsed = parse_policies(policies);
        *self.politeness.write().unwrap_or_else(|p| p.into_inner()) = parsed;
    }

    /// The pools' `spec.autoscale`, as their source read them.
    pub fn set_autoscale_policies(
        &self,
        policies: BTreeMap<PoolKey, egress_core::autoscale::AutoscalePolicy>,
    ) {
        let waits = policies
            .into_iter()
            .map(|(k, p)| (k, p.cold_start_wait()))
            .collect();
        *self.autoscaled.write().unwrap_or_else(|p| p.into_inner()) = waits;
    }

    /// Pool `pool`'s `coldStartWait`, where it is autoscaled.
    pub fn cold_start_wait(&self, pool: &PoolKey) -> Option<std::time::Duration> {
        self.autoscaled
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(pool)
            .copied()
    }

    /// The autoscaled pools served: known to routing even with no member (asleep at zero).
    pub fn autoscaled(&self) -> Vec<PoolKey> {
        self.autoscaled
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|k| self.serves(k))
            .cloned()
            .collect()
    }

    pub fn served(&self) -> &[PoolKey] {
        &self.served
    }

    /// Whether pool `key` is one this gateway serves.
    pub fn serves(&self, key: &PoolKey) -> bool {
        self.served.is_empty() || self.served.contains(key)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.now.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Bumped at every replace, for whoever waits on a change.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Replaces the members with `members` (those of pools not served are dropped). Members
    /// that left have their tunnels closed; draining ones learn when theirs close.
    pub fn replace(&self, members: impl IntoIterator<Item = Member>, synced: bool) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut pools: BTreeMap<PoolKey, Vec<Entry>> = BTreeMap::new();
        let mut kept: HashMap<MemberKey, Arc<Slot>> = HashMap::new();
        for m in members {
            let pool = m.pool_key();
            if !self.serves(&pool) {
                continue;
            }
            let key = m.key();
            let slot = slots
                .remove(&key)
                .or_else(|| kept.get(&key).cloned())
                .unwrap_or_else(|| Arc::new(Slot::new()));
            slot.set(match m.retire_at {
                Some(at) => Fate::RetireAt(at),
                None => Fate::Serving,
            });
            let hash = key.rendezvous_hash();
            kept.insert(key, slot.clone());
            pools.entry(pool).or_default().push(Entry {
                member: Arc::new(m),
                slot,
                hash,
            });
        }
        for entries in pools.values_mut() {
            entries.sort_by_key(|e| e.member.key());
        }
        for (_, gone) in slots.drain() {
            gone.set(Fate::Gone);
        }
        *slots = kept;
        drop(slots);
        *self.now.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Snapshot { pools, synced });
        self.changed.send_modify(|n| *n += 1);
    }
}

/// Counts a member's work under way while it lives.
pub struct Active(Entry);

impl Active {
    pub fn new(e: &Entry) -> Self {
        e.slot.active.fetch_add(1, Ordering::Relaxed);
        Self(e.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.slot.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pools' politeness, parsed; a policy that cannot be read acts on nothing (validation
/// refuses such a pool before anything acts on it) and says so.
pub fn parse_policies(
    policies: std::collections::BTreeMap<PoolKey, egress_core::politeness::PolitenessPolicy>,
) -> std::collections::BTreeMap<PoolKey, Arc<egress_core::politeness::Politeness>> {
    policies
        .into_iter()
        .filter_map(|(pool, p)| match p.parse() {
            Ok(parsed) if !parsed.rules.is_empty() => Some((pool, Arc::new(parsed))),
            Ok(_) => None,
            Err(why) => {
                tracing::warn!(%pool, error = %why, "the pool's politeness cannot be read; the gateway enforces none for it");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn members(n: u8) -> Vec<Member> {
        (1..=n)
            .map(|i| Member {
                namespace: "ns".into(),
                name: format!("web-{i}"),
                pool: "web".into(),
                addr: format!("127.0.1.{i}:3128").parse().unwrap(),
                credential: None,
                egress_ip: None,
                zone: None,
                ready: true,
                cordoned: false,
                retire_at: None,
                leases: Vec::new(),
                quarantines: Vec::new(),
            })
            .collect()
    }

    /// An ejection lasts the base time, doubles on each repeat with no success between, is
    /// capped, and a success forgets them; no more than half a pool is ejected at once.
    #[test]
    fn ejections_grow_on_repeats_and_never_take_more_than_half_a_pool() {
        let t = MemberTable::new(Vec::new());
        t.replace(members(4), true);
        let snap = t.snapshot();
        let pool = &snap.pools.values().next().unwrap()[..];
        let policy = Outliers {
            consecutive: 2,
            base: Duration::from_secs(10),
            max: Duration::from_secs(35),
            max_percent: 50,
        };
        let t0 = Instant::now();
        let s = &pool[0].slot;
        assert!(!s.failed(t0, pool, &policy), "one failure of two");
        assert!(s.failed(t0, pool, &policy));
        assert!(s.ejected(t0 + Duration::from_secs(9)));
        assert!(!s.ejected(t0 + Duration::from_secs(10)));
        // Back, and failing again: twice as long, then capped at 35 s.
        let t1 = t0 + Duration::from_secs(10);
        s.failed(t1, pool, &policy);
        assert!(s.failed(t1, pool, &policy));
        assert!(s.ejected(t1 + Duration::from_secs(19)));
        assert!(!s.ejected(t1 + Duration::from_secs(20)));
        let t2 = t1 + Duration::from_secs(20);
        s.failed(t2, pool, &policy);
        assert!(s.failed(t2, pool, &policy));
        assert!(s.ejected(t2 + Duration::from_secs(34)));
        assert!(!s.ejected(t2 + Duration::from_secs(35)));
        // A success forgets: the next ejection is the base time again.
        s.served();
        let t3 = t2 + Duration::from_secs(35);
        s.failed(t3, pool, &policy);
        assert!(s.failed(t3, pool, &policy));
        assert!(!s.ejected(t3 + Duration::from_secs(10)));
        // Half of four at once: a third member failing stays in routing.
        for e in &pool[1..] {
            e.slot.failed(t3, pool, &policy);
            e.slot.failed(t3, pool, &policy);
        }
        let ejected = pool.iter().filter(|e| e.slot.ejected(t3)).count();
        assert_eq!(ejected, 2);
    }
}
