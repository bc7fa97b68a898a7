//! What this replica's callers ask of its autoscaled pools, said to the lease API
//! (`POST /v1/demand`, the URL of `--reports-to`) so the pool's decision can size it: per pool
//! and caller, the tunnels and plain requests in flight and those held while the pool wakes
//! ([`crate::wake`]).
//!
//! Each count goes with its caller's own token, as the quarantine reports do ([`crate::reports`]):
//! the API authorises it as a lease of the pool, so a caller can wake only a pool it may use.
//! A count that starts or stops being zero is said at once (a held tunnel is a cold start
//! waiting; none in flight starts a pool's idle time); any other change at most every
//! [`MIN_GAP`], so tunnels opening and closing by the thousand make a post a second, not one
//! each; a count above zero is said again every [`REFRESH`] so the API keeps it; a count said
//! zero is dropped here.
//!
//! Bounded: at most [`MAX_KEYS`] (pool, caller) counts (past it a new caller's traffic is
//! served, its demand not said, and counted); one post at a time per count, each within the
//! client's timeout.

use crate::members::PoolKey;
use crate::metrics::Metrics;
use egress_serve::auth::Token;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a count above zero is said again (the API forgets one after 20 s).
pub const REFRESH: Duration = Duration::from_secs(5);
/// The least time between two posts of one count that only changed in size.
pub const MIN_GAP: Duration = Duration::from_secs(1);
/// The most (pool, caller) counts kept.
pub const MAX_KEYS: usize = 4096;
/// Posts in flight at once.
const IN_FLIGHT: usize = 8;

type Key = (PoolKey, String);

#[derive(Debug)]
struct Count {
    tunnels: u32,
    waiting: u32,
    token: Token,
    /// What was last said, and when.
    said: Option<((u32, u32), Instant)>,
    /// A post of it is on its way.
    posting: bool,
}

/// The counts, and the wake-up of the task that says them.
pub struct Demand {
    counts: Mutex<HashMap<Key, Count>>,
    wake: tokio::sync::Notify,
    /// This replica's name, so replicas do not overwrite one another's counts.
    from: String,
    metrics: Arc<Metrics>,
}

/// One tunnel or request counted, or one held: uncounted when dropped.
#[derive(Debug)]
pub struct Counted {
    demand: Arc<Demand>,
    key: Key,
    waiting: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.demand.add(&self.key, self.waiting, false, None);
    }
}

impl std::fmt::Debug for Demand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demand").field("from", &self.from).finish()
    }
}

/// Whether a count is zero: what is said at once when it changes.
fn zeros(n: u32) -> bool {
    n == 0
}

impl Demand {
    /// Counts said to the API at `base` (`--reports-to`, https or http to loopback; `ca` the
    /// roots when given) as replica `from`. The returned task says them; the caller runs it.
    pub fn start(
        base: &str,
        ca: Option<&[u8]>,
        from: &str,
        metrics: Arc<Metrics>,
    ) -> Result<
        (
            Arc<Self>,
            impl std::future::Future<Output = ()> + Send + 'static,
        ),
        crate::reports::ReportsError,
    > {
        let url = crate::reports::api_url(base, "/v1/demand")?;
        let client = crate::reports::client(ca)?;
        let demand = Arc::new(Self {
            counts: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            from: from.to_string(),
            metrics,
        });
        Ok((demand.clone(), demand.run(client, url)))
    }

    /// Counts one tunnel or request of `caller` (with `token`) on `pool` (`waiting`: one held
    /// for want of a member) until the returned value drops; None past [`MAX_KEYS`].
    pub(crate) fn count(
        self: &Arc<Self>,
        pool: &PoolKey,
        caller: &str,
        token: &Token,
        waiting: bool,
    ) -> Option<Counted> {
        let key = (pool.clone(), caller.to_string());
        if !self.add(&key, waiting, true, Some(token)) {
            self.metrics.demand_said("unkept");
            return None;
        }
        Some(Counted {
            demand: self.clone(),
            key,
            waiting,
        })
    }

    /// Adds or takes one; false when a new key would pass the bound.
    fn add(&self, key: &Key, waiting: bool, up: bool, token: Option<&Token>) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if !counts.contains_key(key) {
            if !up || counts.len() >= MAX_KEYS {
                return false;
            }
            let Some(token) = token else { return false };
            counts.insert(
                key.clone(),
                Count {
                    tunnels: 0,
                    waiting: 0,
                    token: token.clone(),
                    said: None,
                    posting: false,
                },
            );
        }
        let Some(c) = counts.get_mut(key) else {
            return false;
        };
        let n = if waiting {
            &mut c.waiting
        } else {
            &mut c.tunnels
        };
        *n = if up {
            n.saturating_add(1)
        } else {
            n.saturating_sub(1)
        };
        let before = zeros(if up { *n - 1 } else { *n + 1 });
        let woke = before != zeros(*n);
        if let Some(t) = token {
            // The latest token of the caller: an older one may have expired.
            c.token = t.clone();
        }
        drop(counts);
        // A count that starts or stops being zero is said at once; a change of size waits
        // for the next round.
        if woke {
            self.wake.notify_one();
        }
        true
    }

    /// The counts to say now: changed since said, or above zero and not said for REFRESH.
    fn due(&self, now: Instant) -> Vec<(Key, (u32, u32), Token)> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // A count said zero and still zero is done with.
        counts.retain(|_, c| {
            c.posting || c.tunnels + c.waiting > 0 || c.said.is_none_or(|(s, _)| s != (0, 0))
        });
        let mut out = Vec::new();
        for (k, c) in counts.iter_mut() {
            if c.posting {
                continue;
            }
            let now_counts = (c.tunnels, c.waiting);
            let stale = match c.said {
                None => true,
                Some((s, at)) => {
                    (zeros(s.0) != zeros(now_counts.0) || zeros(s.1) != zeros(now_counts.1))
                        || (s != now_counts && now >= at + MIN_GAP)
                        || (now_counts != (0, 0) && now >= at + REFRESH)
                }
            };
            if stale {
                c.posting = true;
                out.push((k.clone(), now_counts, c.token.clone()));
            }
        }
        out
    }

    fn said(&self, key: &Key, counts: (u32, u32), ok: bool, now: Instant) {
        // (A count changed while its post was on its way is looked at again at the next
        // round.)
        let mut all = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = all.get_mut(key) {
            c.posting = false;
            if ok {
                c.said = Some((counts, now));
            }
        }
    }

    async fn run(self: Arc<Self>, client: reqwest::Client, url: reqwest::Url) {
        use futures::StreamExt;
        loop {
            let due = self.due(Instant::now());
            let this = &self;
            futures::stream::iter(due)
                .for_each_concurrent(IN_FLIGHT, |(key, counts, token)| {
                    let (client, url) = (&client, &url);
                    async move {
                        let ok = this.post(client, url, &key, counts, &token).await;
                        this.said(&key, counts, ok, Instant::now());
                    }
                })
                .await;
            // Again at a change, or for the refresh (a failed post is tried again then).
            let _ = tokio::time::timeout(REFRESH / 5, self.wake.notified()).await;
        }
    }

    async fn post(
        &self,
        client: &reqwest::Client,
        url: &reqwest::Url,
        key: &Key,
        (tunnels, waiting): (u32, u32),
        token: &Token,
    ) -> bool {
        let body = serde_json::json!({
            "namespace": key.0.namespace,
            "pool": key.0.name,
            "from": self.from,
            "tunnels": tunnels,
            "waitingTunnels": waiting,
        });
        let sent = client
            .post(url.clone())
            .bearer_auth(token.secret())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await;
        let result = match sent {
            Ok(a) if a.status().is_success() => "ok",
            Ok(a) if a.status().is_client_error() => {
                tracing::warn!(status = a.status().as_u16(), pool = %key.0, "the API did not take a pool's demand");
                "refused"
            }
            Ok(_) => "failed",
            Err(e) => {
                tracing::warn!(error = %e, pool = %key.0, "a pool's demand could not be said to the API");
                "failed"
            }
        };
        self.metrics.demand_said(result);
        // A refusal is final for these counts: said (as nothing) until they change.
        result != "failed"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn demand() -> (Arc<Demand>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        // The saying task is never run: what is due stays to be read.
        let (d, _saying) =
            Demand::start("http://127.0.0.1:9", None, "gw", metrics.clone()).unwrap();
        (d, metrics)
    }

    fn pool() -> PoolKey {
        PoolKey::parse("ns/web").unwrap()
    }

    /// Counts starting or stopping are due at once; a change of size only after MIN_GAP;
    /// a steady count every REFRESH.
    #[test]
    fn a_change_of_size_waits_a_gap_and_a_start_or_stop_goes_at_once() {
        let (d, _) = demand();
        let token = Token::new("t");
        let t0 = Instant::now();
        let first = d.count(&pool(), "spider", &token, false).unwrap();
        let due = d.due(t0);
        assert_eq!(due.len(), 1);
        d.said(&due[0].0, due[0].1, true, t0);
        // 99 more tunnels open: a change of size, not due before the gap.
        let more: Vec<_> = (0..99)
            .map(|_| d.count(&pool(), "spider", &token, false).unwrap())
            .collect();
        assert!(d.due(t0 + MIN_GAP / 2).is_empty());
        let due = d.due(t0 + MIN_GAP);
        assert_eq!(due[0].1, (100, 0));
        d.said(&due[0].0, due[0].1, true, t0 + MIN_GAP);
        // One held: waiting starts, due at once.
        let held = d.count(&pool(), "spider", &token, true).unwrap();
        assert_eq!(d.due(t0 + MIN_GAP)[0].1, (100, 1));
        d.said(&(pool(), "spider".into()), (100, 1), true, t0 + MIN_GAP);
        // Steady: again only at REFRESH.
        assert!(d.due(t0 + MIN_GAP * 2).is_empty());
        assert_eq!(d.due(t0 + MIN_GAP + REFRESH).len(), 1);
        d.said(
            &(pool(), "spider".into()),
            (100, 1),
            true,
            t0 + MIN_GAP + REFRESH,
        );
        // All gone: zero, due at once, then forgotten once said.
        drop((first, more, held));
        let due = d.due(t0 + MIN_GAP + REFRESH);
        assert_eq!(due[0].1, (0, 0));
        d.said(&due[0].0, (0, 0), true, t0 + MIN_GAP + REFRESH);
        assert!(d.due(t0 + REFRESH * 10).is_empty());
        assert!(d.counts.lock().unwrap().is_empty());
    }

    /// Past MAX_KEYS (pool, caller) counts a new caller's traffic is not counted (and says
    /// so); the kept ones go on.
    #[test]
    fn counts_past_the_bound_are_not_kept_and_are_counted() {
        let (d, metrics) = demand();
        let token = Token::new("t");
        let kept: Vec<_> = (0..MAX_KEYS)
            .map(|i| d.count(&pool(), &format!("h{i}"), &token, false).unwrap())
            .collect();
        assert!(d.count(&pool(), "late", &token, false).is_none());
        assert!(d.count(&pool(), "h0", &token, false).is_some());
        let unkept = metrics
            .demand_said
            .get_or_create(&vec![("result".into(), "unkept".into())])
            .get();
        assert_eq!(unkept, 1);
        drop(kept);
    }
}
