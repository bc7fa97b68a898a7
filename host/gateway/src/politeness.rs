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

use crate::budgets::{Ask, MAX_WAITERS, Permit, Waiting, now_ms};
use crate::members::{Entry, MemberKey, PoolKey};
use crate::metrics;
use crate::server::{Admitted, Gateway};
use crate::status::{ErrorKind, Failure};
use egress_core::politeness::{Admit, any_of};
use http::StatusCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Times a pick may lose its budget to a concurrent one before it is answered as out of
/// budget.
const RACES: usize = 8;

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
        self.metrics
            .target_politeness_refusals
            .get_or_create(&self.metrics.target_labels(&a.pool, ask.target))
            .inc();
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
