//! The `http` capability: requests to the hosts the grant allows, checked on the final URL
//! after redirects, with named credentials the host attaches so tokens never enter the guest.

use crate::bindings::egress::provider::http as wit;
use crate::call::CallState;
use egress_core::config::HttpGrant;
use serde_json::{Value, json};
use tracing::Instrument;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub final_url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("timed out")]
    Timeout,
    #[error("transport: {0}")]
    Transport(String),
    #[error("response larger than {0} bytes")]
    TooLarge(u64),
    #[error("credential: {0}")]
    Credential(String),
}

#[async_trait::async_trait]
pub trait HttpBackend: Send + Sync {
    /// Sends the request. The backend follows redirects and checks every hop, and the final
    /// URL, against `grant` before sending to it.
    async fn send(&self, req: HttpRequest, grant: &HttpGrant) -> Result<HttpResponse, HttpError>;
}

/// The host part of a URL (`host` or `host:port`), lowercased; None when it is not http(s).
pub fn url_host(url: &str) -> Option<(String, Option<u16>)> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
        return Some((host.to_lowercase(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_lowercase(), Some(p.parse().ok()?))),
        None => Some((authority.to_lowercase(), None)),
    }
}

/// Whether the grant allows `url`: its host equals a granted `host`, or `host:port` matches.
pub fn allowed(grant: &HttpGrant, url: &str) -> bool {
    let Some((host, port)) = url_host(url) else {
        return false;
    };
    grant.hosts.iter().any(|g| {
        let g = g.to_lowercase();
        match g.rsplit_once(':') {
            Some((gh, gp)) if !gh.contains(':') || g.starts_with('[') => {
                gh.trim_matches(['[', ']']) == host
                    && port.map(|p| p.to_string()).as_deref() == Some(gp)
            }
            _ => g == host,
        }
    })
}

/// No real HTTP backend in this build: every request fails as a transport error.
pub struct UnavailableHttp;

#[async_trait::async_trait]
impl HttpBackend for UnavailableHttp {
    async fn send(&self, _req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        Err(HttpError::Transport(
            "the http capability has no real backend in this build".into(),
        ))
    }
}

fn to_wit(e: HttpError) -> wit::HttpError {
    match e {
        HttpError::Denied(m) => wit::HttpError::Denied(m),
        HttpError::Timeout => wit::HttpError::Timeout,
        HttpError::Transport(m) => wit::HttpError::Transport(m),
        HttpError::TooLarge(n) => wit::HttpError::TooLarge(n),
        HttpError::Credential(m) => wit::HttpError::Credential(m),
    }
}

impl wit::Host for CallState {
    async fn send(&mut self, req: wit::Request) -> Result<wit::Response, wit::HttpError> {
        let Some(grant) = self.grants.http.clone() else {
            return Err(wit::HttpError::Denied("no http grant".into()));
        };
        if !allowed(&grant, &req.url) {
            tracing::warn!(provider = %self.provider, "http request to an ungranted host denied");
            return Err(wit::HttpError::Denied(format!(
                "host of {} is not granted",
                self.redactor.text(&req.url)
            )));
        }
        if let Some(c) = &req.credential
            && !grant.credentials.contains(c)
        {
            return Err(wit::HttpError::Denied(format!(
                "credential {c:?} is not granted"
            )));
        }
        let method = req.method.to_uppercase();
        let url = self.redactor.text(&req.url);
        let mutating = !matches!(method.as_str(), "GET" | "HEAD");
        let args = match req.body.as_deref().map(serde_json::from_slice::<Value>) {
            Some(Ok(v)) => v,
            Some(Err(_)) => json!({"bytes": req.body.as_ref().map_or(0, Vec::len)}),
            None => Value::Null,
        };
        let span = tracing::debug_span!("http.send", provider = %self.provider, method = %method, url = %url);
        let backend = self.backends.http.clone();
        let request = HttpRequest {
            method: method.clone(),
            url: req.url,
            headers: req.headers,
            body: req.body,
            credential: req.credential,
        };
        let out = async move {
            let out = backend.send(request, &grant).await;
            match &out {
                Ok(r) => tracing::debug!(status = r.status, bytes = r.body.len(), "http response"),
                Err(e) => tracing::debug!("http failed: {e}"),
            }
            out
        }
        .instrument(span)
        .await;
        if mutating {
            let error = match &out {
                Ok(r) if r.status >= 400 => Some(format!("HTTP {}", r.status)),
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            };
            self.record("http", &method, url.clone(), args, error);
        }
        out.map(|r| wit::Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
            final_url: r.final_url,
        })
        .map_err(to_wit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_matched_exactly() {
        let g = HttpGrant {
            hosts: vec!["compute.googleapis.com".into(), "127.0.0.1:8080".into()],
            credentials: vec![],
            google_credentials_file: None,
        };
        assert!(allowed(
            &g,
            "https://compute.googleapis.com/compute/v1/projects"
        ));
        assert!(allowed(&g, "https://COMPUTE.googleapis.com"));
        assert!(!allowed(&g, "https://compute.googleapis.com.evil.example/"));
        assert!(!allowed(&g, "https://evil.example/?compute.googleapis.com"));
        assert!(!allowed(&g, "https://user@evil.example/"));
        assert!(allowed(&g, "http://127.0.0.1:8080/x"));
        assert!(!allowed(&g, "http://127.0.0.1:8081/x"));
        assert!(!allowed(&g, "http://127.0.0.1/x"));
        assert!(!allowed(&g, "ftp://compute.googleapis.com/"));
    }
}
