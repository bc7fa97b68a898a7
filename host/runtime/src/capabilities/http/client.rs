//! The HTTP client of the host's own requests: the real `http` backend's and the `google`
//! credential's token requests share its TLS (rustls with ring and the platform's roots) and
//! its rules (no environment proxies, no Referer).

use std::sync::{Arc, OnceLock};

/// The rustls config every client shares: ring and the platform's roots, built once. When it
/// cannot be built, each request fails with a transport error that says why, instead of the
/// process failing.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
                .map_err(|e| format!("no system TLS roots: {e}"))?;
            Ok(rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS protocol versions: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth())
        })
        .clone()
}

/// A client for http and https with `redirect` as its redirect policy.
pub(crate) fn client(redirect: reqwest::redirect::Policy) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .referer(false)
        .redirect(redirect)
        .tls_backend_preconfigured(tls_config()?)
        .build()
        .map_err(|e| format!("building the HTTP client: {}", error_chain(&e)))
}

/// An error with its sources: the top level alone often says too little (reqwest's "error
/// sending request", gcp_auth's "token request failed") while a source names file or status.
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
