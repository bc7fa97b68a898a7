//! Who used what: each tunnel and plain request a caller was admitted for is accounted to its
//! holder (the authenticated caller, under the pool's namespace) in the metrics as its bytes
//! move, and written to the audit trail ([`crate::audit`]) once it ends. A request refused
//! before admission (no token, a pool the caller may not use) has no holder to account to; the
//! error metrics count it.

use crate::account::{Account, Exchange, Outcome};
use crate::audit::Record;
use crate::authority::Destination;
use crate::forward::{Carried, Meter};
use crate::metrics::{Labels, with};
use crate::server::{Admitted, Gateway};
use crate::status::Failure;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::time::Instant;

impl Gateway {
    /// The account of `a`'s request to `destination`.
    pub(crate) fn account(
        &self,
        a: &Admitted,
        destination: &Destination,
        target: Option<&str>,
        method: &str,
    ) -> Account {
        Account {
            holder: a.caller.clone(),
            labels: self.metrics.holder_labels(&a.pool.namespace, &a.caller),
            pool: a.pool.clone(),
            session: a.options.session.clone(),
            lease: a.options.lease.clone(),
            listener: a.listener,
            host: destination.host.clone(),
            port: destination.port,
            target: target.map(str::to_string),
            method: method.to_string(),
            started: Instant::now(),
            quota: (!self.quotas.is_empty())
                .then(|| self.quotas.holder(&a.pool.namespace, &a.caller)),
            _in_flight: self.in_flight(a),
        }
    }

    /// The quota `account`'s holder reached, as the answer that refuses it (before any member
    /// is dialled); `tunnel`: it asks to open one.
    pub(crate) fn within_quota(&self, account: &Account, tunnel: bool) -> Result<(), Failure> {
        match &account.quota {
            Some(h) => self.holder_within_quota(h, tunnel),
            None => Ok(()),
        }
    }

    /// [`Self::within_quota`] for caller `caller` on the pools of `namespace` (before its
    /// account is taken: a request held while its pool wakes is refused first, so a holder
    /// past its quota neither waits nor wakes a pool).
    pub(crate) fn caller_within_quota(
        &self,
        namespace: &str,
        caller: &str,
        tunnel: bool,
    ) -> Result<(), Failure> {
        if self.quotas.is_empty() {
            return Ok(());
        }
        self.holder_within_quota(&self.quotas.holder(namespace, caller), tunnel)
    }

    fn holder_within_quota(&self, h: &crate::quota::Holder, tunnel: bool) -> Result<(), Failure> {
        let Some(r) = self.quotas.reached(h, egress_time::now::unix_now(), tunnel) else {
            return Ok(());
        };
        let when = match r.resets_in {
            Some(s) => format!("; it resets in {s}s (the next UTC day)"),
            None => "; a tunnel that ends frees its place".to_string(),
        };
        let mut f = Failure::new(
            crate::status::ErrorKind::Quota,
            http::StatusCode::TOO_MANY_REQUESTS,
            format!("quota: {} of {} reached{when}", r.quota, r.of),
        );
        f.retry_after = Some(r.resets_in.unwrap_or(1).max(1));
        Err(f)
    }

    /// The byte counts of `account`'s quotas.
    pub(crate) fn quota_counters(
        &self,
        account: &Account,
    ) -> Vec<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        account
            .quota
            .as_ref()
            .map(|h| self.quotas.counters(h))
            .unwrap_or_default()
    }

    /// The meters of an exchange of `account` through the member of `member` (its labels):
    /// each direction adds to the member's and the holder's byte counters and to the holder's
    /// quota counts. No cut: a tunnel's relay sets it.
    pub(crate) fn meters(&self, member: &Labels, account: &Account) -> Carried {
        let meter = |direction: &str| {
            let counter = |family: &Family<Labels, Counter>, labels: &Labels| {
                family
                    .get_or_create(&with(labels.clone(), "direction", direction))
                    .clone()
            };
            Meter::new(counter(&self.metrics.bytes, member))
                .and(counter(&self.metrics.holder_bytes, &account.labels))
                .quota(self.quota_counters(account))
        };
        Carried {
            up: meter("up"),
            down: meter("down"),
            cut: None,
        }
    }

    /// `account`'s tunnel or request ended: relayed, or failed before it was.
    pub(crate) fn ended(&self, account: &Account, exchange: Exchange, outcome: Outcome<'_>) {
        let (family, event) = match exchange {
            Exchange::Tunnel => (&self.metrics.holder_tunnels, "egress.tunnel"),
            Exchange::Request => (&self.metrics.holder_requests, "egress.request"),
        };
        family
            .get_or_create(&with(account.labels.clone(), "result", outcome.result))
            .inc();
        if let Some(audit) = &self.audit {
            audit.record(&record(account, event, outcome));
        }
    }

    /// `f` ended `account`'s tunnel or request before any byte was relayed.
    pub(crate) fn failed(&self, account: &Account, f: &Failure, exchange: Exchange) {
        let member = f.member.as_deref().map(crate::metrics::member_name);
        self.ended(
            account,
            exchange,
            Outcome {
                member,
                address: None,
                up: 0,
                down: 0,
                status: Some(f.status.as_u16()),
                result: f.kind.label(),
            },
        );
    }
}

fn record(account: &Account, event: &'static str, outcome: Outcome<'_>) -> Record {
    Record {
        who: crate::audit::Who::now(
            event,
            &account.holder,
            &account.pool.namespace,
            &account.pool.name,
        ),
        session: account.session.clone(),
        lease: account.lease.clone(),
        member: outcome.member.map(str::to_string),
        address: outcome.address.map(str::to_string),
        host: account.host.clone(),
        port: account.port,
        target: account.target.clone(),
        listener: account.listener.label(),
        method: account.method.clone(),
        status: outcome.status,
        up: outcome.up,
        down: outcome.down,
        duration_ms: account.started.elapsed().as_millis() as u64,
        result: outcome.result.to_string(),
    }
}
