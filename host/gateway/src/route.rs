//! Which member serves a request.
//!
//! - A lease id pins the lease's proxies: only its holder may use them, and only while the
//!   lease holds; an exclusively leased member takes no one else's traffic.
//! - A session sticks to one member. Its first request picks by rendezvous hashing (highest
//!   score of the session and each available member), so gateway replicas that see the same
//!   members pick the same one without sharing anything, and a departing member moves only its
//!   own sessions. Each replica then remembers the session's member: when that member goes
//!   (failed its check, drains, deleted) the session fails loudly, unless it asked to be moved.
//! - Anything else goes to the less loaded of two members picked at random.

use crate::ask::{Options, PoolName};
use crate::hash::{mix, stable_hash};
use crate::members::{Entry, MemberKey, PoolKey, Snapshot};
use egress_core::target::{cap, within_cap};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why no member serves a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoute {
    /// The pool named is not one this gateway serves, or none was named where several are.
    #[error("{0}")]
    Pool(String),
    /// No member is available now: 503, with when to ask again.
    #[error("{reason}")]
    NoMember { reason: String, retry_after: u64 },
    /// The session's member went away, and the session did not ask to move.
    #[error(
        "session {session:?}: its member {member} {why}; ask with option move-yes to be moved to another egress address"
    )]
    SessionGone {
        session: String,
        member: String,
        why: &'static str,
    },
    /// The session's member (or every proxy of the lease) is quarantined for the request's
    /// target, and the session did not ask to move: 503, saying until when.
    #[error(
        "{pinned}: its member {member} is quarantined for {target} until {until}; ask with option move-yes to be moved to another egress address"
    )]
    Quarantined {
        /// `session "ID"` or `lease "ID"`.
        pinned: String,
        member: String,
        target: String,
        /// RFC 3339.
        until: String,
    },
    /// The lease holds nothing for this caller: expired, released, its proxy lost, another
    /// caller's or never taken, answered alike so that no one learns which lease ids exist.
    #[error(
        "lease {0:?} holds no proxy of this pool for this caller now (expired, released, its proxy lost, or not this caller's)"
    )]
    LeaseGone(String),
    /// No pool of that name that this caller may use: one that does not exist and another
    /// tenant's answer alike.
    #[error("no pool {0:?} that this credential may use is served here")]
    PoolNotYours(String),
}

/// Seconds a crawler is asked to wait when no member is free: members come back on the
/// pool's own schedule, which the gateway does not know.
pub const RETRY_AFTER: u64 = 5;

/// A session as each replica remembers it: whose, on which pool and lease, and its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    caller: String,
    pool: PoolKey,
    lease: Option<String>,
    session: String,
}

impl SessionKey {
    /// Whose sessions this is one of: a caller on a pool, bounded on its own.
    fn tenant(&self) -> Tenant {
        Tenant {
            caller: self.caller.clone(),
            pool: self.pool.clone(),
        }
    }
}

/// A caller on a pool: the unit whose sessions are bounded together, so that one caller's
/// flood of new sessions evicts only its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Tenant {
    caller: String,
    pool: PoolKey,
}

/// One tenant's sessions, least recently used first out. `order` lists each use as (stamp,
/// key); an entry whose stamp is not its session's latest is stale and skipped when evicting,
/// and the list is compacted when stale entries outnumber live ones, so every operation is
/// O(1) amortised (the scan of a whole table at each insertion past the bound took ~10 ms at
/// 100,000 sessions, under a lock every request took).
#[derive(Default)]
struct Lru {
    map: HashMap<SessionKey, (MemberKey, Instant, u64)>,
    order: std::collections::VecDeque<(u64, SessionKey)>,
    stamp: u64,
}

impl Lru {
    fn touch(&mut self, key: &SessionKey) -> u64 {
        self.stamp += 1;
        self.order.push_back((self.stamp, key.clone()));
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            self.order
                .retain(|(stamp, k)| map.get(k).is_some_and(|(_, _, s)| s == stamp));
        }
        self.stamp
    }

    /// Removes the least recently used session.
    fn evict_one(&mut self) {
        while let Some((stamp, key)) = self.order.pop_front() {
            if self.map.get(&key).is_some_and(|(_, _, s)| *s == stamp) {
                self.map.remove(&key);
                return;
            }
        }
    }
}

/// Shards of the session table: requests of different tenants take different locks.
const SHARDS: usize = 64;
/// Insertions into a shard between two sweeps of its idle sessions: a tenant that went quiet
/// holds its memory at most until its shard's next sweep.
const SWEEP_EVERY: u64 = 1024;

/// The tenants of one shard.
#[derive(Default)]
struct Shard {
    tenants: HashMap<Tenant, Lru>,
    puts: u64,
}

impl Lru {
    /// Forgets the sessions unused for `idle`, oldest first.
    fn expire(&mut self, now: Instant, idle: Duration) {
        while let Some((stamp, oldest)) = self.order.front() {
            match self.map.get(oldest) {
                Some((_, used, s)) if s == stamp => {
                    if now.duration_since(*used) < idle {
                        return;
                    }
                    let oldest = oldest.clone();
                    self.map.remove(&oldest);
                    self.order.pop_front();
                }
                _ => {
                    self.order.pop_front();
                }
            }
        }
    }
}

/// The sessions this replica has routed, each with its member and when last used: at most
/// `capacity` per tenant (caller and pool), each tenant's least recently used going first.
pub struct Sessions {
    shards: Vec<Mutex<Shard>>,
    /// A session unused this long is forgotten (its next request picks anew).
    pub idle: Duration,
    /// Sessions remembered per caller and pool.
    pub capacity: usize,
}

impl Sessions {
    pub fn new(idle: Duration, capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            idle,
            capacity: capacity.max(1),
        }
    }

    fn shard(&self, tenant: &Tenant) -> std::sync::MutexGuard<'_, Shard> {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: a tenant's shard is the same at every call.
        let mut h = std::hash::DefaultHasher::new();
        tenant.hash(&mut h);
        let i = (h.finish() as usize) % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &SessionKey, now: Instant) -> Option<MemberKey> {
        let tenant = key.tenant();
        let mut shard = self.shard(&tenant);
        let lru = shard.tenants.get_mut(&tenant)?;
        match lru.map.get(key) {
            Some((_, used, _)) if now.duration_since(*used) < self.idle => {}
            Some(_) => {
                lru.map.remove(key);
                if lru.map.is_empty() {
                    shard.tenants.remove(&tenant);
                }
                return None;
            }
            None => return None,
        }
        let stamp = lru.touch(key);
        let (member, used, s) = lru.map.get_mut(key)?;
        *used = now;
        *s = stamp;
        Some(member.clone())
    }

    pub fn put(&self, key: SessionKey, member: MemberKey, now: Instant) {
        let tenant = key.tenant();
        let mut shard = self.shard(&tenant);
        shard.puts += 1;
        if shard.puts.is_multiple_of(SWEEP_EVERY) {
            let idle = self.idle;
            shard.tenants.retain(|_, lru| {
                lru.expire(now, idle);
                !lru.map.is_empty()
            });
        }
        let lru = shard.tenants.entry(tenant).or_default();
        if !lru.map.contains_key(&key) {
            // The idle go first, then the least recently used of this tenant alone.
            lru.expire(now, self.idle);
            while lru.map.len() >= self.capacity {
                lru.evict_one();
            }
        }
        let stamp = lru.touch(&key);
        lru.map.insert(key, (member, now, stamp));
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .tenants
                    .values()
                    .map(|l| l.map.len())
                    .sum::<usize>()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The member of `entries` with the highest rendezvous score for `session`.
pub fn rendezvous<'a>(entries: &[&'a Entry], session: u64) -> Option<&'a Entry> {
    entries
        .iter()
        .copied()
        .max_by_key(|e| (mix(session ^ e.hash), e.hash))
}

/// The less loaded of two of `entries` picked by `random`; ties go to the first pick.
pub fn two_choices<'a>(entries: &[&'a Entry], random: u64) -> Option<&'a Entry> {
    let n = entries.len() as u64;
    if n == 0 {
        return None;
    }
    let a = entries[(random % n) as usize];
    let b = entries[(mix(random) % n) as usize];
    Some(if b.slot.active() < a.slot.active() {
        b
    } else {
        a
    })
}

/// What one request asks to be routed: the pool, its options, the caller, the members to
/// leave out (those that failed it already), and its target with the pool's cap on how many
/// members one target quarantines (`maxQuarantinedPercent`).
pub struct Request<'a> {
    pub pool: &'a PoolKey,
    pub options: &'a Options,
    pub caller: &'a str,
    pub exclude: &'a [MemberKey],
    pub target: Option<&'a str>,
    pub max_quarantined_percent: u32,
    /// For traffic pinned to no session or lease: whether a member has budget for the request
    /// now (politeness, [`crate::politeness`]); the members without are left out before the
    /// two random choices, so the choice among those with budget is the usual one.
    pub budget: Option<&'a dyn Fn(&Entry) -> bool>,
}

/// The members of `all` that `target` keeps new traffic from at `now`, each with when its
/// quarantine ends: every record that holds, by the members' statuses and this replica's own
/// signals, within the cap of `percent` of the pool (the earliest begun first, as the core
/// orders them, so every replica reading the same records leaves out the same members).
pub fn quarantined(all: &[Entry], target: &str, percent: u32, now: i64) -> HashMap<MemberKey, i64> {
    let held: Vec<(i64, MemberKey, i64)> = all
        .iter()
        .filter_map(|e| {
            let h = e.slot.hold(&e.member, target, now)?;
            Some((h.since, e.member.key(), h.until))
        })
        .collect();
    if held.is_empty() {
        return HashMap::new();
    }
    within_cap(held, cap(all.len(), percent))
        .into_iter()
        .map(|(_, key, until)| (key, until))
        .collect()
}

/// The pools served that `named` may mean (every pool served when none is named): those to
/// authorise the caller for, before one is chosen among those it may use.
pub fn pools_named(
    named: Option<&PoolName>,
    served: &[PoolKey],
    snapshot: &Snapshot,
) -> Vec<PoolKey> {
    let known: Vec<&PoolKey> = if served.is_empty() {
        snapshot.pools.keys().collect()
    } else {
        served.iter().collect()
    };
    known
        .into_iter()
        .filter(|p| named.is_none_or(|n| n.matches(p)))
        .cloned()
        .collect()
}

/// The pool a request is on, among `allowed`, the pools named that its caller may use.
pub fn pool_among(named: Option<&PoolName>, allowed: &[PoolKey]) -> Result<PoolKey, NoRoute> {
    let list = || {
        allowed
            .iter()
            .map(PoolKey::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (named, allowed) {
        (_, [one]) => Ok(one.clone()),
        (Some(name), []) => Err(NoRoute::PoolNotYours(name.to_string())),
        (None, []) => Err(NoRoute::PoolNotYours(String::new())),
        (Some(name), _) => Err(NoRoute::Pool(format!(
            "pool {:?} is in several namespaces this credential may use ({}): name it NAMESPACE.POOL",
            name.to_string(),
            list()
        ))),
        (None, _) => Err(NoRoute::Pool(format!(
            "this credential may use several pools here ({}): name one (option pool, as POOL or NAMESPACE.POOL)",
            list()
        ))),
    }
}

/// Why a remembered member no longer takes its session.
fn departed(entry: Option<&Entry>, now: i64, lease: Option<&str>) -> Option<&'static str> {
    let Some(e) = entry else {
        return Some("is gone");
    };
    let m = &e.member;
    if !m.ready {
        return Some("failed its check");
    }
    match lease {
        Some(id) => {
            if m.lease(id, now).is_none() {
                Some("is no longer held by the lease")
            } else if m.retire_at.is_some_and(|at| now >= at) {
                Some("has retired")
            } else {
                None
            }
        }
        None if m.retire_at.is_some() => Some("is draining"),
        None if m.cordoned => Some("is cordoned"),
        None if m.exclusive_lease(now).is_some() => Some("is leased exclusively by another"),
        None => None,
    }
}

/// The member that serves `req` at `now` (Unix seconds; `clock` for the session memory).
pub fn choose(
    snapshot: &Snapshot,
    req: &Request<'_>,
    sessions: &Sessions,
    now: i64,
    clock: Instant,
    random: u64,
) -> Result<Entry, NoRoute> {
    let all: &[Entry] = snapshot
        .pools
        .get(req.pool)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let opts = req.options;
    let held = req
        .target
        .map(|t| quarantined(all, t, req.max_quarantined_percent, now))
        .unwrap_or_default();
    let free = |e: &Entry| !held.contains_key(&e.member.key());
    let quarantine_end = |k: &MemberKey| held.get(k).copied();
    let in_zone = |e: &Entry| {
        opts.zone
            .as_deref()
            .is_none_or(|z| e.member.zone.as_deref() == Some(z))
    };
    let not_excluded = |e: &Entry| !req.exclude.contains(&e.member.key());
    let candidates: Vec<&Entry> = match opts.lease.as_deref() {
        Some(id) => {
            // Another caller's lease is no lease of this caller's: it answers as one that
            // does not exist.
            let held: Vec<&Entry> = all
                .iter()
                .filter(|e| {
                    e.member
                        .lease(id, now)
                        .is_some_and(|b| b.holder == req.caller)
                })
                .collect();
            if held.is_empty() {
                return Err(NoRoute::LeaseGone(id.to_string()));
            }
            let serving: Vec<&Entry> = held
                .into_iter()
                .filter(|e| departed(Some(e), now, Some(id)).is_none())
                .filter(|e| in_zone(e) && not_excluded(e))
                .collect();
            // A lease whose proxies the target quarantines is refused by name: it cannot move
            // to proxies it does not hold.
            if let (Some(e), Some(t)) = (serving.first(), req.target)
                && serving.iter().all(|e| !free(e))
            {
                let until = serving
                    .iter()
                    .filter_map(|e| quarantine_end(&e.member.key()))
                    .min()
                    .unwrap_or(now);
                return Err(NoRoute::Quarantined {
                    pinned: format!("lease {id:?}"),
                    member: e.member.key().to_string(),
                    target: t.to_string(),
                    until: egress_time::format_rfc3339(until),
                });
            }
            serving.into_iter().filter(|e| free(e)).collect()
        }
        // A member ejected by passive health takes no new routing until its time is up.
        None => all
            .iter()
            .filter(|e| e.member.usable() && e.member.exclusive_lease(now).is_none())
            .filter(|e| !e.slot.ejected(clock))
            .filter(|e| in_zone(e) && not_excluded(e) && free(e))
            .collect(),
    };
    let none_free = || {
        let mut reason = format!("no member of pool {} is available", req.pool);
        if let Some(z) = &opts.zone {
            reason.push_str(&format!(" in zone {z}"));
        }
        if let Some(l) = &opts.lease {
            reason.push_str(&format!(" under lease {l}"));
        }
        if !req.exclude.is_empty() {
            reason.push_str(" besides those that failed this request");
        }
        if let (Some(t), false) = (req.target, held.is_empty()) {
            reason.push_str(&format!(" that {t} does not quarantine"));
        }
        NoRoute::NoMember {
            reason,
            retry_after: RETRY_AFTER,
        }
    };
    let Some(session) = opts.session.as_deref() else {
        let candidates: Vec<&Entry> = match (req.budget, &opts.lease) {
            (Some(budget), None) => candidates.into_iter().filter(|e| budget(e)).collect(),
            _ => candidates,
        };
        return two_choices(&candidates, random)
            .cloned()
            .ok_or_else(none_free);
    };
    let key = session_key(req, session);
    if let Some(remembered) = sessions.get(&key, clock) {
        let entry = snapshot.find(req.pool, &remembered);
        match departed(entry, now, opts.lease.as_deref()) {
            None => match (entry, req.target, quarantine_end(&remembered)) {
                (Some(_), Some(t), Some(until)) if !opts.move_session => {
                    return Err(NoRoute::Quarantined {
                        pinned: format!("session {session:?}"),
                        member: remembered.to_string(),
                        target: t.to_string(),
                        until: egress_time::format_rfc3339(until),
                    });
                }
                (Some(e), _, None) => return Ok(e.clone()),
                _ => {}
            },
            Some(why) if !opts.move_session => {
                return Err(NoRoute::SessionGone {
                    session: session.to_string(),
                    member: remembered.to_string(),
                    why,
                });
            }
            Some(_) => {}
        }
    }
    // Not remembered yet: [`bind`] remembers it once the member served it, so a first
    // request that met a dead member pins nothing.
    let h = stable_hash(&[req.caller, &req.pool.to_string(), session]);
    rendezvous(&candidates, h).cloned().ok_or_else(none_free)
}

fn session_key(req: &Request<'_>, session: &str) -> SessionKey {
    SessionKey {
        caller: req.caller.to_string(),
        pool: req.pool.clone(),
        lease: req.options.lease.clone(),
        session: session.to_string(),
    }
}

/// `entry` served `req` (its CONNECT answered 200, its request got an answer): the request's
/// session, if it has one, sticks to it from now on.
pub fn bind(sessions: &Sessions, req: &Request<'_>, entry: &Entry, clock: Instant) {
    if let Some(session) = req.options.session.as_deref() {
        sessions.put(session_key(req, session), entry.member.key(), clock);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::members::{Member, MemberTable};
    use egress_core::lease::{LeaseBinding, LeaseMode};

    fn pool() -> PoolKey {
        PoolKey {
            namespace: "ns".into(),
            name: "web".into(),
        }
    }

    fn member(i: u8) -> Member {
        Member {
            namespace: "ns".into(),
            name: format!("web-{i}"),
            pool: "web".into(),
            addr: format!("127.0.1.{i}:3128").parse().unwrap(),
            credential: None,
            egress_ip: Some(format!("198.51.100.{i}")),
            zone: Some(if i.is_multiple_of(2) { "a" } else { "b" }.into()),
            ready: true,
            cordoned: false,
            retire_at: None,
            leases: Vec::new(),
            quarantines: Vec::new(),
        }
    }

    fn binding(id: &str, holder: &str, mode: LeaseMode) -> LeaseBinding {
        LeaseBinding {
            id: id.into(),
            holder: holder.into(),
            mode,
            acquired_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2100-01-01T00:00:00Z".into(),
            count: 1,
            ip: None,
        }
    }

    fn table(members: Vec<Member>) -> MemberTable {
        let t = MemberTable::new(vec![pool()]);
        t.replace(members, true);
        t
    }

    fn pick(
        t: &MemberTable,
        s: &Sessions,
        o: &Options,
        caller: &str,
        random: u64,
    ) -> Result<String, NoRoute> {
        pick_as(t, s, o, caller, None, random)
    }

    /// A pick by `caller` for `target`; each is served, so its session binds to it.
    fn pick_as(
        t: &MemberTable,
        s: &Sessions,
        o: &Options,
        caller: &str,
        target: Option<&str>,
        random: u64,
    ) -> Result<String, NoRoute> {
        let p = pool();
        let req = Request {
            pool: &p,
            options: o,
            caller,
            exclude: &[],
            target,
            max_quarantined_percent: 50,
            budget: None,
        };
        let e = choose(&t.snapshot(), &req, s, 1_000, Instant::now(), random)?;
        bind(s, &req, &e, Instant::now());
        Ok(e.member.name.clone())
    }

    fn session(id: &str) -> Options {
        Options {
            session: Some(id.into()),
            ..Options::default()
        }
    }

    #[test]
    fn replicas_agree_on_a_session_and_a_departure_moves_only_its_own_sessions() {
        let members: Vec<Member> = (1..=8).map(member).collect();
        let a = table(members.clone());
        let b = table(members.clone().into_iter().rev().collect());
        let ids: Vec<String> = (0..400).map(|i| format!("s{i}")).collect();
        let first: Vec<String> = ids
            .iter()
            .map(|id| {
                pick(
                    &a,
                    &Sessions::new(Duration::from_secs(60), 1000),
                    &session(id),
                    "c",
                    1,
                )
                .unwrap()
            })
            .collect();
        // Another replica, with no memory and the members listed in another order, agrees.
        for (id, m) in ids.iter().zip(&first) {
            assert_eq!(
                &pick(
                    &b,
                    &Sessions::new(Duration::from_secs(60), 1000),
                    &session(id),
                    "c",
                    7
                )
                .unwrap(),
                m
            );
        }
        // Spread: every member has some sessions.
        for m in &members {
            assert!(first.contains(&m.name), "{} has no session of 400", m.name);
        }
        // web-3 leaves: on a replica that never saw these sessions, only web-3's move.
        let c = table(
            members
                .iter()
                .filter(|m| m.name != "web-3")
                .cloned()
                .collect(),
        );
        for (id, m) in ids.iter().zip(&first) {
            let now = pick(
                &c,
                &Sessions::new(Duration::from_secs(60), 1000),
                &session(id),
                "c",
                1,
            )
            .unwrap();
            if m != "web-3" {
                assert_eq!(&now, m, "session {id} moved off a member that stayed");
            } else {
                assert_ne!(now, "web-3");
            }
        }
    }

    #[test]
    fn a_remembered_session_fails_loudly_when_its_member_goes_unless_it_asked_to_move() {
        let t = table((1..=4).map(member).collect());
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let m = pick(&t, &s, &session("cart"), "c", 1).unwrap();
        assert_eq!(pick(&t, &s, &session("cart"), "c", 2).unwrap(), m);
        for (change, why) in [
            (
                Box::new(|x: &mut Member| x.ready = false) as Box<dyn Fn(&mut Member)>,
                "failed its check",
            ),
            (
                Box::new(|x: &mut Member| x.retire_at = Some(5_000)),
                "is draining",
            ),
            (Box::new(|x: &mut Member| x.cordoned = true), "is cordoned"),
        ] {
            let members: Vec<Member> = (1..=4)
                .map(member)
                .map(|mut x| {
                    if x.name == m {
                        change(&mut x);
                    }
                    x
                })
                .collect();
            t.replace(members, true);
            match pick(&t, &s, &session("cart"), "c", 3) {
                Err(NoRoute::SessionGone { member, why: w, .. }) => {
                    assert_eq!(member, format!("ns/{m}"));
                    assert_eq!(w, why);
                }
                other => panic!("{other:?}"),
            }
            t.replace((1..=4).map(member), true);
        }
        t.replace((1..=4).map(member).filter(|x| x.name != m), true);
        assert!(matches!(
            pick(&t, &s, &session("cart"), "c", 3),
            Err(NoRoute::SessionGone { why: "is gone", .. })
        ));
        let mut moving = session("cart");
        moving.move_session = true;
        let moved = pick(&t, &s, &moving, "c", 3).unwrap();
        assert_ne!(moved, m);
        // Moved, it sticks to the new member.
        assert_eq!(pick(&t, &s, &session("cart"), "c", 4).unwrap(), moved);
    }

    #[test]
    fn a_lease_pins_its_proxy_to_its_holder_and_an_exclusive_one_takes_no_other_traffic() {
        let mut members: Vec<Member> = (1..=3).map(member).collect();
        members[1].leases = vec![binding("ns_web_l-x", "spider", LeaseMode::Exclusive)];
        let t = table(members);
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let leased = Options {
            lease: Some("ns_web_l-x".into()),
            ..Options::default()
        };
        for r in 0..50 {
            assert_eq!(pick(&t, &s, &leased, "spider", r).unwrap(), "web-2");
            assert_ne!(
                pick(&t, &s, &Options::default(), "rival", r).unwrap(),
                "web-2"
            );
            assert_ne!(
                pick(&t, &s, &Options::default(), "spider", r).unwrap(),
                "web-2"
            );
        }
        assert_eq!(
            pick(&t, &s, &leased, "rival", 0),
            Err(NoRoute::LeaseGone("ns_web_l-x".into()))
        );
        let gone = Options {
            lease: Some("ns_web_l-y".into()),
            ..Options::default()
        };
        assert_eq!(
            pick(&t, &s, &gone, "spider", 0),
            Err(NoRoute::LeaseGone("ns_web_l-y".into()))
        );
        // The lease's proxy drains: it takes its holder's new tunnels until its retireAt.
        let mut members: Vec<Member> = (1..=3).map(member).collect();
        members[1].leases = vec![binding("ns_web_l-x", "spider", LeaseMode::Exclusive)];
        members[1].retire_at = Some(1_500);
        t.replace(members.clone(), true);
        assert_eq!(pick(&t, &s, &leased, "spider", 0).unwrap(), "web-2");
        members[1].retire_at = Some(900);
        t.replace(members, true);
        assert!(matches!(
            pick(&t, &s, &leased, "spider", 0),
            Err(NoRoute::NoMember { .. })
        ));
    }

    #[test]
    fn without_a_session_the_less_loaded_of_two_goes_and_zones_filter() {
        let t = table((1..=2).map(member).collect());
        let snap = t.snapshot();
        let entries = &snap.pools[&pool()];
        entries[0]
            .slot
            .active
            .store(5, std::sync::atomic::Ordering::Relaxed);
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let picks: Vec<String> = (0..200)
            .map(|r| pick(&t, &s, &Options::default(), "c", r).unwrap())
            .collect();
        // With two members, any pick of both goes to the idle one; a pick of the busy one
        // twice is the only way to it.
        let busy = picks.iter().filter(|p| *p == "web-1").count();
        assert!(busy < 100, "{busy} of 200 went to the busy member");
        let zoned = Options {
            zone: Some("a".into()),
            ..Options::default()
        };
        for r in 0..20 {
            assert_eq!(pick(&t, &s, &zoned, "c", r).unwrap(), "web-2");
        }
        let nowhere = Options {
            zone: Some("z".into()),
            ..Options::default()
        };
        match pick(&t, &s, &nowhere, "c", 0) {
            Err(NoRoute::NoMember {
                reason,
                retry_after,
            }) => {
                assert!(reason.contains("zone z"), "{reason}");
                assert_eq!(retry_after, RETRY_AFTER);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sessions_are_bounded_and_forget_the_idle() {
        let s = Sessions::new(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        let m = member(1).key();
        for i in 0..5 {
            s.put(
                SessionKey {
                    caller: "c".into(),
                    pool: pool(),
                    lease: None,
                    session: format!("s{i}"),
                },
                m.clone(),
                t0 + Duration::from_secs(i),
            );
        }
        assert_eq!(s.len(), 3);
        let k = |i: u32| SessionKey {
            caller: "c".into(),
            pool: pool(),
            lease: None,
            session: format!("s{i}"),
        };
        assert!(
            s.get(&k(0), t0 + Duration::from_secs(5)).is_none(),
            "the oldest went"
        );
        assert!(s.get(&k(4), t0 + Duration::from_secs(5)).is_some());
        assert!(
            s.get(&k(4), t0 + Duration::from_secs(30)).is_none(),
            "idle past 10 s"
        );
    }

    fn key(caller: &str, session: String) -> SessionKey {
        SessionKey {
            caller: caller.into(),
            pool: pool(),
            lease: None,
            session,
        }
    }

    /// One caller's flood of new sessions evicts its own least recently used, never another
    /// caller's: the victim's session keeps its member.
    #[test]
    fn a_flood_of_sessions_from_one_caller_evicts_only_its_own() {
        let s = Sessions::new(Duration::from_secs(600), 100);
        let t0 = Instant::now();
        let at = |i: u64| t0 + Duration::from_millis(i);
        s.put(key("victim", "cart".into()), member(1).key(), at(0));
        for i in 0..1_000u64 {
            s.put(key("flood", format!("f{i}")), member(2).key(), at(1 + i));
        }
        assert_eq!(
            s.get(&key("victim", "cart".into()), at(2_000)),
            Some(member(1).key()),
            "the victim's session was evicted by another caller's"
        );
        // The flood kept its newest sessions, up to the bound.
        assert!(s.get(&key("flood", "f999".into()), at(2_001)).is_some());
        assert!(s.get(&key("flood", "f0".into()), at(2_002)).is_none());
        assert_eq!(s.len(), 101);
        // Within one caller the least recently used goes: a session used again stays.
        let s = Sessions::new(Duration::from_secs(600), 3);
        for i in 0..3u64 {
            s.put(key("c", format!("s{i}")), member(1).key(), at(i));
        }
        assert!(s.get(&key("c", "s0".into()), at(10)).is_some());
        s.put(key("c", "s3".into()), member(1).key(), at(11));
        assert!(s.get(&key("c", "s0".into()), at(12)).is_some());
        assert!(
            s.get(&key("c", "s1".into()), at(13)).is_none(),
            "s1 was least recently used"
        );
    }

    /// Insertions past the bound cost no scan of the table: 20,000 of them into a full table
    /// of 100,000 take well under a second (a scan each took ~10 ms).
    #[test]
    fn insertions_past_the_bound_are_constant_time() {
        let s = Sessions::new(Duration::from_secs(600), 100_000);
        let t0 = Instant::now();
        for i in 0..100_000u64 {
            s.put(key("c", format!("s{i}")), member(1).key(), t0);
        }
        let started = Instant::now();
        for i in 0..20_000u64 {
            s.put(key("c", format!("n{i}")), member(1).key(), t0);
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(2),
                "{i} insertions past the bound took {took:?}"
            );
        }
        assert_eq!(s.len(), 100_000);
    }

    fn pick_for(
        t: &MemberTable,
        s: &Sessions,
        o: &Options,
        target: &str,
        random: u64,
    ) -> Result<String, NoRoute> {
        pick_as(t, s, o, "c", Some(target), random)
    }

    fn held(target: &str, since: i64, until: i64) -> egress_core::target::Hold {
        egress_core::target::Hold {
            target: target.into(),
            since,
            until,
        }
    }

    #[test]
    fn unpinned_traffic_for_a_target_avoids_its_quarantined_members_and_no_other_target_does() {
        let mut members: Vec<Member> = (1..=4).map(member).collect();
        members[0].quarantines = vec![held("example.com", 900, 2_000)];
        // Ended: no longer quarantines.
        members[1].quarantines = vec![held("example.com", 100, 999)];
        let t = table(members);
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let none = Options::default();
        let mut for_banning = std::collections::BTreeSet::new();
        let mut for_other = std::collections::BTreeSet::new();
        for r in 0..200u64 {
            let r = r.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for_banning.insert(pick_for(&t, &s, &none, "example.com", r).unwrap());
            for_other.insert(pick_for(&t, &s, &none, "example.org", r).unwrap());
        }
        assert!(!for_banning.contains("web-1"), "{for_banning:?}");
        assert_eq!(for_banning.len(), 3, "{for_banning:?}");
        assert_eq!(for_other.len(), 4, "{for_other:?}");
    }

    #[test]
    fn one_target_quarantines_at_most_its_cap_the_earliest_first() {
        let mut members: Vec<Member> = (1..=4).map(member).collect();
        // Three of four signalled; a cap of 50% leaves two out: those begun first.
        members[0].quarantines = vec![held("example.com", 950, 2_000)];
        members[1].quarantines = vec![held("example.com", 900, 2_000)];
        members[2].quarantines = vec![held("example.com", 910, 2_000)];
        let t = table(members);
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let all = t.snapshot();
        let q = quarantined(&all.pools[&pool()], "example.com", 50, 1_000);
        let mut names: Vec<String> = q.keys().map(|k| k.name.clone()).collect();
        names.sort();
        assert_eq!(names, ["web-2", "web-3"]);
        let mut used = std::collections::BTreeSet::new();
        for r in 0..200u64 {
            let r = r.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            used.insert(pick_for(&t, &s, &Options::default(), "example.com", r).unwrap());
        }
        assert_eq!(
            used.into_iter().collect::<Vec<_>>(),
            ["web-1", "web-4"],
            "the capped-out member keeps serving the target"
        );
    }

    #[test]
    fn a_session_on_a_quarantined_member_is_refused_for_that_target_until_it_asks_to_move() {
        let t = table((1..=4).map(member).collect());
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let m = pick_for(&t, &s, &session("cart"), "example.com", 1).unwrap();
        // This replica's own signal quarantines it (as a report or a relayed 429 does).
        let snapshot = t.snapshot();
        let entry = snapshot.pools[&pool()]
            .iter()
            .find(|e| e.member.name == m)
            .unwrap();
        entry
            .slot
            .set_local_quarantines(vec![egress_core::target::Quarantine {
                target: "example.com".into(),
                since: egress_time::format_rfc3339(990),
                until: egress_time::format_rfc3339(1_300),
                strikes: 1,
                reporters: Vec::new(),
            }]);
        match pick_for(&t, &s, &session("cart"), "example.com", 2) {
            Err(NoRoute::Quarantined {
                pinned,
                member,
                target,
                until,
            }) => {
                assert_eq!(pinned, "session \"cart\"");
                assert_eq!(member, format!("ns/{m}"));
                assert_eq!(target, "example.com");
                assert_eq!(until, egress_time::format_rfc3339(1_300));
            }
            other => panic!("{other:?}"),
        }
        // Another target keeps the session where it is.
        assert_eq!(
            pick_for(&t, &s, &session("cart"), "example.org", 3).unwrap(),
            m
        );
        // Asked to move, it moves, and sticks to its new member.
        let mut moving = session("cart");
        moving.move_session = true;
        let moved = pick_for(&t, &s, &moving, "example.com", 4).unwrap();
        assert_ne!(moved, m);
        assert_eq!(
            pick_for(&t, &s, &session("cart"), "example.com", 5).unwrap(),
            moved
        );
    }

    #[test]
    fn a_budget_narrows_unpinned_traffic_only() {
        let t = table((1..=4).map(member).collect());
        let s = Sessions::new(Duration::from_secs(60), 1000);
        let p = pool();
        let only_web_3 = |e: &Entry| e.member.name == "web-3";
        let none = |_: &Entry| false;
        let pick_with = |o: &Options, budget: &dyn Fn(&Entry) -> bool, random: u64| {
            let req = Request {
                pool: &p,
                options: o,
                caller: "c",
                exclude: &[],
                target: Some("example.com"),
                max_quarantined_percent: 50,
                budget: Some(budget),
            };
            choose(&t.snapshot(), &req, &s, 1_000, Instant::now(), random)
                .map(|e| e.member.name.clone())
        };
        for r in 0..50u64 {
            let r = r.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            assert_eq!(
                pick_with(&Options::default(), &only_web_3, r).unwrap(),
                "web-3"
            );
        }
        assert!(matches!(
            pick_with(&Options::default(), &none, 1),
            Err(NoRoute::NoMember { .. })
        ));
        // A session's member is its own: the budget is checked on it by the caller.
        let m = pick(&t, &s, &session("cart"), "c", 1).unwrap();
        assert_eq!(pick_with(&session("cart"), &none, 2).unwrap(), m);
    }
}
