//! `run`: the operator in a cluster (see egress-operator), from its command line.

use super::{exit, failed};
use crate::cli::RunArgs;
use std::process::ExitCode;

/// Runs the operator until it stops: exit code 1 on an error.
pub async fn command(a: RunArgs) -> ExitCode {
    let api_tls = match a.tls.mode("--listen") {
        Ok(m) => m,
        Err(e) => return failed(e),
    };
    let demand_peers = if a.demand_peers.is_empty() {
        None
    } else {
        let ca = match &a.demand_peer_ca {
            Some(f) => match std::fs::read(f) {
                Ok(pem) => Some(pem),
                Err(e) => return failed(format!("--demand-peer-ca {}: {e}", f.display())),
            },
            None => None,
        };
        match egress_operator::demand::Peers::new(
            &a.demand_peers,
            ca.as_deref(),
            a.demand_peer_token_file.clone(),
        ) {
            Ok(p) => Some(p),
            Err(e) => return failed(e),
        }
    };
    let opts = egress_operator::Options {
        demand_peers,
        quotas: a.quotas,
        api_tls,
        token_audiences: a.audiences.token.clone(),
        metrics_token_audiences: a.audiences.metrics.clone(),
        providers: a.providers,
        namespace: a.namespace,
        lease_name: a.lease,
        identity: a.identity,
        listen: a.listen,
        probe_listen: a.probe_listen,
        gc_interval: a.gc_interval,
        gc_grace: a.gc_grace,
        health_interval: a.health_interval,
        reload_interval: a.reload_interval,
        concurrency: a.concurrency,
        api_tokens: a.api_tokens,
        webhook: match (a.webhook_listen, a.webhook_cert, a.webhook_key) {
            (Some(listen), Some(cert), Some(key)) => {
                Some(egress_operator::WebhookOptions { listen, cert, key })
            }
            // clap requires all three together.
            _ => None,
        },
        max_replicas: a.max_replicas,
        audit: a.audit.sink(),
    };
    exit(egress_operator::run(opts).await)
}
