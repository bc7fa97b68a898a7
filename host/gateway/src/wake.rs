//! Holding a request while its autoscaled pool wakes from zero, and counting what it carries
//! in the pool's demand ([`crate::demand`]).

use crate::answers::exhausted;
use crate::budgets::Permit;
use crate::demand::Counted;
use crate::forward::HopError;
use crate::members::{Entry, MemberKey, PoolKey, Snapshot};
use crate::server::{Admitted, Gateway};
use crate::status::{ErrorKind, Failure};
use crate::tries::Tries;
use std::sync::Arc;
use std::time::Instant;

/// What a caller held past coldStartWait is told to wait before asking again.
const RETRY_AFTER: u64 = 5;

/// Whether pool `pool` has a member to route new traffic to, other than `tried`: usable and
/// not out of routing for its failures (passive health), as routing chooses.
fn awake(snapshot: &Snapshot, pool: &PoolKey, tried: &[MemberKey]) -> bool {
    let now = std::time::Instant::now();
    snapshot.pools.get(pool).is_some_and(|v| {
        v.iter()
            .any(|e| e.member.usable() && !e.slot.ejected(now) && !tried.contains(&e.member.key()))
    })
}

impl Gateway {
    /// Holds `a` while its pool, autoscaled, has no member to route to (asleep at zero, or
    /// all of it starting): up to the pool's `coldStartWait`, its wait counted in the demand
    /// said to the API, so the pool wakes for it. Then it goes on, or is answered 503 with
    /// Retry-After. A request on a lease is not held: its lease names its member.
    ///
    /// What it returns, where it held, counts the request as in flight until the caller's own
    /// count of it is taken (its [`crate::account::Account`]): dropped before, the demand
    /// said between the two would be none, and the pool would start its idle time while the
    /// request it woke for is being served.
    ///
    /// A holder past a quota (`tunnel`: a tunnel's, counting `concurrentTunnels`) is refused
    /// before it is held, so it neither waits nor wakes the pool.
    pub(crate) async fn woken(
        &self,
        a: &Admitted,
        tunnel: bool,
    ) -> Result<Option<Counted>, Failure> {
        let Some(wait) = self.table.cold_start_wait(&a.pool) else {
            return Ok(None);
        };
        if a.options.lease.is_some() {
            return Ok(None);
        }
        if !awake(&self.table.snapshot(), &a.pool, &[]) {
            self.caller_within_quota(&a.pool.namespace, &a.caller, tunnel)?;
        }
        self.hold(a, wait, &[]).await
    }

    /// Where every member tried for `a` (`tried`) went down before a byte was relayed
    /// (`down`: refused, broke off or did not take the connection) and no other is left: holds
    /// `a` again as [`Self::woken`] does, for a member not among them, when its pool is
    /// autoscaled and `a` pinned to no session or lease. True when one came (try again);
    /// false where it is not held (the last failure stands). A pool that went to sleep (or lost
    /// its only member) just as a request chose its member serves it from the next one.
    pub(crate) async fn held_again(
        &self,
        a: &Admitted,
        tried: &[MemberKey],
        down: bool,
    ) -> Result<bool, Failure> {
        if !down || tried.is_empty() || a.options.lease.is_some() || a.options.session.is_some() {
            return Ok(false);
        }
        let Some(wait) = self.table.cold_start_wait(&a.pool) else {
            return Ok(false);
        };
        // Its own count in the demand is kept by its account meanwhile.
        self.hold(a, wait, tried).await.map(|_| true)
    }

    /// The next member `a` tries for `host` (`target`, its politeness), or why none: past
    /// `tries`' attempts, or with no member left, the last failure; where every member it had
    /// went down under it, it is first held again while its pool wakes ([`Self::held_again`]).
    pub(crate) async fn next_try(
        &self,
        a: &Admitted,
        (host, target): (&str, Option<&str>),
        tries: &mut Tries,
    ) -> Result<(Entry, Option<Permit>), Failure> {
        loop {
            let down = tries.last.as_ref().is_some_and(|h| h.down);
            let chosen = if tries.made < tries.attempts {
                tries.made += 1;
                self.polite_member(a, host, target, &tries.tried, &mut tries.last)
                    .await
            } else {
                Err(exhausted(tries.last.take()))
            };
            match chosen {
                Ok(chosen) => return Ok(chosen),
                Err(f) => {
                    if !tries.reheld && self.held_again(a, &tries.tried, down).await? {
                        tries.reheld = true;
                        tries.made = 0;
                        continue;
                    }
                    return Err(f);
                }
            }
        }
    }

    /// `entry` failed `a`'s try with `h` before a byte was relayed: counted, and left out of
    /// the tries that follow.
    pub(crate) fn try_failed(&self, a: &Admitted, entry: &Entry, h: HopError, tries: &mut Tries) {
        self.hop_failed(a, entry, &h);
        self.metrics.error(
            a.listener,
            Some(&a.pool),
            h.failure.member.as_deref(),
            h.failure.kind,
        );
        tries.tried.push(entry.member.key());
        tries.last = Some(h);
    }

    /// Holds `a` until its pool has a usable member other than `tried`, up to `wait`.
    async fn hold(
        &self,
        a: &Admitted,
        wait: std::time::Duration,
        tried: &[MemberKey],
    ) -> Result<Option<Counted>, Failure> {
        let mut changes = self.table.changes();
        if awake(&self.table.snapshot(), &a.pool, tried) {
            return Ok(None);
        }
        let started = Instant::now();
        let _held = self
            .demand
            .as_ref()
            .and_then(|d| d.count(&a.pool, &a.caller, &a.token, true));
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = changes.changed() => {
                    if r.is_err() {
                        break;
                    }
                    if awake(&self.table.snapshot(), &a.pool, tried) {
                        self.metrics.cold_start(&a.pool, "served", started.elapsed());
                        return Ok(self.demand.as_ref().and_then(|d| d.count(&a.pool, &a.caller, &a.token, false)));
                    }
                }
                () = &mut deadline => break,
            }
        }
        self.metrics
            .cold_start(&a.pool, "timeout", started.elapsed());
        let mut f = Failure::new(
            ErrorKind::NoMember,
            http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "pool {} is waking: no member of it verified within its coldStartWait of {}s",
                a.pool,
                wait.as_secs()
            ),
        );
        f.retry_after = Some(RETRY_AFTER);
        Err(f)
    }

    /// Counts `a`'s tunnel or request in its pool's demand while the returned value lives
    /// (autoscaled pools only, where demand is said at all).
    pub(crate) fn in_flight(&self, a: &Admitted) -> Option<Arc<Counted>> {
        self.table.cold_start_wait(&a.pool)?;
        self.demand
            .as_ref()
            .and_then(|d| d.count(&a.pool, &a.caller, &a.token, false))
            .map(Arc::new)
    }
}
