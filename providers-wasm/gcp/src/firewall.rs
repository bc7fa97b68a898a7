//! The optional firewall rule: one per provider, opening the proxy ports to the instances
//! carrying the network tag from the configured source ranges. Created once; a Proxy on a port
//! the rule does not list yet adds it.

use crate::api::Api;
use crate::config::GcpConfig;
use crate::errors::classify;
use guest_sdk::{Level, ProviderError};
use serde_json::{Value, json};

/// `egress-proxies-<provider>`, cut to the 63 characters a resource name allows.
pub fn rule_name(provider: &str) -> String {
    let mut name = format!("egress-proxies-{provider}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

/// The rule's body for `ports` (pure).
pub fn build_rule(provider: &str, cfg: &GcpConfig, ports: &[u16]) -> Value {
    json!({
        "name": rule_name(provider),
        "description": format!("egress-proxies: Squid ports of provider {provider}"),
        "network": cfg.network_path(),
        "direction": "INGRESS",
        "priority": 1000,
        "targetTags": [cfg.network_tag],
        "sourceRanges": cfg.allowed_source_cidrs,
        "allowed": [{
            "IPProtocol": "tcp",
            "ports": ports.iter().map(u16::to_string).collect::<Vec<_>>(),
        }],
    })
}

fn listed_ports(rule: &Value) -> Vec<u16> {
    rule["allowed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["IPProtocol"] == "tcp")
        .flat_map(|a| a["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p.as_str().and_then(|p| p.parse().ok()))
        .collect()
}

/// Ensures the rule exists and admits `port`.
pub fn ensure(
    api: &Api<'_>,
    provider: &str,
    cfg: &GcpConfig,
    port: u16,
) -> Result<(), ProviderError> {
    let name = rule_name(provider);
    match api.get(&format!("global/firewalls/{name}")) {
        Ok(rule) => {
            let mut ports = listed_ports(&rule);
            let ranges_match = rule["sourceRanges"] == json!(cfg.allowed_source_cidrs);
            if ports.contains(&port) && ranges_match {
                return Ok(());
            }
            if !ports.contains(&port) {
                ports.push(port);
            }
            ports.sort_unstable();
            let patch = json!({
                "sourceRanges": cfg.allowed_source_cidrs,
                "allowed": build_rule(provider, cfg, &ports)["allowed"],
            });
            api.patch(&format!("global/firewalls/{name}"), &patch)
                .map_err(|e| classify("patch firewall rule", &e))?;
            api.host().log(
                Level::Info,
                "firewall rule updated",
                &[("rule", &name), ("port", &port.to_string())],
            );
            Ok(())
        }
        Err(e) if e.status() == 404 => {
            match api.post("global/firewalls", &build_rule(provider, cfg, &[port])) {
                // 409: a concurrent Create made it first.
                Ok(_) => {}
                Err(e) if e.status() == 409 => {}
                Err(e) => return Err(classify("insert firewall rule", &e)),
            }
            api.host().log(
                Level::Info,
                "firewall rule created",
                &[("rule", &name), ("port", &port.to_string())],
            );
            Ok(())
        }
        Err(e) => Err(classify("get firewall rule", &e)),
    }
}
