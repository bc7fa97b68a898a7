//! The simulated proxies and echoes of a dry-run, from the world file's `egress` section.

use super::probe::{Chosen, EchoLook, EgressProbe, is_https};
use egress_core::egress::{CheckReason, CheckResult, Settings};
use egress_runtime::capabilities::clock::ClockBackend;
use std::sync::Arc;

/// The simulated proxies' behaviour, from the world file's `egress` section.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimEgressSpec {
    /// The echo endpoints answer nothing, from `from` on (RFC 3339; default: always); with
    /// `urls`, only those.
    #[serde(default)]
    pub echo_down: Option<SimEchoDown>,
    /// The address the echoes see the checker come from when asked directly (a NAT's); a
    /// proxy whose egress is that address hides nothing (NotAnonymous). Default: one no
    /// proxy has.
    #[serde(default, rename = "checkerIP")]
    pub checker_ip: Option<String>,
    /// How particular proxies behave, by their address. Every other proxy forwards and
    /// tunnels, anonymously, and the echo sees its own address.
    #[serde(default)]
    pub proxies: Vec<SimProxy>,
}

#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimEchoDown {
    /// RFC 3339; default: from the start.
    #[serde(default)]
    pub from: Option<String>,
    /// RFC 3339; default: for ever.
    #[serde(default)]
    pub until: Option<String>,
    /// The echo URLs that are down, as the providers config writes them; default: all.
    #[serde(default)]
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimWindow {
    /// RFC 3339; default: from the start.
    #[serde(default)]
    pub from: Option<String>,
    /// RFC 3339; default: for ever.
    #[serde(default)]
    pub until: Option<String>,
}

/// What a simulated proxy does with the CONNECT tunnel to the https echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SimTunnel {
    /// Tunnels, as Squid does (the default).
    Forwards,
    /// Answers CONNECT 403 (TunnelRefused), though it forwards plain http.
    Refused,
    /// Opens the tunnel but breaks TLS inside it: its own certificate, or bytes of its own
    /// (TlsFailed).
    BreaksTls,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimProxy {
    /// The proxy's address (the instance's IP), or a CIDR range of them (`10.244.0.0/24`:
    /// every proxy with an address in it, such as the Pods behind one NAT).
    pub ip: String,
    /// Only this share of the proxies `ip` matches, in [0, 1], chosen from each address and
    /// the rule's place in the list (so two rules with a share pick different proxies, the
    /// same ones on every run): a blip that hits a tenth of all proxies is `{ip: 0.0.0.0/0,
    /// share: 0.1, serving: false, during: …}`. Default: all of them.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub share: Option<f64>,
    /// What the echo sees (a NAT address, the node's or the hypervisor's); default the
    /// proxy's own address.
    #[serde(default, rename = "egressIP")]
    pub egress_ip: Option<String>,
    /// The proxy does not answer (ProxyUnreachable).
    #[serde(default)]
    pub serving: Option<bool>,
    /// The proxy adds Via and X-Forwarded-For (NotAnonymous).
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// What it does with the CONNECT tunnel; default: forwards.
    #[serde(default)]
    pub tunnel: Option<SimTunnel>,
    /// When this behaviour holds; default: always.
    #[serde(default)]
    pub during: Option<SimWindow>,
}

/// The probe of simulated runs: answers from the world's `egress` section on the virtual
/// clock, deterministically, as the network probe would judge the real parts.
pub struct SimEgress {
    spec: SimEgressSpec,
    clock: Arc<dyn ClockBackend>,
    /// Each rule's `ip` as a range (an address is a range of one).
    ranges: Vec<Option<ipnet::IpNet>>,
    /// Each rule's `during`, and the echo outage's window, in Unix seconds: parsed once,
    /// not at each of a day's hundred thousand probes.
    windows: Vec<Window>,
    echo_window: Window,
}

/// A window's bounds in Unix seconds; an absent bound, or one that does not parse, is open.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    from: Option<i64>,
    until: Option<i64>,
}

impl Window {
    fn of(from: &Option<String>, until: &Option<String>) -> Self {
        let at = |t: &Option<String>| t.as_deref().and_then(egress_core::gc::parse_rfc3339);
        Self {
            from: at(from),
            until: at(until),
        }
    }

    fn holds(&self, now: i64) -> bool {
        self.from.is_none_or(|f| now >= f) && self.until.is_none_or(|u| now < u)
    }
}

/// A rule's `ip` as a range: a CIDR range, or an address as the range of one.
fn range_of(ip: &str) -> Option<ipnet::IpNet> {
    ip.parse::<ipnet::IpNet>()
        .or_else(|_| ip.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .ok()
}

/// Whether the rule at `index` with `share` picks the proxy at `ip`: a hash of both, so the
/// choice is the same on every run and independent between rules.
fn picked(index: usize, ip: &str, share: f64) -> bool {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update((index as u64).to_be_bytes())
        .chain_update(ip.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) as f64 / u64::MAX as f64) < share
}

impl SimEgress {
    pub fn new(spec: SimEgressSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let ranges = spec.proxies.iter().map(|p| range_of(&p.ip)).collect();
        let windows = spec
            .proxies
            .iter()
            .map(|p| {
                p.during
                    .as_ref()
                    .map_or_else(Window::default, |w| Window::of(&w.from, &w.until))
            })
            .collect();
        let echo_window = spec
            .echo_down
            .as_ref()
            .map_or_else(Window::default, |d| Window::of(&d.from, &d.until));
        Self {
            spec,
            clock,
            ranges,
            windows,
            echo_window,
        }
    }

    /// Checks the world's `egress` section: every rule's `ip` is an address or a range, and
    /// every share within [0, 1].
    pub fn check(spec: &SimEgressSpec) -> Result<(), egress_core::config::ConfigError> {
        use egress_core::config::ConfigError;
        for (i, p) in spec.proxies.iter().enumerate() {
            if range_of(&p.ip).is_none() {
                return Err(ConfigError::new(
                    format!("egress.proxies[{i}].ip"),
                    format!("{:?} is neither an IP address nor a CIDR range", p.ip),
                ));
            }
            if let Some(share) = p.share
                && !(0.0..=1.0).contains(&share)
            {
                return Err(ConfigError::new(
                    format!("egress.proxies[{i}].share"),
                    format!("{share} is not within [0, 1]"),
                ));
            }
        }
        Ok(())
    }

    /// The first rule that holds for the proxy at `ip` now.
    fn rule(&self, ip: &str) -> Option<&SimProxy> {
        let addr = ip.parse::<std::net::IpAddr>().ok();
        let now = self.now_secs();
        self.spec
            .proxies
            .iter()
            .zip(self.ranges.iter().zip(&self.windows))
            .enumerate()
            .find(|(i, (p, (range, window)))| {
                let matches = range.zip(addr).is_some_and(|(r, a)| r.contains(&a));
                // The window first: the share's hash is the dearest test.
                matches && window.holds(now) && p.share.is_none_or(|share| picked(*i, ip, share))
            })
            .map(|(_, (p, _))| p)
    }

    fn now_secs(&self) -> i64 {
        (self.clock.now_millis() / 1000) as i64
    }

    fn echo_down(&self, url: &str) -> bool {
        self.spec.echo_down.as_ref().is_some_and(|d| {
            self.echo_window.holds(self.now_secs())
                && (d.urls.is_empty() || d.urls.iter().any(|u| u == url))
        })
    }
}

#[async_trait::async_trait]
impl EgressProbe for SimEgress {
    async fn probe(
        &self,
        ip: &str,
        port: u16,
        _settings: &Settings,
        chosen: &Chosen,
    ) -> CheckResult {
        let rule = self.rule(ip);
        let latency = 15 + ip.bytes().map(u64::from).sum::<u64>() % 30;
        let fail = |reason, latency_ms, message: String| CheckResult {
            reason,
            egress_ip: None,
            latency_ms,
            message,
        };
        if rule.is_some_and(|r| r.serving == Some(false)) {
            return fail(
                CheckReason::ProxyUnreachable,
                None,
                format!("connecting to {ip}:{port}: connection refused"),
            );
        }
        // As every generated Squid: no credential, no service.
        if chosen.proxy_authorization.is_none() {
            return fail(
                CheckReason::ProxyRefused,
                Some(latency),
                format!(
                    "{ip}:{port} answered 407 Proxy Authentication Required: the check presented no credential"
                ),
            );
        }
        if let Some(url) = chosen.urls.iter().find(|u| self.echo_down(u)) {
            return fail(
                CheckReason::BadEcho,
                Some(latency),
                format!("{url} through {ip}:{port}: 502 Bad Gateway"),
            );
        }
        let egress_ip = rule
            .and_then(|r| r.egress_ip.clone())
            .unwrap_or_else(|| ip.to_string());
        let plain = chosen.urls.iter().find(|u| !is_https(u));
        let tls = chosen.urls.iter().find(|u| is_https(u));
        if let Some(url) = plain
            && rule.is_some_and(|r| r.anonymous == Some(false))
        {
            return CheckResult {
                reason: CheckReason::NotAnonymous,
                egress_ip: Some(egress_ip),
                latency_ms: Some(latency),
                message: format!("{url} through {ip}:{port}: the echo saw Via and X-Forwarded-For"),
            };
        }
        if let Some(url) = tls {
            match rule.and_then(|r| r.tunnel) {
                Some(SimTunnel::Refused) => {
                    return fail(
                        CheckReason::TunnelRefused,
                        Some(latency),
                        format!("{url} through {ip}:{port}: the proxy answered CONNECT with 403"),
                    );
                }
                Some(SimTunnel::BreaksTls) => {
                    return fail(
                        CheckReason::TlsFailed,
                        Some(latency),
                        format!(
                            "{url} through {ip}:{port}: TLS inside the tunnel failed: the certificate is not the echo's"
                        ),
                    );
                }
                Some(SimTunnel::Forwards) | None => {}
            }
        }
        if chosen.own_addresses.contains(&egress_ip) {
            return CheckResult {
                reason: CheckReason::NotAnonymous,
                egress_ip: Some(egress_ip.clone()),
                latency_ms: Some(latency),
                message: format!(
                    "through {ip}:{port}: the echo saw the client's own address {egress_ip} in origin"
                ),
            };
        }
        CheckResult {
            reason: CheckReason::Verified,
            egress_ip: Some(egress_ip),
            latency_ms: Some(latency),
            message: String::new(),
        }
    }

    async fn look(&self, settings: &Settings) -> EchoLook {
        let mut look = EchoLook::default();
        for url in &settings.urls {
            let up = !self.echo_down(url);
            look.up.push(up);
            if !up {
                look.why_down.push(format!("{url}: connection refused"));
            }
        }
        if look.up.iter().any(|u| *u)
            && let Some(ip) = &self.spec.checker_ip
        {
            look.origins.push(ip.clone());
        }
        look
    }
}
