//! What one probe found, as plain data: the core mirrors these names in the `EgressVerified`
//! condition without depending on this crate.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// The condition type the result of a check is recorded under.
pub const CONDITION_TYPE: &str = "EgressVerified";

/// The condition reasons, as the names the status carries.
pub mod reason {
    pub const VERIFIED: &str = "Verified";
    pub const PROXY_UNREACHABLE: &str = "ProxyUnreachable";
    pub const PROXY_REFUSED: &str = "ProxyRefused";
    pub const TIMEOUT: &str = "Timeout";
    pub const BAD_ECHO: &str = "BadEcho";
    pub const NOT_ANONYMOUS: &str = "NotAnonymous";
    pub const CHECKER_UNAVAILABLE: &str = "CheckerUnavailable";
    pub const TUNNEL_REFUSED: &str = "TunnelRefused";
    pub const TLS_FAILED: &str = "TlsFailed";
}

/// Why a check ended as it did. Only [`Reason::Verified`] is a working proxy;
/// [`Reason::CheckerUnavailable`] says nothing about the proxy (the echo or the checker
/// itself failed), so it must never count towards replacing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// The echo answered through the proxy, with this probe's nonce, and saw nothing of the
    /// client.
    Verified,
    /// No TCP connection to the proxy (refused, reset, unreachable), or it closed the
    /// connection without answering.
    ProxyUnreachable,
    /// The proxy itself answered 403 or 407.
    ProxyRefused,
    /// No connection or no complete answer within the probe's bound.
    Timeout,
    /// An answer that is not the echo's for this probe: non-2xx, unparsable, too large, or
    /// without the nonce (cached or forged).
    BadEcho,
    /// The echo saw Via, X-Forwarded-For or Forwarded, or the client's own address.
    NotAnonymous,
    /// No echo answered a direct request, or the checker could not open a socket: the proxy
    /// was not judged.
    CheckerUnavailable,
    /// The proxy answered CONNECT to the https echo with something other than 2xx, or closed
    /// the connection instead.
    TunnelRefused,
    /// Inside the tunnel, TLS to the echo failed: the handshake broke, or the certificate was
    /// not one the checker trusts for the echo (an intercepting or broken proxy).
    TlsFailed,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::Verified,
        Reason::ProxyUnreachable,
        Reason::ProxyRefused,
        Reason::Timeout,
        Reason::BadEcho,
        Reason::NotAnonymous,
        Reason::CheckerUnavailable,
        Reason::TunnelRefused,
        Reason::TlsFailed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Verified => reason::VERIFIED,
            Reason::ProxyUnreachable => reason::PROXY_UNREACHABLE,
            Reason::ProxyRefused => reason::PROXY_REFUSED,
            Reason::Timeout => reason::TIMEOUT,
            Reason::BadEcho => reason::BAD_ECHO,
            Reason::NotAnonymous => reason::NOT_ANONYMOUS,
            Reason::CheckerUnavailable => reason::CHECKER_UNAVAILABLE,
            Reason::TunnelRefused => reason::TUNNEL_REFUSED,
            Reason::TlsFailed => reason::TLS_FAILED,
        }
    }

    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of one probe. The caller stamps `egressCheckedAt` from its own clock (virtual in
/// a simulated run), so no time of day is in here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub reason: Reason,
    /// The address the echo saw the request come from (its `origin`, first address): set for
    /// [`Reason::Verified`] and [`Reason::NotAnonymous`].
    pub egress_ip: Option<IpAddr>,
    /// From the start of the TCP connect to the end of the answer; set whenever an HTTP
    /// answer arrived, whatever it said.
    pub latency_ms: Option<u64>,
    /// Whether the echo's view of the request's headers was inspected for what gives the
    /// client away (false for a direct look, which expects to see the client).
    pub anonymity_checked: bool,
    /// For people: what was seen. Holds no credential (the probe sends none) and at most a
    /// short, escaped excerpt of an answer.
    pub message: String,
}

impl Outcome {
    pub fn failed(reason: Reason, message: impl Into<String>) -> Outcome {
        Outcome {
            reason,
            egress_ip: None,
            latency_ms: None,
            anonymity_checked: false,
            message: message.into(),
        }
    }

    pub fn is_verified(&self) -> bool {
        self.reason == Reason::Verified
    }

    /// One check of a proxy from its probes (the plain request's and the tunnel's, in the
    /// order given): verified only when every probe verified, with the egress address the
    /// last one saw (the tunnel's, which the proxy cannot forge) and the slowest latency.
    /// Otherwise the first failure, in the order given, is the check's.
    pub fn all_of(outcomes: Vec<Outcome>) -> Outcome {
        let latency = outcomes.iter().filter_map(|o| o.latency_ms).max();
        if let Some(failed) = outcomes.iter().find(|o| !o.is_verified()) {
            let mut failed = failed.clone();
            failed.latency_ms = failed.latency_ms.or(latency);
            return failed;
        }
        let anonymity_checked = outcomes.iter().any(|o| o.anonymity_checked);
        let message = outcomes
            .iter()
            .map(|o| o.message.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        match outcomes.into_iter().last() {
            Some(last) => Outcome {
                reason: Reason::Verified,
                egress_ip: last.egress_ip,
                latency_ms: latency,
                anonymity_checked,
                message,
            },
            None => Outcome::failed(Reason::CheckerUnavailable, "no probe was sent"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn names_round_trip_and_serialize_as_the_condition_reasons() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_name(r.as_str()), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        assert_eq!(Reason::from_name("verified"), None);
        let o = Outcome::failed(Reason::Timeout, "no answer");
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["reason"], "Timeout");
        assert!(json.get("egressIp").is_some() && json.get("latencyMs").is_some());
    }

    fn verified(ip: &str, latency: u64, anonymity_checked: bool) -> Outcome {
        Outcome {
            reason: Reason::Verified,
            egress_ip: ip.parse().ok(),
            latency_ms: Some(latency),
            anonymity_checked,
            message: format!("saw {ip}"),
        }
    }

    #[test]
    fn a_check_verifies_only_when_every_probe_did() {
        let both = Outcome::all_of(vec![
            verified("203.0.113.1", 12, true),
            verified("203.0.113.2", 30, false),
        ]);
        assert_eq!(both.reason, Reason::Verified);
        assert_eq!(both.egress_ip, "203.0.113.2".parse().ok(), "the tunnel's");
        assert_eq!(both.latency_ms, Some(30));
        assert!(both.anonymity_checked);
        let tunnel = Outcome::failed(Reason::TunnelRefused, "CONNECT answered 403");
        let o = Outcome::all_of(vec![verified("203.0.113.1", 12, true), tunnel.clone()]);
        assert_eq!(o.reason, Reason::TunnelRefused);
        assert_eq!(o.egress_ip, None);
        let plain = Outcome::failed(Reason::NotAnonymous, "Via");
        let o = Outcome::all_of(vec![plain, tunnel]);
        assert_eq!(o.reason, Reason::NotAnonymous, "the first failure");
        assert_eq!(Outcome::all_of(vec![]).reason, Reason::CheckerUnavailable);
    }
}
