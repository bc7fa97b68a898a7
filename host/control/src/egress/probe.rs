//! What a check asks of a probe and of the echoes: the seam between the checker and the
//! network (or its simulation).

use egress_core::egress::{CheckReason, CheckResult, Settings};
use std::time::Duration;

/// How stale the recorded check time and latency may grow before a check that changed
/// nothing writes them anyway.
pub const STATUS_REFRESH: Duration = Duration::from_secs(300);
/// How long a direct look at the echo endpoints is trusted.
pub(super) const ECHO_LOOK_TTL_MS: u64 = 10_000;

/// What a direct look (no proxy in between) at every echo endpoint found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoLook {
    /// Per configured URL, in the settings' order: it answered in the echo format.
    pub up: Vec<bool>,
    /// The checker's own addresses as the echoes that answered saw them (behind a NAT, its
    /// public ones): an echo seeing one of them through a proxy was not hidden from.
    pub origins: Vec<String>,
    /// Per URL that did not answer, why (for messages).
    pub why_down: Vec<String>,
}

/// The echoes a probe asks for: per scheme configured, the first that answered directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    pub urls: Vec<String>,
    /// More of the checker's own addresses: [`EchoLook::origins`].
    pub own_addresses: Vec<String>,
    /// The proxy's credential as a `Proxy-Authorization` value, which every generated Squid
    /// requires. Secret: a probe sends it to the proxy and quotes it nowhere.
    pub proxy_authorization: Option<String>,
}

pub(super) fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
}

impl EchoLook {
    /// The echoes to ask for among `urls` ([`egress_check::choose_echoes`]); Err says which
    /// scheme has none up.
    pub fn choose(&self, urls: &[String]) -> Result<Chosen, String> {
        let numbered: Vec<(usize, &String)> = urls.iter().enumerate().collect();
        let chosen = egress_check::choose_echoes(
            &numbered,
            |(_, u)| is_https(u),
            |(i, _)| self.up.get(*i).copied().unwrap_or(false),
        )
        .map_err(|e| e.to_string())?;
        Ok(Chosen {
            urls: chosen.into_iter().map(|(_, u)| (*u).clone()).collect(),
            own_addresses: self.origins.clone(),
            proxy_authorization: None,
        })
    }
}

/// A check through one proxy, and a direct look at the echo endpoints.
#[async_trait::async_trait]
pub trait EgressProbe: Send + Sync {
    /// Asks for each of `echoes.urls` through the proxy at `ip:port` (the plain GET and the
    /// tunnel), judged together: verified only when every one verified.
    async fn probe(&self, ip: &str, port: u16, settings: &Settings, echoes: &Chosen)
    -> CheckResult;
    /// Asks every echo endpoint directly, without a proxy in between.
    async fn look(&self, settings: &Settings) -> EchoLook;
}

/// Told of every check's result (the operator's metrics).
pub trait CheckObserver: Send + Sync {
    fn checked(&self, provider: &str, reason: CheckReason, latency_ms: Option<u64>);
}
