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
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::Verified,
        Reason::ProxyUnreachable,
        Reason::ProxyRefused,
        Reason::Timeout,
        Reason::BadEcho,
        Reason::NotAnonymous,
        Reason::CheckerUnavailable,
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
}
