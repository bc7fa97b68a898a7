//! Calling another replica's API with a token: the URL it may be sent to, and a JSON answer
//! read within a bound. Shared by the gateway (its reports, demand and quota peers) and the
//! operator (its demand peers).

/// Why a URL may not carry a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0:?} is not a URL with a host")]
    Malformed(String),
    #[error("{0:?} would carry a token in clear: https, or http to a loopback address only")]
    Clear(String),
}

/// `path` under `base`, an https URL or an http one to a loopback address: what is sent
/// carries a token, which never crosses a network in clear. Its query and fragment dropped.
pub fn url(base: &str, path: &str) -> Result<reqwest::Url, UrlError> {
    let mut url = reqwest::Url::parse(base).map_err(|_| UrlError::Malformed(base.to_string()))?;
    let Some(host) = url.host_str() else {
        return Err(UrlError::Malformed(base.to_string()));
    };
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => return Err(UrlError::Clear(base.to_string())),
    }
    url.set_query(None);
    url.set_fragment(None);
    let path = format!("{}{path}", url.path().trim_end_matches('/'));
    url.set_path(&path);
    Ok(url)
}

/// The roots of `pem` (a CA bundle): at least one certificate, or why not.
pub fn roots(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(pem) {
        let cert: rustls::pki_types::CertificateDer<'static> = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate in them".into());
    }
    Ok(roots)
}

/// `GET url` with `token`, its JSON answer read up to `max` bytes (a peer that answers more
/// is refused, not buffered).
pub async fn get_json<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    url: &reqwest::Url,
    token: &str,
    max: usize,
) -> Result<T, String> {
    let mut resp = client
        .get(url.clone())
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk);
        if body.len() > max {
            return Err(format!("answered more than {max} bytes"));
        }
    }
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_goes_over_tls_or_to_loopback_only() {
        assert_eq!(
            url("https://api.example:8443/base/?q=1#f", "/v1/demand")
                .unwrap()
                .as_str(),
            "https://api.example:8443/base/v1/demand"
        );
        for ok in [
            "http://127.0.0.2:80",
            "http://localhost:1",
            "http://[::1]:8",
        ] {
            assert!(url(ok, "/x").is_ok(), "{ok}");
        }
        assert!(matches!(
            url("http://10.0.0.1:8443", "/x"),
            Err(UrlError::Clear(_))
        ));
        assert!(matches!(
            url("not a url", "/x"),
            Err(UrlError::Malformed(_))
        ));
    }
}
