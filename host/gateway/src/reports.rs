//! The gateway's own quarantine signals carried to the lease API (`POST /v1/reports`), where
//! they are written on the member's Proxy status: every gateway replica reads that status (the
//! Proxy watch in a cluster, the lease file beside the state out of one), and so does the
//! operator, so one replica's signal changes routing on all of them and outlives a restart.
//!
//! A signal goes on as its caller's own report, with the caller's own token (over TLS, or in
//! clear on loopback only): the API counts it once per holder and bounds each holder's rate,
//! as it does for the crawler's direct reports, and a report the caller may not make (another
//! namespace's pool, a proxy another holder leases) is refused there as it would be for the
//! caller. The replica's own record holds meanwhile, so routing on this replica changes at
//! once and does not wait for the round trip.
//!
//! Sending never holds the request that signalled: signals wait in a bounded queue (full, a
//! signal is dropped and counted) and are posted by one task, a few at once, each within a
//! timeout.

use crate::members::PoolKey;
use crate::metrics::Metrics;
use egress_serve::auth::Token;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Signals waiting to be sent at most: past it a new one is dropped (the replica's own
/// record still holds it).
pub const QUEUE: usize = 1024;
/// Reports in flight to the API at once.
const IN_FLIGHT: usize = 8;
/// One report's whole exchange with the API.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The longest answer read from the API (its error bodies are a line).
const MAX_ANSWER: usize = 4096;

/// One signal to send: the member, the target and the caller it is reported for.
pub struct Outgoing {
    pub pool: PoolKey,
    pub proxy: String,
    pub target: String,
    pub retry_after: Option<Duration>,
    pub token: Token,
}

/// Where the reports go wrong before a byte is sent.
#[derive(Debug, thiserror::Error)]
pub enum ReportsError {
    #[error("{0}: not a URL")]
    Url(String),
    #[error(
        "{0}: reports carry their callers' tokens: the API's URL is https, or http on a loopback address"
    )]
    Clear(String),
    #[error("the CA certificates: {0}")]
    Ca(String),
    #[error("the HTTP client: {0}")]
    Client(String),
}

/// The `/v1/reports` URL of the API at `base`: https, or http to a loopback address, where
/// no token crosses a network.
pub fn reports_url(base: &str) -> Result<reqwest::Url, ReportsError> {
    api_url(base, "/v1/reports")
}

/// `path` under `base`, an https URL or an http one to a loopback address: what the gateway
/// sends carries a token, which never crosses a network in clear.
pub fn api_url(base: &str, path: &str) -> Result<reqwest::Url, ReportsError> {
    egress_serve::peer::url(base, path).map_err(|e| match e {
        egress_serve::peer::UrlError::Malformed(u) => ReportsError::Url(u),
        egress_serve::peer::UrlError::Clear(u) => ReportsError::Clear(u),
    })
}

/// The sending side the gateway holds.
pub struct Reports {
    queue: mpsc::Sender<Outgoing>,
    metrics: Arc<Metrics>,
}

impl Reports {
    /// Reports to the API at `base` (its root URL), trusting the CA certificates in PEM
    /// `ca` if given (the platform's roots otherwise). The returned task sends them; the
    /// caller runs it.
    pub fn start(
        base: &str,
        ca: Option<&[u8]>,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, impl std::future::Future<Output = ()> + Send + 'static), ReportsError> {
        let url = reports_url(base)?;
        let client = client(ca)?;
        let (queue, rx) = mpsc::channel(QUEUE);
        let sender = Sender {
            client,
            url,
            metrics: metrics.clone(),
        };
        Ok((Self { queue, metrics }, sender.run(rx)))
    }

    /// Queues `o`, or drops it when the queue is full.
    pub(crate) fn send(&self, o: Outgoing) {
        if self.queue.try_send(o).is_err() {
            self.metrics.report_forwarded("dropped");
        }
    }
}

/// The client of the API: rustls with ring, `ca` alone as roots when given, no environment
/// proxy, no redirect (a redirect would carry the token elsewhere).
pub(crate) fn client(ca: Option<&[u8]>) -> Result<reqwest::Client, ReportsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ReportsError::Client(e.to_string()))?;
    let config = match ca {
        Some(pem) => {
            let roots = egress_serve::peer::roots(pem).map_err(ReportsError::Ca)?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => {
            let verifier = rustls_platform_verifier::Verifier::new(provider)
                .map_err(|e| ReportsError::Client(format!("no system TLS roots: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
    };
    reqwest::Client::builder()
        .no_proxy()
        .referer(false)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .tls_backend_preconfigured(config)
        .build()
        .map_err(|e| ReportsError::Client(e.to_string()))
}

struct Sender {
    client: reqwest::Client,
    url: reqwest::Url,
    metrics: Arc<Metrics>,
}

impl Sender {
    async fn run(self, rx: mpsc::Receiver<Outgoing>) {
        let this = &self;
        tokio_stream_of(rx)
            .for_each_concurrent(IN_FLIGHT, |o| async move {
                let result = this.post(&o).await;
                this.metrics.report_forwarded(result);
            })
            .await;
    }

    /// Posts `o`: `ok`, `refused` (the API answered 4xx: the caller may not, or is past its
    /// rate) or `failed` (no answer, or 5xx).
    async fn post(&self, o: &Outgoing) -> &'static str {
        let mut body = serde_json::json!({
            "namespace": o.pool.namespace,
            "pool": o.pool.name,
            "proxy": o.proxy,
            "target": o.target,
        });
        if let Some(r) = o.retry_after {
            body["retryAfter"] = serde_json::json!(r.as_secs());
        }
        let sent = self
            .client
            .post(self.url.clone())
            .bearer_auth(o.token.secret())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await;
        let mut answer = match sent {
            Ok(a) => a,
            Err(e) => {
                // reqwest's error names the URL (no token is in it) and the cause.
                tracing::warn!(error = %e, proxy = %o.proxy, "a quarantine report could not be sent to the API");
                return "failed";
            }
        };
        let status = answer.status();
        if status.is_success() {
            return "ok";
        }
        // The reason, a line at most, bounded.
        let mut why = Vec::new();
        while let Ok(Some(chunk)) = answer.chunk().await {
            why.extend_from_slice(&chunk);
            if why.len() >= MAX_ANSWER {
                break;
            }
        }
        why.truncate(MAX_ANSWER);
        let why = String::from_utf8_lossy(&why);
        let why = why.lines().next().unwrap_or_default();
        tracing::warn!(
            status = status.as_u16(),
            reason = why,
            namespace = %o.pool.namespace,
            pool = %o.pool.name,
            proxy = %o.proxy,
            "the API did not take a quarantine report"
        );
        if status.is_client_error() {
            "refused"
        } else {
            "failed"
        }
    }
}

/// The queue as a stream (tokio's receiver polled one by one).
fn tokio_stream_of(mut rx: mpsc::Receiver<Outgoing>) -> impl futures::Stream<Item = Outgoing> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Past the queue's bound a signal is dropped and counted, never held: a flood of signals
    /// costs at most the queue, whatever the API does.
    #[test]
    fn past_the_queue_a_signal_is_dropped_and_counted() {
        let metrics = Arc::new(Metrics::new());
        // The sending task is never run: nothing leaves the queue.
        let (reports, _sending) =
            Reports::start("http://127.0.0.1:9", None, metrics.clone()).unwrap();
        let pool = PoolKey {
            namespace: "ns".into(),
            name: "web".into(),
        };
        for i in 0..QUEUE + 3 {
            reports.send(Outgoing {
                pool: pool.clone(),
                proxy: format!("web-{i}"),
                target: "example.com".into(),
                retry_after: None,
                token: Token::new("t"),
            });
        }
        let dropped = metrics
            .reports_forwarded
            .get_or_create(&vec![("result".into(), "dropped".into())])
            .get();
        assert_eq!(dropped, 3);
    }

    #[test]
    fn the_api_is_https_or_loopback_and_the_path_is_the_reports() {
        assert_eq!(
            reports_url("https://api.egress.svc:8443").unwrap().as_str(),
            "https://api.egress.svc:8443/v1/reports"
        );
        assert_eq!(
            reports_url("https://api.example/base/?x=1")
                .unwrap()
                .as_str(),
            "https://api.example/base/v1/reports"
        );
        assert_eq!(
            reports_url("http://127.0.0.1:9000").unwrap().as_str(),
            "http://127.0.0.1:9000/v1/reports"
        );
        assert!(reports_url("http://[::1]:9000").is_ok());
        assert!(matches!(
            reports_url("http://api.egress.svc:8080"),
            Err(ReportsError::Clear(_))
        ));
        assert!(matches!(
            reports_url("http://10.0.0.1:8080"),
            Err(ReportsError::Clear(_))
        ));
        assert!(matches!(
            reports_url("ftp://127.0.0.1"),
            Err(ReportsError::Clear(_))
        ));
        assert!(matches!(reports_url("no url"), Err(ReportsError::Url(_))));
    }
}
