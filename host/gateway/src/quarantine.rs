//! The gateway's side of quarantine per member and target (`egress_core::target`): the
//! signals it takes and the records they make.
//!
//! - A crawler's report in-band: option `report-banned` (in the username, where a client can
//!   set nothing else on a CONNECT, or as the `Egress-Report: banned` header) says the member
//!   of the request's session or lease was banned by the request's target.
//! - A target's refusal the gateway relays on plain HTTP: an answer whose status is one of the
//!   pool's `quarantine.signalStatuses` (403, 429, 503 by default), its `Retry-After` honoured.
//!
//! Each makes or joins a quarantine of the member for the target, decided by the core's
//! [`report`] (once per holder and quarantine, at a bounded rate per holder), held in the
//! member's slot on this replica until its status carries the record; routing reads both
//! ([`crate::route::quarantined`]), within the pool's cap per target. With `--reports-to`,
//! a signal that counted goes on to the lease API as its caller's report
//! ([`crate::reports`]), which writes it on the member's status for every replica.

use crate::members::Entry;
use crate::route;
use crate::server::{Admitted, Gateway};
use crate::status::{ErrorKind, Failure};
use egress_core::target::{Cooldowns, Quarantine, Reported, Signal, report};
use http::StatusCode;
use std::time::{Duration, Instant};

/// Where a signal came from, as the metrics say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The crawler's own report.
    Report,
    /// A plain answer's status.
    Status,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Report => "report",
            Source::Status => "status",
        }
    }
}

/// The longest `Retry-After` a target's answer is taken at: a longer one (or a date years
/// away) is a quarantine of the pool's `maxCooldown` at most anyway.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The seconds a `Retry-After` asks for: a number of seconds or an HTTP date, against `now`
/// (Unix seconds).
pub fn retry_after(headers: &http::HeaderMap, now: i64) -> Option<Duration> {
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let secs = match v.parse::<u64>() {
        Ok(s) => s,
        Err(_) => {
            let at = httpdate::parse_http_date(v).ok()?;
            let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
            u64::try_from(at.saturating_sub(now)).ok()?
        }
    };
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

impl Gateway {
    /// `a`'s in-band report (`report-banned`) that `target` banned the member of its session or
    /// lease: that member is quarantined for `target` before `a` itself is routed. A report
    /// that names no member (neither a session nor a lease of one proxy) is a 400 naming why.
    pub(crate) fn take_report(&self, a: &Admitted, target: Option<&str>) -> Result<(), Failure> {
        let bad = |m: &str| Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, m);
        let Some(target) = target else {
            return Err(bad("option report: the destination names no target"));
        };
        if a.options.session.is_none() && a.options.lease.is_none() {
            return Err(bad(
                "option report names the member of a session or a lease: give option session or lease too",
            ));
        }
        let snapshot = self.table.snapshot();
        // The member the session or lease is on now: the one remembered, or the one the
        // session's hash picks (which every replica picks alike). Routed without the target,
        // so a quarantine that holds already does not hide it.
        let mut options = a.options.clone();
        options.move_session = false;
        options.report_banned = false;
        let req = route::Request {
            pool: &a.pool,
            options: &options,
            caller: &a.caller,
            exclude: &[],
            target: None,
            max_quarantined_percent: 0,
            budget: None,
        };
        let lease_members = match (&a.options.session, &a.options.lease) {
            (None, Some(id)) => snapshot.pools.get(&a.pool).map_or(0, |all| {
                let now = egress_time::now::unix_now();
                all.iter()
                    .filter(|e| {
                        e.member
                            .lease(id, now)
                            .is_some_and(|b| b.holder == a.caller)
                    })
                    .count()
            }),
            _ => 0,
        };
        if lease_members > 1 {
            return Err(bad(
                "option report with a lease of several proxies names none of them: give option session too",
            ));
        }
        let now = egress_time::now::unix_now();
        match route::choose(&snapshot, &req, &self.sessions, now, Instant::now(), 0) {
            Ok(entry) => {
                self.signal(a, &entry, target, None, Source::Report);
                Ok(())
            }
            // The member is gone or out of routing already: the request's own routing says so.
            Err(_) => Ok(()),
        }
    }

    /// Signal from `source` that `target` refused `entry`'s member, for `a`'s caller, with the
    /// target's `Retry-After`.
    pub(crate) fn signal(
        &self,
        a: &Admitted,
        entry: &Entry,
        target: &str,
        retry_after: Option<Duration>,
        source: Source,
    ) {
        let policy = self.table.quarantine_policy(&a.pool);
        let cooldowns = Cooldowns::of(&policy);
        let now = egress_time::now::unix_now();
        // Every record of the pool, for the holder's rate: the members' own and this
        // replica's.
        let snapshot = self.table.snapshot();
        let in_pool: Vec<Quarantine> = snapshot
            .pools
            .get(&a.pool)
            .into_iter()
            .flatten()
            .flat_map(|e| e.slot.local_quarantines())
            .collect();
        let signal = Signal {
            member: &entry.member.name,
            target,
            holder: &a.caller,
            retry_after,
        };
        let result = entry.slot.update_local(|records| {
            match report(records, &in_pool, &signal, &cooldowns, now) {
                Reported::Quarantined { records, until } => {
                    tracing::info!(
                        member = %entry.member.key(),
                        target,
                        until = %egress_time::format_rfc3339(until),
                        source = source.label(),
                        "member quarantined for a target"
                    );
                    (Some(records), "quarantined")
                }
                Reported::Repeated { .. } => (None, "repeated"),
                Reported::OverRate => (None, "over_rate"),
            }
        });
        if let (Some(reports), "quarantined") = (&self.reports, result) {
            reports.send(crate::reports::Outgoing {
                pool: a.pool.clone(),
                proxy: entry.member.name.clone(),
                target: target.to_string(),
                retry_after,
                token: a.token.clone(),
            });
        }
        self.metrics
            .target_signals
            .get_or_create(&crate::metrics::with(
                self.metrics.target_labels(&a.pool, target),
                "source",
                source.label(),
            ))
            .inc();
        let labels = crate::metrics::with(
            crate::metrics::with(
                crate::metrics::pool_labels(&a.pool),
                "source",
                source.label(),
            ),
            "result",
            result,
        );
        self.metrics.quarantine_signals.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date_and_bounded() {
        let mut h = http::HeaderMap::new();
        assert_eq!(retry_after(&h, 0), None);
        h.insert(http::header::RETRY_AFTER, "120".parse().unwrap());
        assert_eq!(retry_after(&h, 0), Some(Duration::from_secs(120)));
        h.insert(http::header::RETRY_AFTER, "99999999".parse().unwrap());
        assert_eq!(retry_after(&h, 0), Some(MAX_RETRY_AFTER));
        // 1994-11-06 08:49:37 UTC is 784111777.
        h.insert(
            http::header::RETRY_AFTER,
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        assert_eq!(
            retry_after(&h, 784_111_777 - 60),
            Some(Duration::from_secs(60))
        );
        assert_eq!(retry_after(&h, 784_111_777 + 60), None);
        h.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h, 0), None);
    }
}
