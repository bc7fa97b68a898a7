//! The gateway's side of politeness per (egress address, target) (`egress_core::politeness`):
//! the budgets' state on this replica, the starts it admits and the in-flight counts it
//! releases, and the choice of a member with budget for a request whose host a pool's rule
//! matches.
//!
//! - Traffic pinned to no session or lease goes to a member with budget now, chosen among
//!   those as routing always chooses (the less loaded of two at random).
//! - A session or lease uses its own member's budget.
//! - Without budget now, a request waits for it up to the pool's `maxWait` (at most
//!   [`MAX_WAITERS`] wait at once), or is answered 429 with `Retry-After` and a `Proxy-Status`
//!   naming the target and the rule. Either is decided before any member is dialled.
//!
//! A start's in-flight count is held by a [`Permit`], released when the tunnel or the
//! request's answer ends.

use crate::hash::stable_hash;
use crate::members::{Entry, MemberKey, PoolKey};
use crate::metrics;
use crate::server::{Admitted, Gateway};
use crate::status::{ErrorKind, Failure};
use egress_core::politeness::{
    Admit, Limit, Politeness, Rule, Share, State, admit, all_of, any_of, finish, idle, start,
};
use http::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys (member or pool, and target) this replica keeps at most: past it, the idle ones are
/// forgotten, and a start that finds no room is refused.
pub const MAX_KEYS: usize = 100_000;
/// Requests waiting for budget at once: past it, one more is refused at once.
pub const MAX_WAITERS: usize = 4_096;
/// Times a pick may lose its budget to a concurrent one before it is answered as out of
/// budget.
const RACES: usize = 8;

/// A budget's key: the member (None: the pool's budget over all members) and the target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    pool: PoolKey,
    member: Option<(String, String)>,
    target: String,
}

impl Key {
    /// The same on every replica: the windows and the concurrency shares hang on it.
    fn stable(&self) -> u64 {
        let (ns, name) = self
            .member
            .as_ref()
            .map_or(("", ""), |(a, b)| (a.as_str(), b.as_str()));
        stable_hash(&[
            &self.pool.namespace,
            &self.pool.name,
            ns,
            name,
            &self.target,
        ])
    }
}

struct Kept {
    state: State,
    every: Duration,
    hash: u64,
}

/// The budgets' state on this replica.
pub struct Budgets {
    share: Share,
    keys: Mutex<HashMap<Key, Kept>>,
    /// Woken when an in-flight start ends: a request waiting on a full key tries again.
    released: tokio::sync::Notify,
    waiting: AtomicUsize,
}

/// A request's budgets: its pool, its target, the rule that matched its host.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    pub pool: &'a PoolKey,
    pub target: &'a str,
    pub rule: &'a Rule,
}

impl Ask<'_> {
    fn parts(&self, member: &MemberKey) -> impl Iterator<Item = (Key, Limit)> + '_ {
        let own = Key {
            pool: self.pool.clone(),
            member: Some((member.namespace.clone(), member.name.clone())),
            target: self.target.to_string(),
        };
        let pool = self.rule.per_pool.map(|l| {
            (
                Key {
                    pool: self.pool.clone(),
                    member: None,
                    target: self.target.to_string(),
                },
                l,
            )
        });
        std::iter::once((own, self.rule.per_address)).chain(pool)
    }
}

/// Unix milliseconds now: the windows are on the wall clock, which replicas share.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64)
}

impl Budgets {
    pub fn new(share: Share) -> Self {
        Self {
            share,
            keys: Mutex::new(HashMap::new()),
            released: tokio::sync::Notify::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    pub fn share(&self) -> Share {
        self.share
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Kept>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a start of `ask` on `member` may go at `now`.
    pub fn check(&self, ask: &Ask<'_>, member: &MemberKey, now: u64) -> Admit {
        let keys = self.lock();
        all_of(ask.parts(member).map(|(k, l)| {
            let (state, hash) = keys
                .get(&k)
                .map_or_else(|| (State::default(), k.stable()), |e| (e.state, e.hash));
            admit(&state, &l, &self.share, hash, now)
        }))
    }

    /// A start of `ask` on `member` at `now`, if its budgets allow it: its permit, or what
    /// holds it.
    pub fn try_start(
        self: &Arc<Self>,
        ask: &Ask<'_>,
        member: &MemberKey,
        now: u64,
    ) -> Result<Permit, Admit> {
        let mut keys = self.lock();
        let parts: Vec<(Key, Limit, u64)> = ask
            .parts(member)
            .map(|(k, l)| {
                let h = keys.get(&k).map_or_else(|| k.stable(), |e| e.hash);
                (k, l, h)
            })
            .collect();
        let verdict = all_of(parts.iter().map(|(k, l, h)| {
            let state = keys.get(k).map_or_else(State::default, |e| e.state);
            admit(&state, l, &self.share, *h, now)
        }));
        if verdict != Admit::Now {
            return Err(verdict);
        }
        if keys.len() + parts.len() > MAX_KEYS {
            keys.retain(|_, e| !idle(&e.state, e.every, now));
            if keys.len() + parts.len() > MAX_KEYS {
                return Err(Admit::Full);
            }
        }
        let mut held = Vec::with_capacity(parts.len());
        for (k, l, hash) in parts {
            let e = keys.entry(k.clone()).or_insert(Kept {
                state: State::default(),
                every: l.every,
                hash,
            });
            e.every = l.every;
            e.state = start(&e.state, now);
            held.push(k);
        }
        Ok(Permit {
            budgets: self.clone(),
            keys: held,
        })
    }

    /// Keys kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A start's place in its keys' in-flight counts, until it drops.
pub struct Permit {
    budgets: Arc<Budgets>,
    keys: Vec<Key>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut keys = self.budgets.lock();
            for k in &self.keys {
                if let Some(e) = keys.get_mut(k) {
                    e.state = finish(&e.state);
                }
            }
        }
        self.budgets.released.notify_waiters();
    }
}

/// Counts a request waiting for budget while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a request is out of budget, and when to come back.
struct OutOfBudget {
    admit: Admit,
    member: Option<String>,
}

impl Gateway {
    /// The member to try next for `a` to `host` (whose target is `target`), with its permit
    /// where a rule of the pool's politeness matches the host; or the answer when there is
    /// none. Without a rule, routing as ever.
    pub(crate) async fn polite_member(
        &self,
        a: &Admitted,
        host: &str,
        target: Option<&str>,
        exclude: &[MemberKey],
        last: &mut Option<crate::forward::HopError>,
    ) -> Result<(Entry, Option<Permit>), Failure> {
        let policy = self.table.politeness(&a.pool);
        let found = policy
            .as_deref()
            .and_then(|p| Some((p.rule_for(host)?, target?)));
        let (Some(policy), Some((rule, target))) = (policy.as_deref(), found) else {
            return self
                .next_member(a, target, exclude, last)
                .map(|e| (e, None));
        };
        let ask = Ask {
            pool: &a.pool,
            target,
            rule,
        };
        let pinned = a.options.session.is_some() || a.options.lease.is_some();
        let deadline = Instant::now() + policy.max_wait;
        let mut waited = false;
        let mut races = 0;
        loop {
            // Taken before the budgets are read: a release between the reading and the wait
            // still wakes it.
            let released = self.budgets.released.notified();
            let now = now_ms();
            let out = if pinned {
                let e = self.next_member(a, Some(target), exclude, last)?;
                match self.budgets.try_start(&ask, &e.member.key(), now) {
                    Ok(p) => return Ok(self.started(a, e, p, waited)),
                    Err(admit) => OutOfBudget {
                        admit,
                        member: Some(e.member.id()),
                    },
                }
            } else {
                let held = std::cell::Cell::new(None::<Admit>);
                let budget = |e: &Entry| match self.budgets.check(&ask, &e.member.key(), now) {
                    Admit::Now => true,
                    other => {
                        held.set(Some(held.get().map_or(other, |h| any_of([h, other]))));
                        false
                    }
                };
                match self.choose_with(a, Some(target), exclude, Some(&budget)) {
                    Ok(e) => match self.budgets.try_start(&ask, &e.member.key(), now) {
                        Ok(p) => return Ok(self.started(a, e, p, waited)),
                        // Another request took its budget between the pick and the start.
                        Err(_) if races < RACES => {
                            races += 1;
                            continue;
                        }
                        Err(admit) => OutOfBudget {
                            admit,
                            member: None,
                        },
                    },
                    Err(r) => match held.get() {
                        Some(admit) => OutOfBudget {
                            admit,
                            member: None,
                        },
                        None => {
                            return Err(match last.take() {
                                Some(h) => h.failure,
                                None => crate::answers::no_route(&r),
                            });
                        }
                    },
                }
            };
            // Out of budget: wait for it within maxWait, or refuse.
            let wake = match out.admit {
                Admit::At(t) => Some(Instant::now() + Duration::from_millis(t.saturating_sub(now))),
                Admit::Full => Some(deadline),
                Admit::Never | Admit::Now => None,
            };
            match wake {
                Some(wake) if wake <= deadline && Instant::now() < deadline => {
                    if self.budgets.waiting.fetch_add(1, Ordering::Relaxed) >= MAX_WAITERS {
                        self.budgets.waiting.fetch_sub(1, Ordering::Relaxed);
                        return Err(self.refused(a, &ask, &out, now));
                    }
                    let _waiting = Waiting(&self.budgets.waiting);
                    waited = true;
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake.into()) => {}
                        _ = released => {}
                    }
                }
                _ => return Err(self.refused(a, &ask, &out, now)),
            }
        }
    }

    fn started(&self, a: &Admitted, e: Entry, p: Permit, waited: bool) -> (Entry, Option<Permit>) {
        self.count(&a.pool, if waited { "waited" } else { "started" });
        (e, Some(p))
    }

    fn count(&self, pool: &PoolKey, result: &str) {
        self.metrics
            .politeness
            .get_or_create(&metrics::with(metrics::pool_labels(pool), "result", result))
            .inc();
    }

    /// The 429 of a request out of budget: `Retry-After` in whole seconds, rounded up, and a
    /// `Proxy-Status` naming the target and the rule.
    fn refused(&self, a: &Admitted, ask: &Ask<'_>, out: &OutOfBudget, now: u64) -> Failure {
        self.count(&a.pool, "refused");
        let every = ask.rule.per_address.every.as_millis() as u64;
        let (wait_ms, why) = match out.admit {
            Admit::At(t) => (t.saturating_sub(now), "no start allowed yet"),
            Admit::Full => (every, "as many in flight as allowed"),
            Admit::Never => (every, "its in-flight share is another gateway replica's"),
            Admit::Now => (0, "no budget"),
        };
        let retry_after = wait_ms.div_ceil(1_000).max(1);
        let on = match &out.member {
            Some(m) => format!("member {m}"),
            None => format!("any member of pool {} this request may use", a.pool),
        };
        let mut f = Failure::new(
            ErrorKind::Polite,
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "politeness: target {} has no budget on {on} ({why}) under rule {}; retry after {retry_after}s",
                ask.target,
                ask.rule.describe()
            ),
        );
        f.member = out.member.clone();
        f.retry_after = Some(retry_after);
        f
    }
}

/// The pools' politeness, parsed; a policy that cannot be read acts on nothing (validation
/// refuses such a pool before anything acts on it) and says so.
pub fn parse_policies(
    policies: std::collections::BTreeMap<PoolKey, egress_core::politeness::PolitenessPolicy>,
) -> std::collections::BTreeMap<PoolKey, Arc<Politeness>> {
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

    fn rule(every_ms: u64, concurrency: Option<u32>, per_pool: Option<Limit>) -> Rule {
        Rule {
            written: "example.com".into(),
            pattern: egress_core::politeness::Pattern::Exact("example.com".into()),
            per_address: Limit {
                every: Duration::from_millis(every_ms),
                concurrency,
            },
            per_pool,
        }
    }

    fn key(name: &str) -> MemberKey {
        MemberKey {
            namespace: "ns".into(),
            name: name.into(),
            addr: "127.0.1.1:3128".parse().unwrap(),
        }
    }

    #[test]
    fn a_permit_holds_its_keys_in_flight_until_it_drops() {
        let b = Arc::new(Budgets::new(Share::alone()));
        let pool = PoolKey::parse("ns/web").unwrap();
        let r = rule(
            0,
            Some(1),
            Some(Limit {
                every: Duration::ZERO,
                concurrency: Some(2),
            }),
        );
        let ask = Ask {
            pool: &pool,
            target: "example.com",
            rule: &r,
        };
        let one = b.try_start(&ask, &key("web-1"), 1_000).unwrap();
        assert_eq!(b.check(&ask, &key("web-1"), 1_000), Admit::Full);
        assert!(matches!(
            b.try_start(&ask, &key("web-1"), 1_000),
            Err(Admit::Full)
        ));
        let two = b.try_start(&ask, &key("web-2"), 1_000).unwrap();
        // The pool's cap of two is taken: a third member has its own budget, not the pool's.
        assert_eq!(b.check(&ask, &key("web-3"), 1_000), Admit::Full);
        drop(one);
        assert_eq!(b.check(&ask, &key("web-1"), 1_000), Admit::Now);
        assert_eq!(b.check(&ask, &key("web-3"), 1_000), Admit::Now);
        drop(two);
        assert_eq!(b.len(), 3, "web-1, web-2 and the pool's key");
    }

    #[test]
    fn a_gap_holds_per_member_and_target_and_names_its_end() {
        let b = Arc::new(Budgets::new(Share::alone()));
        let pool = PoolKey::parse("ns/web").unwrap();
        let r = rule(5_000, None, None);
        let ask = Ask {
            pool: &pool,
            target: "example.com",
            rule: &r,
        };
        drop(b.try_start(&ask, &key("web-1"), 10_000).unwrap());
        assert_eq!(b.check(&ask, &key("web-1"), 12_000), Admit::At(15_000));
        assert_eq!(b.check(&ask, &key("web-2"), 12_000), Admit::Now);
        let other = Ask {
            target: "example.org",
            ..ask
        };
        assert_eq!(b.check(&other, &key("web-1"), 12_000), Admit::Now);
        assert_eq!(b.check(&ask, &key("web-1"), 15_000), Admit::Now);
    }
}
