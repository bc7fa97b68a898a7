//! The gateways' demand, carried to the replica that decides. Every replica keeps a board of
//! what reached it ([`egress_control::demand::DemandBoard`]): a gateway's `POST /v1/demand`
//! lands on whichever replica the Service picks, a waiting lease request on the one it
//! reached. The leader reads every replica's board (`GET /v1/demand`) each [`READ_EVERY`] and
//! takes it into its own; each pool whose demand that changes is reconciled at once.
//!
//! The replicas are named by `--demand-peers`: base URLs whose host names every replica (a
//! headless Service resolves to each Pod's address). The host is resolved again every round,
//! and each address is read with the URL's host as the TLS name, so one certificate naming
//! the Service serves them all and a replica that comes or goes is seen within a round. The
//! leader reads itself among them and leaves its own board out (a snapshot names its replica).
//!
//! Written here, not with a discovery crate: the reads are three lines of reqwest over
//! tokio's resolver, and the Endpoints of the Service would need a watch (and RBAC on it)
//! for what DNS already answers.

use egress_control::demand::{DemandBoard, Snapshot};
use egress_control::metrics::Metrics;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the leader reads its peers' boards: a demand said to a standby reaches the
/// decision within this and a reconcile.
pub const READ_EVERY: Duration = Duration::from_secs(1);
/// How long one read may take.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The largest answer read: a board's bound ([`egress_control::demand::MAX_ALL_SOURCES`]
/// sources of at most a few hundred bytes each) fits in it.
const MAX_ANSWER: usize = 8 << 20;
/// Addresses read per round at most, over every URL.
const MAX_ADDRESSES: usize = egress_control::demand::MAX_PEERS;

/// Why the peers cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    #[error("--demand-peers: {0:?} is not an https URL with a host (http only to loopback)")]
    Url(String),
    #[error("--demand-peer-ca: {0}")]
    Ca(String),
    #[error("the client for --demand-peers: {0}")]
    Client(String),
}

/// Where the replicas are and how to reach them.
#[derive(Debug, Clone)]
pub struct Peers {
    /// `GET /v1/demand` on each, its host resolved to every replica.
    urls: Vec<reqwest::Url>,
    tls: rustls::ClientConfig,
    /// The token presented (the replica's ServiceAccount token, read again every round: it
    /// is rotated in place); a token the peers let read `/metrics`.
    token: PathBuf,
}

impl Peers {
    /// The replicas of `urls` (base URLs of their API), their certificate issued by `ca`
    /// (PEM), reached with the token in file `token`.
    pub fn new(urls: &[String], ca: Option<&[u8]>, token: PathBuf) -> Result<Self, PeersError> {
        let urls = urls
            .iter()
            .map(|u| board_url(u))
            .collect::<Result<Vec<_>, _>>()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PeersError::Client(e.to_string()))?;
        let https = urls.iter().any(|u| u.scheme() == "https");
        let roots = match ca {
            Some(pem) => egress_serve::peer::roots(pem).map_err(PeersError::Ca)?,
            // The replicas' certificate is the installation's own: no public root issues it.
            None if https => {
                return Err(PeersError::Ca(
                    "none given (the replicas' certificate is the installation's own)".into(),
                ));
            }
            None => rustls::RootCertStore::empty(),
        };
        Ok(Self {
            urls,
            tls: builder.with_root_certificates(roots).with_no_client_auth(),
            token,
        })
    }
}

/// `base` + `/v1/demand`: https, or http to loopback.
fn board_url(base: &str) -> Result<reqwest::Url, PeersError> {
    egress_serve::peer::url(base, "/v1/demand").map_err(|_| PeersError::Url(base.to_string()))
}

/// Reads `peers`' boards into `board` every [`READ_EVERY`], until dropped; each read counted
/// in `metrics` by result.
pub async fn read(board: Arc<DemandBoard>, peers: Peers, metrics: Arc<Metrics>) {
    let mut clients: BTreeMap<(String, SocketAddr), reqwest::Client> = BTreeMap::new();
    let mut tick = tokio::time::interval(READ_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let count = |result: &str, n: u64| {
        metrics
            .demand_peer_reads
            .get_or_create(&vec![("result".into(), result.into())])
            .inc_by(n);
    };
    loop {
        tick.tick().await;
        let token = match std::fs::read_to_string(&peers.token) {
            Ok(t) => t.trim().to_string(),
            Err(e) => {
                tracing::warn!(file = %peers.token.display(), error = %e, "the token for the demand peers could not be read");
                count("failed", 1);
                continue;
            }
        };
        let mut targets = Vec::new();
        for url in &peers.urls {
            let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
                continue;
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            match tokio::net::lookup_host((host, port)).await {
                Ok(addrs) => targets.extend(addrs.map(|a| (url, host.to_string(), a))),
                Err(e) => {
                    tracing::debug!(peer = %url, error = %e, "a demand peer's name did not resolve");
                    count("failed", 1);
                }
            }
        }
        targets.truncate(MAX_ADDRESSES);
        // A client per address, kept while the address is: its connection is reused.
        let seen: std::collections::BTreeSet<(String, SocketAddr)> =
            targets.iter().map(|(_, h, a)| (h.clone(), *a)).collect();
        clients.retain(|k, _| seen.contains(k));
        for (_, host, addr) in &targets {
            if clients.contains_key(&(host.clone(), *addr)) {
                continue;
            }
            match client_for(&peers.tls, host, *addr) {
                Ok(c) => {
                    clients.insert((host.clone(), *addr), c);
                }
                Err(e) => tracing::warn!(error = %e, "no client for a demand peer"),
            }
        }
        let reads = futures::future::join_all(targets.iter().filter_map(|(url, host, addr)| {
            let client = clients.get(&(host.clone(), *addr))?.clone();
            let token = token.clone();
            Some(async move { (*addr, read_one(&client, url, &token).await) })
        }))
        .await;
        for (addr, read) in reads {
            let taken = read.and_then(|snapshot| {
                board.take_peer(&addr.to_string(), snapshot, std::time::Instant::now())
            });
            match taken {
                Ok(()) => count("ok", 1),
                Err(e) => {
                    tracing::debug!(peer = %addr, error = %e, "a demand peer's board could not be read");
                    count("failed", 1);
                }
            }
        }
    }
}

/// A client that reaches `host` at `addr` alone, verifying the certificate for `host`.
fn client_for(
    tls: &rustls::ClientConfig,
    host: &str,
    addr: SocketAddr,
) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .referer(false)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .resolve(host, addr)
        .tls_backend_preconfigured(tls.clone())
        .build()
        .map_err(|e| e.to_string())
}

async fn read_one(
    client: &reqwest::Client,
    url: &reqwest::Url,
    token: &str,
) -> Result<Snapshot, String> {
    egress_serve::peer::get_json(client, url, token, MAX_ANSWER).await
}

/// The pools whose demand changed on `board`, as the pool controller's wake-ups.
pub fn pools_changed(
    board: Arc<DemandBoard>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<egress_k8s_api::crd::ProxyPool>>
+ Send
+ 'static {
    futures::stream::unfold(
        (board, std::collections::VecDeque::<(String, String)>::new()),
        |(board, mut pending)| async move {
            loop {
                if let Some((namespace, name)) = pending.pop_front() {
                    let r = kube::runtime::reflector::ObjectRef::new(&name).within(&namespace);
                    return Some((r, (board, pending)));
                }
                board.pools_changed().await;
                pending.extend(board.take_changed());
            }
        },
    )
}
