//! The real `http` backend: hyper over rustls (ring, the system's roots), redirects followed
//! here so every hop and the final URL are checked against the grant, the response body capped
//! while it streams, the whole call (token included) bounded in time, and the named credential
//! attached only on the way out, so the guest never holds it.

use crate::capabilities::google_auth::GoogleAuth;
use crate::capabilities::http::{
    HttpBackend, HttpError, HttpRequest, HttpResponse, allowed, url_host,
};
use bytes::Bytes;
use egress_core::config::HttpGrant;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Default bound on one call, redirects and token included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on a response body: an aggregatedList page of 500 instances is a few MiB.
pub const DEFAULT_MAX_BODY: u64 = 32 * 1024 * 1024;
/// Redirects followed before giving up.
pub const MAX_REDIRECTS: usize = 5;
/// The credential name the gcp provider uses.
pub const GOOGLE: &str = "google";

/// A client for http and https with the system's roots. When they cannot be loaded, https
/// fails per request with a transport error that says so, instead of the process failing.
pub fn https_client() -> HttpsClient {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_provider_and_native_roots(provider.clone()) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("no system TLS roots ({e}); https requests will fail");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth()
                });
            match config {
                Ok(c) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(c),
                // ring supports the default versions; this arm cannot be reached in practice.
                Err(_) => {
                    hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(empty_config())
                }
            }
        }
    };
    let https = builder.https_or_http().enable_http1().build();
    Client::builder(TokioExecutor::new()).build(https)
}

fn empty_config() -> rustls::ClientConfig {
    rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

/// The real backend with its credentials and bounds.
pub struct RealHttp {
    client: HttpsClient,
    /// The process's `google` credential (Application Default Credentials).
    google: Arc<GoogleAuth>,
    /// Credentials files named by providers' grants, each with its own token cache.
    google_files: std::sync::Mutex<HashMap<String, Arc<GoogleAuth>>>,
    timeout: Duration,
    max_body: u64,
}

impl RealHttp {
    pub fn new(google: GoogleAuth) -> Self {
        Self {
            client: https_client(),
            google: Arc::new(google),
            google_files: std::sync::Mutex::default(),
            timeout: DEFAULT_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Other bounds than the defaults (tests use small ones).
    pub fn with_limits(mut self, timeout: Duration, max_body: u64) -> Self {
        self.timeout = timeout;
        self.max_body = max_body;
        self
    }

    async fn credential(&self, name: &str, grant: &HttpGrant) -> Result<String, HttpError> {
        match name {
            GOOGLE => {
                let auth = match &grant.google_credentials_file {
                    Some(file) => {
                        let mut files = self.google_files.lock().unwrap_or_else(|p| p.into_inner());
                        match files.get(file) {
                            Some(auth) => auth.clone(),
                            None => files
                                .entry(file.clone())
                                .or_insert_with(|| Arc::new(GoogleAuth::from_file(file)))
                                .clone(),
                        }
                    }
                    None => self.google.clone(),
                };
                auth.token()
                    .await
                    .map_err(|e| HttpError::Credential(e.to_string()))
            }
            other => Err(HttpError::Denied(format!("unknown credential {other:?}"))),
        }
    }

    async fn send_inner(
        &self,
        req: HttpRequest,
        grant: &HttpGrant,
    ) -> Result<HttpResponse, HttpError> {
        let origin = url_host(&req.url);
        let token = match &req.credential {
            Some(name) => Some(self.credential(name, grant).await?),
            None => None,
        };
        let mut url = req.url.clone();
        let mut method = req.method.to_uppercase();
        let mut body = req.body.clone();
        for _hop in 0..=MAX_REDIRECTS {
            if !allowed(grant, &url) {
                return Err(HttpError::Denied(format!("host of {url} is not granted")));
            }
            // The token goes only to the host it was asked for, and never in clear beyond
            // loopback.
            let here = url_host(&url);
            let attach = token.as_deref().filter(|_| here == origin);
            if attach.is_some() && url.starts_with("http://") && !is_loopback(here.as_ref()) {
                return Err(HttpError::Denied(format!(
                    "a credential is not sent over plain http to {url}"
                )));
            }
            let mut builder = http::Request::builder().method(method.as_str()).uri(&url);
            for (k, v) in &req.headers {
                if k.eq_ignore_ascii_case("host")
                    || k.eq_ignore_ascii_case("authorization") && attach.is_some()
                {
                    continue;
                }
                builder = builder.header(k.as_str(), v.as_str());
            }
            if let Some(t) = attach {
                builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let request = builder
                .body(Full::new(Bytes::from(body.clone().unwrap_or_default())))
                .map_err(|e| HttpError::Transport(format!("bad request for {url}: {e}")))?;
            let resp = self
                .client
                .request(request)
                .await
                .map_err(|e| HttpError::Transport(error_chain(&e)))?;
            let status = resp.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(location) = resp
                    .headers()
                    .get(http::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                else {
                    return Err(HttpError::Transport(format!(
                        "redirect {status} from {url} without a Location"
                    )));
                };
                url = url::Url::parse(&url)
                    .and_then(|base| base.join(location))
                    .map_err(|e| HttpError::Transport(format!("bad redirect Location: {e}")))?
                    .to_string();
                // As browsers and curl do: 303, and 301/302 after a POST, continue as GET.
                if status == 303 || (matches!(status, 301 | 302) && method == "POST") {
                    method = "GET".into();
                    body = None;
                }
                continue;
            }
            let headers = resp
                .headers()
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect();
            let bytes = read_capped(resp.into_body(), self.max_body).await?;
            return Ok(HttpResponse {
                status,
                headers,
                body: bytes,
                final_url: url,
            });
        }
        Err(HttpError::Transport(format!(
            "more than {MAX_REDIRECTS} redirects from {}",
            req.url
        )))
    }
}

fn is_loopback(host: Option<&(String, Option<u16>)>) -> bool {
    host.is_some_and(|(h, _)| {
        h == "localhost"
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// An error with its sources: the top level alone often says too little (hyper's "client
/// error (Connect)", gcp_auth's "token request failed") while a source names file or status.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

async fn read_capped(mut body: hyper::body::Incoming, max: u64) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| HttpError::Transport(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if out.len() as u64 + data.len() as u64 > max {
                return Err(HttpError::TooLarge(max));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[async_trait::async_trait]
impl HttpBackend for RealHttp {
    async fn send(&self, req: HttpRequest, grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        match tokio::time::timeout(self.timeout, self.send_inner(req, grant)).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Timeout),
        }
    }
}
