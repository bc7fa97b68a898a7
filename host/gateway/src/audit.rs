//! The audit trail: one JSON line per tunnel and per plain request a caller was admitted for
//! (`--audit-log`), written when it ends: who (the holder and the pool's namespace), through
//! what (pool, session or lease, member, its egress address), to where (the destination's host
//! and port, its target), how much (bytes each way), how long, and how it ended.
//!
//! ```json
//! {"timestamp":"2026-12-07T19:02:03.456Z","event.name":"egress.tunnel","user.name":"spider",
//!  "k8s.namespace.name":"crawlers","egress.pool":"web","egress.session":"cart42",
//!  "egress.member":"web-d9znx8ng7","egress.address":"203.0.113.7","server.address":"example.com",
//!  "server.port":443,"egress.target":"example.com","network.protocol.name":"http2",
//!  "http.request.method":"CONNECT","egress.bytes.up":1830,"egress.bytes.down":104211,
//!  "egress.duration_ms":912,"egress.result":"closed"}
//! ```
//!
//! Names are OpenTelemetry's semantic conventions where one fits (`user.name`,
//! `k8s.namespace.name`, `server.address`, `server.port`, `network.protocol.name`,
//! `http.request.method`, `http.response.status_code`), under `egress.` otherwise; the
//! collector's filelog receiver, Vector and Fluent Bit read the lines as they are. Never a
//! path, a query, a header, a body or a credential: a plain request's line names its method,
//! host and port only.
//!
//! Lines go through [`egress_serve::audit`]'s bounded queue to a thread of their own, so the
//! relay never waits on a disk: a full queue drops the line and counts it
//! (`egress_gateway_audit_records_total{result="dropped"}`, beside `result="queued"`). To a
//! file, lines rotate by size (`--audit-max-bytes`, `--audit-keep`).

use serde::Serialize;

/// The writer, shared with the lease API's trail.
pub use egress_serve::audit::{Audit, AuditError, QUEUE, Sink, Who};

/// One line of the trail.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Record {
    /// When it ended (`egress.tunnel`: a CONNECT, an HTTP/2 CONNECT stream, a SOCKS CONNECT;
    /// `egress.request`: a plain HTTP request), by whom, on which pool.
    #[serde(flatten)]
    pub who: Who,
    #[serde(rename = "egress.session", skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(rename = "egress.lease", skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The member that carried it; none when it failed before one was chosen.
    #[serde(rename = "egress.member", skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The member's egress address, as its status gives it.
    #[serde(rename = "egress.address", skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(rename = "server.address")]
    pub host: String,
    #[serde(rename = "server.port")]
    pub port: u16,
    /// The destination's registrable domain (`egress_core::target`).
    #[serde(rename = "egress.target", skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `http`, `http2` or `socks5`.
    #[serde(rename = "network.protocol.name")]
    pub listener: &'static str,
    #[serde(rename = "http.request.method")]
    pub method: String,
    /// A plain request's answer, or the gateway's own refusal.
    #[serde(
        rename = "http.response.status_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub status: Option<u16>,
    /// From the crawler to the member: a tunnel's bytes after its `200`, a request's body.
    #[serde(rename = "egress.bytes.up")]
    pub up: u64,
    /// From the member to the crawler: a tunnel's bytes, an answer's body.
    #[serde(rename = "egress.bytes.down")]
    pub down: u64,
    #[serde(rename = "egress.duration_ms")]
    pub duration_ms: u64,
    /// A tunnel: `closed`, `idle` or `retired`; a request: `served`, `refused` (one of the
    /// pool's signal statuses) or `failed`; either: the gateway's error kind when it failed.
    #[serde(rename = "egress.result")]
    pub result: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A line is one JSON document in the conventions' names; what is absent is left out, not
    /// null.
    #[test]
    fn a_line_speaks_the_conventions_names_and_leaves_out_what_is_absent() {
        let r = Record {
            who: Who::at(
                1_796_670_123_456,
                "egress.tunnel",
                "spider",
                "crawlers",
                "web",
            ),
            session: Some("cart42".into()),
            lease: None,
            member: Some("web-1".into()),
            address: Some("203.0.113.7".into()),
            host: "example.com".into(),
            port: 443,
            target: Some("example.com".into()),
            listener: "http",
            method: "CONNECT".into(),
            status: None,
            up: 100,
            down: 218,
            duration_ms: 5,
            result: "closed".into(),
        };
        let l: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(l["timestamp"], "2026-12-07T19:02:03.456Z");
        assert_eq!(l["event.name"], "egress.tunnel");
        assert_eq!(l["user.name"], "spider");
        assert_eq!(l["k8s.namespace.name"], "crawlers");
        assert_eq!(l["server.port"], 443);
        assert_eq!(l["egress.bytes.down"], 218);
        assert!(l.get("egress.lease").is_none(), "absent, not null: {l}");
        assert!(l.get("http.response.status_code").is_none(), "{l}");
    }
}
