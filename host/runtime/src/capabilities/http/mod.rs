//! The `http` capability: requests to the hosts the grant allows, checked on the final URL
//! after redirects, with named credentials the host attaches so tokens never enter the guest.
//!
//! Here the backend trait, the grant's host check and the unavailable backend; `host.rs` the
//! host functions, `real.rs` reqwest (with `client.rs`, the TLS client it shares with
//! `google_auth.rs`, the `google` credential) and `sim.rs` the simulated Compute Engine API.

mod client;
pub mod google_auth;
mod host;
pub mod real;
pub mod sim;

use egress_core::config::HttpGrant;

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
