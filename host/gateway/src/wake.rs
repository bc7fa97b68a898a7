//! Holding a request while its autoscaled pool wakes from zero, and counting what it carries
//! in the pool's demand ([`crate::demand`]).

use crate::demand::Counted;
use crate::members::{PoolKey, Snapshot};
use crate::server::{Admitted, Gateway};
use crate::status::{ErrorKind, Failure};
use std::sync::Arc;
use std::time::Instant;

/// What a caller held past coldStartWait is told to wait before asking again.
const RETRY_AFTER: u64 = 5;

/// Whether pool `pool` has a member to route new traffic to.
fn awake(snapshot: &Snapshot, pool: &PoolKey) -> bool {
    snapshot
        .pools
        .get(pool)
        .is_some_and(|v| v.iter().any(|e| e.member.usable()))
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
    pub(crate) async fn woken(&self, a: &Admitted) -> Result<Option<Counted>, Failure> {
        let Some(wait) = self.table.cold_start_wait(&a.pool) else {
            return Ok(None);
        };
        if a.options.lease.is_some() {
            return Ok(None);
        }
        let mut changes = self.table.changes();
        if awake(&self.table.snapshot(), &a.pool) {
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
                    if awake(&self.table.snapshot(), &a.pool) {
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
