//! `egress-proxies gateway`: the gateway crate wired to its members and its callers. In a
//! cluster the members come from the Proxies and callers are reviewed by the API server (or
//! named tokens); out of one the members come from the state file `reconcile --watch` keeps,
//! with its leases and credentials beside it, read again whenever one of them changes.

use crate::cli::GatewayArgs;
use crate::error::CliError;
use crate::state::LeaseFile;
use crate::state::StateFile;
use egress_control::credential_store::FileCredentials;
use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use egress_serve::auth::{self, Guard};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The members the state at `state` holds now, with their leases and credentials.
pub fn members_from_state(state: &Path) -> Result<Vec<Member>, CliError> {
    let file = StateFile::read(state)?;
    let leases = LeaseFile::read(&LeaseFile::path_for(state))?;
    let credentials =
        FileCredentials::open(FileCredentials::path_for(state)).map_err(CliError::Runtime)?;
    let now = egress_time::now::unix_now();
    let mut out = Vec::new();
    for stored in file.proxies.values() {
        let mut p = stored.clone();
        leases.overlay(&mut p);
        let credential = credentials.get(&p.uid);
        let c = p.candidate(credential.as_ref(), now);
        if let Some(m) = Member::from_candidate(&c, p.retiring().map(|(at, _)| at)) {
            out.push(m);
        }
    }
    Ok(out)
}

/// What the files behind a state say, to tell a change: their modification times and sizes.
fn stamp(state: &Path) -> Vec<Option<(std::time::SystemTime, u64)>> {
    let files: [PathBuf; 3] = [
        state.to_path_buf(),
        LeaseFile::path_for(state),
        FileCredentials::path_for(state),
    ];
    let mut journal = state.as_os_str().to_owned();
    journal.push(".journal");
    files
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new(&journal)])
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// However often the files are looked at, the members are read again at least this often:
/// leases end and drains fall due by the clock, not by a write.
const REREAD: Duration = Duration::from_secs(10);

/// Keeps `table` to the state at `state`, read again when its files change (looked at every
/// `interval`: a quarantine or a lease the API writes reaches routing within it) and at least
/// every [`REREAD`]. A state that cannot be read keeps the last members, and says why once
/// per change of reason.
pub async fn follow_state(state: PathBuf, table: Arc<MemberTable>, interval: Duration) {
    let mut last_stamp = None;
    let mut last_error: Option<String> = None;
    let mut read_at = std::time::Instant::now();
    loop {
        let now = stamp(&state);
        if last_stamp.as_ref() != Some(&now) || read_at.elapsed() >= REREAD {
            read_at = std::time::Instant::now();
            match members_from_state(&state) {
                Ok(members) => {
                    table.replace(members, true);
                    last_stamp = Some(now);
                    last_error = None;
                }
                Err(e) => {
                    let why = e.to_string();
                    if last_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(error = %why, "the state could not be read; the gateway keeps its last members");
                        last_error = Some(why);
                    }
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// The pools of the file at `path` (ProxyPool documents, as `reconcile -f` reads it): their
/// `quarantine` and `politeness`, by pool.
pub fn pool_policies(path: &Path) -> Result<PoolPolicies, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::Input {
        what: path.display().to_string(),
        message: e.to_string(),
    })?;
    let inputs = crate::inputs::parse_inputs(&text, &path.display().to_string())?;
    let mut policies = PoolPolicies::default();
    for p in &inputs.pools {
        let problems = egress_core::pool::validate(p);
        if !problems.is_empty() {
            return Err(CliError::Input {
                what: format!(
                    "{}: ProxyPool {}/{}",
                    path.display(),
                    p.metadata.namespace,
                    p.metadata.name
                ),
                message: problems.join("; "),
            });
        }
        let key = PoolKey {
            namespace: p.metadata.namespace.clone(),
            name: p.metadata.name.clone(),
        };
        policies
            .quarantine
            .insert(key.clone(), p.spec.quarantine_policy());
        if let Some(a) = &p.spec.autoscale {
            policies.autoscale.insert(key.clone(), a.clone());
        }
        if let Some(polite) = &p.spec.politeness {
            policies.politeness.insert(key, polite.clone());
        }
    }
    Ok(policies)
}

/// Pools' `quarantine`, `politeness` and `autoscale`, by pool.
#[derive(Debug, Default)]
pub struct PoolPolicies {
    pub quarantine: std::collections::BTreeMap<PoolKey, egress_core::target::QuarantinePolicy>,
    pub politeness: std::collections::BTreeMap<PoolKey, egress_core::politeness::PolitenessPolicy>,
    pub autoscale: std::collections::BTreeMap<PoolKey, egress_core::autoscale::AutoscalePolicy>,
}

impl PoolPolicies {
    /// Puts them in force on `table`.
    pub fn apply(self, table: &MemberTable) {
        table.set_quarantine_policies(self.quarantine);
        table.set_politeness_policies(self.politeness);
        table.set_autoscale_policies(self.autoscale);
    }
}

/// Keeps `table`'s pool policies to the file at `path`, read again when it changes; a file
/// that cannot be read keeps the last ones, and says why once per change of reason.
pub async fn follow_pools(path: PathBuf, table: Arc<MemberTable>, interval: Duration) {
    let mut last_stamp = None;
    let mut last_error: Option<String> = None;
    loop {
        let now = std::fs::metadata(&path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        if last_stamp != Some(now) {
            match pool_policies(&path) {
                Ok(p) => {
                    p.apply(&table);
                    last_stamp = Some(now);
                    last_error = None;
                }
                Err(e) => {
                    let why = e.to_string();
                    if last_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(error = %why, "the pools could not be read; the gateway keeps their last policies");
                        last_error = Some(why);
                    }
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Runs the gateway until `stop`; then it takes no new connection and gives the open tunnels
/// up to `--shutdown-grace` to end.
pub async fn run(
    a: GatewayArgs,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    let tls = a.tls.mode("--listen").map_err(|message| CliError::Input {
        what: "--listen".into(),
        message,
    })?;
    let socks_tls = match (a.socks_listen, &tls, a.socks_plaintext) {
        (None, _, _) => None,
        (Some(_), egress_serve::tls::Mode::Tls { .. }, false) => Some(true),
        (Some(_), egress_serve::tls::Mode::Plaintext, true) => Some(false),
        (Some(_), _, _) => {
            return Err(CliError::Input {
                what: "--socks-listen".into(),
                message: "--socks-listen carries its callers' tokens: serve it over TLS with --tls-cert and --tls-key, or in clear with --socks-plaintext (on loopback or a node-local address only)".into(),
            });
        }
    };
    if a.http2_stream_window > a.http2_connection_window {
        return Err(CliError::Input {
            what: "--http2-stream-window".into(),
            message: format!(
                "{} is more than --http2-connection-window ({}): one stalled stream would stall its connection",
                a.http2_stream_window, a.http2_connection_window
            ),
        });
    }
    let pools = a
        .pools
        .iter()
        .map(|p| {
            PoolKey::parse(p).map_err(|message| CliError::Input {
                what: "--pool".into(),
                message,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tokens = a
        .api_tokens
        .as_deref()
        .map(auth::tokens::TokensFile::load)
        .transpose()
        .map_err(|e| CliError::Input {
            what: "--api-tokens".into(),
            message: e.to_string(),
        })?
        .map(Arc::new);
    let table = Arc::new(MemberTable::new(pools));
    let client = match &a.state {
        Some(state) => {
            // Read once before serving: a state (or pools file) that cannot be read stops
            // the start.
            table.replace(members_from_state(state)?, true);
            if let Some(pools) = &a.pools_from {
                pool_policies(pools)?.apply(&table);
                tokio::spawn(follow_pools(
                    pools.clone(),
                    table.clone(),
                    a.reload_interval,
                ));
            }
            tokio::spawn(follow_state(
                state.clone(),
                table.clone(),
                a.reload_interval,
            ));
            None
        }
        None => {
            let config = kube::Config::infer()
                .await
                .map_err(|e| CliError::Runtime(format!("Kubernetes config: {e}")))?;
            let own_namespace = std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| config.default_namespace.clone());
            let secret = match &a.credential_secret {
                Some(s) => PoolKey::parse(s).map_err(|message| CliError::Input {
                    what: "--credential-secret".into(),
                    message,
                })?,
                None => PoolKey {
                    namespace: own_namespace,
                    name: egress_k8s_api::secrets::GATEWAY_SECRET.to_string(),
                },
            };
            let client = kube::Client::try_from(config)
                .map_err(|e| CliError::Runtime(format!("Kubernetes config: {e}")))?;
            tokio::spawn(egress_gateway::cluster::run(
                client.clone(),
                table.clone(),
                (secret.namespace, secret.name),
            ));
            Some(client)
        }
    };
    let reviewer: Arc<dyn auth::Reviewer> = match (&tokens, client) {
        (Some(t), _) => t.clone(),
        (None, Some(c)) => Arc::new(a.audiences.reviewer(c)),
        (None, None) => {
            return Err(CliError::Input {
                what: "--api-tokens".into(),
                message:
                    "out of a cluster (--state) crawlers present named tokens: pass --api-tokens"
                        .into(),
            });
        }
    };
    let guard = Arc::new(Guard::new(reviewer));
    if let Some(t) = tokens {
        tokio::spawn(t.watch(guard.clone(), a.reload_interval));
    }
    let bind = |addr: std::net::SocketAddr| async move {
        egress_gateway::listen(addr)
            .map_err(|e| CliError::Runtime(format!("listening on {addr}: {e}")))
    };
    let listener = bind(a.listen).await?;
    let admin = bind(a.admin_listen).await?;
    let socks = match a.socks_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let limits = Limits {
        timeouts: egress_gateway::forward::Timeouts {
            connect: a.connect_timeout,
            idle: a.idle_timeout,
            source: a.source_address,
            ..Default::default()
        },
        max_connections: a.max_connections,
        unauthenticated_timeout: a.unauthenticated_timeout,
        unauthenticated_per_source: a.max_unauthenticated_per_source,
        replica: egress_core::politeness::Share::replica(a.replica.0, a.replica.1),
        http2: egress_gateway::h2::Http2Limits {
            max_concurrent_streams: a.http2_max_streams,
            stream_window: a.http2_stream_window,
            connection_window: a.http2_connection_window,
            send_buffer: a.http2_send_buffer as usize,
            keep_alive_interval: a.http2_keepalive_interval,
            keep_alive_timeout: a.http2_keepalive_timeout,
            ..Default::default()
        },
        ..Limits::default()
    };
    let metrics = Arc::new(egress_gateway::metrics::Metrics::new());
    let mut gateway = Gateway::new(table, guard, metrics.clone(), limits);
    if let Some(url) = &a.reports_to {
        let ca = a
            .reports_ca
            .as_deref()
            .map(|f| {
                std::fs::read(f).map_err(|e| CliError::Input {
                    what: "--reports-ca".into(),
                    message: format!("{}: {e}", f.display()),
                })
            })
            .transpose()?;
        let (reports, sending) =
            egress_gateway::reports::Reports::start(url, ca.as_deref(), metrics.clone()).map_err(
                |e| CliError::Input {
                    what: match e {
                        egress_gateway::reports::ReportsError::Ca(_) => "--reports-ca",
                        _ => "--reports-to",
                    }
                    .into(),
                    message: e.to_string(),
                },
            )?;
        tokio::spawn(sending);
        gateway = gateway.with_reports(reports);
        // The replica's name, so replicas' demands add up rather than overwrite: its Pod's
        // name in a cluster, its host's and process's out of one.
        let from = std::env::var("POD_NAME").unwrap_or_else(|_| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        });
        let (demand, saying) =
            egress_gateway::demand::Demand::start(url, ca.as_deref(), &from, metrics.clone())
                .map_err(|e| CliError::Input {
                    what: "--reports-to".into(),
                    message: e.to_string(),
                })?;
        tokio::spawn(saying);
        gateway = gateway.with_demand(demand);
    }
    if let Some(sink) = a.audit.sink() {
        gateway = gateway.with_audit(sink).map_err(|e| CliError::Input {
            what: "--audit-log".into(),
            message: e.to_string(),
        })?;
    }
    if let Some(file) = &a.quotas {
        let quotas = egress_gateway::quota::Quotas::load(file).map_err(|e| CliError::Input {
            what: "--quotas".into(),
            message: e.to_string(),
        })?;
        gateway = gateway.with_quotas(quotas);
        if !a.quota_peers.is_empty() {
            let read = |what: &str, f: &std::path::Path| {
                std::fs::read(f).map_err(|e| CliError::Input {
                    what: what.into(),
                    message: format!("{}: {e}", f.display()),
                })
            };
            // Read once here, so a missing file stops the start; again for every round, as
            // a projected ServiceAccount token is rotated in place.
            let token = match &a.quota_peer_token_file {
                Some(f) => {
                    read("--quota-peer-token-file", f)?;
                    egress_gateway::quota::PeerToken::File(f.clone())
                }
                None => egress_gateway::quota::PeerToken::Fixed(String::new()),
            };
            // Every replica takes the same list: the one naming this replica's own Pod (its
            // host's first label is POD_NAME) is left out.
            let own = std::env::var("POD_NAME").ok();
            let peers: Vec<String> = a
                .quota_peers
                .iter()
                .filter(|p| !names_pod(p, own.as_deref()))
                .cloned()
                .collect();
            let ca = a
                .quota_peer_ca
                .as_deref()
                .map(|f| read("--quota-peer-ca", f))
                .transpose()?;
            // Its own URL, as the others read it: at start it takes back its counts of the day
            // from what they last read (a restart forgets nothing they saw).
            let me = a.quota_peers.iter().find(|p| names_pod(p, own.as_deref()));
            gateway = gateway
                .with_quota_peers(&peers, me.map(String::as_str), ca.as_deref(), token)
                .map_err(|e| CliError::Input {
                    what: "--quota-peers".into(),
                    message: e.to_string(),
                })?;
        }
    }
    let gateway = Arc::new(gateway);
    let transport = tls
        .start(a.reload_interval, "the gateway")
        .map_err(|e| CliError::Input {
            what: "--tls-cert".into(),
            message: e.to_string(),
        })?;
    tracing::info!(listen = %a.listen, admin = %a.admin_listen, scheme = tls.scheme(), "gateway serving");
    tokio::spawn(egress_gateway::admin::serve_admin_over(
        admin,
        gateway.clone(),
        transport.clone(),
    ));
    if let (Some(socks), Some(over_tls)) = (socks, socks_tls) {
        // Over the HTTP listener's TLS, its certificate reloaded with it.
        let socks_transport = if over_tls {
            transport.clone()
        } else {
            egress_serve::tls::Transport::Plaintext
        };
        tracing::info!(listen = ?a.socks_listen, tls = over_tls, "gateway serving SOCKS5");
        tokio::spawn(egress_gateway::socks::serve_socks(
            socks,
            gateway.clone(),
            socks_transport,
        ));
    }
    tokio::select! {
        () = egress_gateway::serve_over(listener, gateway.clone(), transport) => {}
        () = stop => {}
    }
    let open = gateway.tunnels_open();
    if open > 0 {
        tracing::info!(tunnels = open, grace = ?a.shutdown_grace, "stopping: waiting for the open tunnels");
        gateway.drained(a.shutdown_grace).await;
    }
    Ok(())
}

/// Runs `gateway` until `stop`: exit code 1 on an error.
pub async fn command(a: GatewayArgs, stop: impl std::future::Future<Output = ()>) -> ExitCode {
    super::exit(run(a, stop).await)
}

/// Whether peer URL `url`'s host is Pod `pod`'s own name under its StatefulSet's Service
/// (`https://POD.SERVICE.NAMESPACE.svc:9090`).
fn names_pod(url: &str, pod: Option<&str>) -> bool {
    let Some(pod) = pod.filter(|p| !p.is_empty()) else {
        return false;
    };
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    host.split('.').next() == Some(pod)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const POOL: &str = "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {name: web, namespace: ns}\nspec:\n  replicas: 2\n  template: {port: 3128}\n  placements: [{provider: p}]\n";

    /// The pools file gives each pool's quarantine (its defaults where it sets none) and its
    /// politeness; a pool that does not validate is refused naming the file, the pool and the
    /// field.
    #[test]
    fn the_pools_file_gives_each_pools_quarantine_and_politeness_or_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pools.yaml");
        std::fs::write(
            &f,
            format!(
                "{POOL}  quarantine: {{maxQuarantinedPercent: 20}}\n  politeness: {{targets: [{{match: '*.example.com', perAddress: {{every: 5s}}}}]}}\n---\n{}",
                POOL.replace("name: web", "name: api")
            ),
        )
        .unwrap();
        let p = pool_policies(&f).unwrap();
        let key = |name: &str| PoolKey {
            namespace: "ns".into(),
            name: name.into(),
        };
        assert_eq!(p.quarantine[&key("web")].max_quarantined_percent, 20);
        assert_eq!(p.quarantine[&key("api")].max_quarantined_percent, 50);
        assert_eq!(
            p.politeness[&key("web")].targets[0]
                .per_address
                .every
                .as_deref(),
            Some("5s")
        );
        assert!(!p.politeness.contains_key(&key("api")));

        std::fs::write(
            &f,
            format!(
                "{POOL}  politeness: {{targets: [{{match: 'a b', perAddress: {{every: 5s}}}}]}}\n"
            ),
        )
        .unwrap();
        let e = pool_policies(&f).unwrap_err().to_string();
        assert!(
            e.contains("ProxyPool ns/web") && e.contains("spec.politeness.targets[0].match"),
            "{e}"
        );
    }

    #[test]
    fn a_replica_leaves_out_the_peer_url_naming_its_own_pod() {
        let url =
            "https://egress-proxies-gateway-0.egress-proxies-gateway-peers.egress-proxies.svc:9090";
        assert!(super::names_pod(url, Some("egress-proxies-gateway-0")));
        assert!(!super::names_pod(url, Some("egress-proxies-gateway-1")));
        assert!(!super::names_pod(url, Some("egress-proxies-gateway")));
        assert!(!super::names_pod(url, None));
    }
}
