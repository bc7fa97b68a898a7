//! The probe of real runs, over egress-check, and the checker built from the config.

use super::checker::EgressChecker;
use super::probe::{Chosen, EchoLook, EgressProbe};
use egress_core::egress::{CheckReason, CheckResult, Settings};
use egress_runtime::capabilities::clock::ClockBackend;
use std::sync::Arc;

/// The checker of real runs: a [`NetworkProbe`] with the config's settings and TLS trust.
/// Errors name the field at fault.
pub fn network_checker(
    config: &egress_core::config::EgressCheck,
    clock: Arc<dyn ClockBackend>,
) -> Result<EgressChecker, String> {
    let settings = Settings::from_config(config);
    let trust = trust_of(config.tls.as_ref())?;
    let probe = NetworkProbe::new(
        &settings,
        &config.client_addresses,
        config.source_address.as_deref(),
        &trust,
    )?;
    Ok(EgressChecker::new(settings, Arc::new(probe), clock))
}

/// What the https echoes are trusted by: `egressCheck.tls`, else the system's roots.
pub fn trust_of(
    tls: Option<&egress_core::config::EgressTls>,
) -> Result<egress_check::Trust, String> {
    let Some(tls) = tls else {
        return Ok(egress_check::Trust::System);
    };
    if let Some(Ok(pin)) = tls.pin() {
        return Ok(egress_check::Trust::Pinned(pin));
    }
    if let Some(Err(m)) = tls.pin() {
        return Err(format!("egressCheck.tls.certificateSHA256: {m}"));
    }
    match &tls.ca_file {
        Some(file) => egress_check::Trust::from_ca_file(std::path::Path::new(file))
            .map_err(|e| format!("egressCheck.tls.caFile: {e}")),
        None => Ok(egress_check::Trust::System),
    }
}

/// The probe of real runs: through the proxy, a plain GET to the http echo and a CONNECT
/// tunnel with TLS to the https echo (egress-check), a fresh connection and a nonce each.
pub struct NetworkProbe {
    prober: egress_check::HttpProber,
    /// In the settings' order.
    echoes: Vec<(String, Arc<egress_check::EchoUrl>)>,
    nonces: Arc<dyn egress_check::NonceSource>,
}

impl NetworkProbe {
    /// Probes with the settings' timeout, counting the configured client addresses as the
    /// checker's own, trusting the https echoes by `trust`. Errors name the field at fault.
    pub fn new(
        settings: &Settings,
        client_addresses: &[String],
        source_address: Option<&str>,
        trust: &egress_check::Trust,
    ) -> Result<Self, String> {
        let echoes = settings
            .urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                u.parse::<egress_check::EchoUrl>()
                    .map(|e| (u.clone(), Arc::new(e)))
                    .map_err(|e| format!("egressCheck.urls[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let extra_own_addresses = client_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        let prober = egress_check::HttpProber::with_trust(
            egress_check::ProbeOptions {
                timeout: settings.timeout,
                extra_own_addresses,
                local_address: source_address.and_then(|a| a.parse().ok()),
                ..Default::default()
            },
            trust,
        )
        .map_err(|e| format!("egressCheck.tls: {e}"))?;
        Ok(Self {
            prober,
            echoes,
            nonces: Arc::new(egress_check::SeededNonces::from_entropy()),
        })
    }
}

fn reason_of(r: egress_check::Reason) -> CheckReason {
    use egress_check::Reason as R;
    match r {
        R::Verified => CheckReason::Verified,
        R::ProxyUnreachable => CheckReason::ProxyUnreachable,
        R::ProxyRefused => CheckReason::ProxyRefused,
        R::Timeout => CheckReason::Timeout,
        R::BadEcho => CheckReason::BadEcho,
        R::NotAnonymous => CheckReason::NotAnonymous,
        R::CheckerUnavailable => CheckReason::CheckerUnavailable,
        R::TunnelRefused => CheckReason::TunnelRefused,
        R::TlsFailed => CheckReason::TlsFailed,
    }
}

#[async_trait::async_trait]
impl EgressProbe for NetworkProbe {
    async fn probe(
        &self,
        ip: &str,
        port: u16,
        _settings: &Settings,
        chosen: &Chosen,
    ) -> CheckResult {
        let Ok(addr) = ip.parse::<std::net::IpAddr>() else {
            return CheckResult {
                reason: CheckReason::ProxyUnreachable,
                egress_ip: None,
                latency_ms: None,
                message: format!("{ip:?} is not an IP address"),
            };
        };
        let own: Vec<std::net::IpAddr> = chosen
            .own_addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        let requests: Vec<egress_check::ProbeRequest> = chosen
            .urls
            .iter()
            .filter_map(|u| self.echoes.iter().find(|(text, _)| text == u))
            .map(|(_, echo)| egress_check::ProbeRequest {
                proxy: Some(std::net::SocketAddr::new(addr, port)),
                echo: echo.clone(),
                nonce: self.nonces.next_nonce(),
                client_addresses: own.clone(),
                proxy_authorization: chosen.proxy_authorization.clone(),
            })
            .collect();
        let out = egress_check::probe_all(&self.prober, &requests).await;
        CheckResult {
            reason: reason_of(out.reason),
            egress_ip: out.egress_ip.map(|a| a.to_string()),
            latency_ms: out.latency_ms,
            message: out.message,
        }
    }

    async fn look(&self, _settings: &Settings) -> EchoLook {
        let looks = self.echoes.iter().map(|(_, echo)| {
            let request =
                egress_check::ProbeRequest::new(None, echo.clone(), self.nonces.next_nonce());
            async move { egress_check::Prober::probe(&self.prober, &request).await }
        });
        let outcomes = futures::future::join_all(looks).await;
        let mut look = EchoLook::default();
        for ((url, _), out) in self.echoes.iter().zip(outcomes) {
            // Seeing the checker itself is expected without a proxy: answering is what counts.
            let up = out.is_verified() || out.reason == egress_check::Reason::NotAnonymous;
            look.up.push(up);
            if up {
                if let Some(ip) = out.egress_ip.map(|a| a.to_string())
                    && !look.origins.contains(&ip)
                {
                    look.origins.push(ip);
                }
            } else {
                look.why_down.push(format!("{url}: {}", out.message));
            }
        }
        look
    }
}
