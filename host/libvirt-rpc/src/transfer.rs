//! Streaming an HTTP(S) body into a libvirt volume, and small byte transfers.
//!
//! The body is never held whole: it is read piece by piece, hashed (sha256) on the fly and
//! forwarded as STORAGE_VOL_UPLOAD stream packets, so memory stays at a few packets however big
//! the image is. HTTP is hyper used directly: the workspace already builds hyper, hyper-util
//! and hyper-rustls (kube depends on them), so this adds no HTTP stack of its own.

use std::time::Instant;

use bytes::BytesMut;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::error::Error;
use crate::proto::{STREAM_CHUNK_MAX, StorageVol};

/// Progress is logged every this many bytes.
pub const PROGRESS_EVERY: u64 = 64 * 1024 * 1024;
const MAX_REDIRECTS: usize = 5;

/// What a transfer wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub bytes: u64,
    /// Lower-case hex sha256 of the bytes written.
    pub sha256: String,
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

fn http_client() -> Result<HttpClient<Https, Empty<bytes::Bytes>>, Error> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| Error::Http(format!("loading the system's CA roots: {e}")))?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(HttpClient::builder(TokioExecutor::new()).build(connector))
}

/// The URL as safe to log: no user-info, no query (either may carry a token).
pub fn redact_url(url: &str) -> String {
    match url.parse::<Uri>() {
        Ok(uri) => {
            format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or("?"),
                uri.host().unwrap_or("?"),
                uri.port().map(|p| format!(":{p}")).unwrap_or_default()
            ) + uri.path()
        }
        Err(_) => "(unparsable url)".to_owned(),
    }
}

fn parse_url(url: &str) -> Result<Uri, Error> {
    let uri: Uri = url
        .parse()
        .map_err(|e| Error::InvalidArgument(format!("url {}: {e}", redact_url(url))))?;
    match uri.scheme_str() {
        Some("http" | "https") => Ok(uri),
        _ => Err(Error::InvalidArgument(format!(
            "url {} is not http(s)",
            redact_url(url)
        ))),
    }
}

/// Sends `method` to `url`, following up to five redirects; fails on a non-2xx answer.
async fn request(method: Method, url: &str) -> Result<hyper::Response<Incoming>, Error> {
    let client = http_client()?;
    let mut uri = parse_url(url)?;
    for _ in 0..=MAX_REDIRECTS {
        let req = Request::builder()
            .method(method.clone())
            .uri(uri.clone())
            .header(header::USER_AGENT, "egress-proxies-libvirt-rpc")
            .body(Empty::new())
            .map_err(|e| Error::Http(e.to_string()))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| Error::Http(format!("{method} {}: {e}", redact_url(url))))?;
        let status = resp.status();
        if status.is_redirection() {
            let next = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| Error::Http(format!("{status} without a Location header")))?;
            uri = resolve_redirect(&uri, next)?;
            continue;
        }
        if status != StatusCode::OK {
            return Err(Error::Http(format!(
                "{method} {}: status {status}",
                redact_url(url)
            )));
        }
        return Ok(resp);
    }
    Err(Error::Http(format!(
        "more than {MAX_REDIRECTS} redirects for {}",
        redact_url(url)
    )))
}

fn resolve_redirect(base: &Uri, location: &str) -> Result<Uri, Error> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return parse_url(location);
    }
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        location
            .parse()
            .map_err(|e| Error::Http(format!("bad redirect location: {e}")))?,
    );
    Uri::from_parts(parts).map_err(|e| Error::Http(format!("bad redirect location: {e}")))
}

fn content_length(resp: &hyper::Response<Incoming>) -> Option<u64> {
    resp.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The body size the server announces for `url` (HEAD), `None` when it does not say.
pub async fn url_size(url: &str) -> Result<Option<u64>, Error> {
    let resp = request(Method::HEAD, url).await?;
    Ok(content_length(&resp))
}

fn normalise_sha256(expected: Option<&str>) -> Result<Option<String>, Error> {
    expected
        .map(|s| {
            let s = s.trim().to_ascii_lowercase();
            if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(s)
            } else {
                Err(Error::InvalidArgument(
                    "sha256 must be 64 hex digits".to_owned(),
                ))
            }
        })
        .transpose()
}

/// Streams `url`'s body into `vol` through `client` (a connection of its own is best: the
/// upload keeps its write queue busy). Fails past `max_bytes`, and when `expected_sha256` is
/// given and differs; the volume then holds partial or wrong data and the caller deletes it.
pub async fn upload_from_url(
    client: &Client,
    vol: &StorageVol,
    url: &str,
    expected_sha256: Option<&str>,
    max_bytes: u64,
) -> Result<Transfer, Error> {
    let expected = normalise_sha256(expected_sha256)?;
    let shown = redact_url(url);
    let resp = request(Method::GET, url).await?;
    if let Some(len) = content_length(&resp)
        && len > max_bytes
    {
        return Err(Error::TooLarge { limit: max_bytes });
    }
    let mut body = resp.into_body();
    let mut upload = client.storage_vol_upload(vol, 0, 0).await?;
    let mut hasher = Sha256::new();
    let mut total: u64 = 0;
    let mut next_report = PROGRESS_EVERY;
    let started = Instant::now();
    // coalesce the body's small pieces into full stream packets: fewer, larger messages
    let mut pending = BytesMut::with_capacity(STREAM_CHUNK_MAX);
    let outcome: Result<(), Error> = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Error::Http(format!("reading {shown}: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            total = total.saturating_add(data.len() as u64);
            if total > max_bytes {
                return Err(Error::TooLarge { limit: max_bytes });
            }
            hasher.update(&data);
            let mut rest = &data[..];
            while !rest.is_empty() {
                let take = rest.len().min(STREAM_CHUNK_MAX - pending.len());
                pending.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if pending.len() == STREAM_CHUNK_MAX {
                    upload.send(&pending).await?;
                    pending.clear();
                }
            }
            if total >= next_report {
                tracing::info!(
                    url = %shown,
                    mib = total >> 20,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "volume upload in progress"
                );
                next_report = next_report.saturating_add(PROGRESS_EVERY);
            }
        }
        if !pending.is_empty() {
            upload.send(&pending).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        upload.abort().await;
        return Err(e);
    }
    upload.finish().await?;
    let actual = hex::encode(hasher.finalize());
    tracing::info!(
        url = %shown,
        bytes = total,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "volume upload done"
    );
    if let Some(expected) = expected
        && expected != actual
    {
        return Err(Error::ChecksumMismatch { expected, actual });
    }
    Ok(Transfer {
        bytes: total,
        sha256: actual,
    })
}

/// Writes `data` into `vol` from offset 0 (seed ISOs, markers).
pub async fn upload_bytes(
    client: &Client,
    vol: &StorageVol,
    data: &[u8],
) -> Result<Transfer, Error> {
    let mut upload = client.storage_vol_upload(vol, 0, data.len() as u64).await?;
    if let Err(e) = upload.send(data).await {
        upload.abort().await;
        return Err(e);
    }
    upload.finish().await?;
    Ok(Transfer {
        bytes: data.len() as u64,
        sha256: hex::encode(Sha256::digest(data)),
    })
}

/// Reads at most `max_bytes` of `vol` from offset 0.
pub async fn download_bytes(
    client: &Client,
    vol: &StorageVol,
    max_bytes: u64,
) -> Result<Vec<u8>, Error> {
    if max_bytes == 0 {
        return Ok(Vec::new());
    }
    let mut download = client.storage_vol_download(vol, 0, max_bytes).await?;
    let cap = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    while let Some(chunk) = download.next_chunk().await? {
        // the daemon honours the length already; this only guards against a chatty peer
        let room = cap.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn urls_are_redacted_for_logs() {
        assert_eq!(
            redact_url("https://user:secret@example.com:8443/img.qcow2?token=abc"),
            "https://example.com:8443/img.qcow2"
        );
        assert_eq!(redact_url("http://h/x"), "http://h/x");
    }

    #[test]
    fn checksums_are_validated() {
        assert!(normalise_sha256(Some("xyz")).is_err());
        let upper = "A".repeat(64);
        assert_eq!(
            normalise_sha256(Some(&upper)).unwrap(),
            Some("a".repeat(64))
        );
        assert_eq!(normalise_sha256(None).unwrap(), None);
    }

    #[test]
    fn only_http_urls_are_accepted() {
        assert!(parse_url("ftp://h/x").is_err());
        assert!(parse_url("https://h/x").is_ok());
    }

    #[test]
    fn relative_redirects_resolve_against_the_base() {
        let base: Uri = "http://h:8080/a/b?q=1".parse().unwrap();
        assert_eq!(
            resolve_redirect(&base, "/c").unwrap().to_string(),
            "http://h:8080/c"
        );
        assert_eq!(
            resolve_redirect(&base, "https://o/d").unwrap().to_string(),
            "https://o/d"
        );
    }
}
