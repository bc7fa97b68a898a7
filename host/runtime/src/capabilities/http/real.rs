//! The real `http` backend: reqwest over rustls (ring, the platform's roots), HTTP/1, no
//! environment proxies. Redirects are followed by a redirect policy that checks every hop, and
//! so the final URL, against the grant; the response body is capped while it streams, the
//! whole call (token included) bounded in time, and the named credential attached only on the
//! way out, so the guest never holds it. reqwest drops it at any hop to another host, port or
//! scheme.

use crate::capabilities::http::client::{client, error_chain};
use crate::capabilities::http::google_auth::GoogleAuth;
use crate::capabilities::http::{
    HttpBackend, HttpError, HttpRequest, HttpResponse, allowed, url_host,
};
use egress_core::config::HttpGrant;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default bound on one call, redirects and token included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on a response body: an aggregatedList page of 500 instances is a few MiB.
pub const DEFAULT_MAX_BODY: u64 = 32 * 1024 * 1024;
/// Redirects followed before giving up.
pub const MAX_REDIRECTS: usize = 5;
/// The credential name the gcp provider uses.
pub const GOOGLE: &str = "google";

/// Why the redirect policy stopped a chain.
#[derive(Debug, thiserror::Error)]
enum Hop {
    #[error("host of {0} is not granted")]
    Denied(String),
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooMany,
}

/// The redirect policy of one grant: a hop outside it is refused before anything is sent
/// there.
fn redirect_policy(hosts: Vec<String>) -> reqwest::redirect::Policy {
    let grant = HttpGrant {
        hosts,
        ..HttpGrant::default()
    };
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(Hop::TooMany);
        }
        if !allowed(&grant, attempt.url().as_str()) {
            let e = Hop::Denied(attempt.url().to_string());
            return attempt.error(e);
        }
        attempt.follow()
    })
}

/// The real backend with its credentials and bounds.
pub struct RealHttp {
    /// One client (and connection pool) per granted host list: the redirect policy belongs to
    /// the client, and checks each hop against that list.
    clients: Mutex<HashMap<Vec<String>, reqwest::Client>>,
    /// The process's `google` credential (Application Default Credentials).
    google: Arc<GoogleAuth>,
    /// Credentials files named by providers' grants, each with its own token cache.
    google_files: Mutex<HashMap<String, Arc<GoogleAuth>>>,
    timeout: Duration,
    max_body: u64,
}

impl RealHttp {
    pub fn new(google: GoogleAuth) -> Self {
        Self {
            clients: Mutex::default(),
            google: Arc::new(google),
            google_files: Mutex::default(),
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

    fn client_for(&self, grant: &HttpGrant) -> Result<reqwest::Client, HttpError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&grant.hosts) {
            return Ok(c.clone());
        }
        let c = client(redirect_policy(grant.hosts.clone())).map_err(HttpError::Transport)?;
        clients.insert(grant.hosts.clone(), c.clone());
        Ok(c)
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
        if !allowed(grant, &req.url) {
            return Err(HttpError::Denied(format!(
                "host of {} is not granted",
                req.url
            )));
        }
        let token = match &req.credential {
            Some(name) => Some(self.credential(name, grant).await?),
            None => None,
        };
        // The token never goes in clear beyond loopback.
        if token.is_some()
            && req.url.starts_with("http://")
            && !is_loopback(url_host(&req.url).as_ref())
        {
            return Err(HttpError::Denied(format!(
                "a credential is not sent over plain http to {}",
                req.url
            )));
        }
        let url = reqwest::Url::parse(&req.url)
            .map_err(|e| HttpError::Transport(format!("bad request for {}: {e}", req.url)))?;
        let method = reqwest::Method::from_bytes(req.method.to_uppercase().as_bytes())
            .map_err(|e| HttpError::Transport(format!("bad request for {}: {e}", req.url)))?;
        let mut builder = self.client_for(grant)?.request(method, url);
        for (k, v) in &req.headers {
            if k.eq_ignore_ascii_case("host")
                || k.eq_ignore_ascii_case("authorization") && token.is_some()
            {
                continue;
            }
            builder = builder.header(k.as_str(), v.as_str());
        }
        if let Some(t) = &token {
            builder = builder.bearer_auth(t);
        }
        if let Some(body) = req.body {
            builder = builder.body(body);
        }
        let mut resp = builder.send().await.map_err(|e| send_error(&req.url, e))?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let final_url = resp.url().to_string();
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| HttpError::Transport(error_chain(&e.without_url())))?
        {
            if body.len() as u64 + chunk.len() as u64 > self.max_body {
                return Err(HttpError::TooLarge(self.max_body));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(HttpResponse {
            status,
            headers,
            body,
            final_url,
        })
    }
}

/// A failed send: a hop the redirect policy refused is Denied, too many hops a transport
/// error naming the first URL; anything else a transport error with its causes.
fn send_error(url: &str, e: reqwest::Error) -> HttpError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        match s.downcast_ref::<Hop>() {
            Some(Hop::Denied(hop)) => {
                return HttpError::Denied(format!("host of {hop} is not granted"));
            }
            Some(Hop::TooMany) => {
                return HttpError::Transport(format!(
                    "more than {MAX_REDIRECTS} redirects from {url}"
                ));
            }
            None => source = s.source(),
        }
    }
    // Without the URL: the caller knows it, and a query may carry a secret.
    HttpError::Transport(error_chain(&e.without_url()))
}

fn is_loopback(host: Option<&(String, Option<u16>)>) -> bool {
    host.is_some_and(|(h, _)| {
        h == "localhost"
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
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
