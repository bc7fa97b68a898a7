//! Politeness budgets on this replica (`egress_core::politeness`): per (member, target) and
//! (pool, target), the starts they admit and the in-flight counts a [`Permit`] holds until the
//! tunnel or the request's answer ends. Bounded: at most [`MAX_KEYS`] keys and
//! [`MAX_WAITERS`] waiting. The choice of a member with budget, and the answers, are
//! [`crate::politeness`]'s.

use crate::hash::stable_hash;
use crate::members::{MemberKey, PoolKey};
use egress_core::politeness::{
    Admit, Limit, Rule, Share, State, admit, all_of, finish, idle, start,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Keys (member or pool, and target) this replica keeps at most: past it, the idle ones are
/// forgotten, and a start that finds no room is refused.
pub const MAX_KEYS: usize = 100_000;
/// Requests waiting for budget at once: past it, one more is refused at once.
pub const MAX_WAITERS: usize = 4_096;

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
    pub(crate) released: tokio::sync::Notify,
    pub(crate) waiting: AtomicUsize,
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
pub(crate) struct Waiting<'a>(pub(crate) &'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
