//! The lease API's audit trail (`--audit-log`): one JSON line per lease asked for, renewed and
//! released and per ban report, refused ones included, in the names the gateway's trail uses
//! (`user.name`, `k8s.namespace.name`, `egress.pool`, `egress.lease`, ...), so one query reads
//! both. A grant names the proxies it holds and their egress addresses; a release its outcome
//! and the target it names. Never a token.
//!
//! ```json
//! {"timestamp":"2026-12-07T19:02:03.456Z","event.name":"egress.lease.acquire","user.name":"spider",
//!  "k8s.namespace.name":"crawlers","egress.pool":"web","egress.lease":"crawlers_web_l-3wj5…",
//!  "egress.mode":"exclusive","egress.members":["web-d9znx8ng7"],"egress.addresses":["203.0.113.7"],
//!  "egress.expires_at":"2026-12-07T19:12:03Z","http.response.status_code":201,"egress.result":"ok"}
//! ```

use crate::leases::LeaseRefusal;
use egress_core::lease::LeaseView;
use serde::Serialize;

/// One line.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LeaseLine {
    /// `egress.lease.acquire`, `egress.lease.renew`, `egress.lease.release` or `egress.report`,
    /// by whom, on which pool.
    #[serde(flatten)]
    pub who: egress_serve::audit::Who,
    #[serde(rename = "egress.lease", skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(rename = "egress.mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The proxies the lease holds after the call (a report: the one reported).
    #[serde(rename = "egress.members", skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    #[serde(rename = "egress.addresses", skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(rename = "egress.expires_at", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// A release's `ok` or `banned`.
    #[serde(rename = "egress.outcome", skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The host a ban names.
    #[serde(rename = "server.address", skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(rename = "http.response.status_code")]
    pub status: u16,
    /// `ok`, or why it was refused: `bad_request`, `not_found`, `too_many`, `unavailable`,
    /// `busy`.
    #[serde(rename = "egress.result")]
    pub result: &'static str,
}

impl LeaseLine {
    /// A line of `event` by `holder` on pool `namespace/pool`, answered `status`.
    pub fn new(
        event: &'static str,
        holder: &str,
        namespace: &str,
        pool: &str,
        status: u16,
    ) -> Self {
        Self {
            who: egress_serve::audit::Who::now(event, holder, namespace, pool),
            lease: None,
            mode: None,
            members: Vec::new(),
            addresses: Vec::new(),
            expires_at: None,
            outcome: None,
            target: None,
            status,
            result: "ok",
        }
    }

    /// With what a call answered: the lease it shows, or why it refused.
    pub fn with(mut self, answer: Result<Option<&LeaseView>, &LeaseRefusal>) -> Self {
        match answer {
            Ok(view) => {
                if let Some(v) = view {
                    self.lease = Some(v.id.clone());
                    self.mode = serde_json::to_value(v.mode)
                        .ok()
                        .and_then(|m| m.as_str().map(str::to_string));
                    self.members = v.proxies.iter().map(|p| p.proxy.name.clone()).collect();
                    self.addresses = v
                        .proxies
                        .iter()
                        .filter_map(|p| p.proxy.egress_ip.clone())
                        .collect();
                    self.expires_at = Some(v.expires_at.clone());
                }
            }
            Err(e) => self.result = refusal_label(e),
        }
        self
    }
}

/// The refusal's name in the trail.
pub fn refusal_label(e: &LeaseRefusal) -> &'static str {
    match e {
        LeaseRefusal::BadRequest(_) => "bad_request",
        LeaseRefusal::NotFound(_) => "not_found",
        LeaseRefusal::TooMany(_) => "too_many",
        LeaseRefusal::Unavailable { .. } => "unavailable",
        LeaseRefusal::Busy(_) => "busy",
    }
}
