//! Streaming an HTTP(S) body into a libvirt volume, and small byte transfers.
//!
//! The body is never held whole: it is read piece by piece, hashed (sha256) on the fly and
//! forwarded as STORAGE_VOL_UPLOAD stream packets, so memory stays at a few packets however big
//! the image is. A body that sends nothing for [`BODY_IDLE_TIMEOUT`] fails the transfer. HTTP is reqwest over rustls with ring (HTTP/1, no environment proxies, no
//! Referer), and every request is held to a [`UrlGrant`]: the URL and every redirect hop must
//! name a granted host, and a link-local or metadata address, or a name that resolves to one,
//! is reached only when it was named explicitly. A refusal is [`Error::Denied`], decided before
//! anything is sent to the refused host.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use reqwest::header;
use reqwest::{Method, StatusCode, Url};
use sha2::{Digest, Sha256};

pub use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::client::Client;
use crate::error::Error;
use crate::proto::{STREAM_CHUNK_MAX, StorageVol};

/// Progress is logged (at info) every this many bytes.
pub const PROGRESS_EVERY: u64 = 64 * 1024 * 1024;
/// A trace event says how far a transfer got every this many bytes: what a progress bar
/// follows. Nothing listens at trace in a log, and a disabled event costs a comparison.
pub const PROGRESS_TICK: u64 = 1024 * 1024;
/// Redirects followed before giving up.
pub const MAX_REDIRECTS: usize = 5;

/// What the resolver and connection gate fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a transfer wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub bytes: u64,
    /// Lower-case hex sha256 of the bytes written.
    pub sha256: String,
}

/// The hosts image URLs may be fetched from. An entry is `host` (any port) or `host:port`
/// (`[v6]:port` for IPv6); names compare case-insensitively, addresses by value, so another
/// spelling of an address (`2130706433`, `0x7f.1`) is the same address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlGrant {
    hosts: Vec<GrantedHost>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GrantedHost {
    host: HostName,
    port: Option<u16>,
    /// Named in an allow-list rather than implied by a catalogue URL: only such an entry may
    /// reach a link-local or metadata address.
    explicit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostName {
    Ip(IpAddr),
    Domain(String),
}

impl HostName {
    fn parse(s: &str) -> Option<Self> {
        let s = s.trim_end_matches('.').to_ascii_lowercase();
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(Self::Ip(ip));
        }
        let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        (!s.is_empty() && s.chars().all(name_char) && !s.starts_with('.'))
            .then_some(Self::Domain(s))
    }

    fn of_url(url: &Url) -> Option<Self> {
        match url.host()? {
            url::Host::Domain(d) => Self::parse(d),
            url::Host::Ipv4(ip) => Some(Self::Ip(IpAddr::V4(ip))),
            url::Host::Ipv6(ip) => Some(Self::Ip(IpAddr::V6(ip))),
        }
    }
}

/// Parses a grant entry: `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
/// Returns the host and the port, or None when the entry is not of that form.
pub fn parse_host_entry(entry: &str) -> Option<(String, Option<u16>)> {
    let entry = entry.trim();
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<Ipv6Addr>().ok()?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?.parse::<u16>().ok()?)),
        }
    } else if entry.matches(':').count() > 1 {
        entry.parse::<Ipv6Addr>().ok()?;
        (entry, None)
    } else if let Some((h, p)) = entry.split_once(':') {
        (h, Some(p.parse::<u16>().ok()?))
    } else {
        (entry, None)
    };
    if port == Some(0) {
        return None;
    }
    HostName::parse(host)?;
    Some((host.to_ascii_lowercase(), port))
}

/// Why a host is refused.
enum Refusal {
    NotGranted,
    Special(IpAddr),
}

impl UrlGrant {
    /// `implied`: the hosts of URLs the entry's own config names (an image catalogue), each
    /// limited to its URL's port; `explicit`: an allow-list of `host` or `host:port` entries.
    /// Entries that do not parse grant nothing (config validation reports them).
    pub fn new<'a>(
        implied: impl IntoIterator<Item = &'a str>,
        explicit: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut hosts: Vec<GrantedHost> = implied
            .into_iter()
            .filter_map(|url| {
                let url = Url::parse(url).ok()?;
                Some(GrantedHost {
                    host: HostName::of_url(&url)?,
                    port: url.port_or_known_default(),
                    explicit: false,
                })
            })
            .collect();
        hosts.extend(explicit.into_iter().filter_map(|e| {
            let (host, port) = parse_host_entry(e)?;
            Some(GrantedHost {
                host: HostName::parse(&host)?,
                port,
                explicit: true,
            })
        }));
        Self { hosts }
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Checks a URL as given (not a redirect hop). The error names the host.
    pub fn check_url(&self, url: &str) -> Result<(), Error> {
        let url = parse_url(url)?;
        self.check(&url)
    }

    fn check(&self, url: &Url) -> Result<(), Error> {
        match self.refusal(url) {
            None => Ok(()),
            Some(r) => Err(denied(url, r, None)),
        }
    }

    fn refusal(&self, url: &Url) -> Option<Refusal> {
        let Some(host) = HostName::of_url(url) else {
            return Some(Refusal::NotGranted);
        };
        let port = url.port_or_known_default();
        let matching: Vec<&GrantedHost> = self
            .hosts
            .iter()
            .filter(|g| g.host == host && (g.port.is_none() || g.port == port))
            .collect();
        if matching.is_empty() {
            return Some(Refusal::NotGranted);
        }
        let explicit = matching.iter().any(|g| g.explicit);
        match host {
            HostName::Ip(ip) if is_special(ip) && !explicit => Some(Refusal::Special(ip)),
            _ => None,
        }
    }

    /// A resolved name may reach a link-local or metadata address only when the name itself
    /// was named explicitly.
    fn check_resolved(&self, name: &str, addrs: &[SocketAddr]) -> Result<(), Error> {
        let Some(special) = addrs.iter().map(SocketAddr::ip).find(|ip| is_special(*ip)) else {
            return Ok(());
        };
        let host = HostName::parse(name);
        let explicit = self
            .hosts
            .iter()
            .any(|g| g.explicit && Some(&g.host) == host.as_ref());
        if explicit {
            return Ok(());
        }
        Err(Error::Denied {
            host: name.to_owned(),
            reason: format!(
                "resolves to {special}, a link-local or metadata address; such a host is reached \
                 only when named in imageHosts"
            ),
        })
    }
}

/// The host as the URL names it, with the port when the URL gives one.
fn shown_host(url: &Url) -> String {
    let host = url.host_str().unwrap_or("?");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    }
}

fn denied(url: &Url, why: Refusal, redirected_from: Option<&Url>) -> Error {
    let mut reason = match why {
        Refusal::NotGranted => "is not granted".to_owned(),
        Refusal::Special(ip) => format!(
            "is {ip}, a link-local or metadata address; it is reached only when named in \
             imageHosts"
        ),
    };
    if let Some(from) = redirected_from {
        reason.push_str(&format!(" (redirect from {})", redact_url(from.as_str())));
    }
    Error::Denied {
        host: shown_host(url),
        reason,
    }
}

/// Link-local addresses, where clouds serve instance metadata and credentials
/// (169.254.169.254, fe80::/10), and the metadata addresses outside that range.
pub fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            (s[0] & 0xffc0) == 0xfe80
                // AWS's IPv6 metadata endpoint
                || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
                // an IPv4 address mapped or translated (NAT64, 64:ff9b::/96) into IPv6
                || v6.to_ipv4_mapped().is_some_and(is_special_v4)
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                    && is_special_v4(Ipv4Addr::from(
                        (u32::from(s[6]) << 16) | u32::from(s[7]),
                    )))
        }
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    // 100.100.100.200: Alibaba Cloud's metadata service
    ip.is_link_local() || ip == Ipv4Addr::new(100, 100, 100, 200)
}

/// The URL as safe to log: no user-info, no query (either may carry a token).
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(u) => {
            let mut out = format!("{}://{}", u.scheme(), u.host_str().unwrap_or("?"));
            if let Some(p) = u.port() {
                out.push_str(&format!(":{p}"));
            }
            out.push_str(u.path());
            out
        }
        Err(_) => "(unparsable url)".to_owned(),
    }
}

fn parse_url(url: &str) -> Result<Url, Error> {
    let parsed = Url::parse(url)
        .map_err(|e| Error::InvalidArgument(format!("url {}: {e}", redact_url(url))))?;
    match parsed.scheme() {
        "http" | "https" if parsed.host().is_some() => Ok(parsed),
        _ => Err(Error::InvalidArgument(format!(
            "url {} is not http(s)",
            redact_url(url)
        ))),
    }
}

/// How a fetcher reaches the network. The default is the system's resolver and plain
/// connections; a test replaces the resolver, and gates connections, so that nothing it
/// exercises can leave loopback even when a check is broken.
#[derive(Clone, Default)]
pub struct Net {
    /// Resolves names; None for the system's resolver (getaddrinfo on the blocking pool).
    pub resolver: Option<Arc<dyn Resolve>>,
    /// Asked before each connection attempt, ahead of resolving and connecting; an error
    /// refuses the attempt.
    pub before_connect: Option<Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>>,
    /// How long an image's body may send nothing before the transfer fails; None for
    /// [`BODY_IDLE_TIMEOUT`].
    pub body_idle_timeout: Option<Duration>,
}

/// An image server that sends nothing for this long has stalled: the transfer fails (a
/// transient error) rather than hold its create, and the image's claim, for the transfer's
/// whole budget. The same span as the claim's stall timeout, after which another writer may
/// take the image over.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The HTTP side of image transfers, held to one grant.
pub struct Fetcher {
    client: reqwest::Client,
    grant: Arc<UrlGrant>,
    body_idle: Duration,
}

impl Fetcher {
    /// A fetcher on the system's resolver.
    pub fn new(grant: &UrlGrant) -> Result<Self, Error> {
        Self::with_net(grant, Net::default())
    }

    pub fn with_net(grant: &UrlGrant, net: Net) -> Result<Self, Error> {
        let grant = Arc::new(grant.clone());
        let body_idle = net.body_idle_timeout.unwrap_or(BODY_IDLE_TIMEOUT);
        let hops = grant.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                let msg = format!("more than {MAX_REDIRECTS} redirects");
                return attempt.error(Error::Http(msg));
            }
            match hops.refusal(attempt.url()) {
                None => attempt.follow(),
                Some(why) => {
                    let e = denied(attempt.url(), why, attempt.previous().last());
                    attempt.error(e)
                }
            }
        });
        let resolver = GrantResolver {
            inner: net.resolver.unwrap_or_else(|| Arc::new(SystemResolver)),
            grant: grant.clone(),
        };
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .referer(false)
            .redirect(policy)
            .dns_resolver(Arc::new(resolver))
            .tls_backend_preconfigured(tls_config()?)
            .user_agent("egress-proxies-libvirt-rpc");
        if let Some(gate) = net.before_connect {
            builder = builder.connector_layer(Gate(gate));
        }
        let client = builder
            .build()
            .map_err(|e| Error::Http(format!("building the HTTP client: {}", chain(&e))))?;
        Ok(Self {
            client,
            grant,
            body_idle,
        })
    }

    /// Sends `method` to `url`, following up to five redirects; fails on a non-2xx answer.
    async fn request(&self, method: Method, url: &str) -> Result<reqwest::Response, Error> {
        let parsed = parse_url(url)?;
        self.grant.check(&parsed)?;
        let shown = redact_url(url);
        let resp = self
            .client
            .request(method.clone(), parsed)
            .send()
            .await
            .map_err(|e| http_error(&format!("{method} {shown}"), e))?;
        let status = resp.status();
        if status != StatusCode::OK {
            return Err(Error::Http(format!("{method} {shown}: status {status}")));
        }
        Ok(resp)
    }

    /// The body size the server announces for `url` (HEAD), `None` when it does not say.
    pub async fn size(&self, url: &str) -> Result<Option<u64>, Error> {
        let resp = self.request(Method::HEAD, url).await?;
        Ok(content_length(&resp))
    }

    /// See [`upload_from_url`].
    pub async fn upload(
        &self,
        client: &Client,
        vol: &StorageVol,
        url: &str,
        expected_sha256: Option<&str>,
        max_bytes: u64,
    ) -> Result<Transfer, Error> {
        let expected = normalise_sha256(expected_sha256)?;
        let shown = redact_url(url);
        let mut resp = self.request(Method::GET, url).await?;
        let announced = content_length(&resp);
        if let Some(len) = announced
            && len > max_bytes
        {
            return Err(Error::TooLarge { limit: max_bytes });
        }
        tracing::trace!(
            url = %shown,
            bytes = 0u64,
            total = announced,
            "volume upload started"
        );
        let mut upload = client.storage_vol_upload(vol, 0, 0).await?;
        let mut hasher = Sha256::new();
        let mut total: u64 = 0;
        let mut next_report = PROGRESS_EVERY;
        let mut next_tick = PROGRESS_TICK;
        let started = Instant::now();
        // coalesce the body's small pieces into full stream packets: fewer, larger messages
        let mut pending = BytesMut::with_capacity(STREAM_CHUNK_MAX);
        let outcome: Result<(), Error> = async {
            while let Some(data) = tokio::time::timeout(self.body_idle, resp.chunk())
                .await
                .map_err(|_| Error::timeout(format!("reading {shown}: no bytes"), self.body_idle))?
                .map_err(|e| http_error(&format!("reading {shown}"), e))?
            {
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
                if total >= next_tick {
                    tracing::trace!(
                        url = %shown,
                        bytes = total,
                        total = announced,
                        "volume upload progress"
                    );
                    next_tick = total.saturating_add(PROGRESS_TICK);
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
            tracing::trace!(url = %shown, bytes = total, "volume upload failed");
            upload.abort().await;
            return Err(e);
        }
        if let Err(e) = upload.finish().await {
            tracing::trace!(url = %shown, bytes = total, "volume upload failed");
            return Err(e);
        }
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
}

/// The rustls config every fetcher shares: ring and the platform's roots. Built once; when the
/// roots cannot be had, every https request fails with a transport error that says why.
fn tls_config() -> Result<rustls::ClientConfig, Error> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
                .map_err(|e| format!("the platform's certificate verifier: {e}"))?;
            Ok(rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS protocol versions: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth())
        })
        .clone()
        .map_err(Error::Http)
}

/// A reqwest error as an [`Error`]: a refusal raised by the grant (at a redirect or on a
/// resolved address) comes back as itself; anything else is an HTTP error with its causes,
/// without the URL, which may carry a token in its query.
fn http_error(what: &str, e: reqwest::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(Error::Denied { host, reason }) = s.downcast_ref::<Error>() {
            return Error::Denied {
                host: host.clone(),
                reason: reason.clone(),
            };
        }
        if let Some(Error::Http(m)) = s.downcast_ref::<Error>() {
            return Error::Http(format!("{what}: {m}"));
        }
        source = s.source();
    }
    Error::Http(format!("{what}: {}", chain(&e.without_url())))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The system's resolver.
struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Resolves through `inner`, then refuses a name that reaches a link-local or metadata
/// address without having been named explicitly, so no connection is opened to it.
struct GrantResolver {
    inner: Arc<dyn Resolve>,
    grant: Arc<UrlGrant>,
}

impl Resolve for GrantResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let grant = self.grant.clone();
        let lookup = self.inner.resolve(name);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = lookup.await?.collect();
            grant.check_resolved(&host, &addrs)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// A connector layer that asks [`Net::before_connect`] first.
#[derive(Clone)]
struct Gate(Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>);

impl<S> tower_layer::Layer<S> for Gate {
    type Service = Gated<S>;
    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct Gated<S> {
    inner: S,
    gate: Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>,
}

type GatedFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, R> tower_service::Service<R> for Gated<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = GatedFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        match (self.gate)() {
            Ok(()) => Box::pin(self.inner.call(req)),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

fn content_length(resp: &reqwest::Response) -> Option<u64> {
    // The header, not `Response::content_length`: a HEAD answer's body is empty, and its
    // size hint says 0 whatever the server announced.
    resp.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The body size the server announces for `url` (HEAD), `None` when it does not say. `url`
/// and every redirect must be within `grant`.
pub async fn url_size(url: &str, grant: &UrlGrant) -> Result<Option<u64>, Error> {
    grant.check_url(url)?;
    Fetcher::new(grant)?.size(url).await
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
/// upload keeps its write queue busy). `url` and every redirect must be within `grant`.
/// Fails past `max_bytes`, and when `expected_sha256` is given and differs; the volume then
/// holds partial or wrong data and the caller deletes it.
pub async fn upload_from_url(
    client: &Client,
    vol: &StorageVol,
    url: &str,
    expected_sha256: Option<&str>,
    max_bytes: u64,
    grant: &UrlGrant,
) -> Result<Transfer, Error> {
    Fetcher::new(grant)?
        .upload(client, vol, url, expected_sha256, max_bytes)
        .await
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

    fn refused(g: &UrlGrant, url: &str) -> Option<String> {
        g.check_url(url).err().map(|e| e.to_string())
    }

    #[test]
    fn catalogue_urls_grant_their_host_and_port() {
        let g = UrlGrant::new(
            [
                "https://images.example.com/debian.qcow2",
                "http://127.0.0.1:8080/x",
            ],
            [],
        );
        assert_eq!(refused(&g, "https://IMAGES.example.com./other.qcow2"), None);
        assert_eq!(refused(&g, "https://images.example.com:443/a"), None);
        assert_eq!(refused(&g, "http://127.0.0.1:8080/y?t=1"), None);
        // another spelling of the same address is the same address
        assert_eq!(refused(&g, "http://2130706433:8080/y"), None);
        assert_eq!(
            refused(&g, "http://images.example.com/a").as_deref(),
            Some("image host \"images.example.com\" is not granted")
        );
        assert_eq!(
            refused(&g, "http://127.0.0.1:8081/x").as_deref(),
            Some("image host \"127.0.0.1:8081\" is not granted")
        );
        assert!(refused(&g, "https://images.example.com.evil.example/x").is_some());
        assert!(refused(&g, "https://evil.example/?images.example.com").is_some());
        assert!(refused(&g, "https://images.example.com@evil.example/").is_some());
        assert!(refused(&g, "ftp://images.example.com/x").is_some());
    }

    #[test]
    fn allow_list_entries_are_hosts_with_an_optional_port() {
        let g = UrlGrant::new(
            [],
            [
                "Mirror.example.org",
                "10.0.0.5:8000",
                "[fd00::1]:80",
                "fe80::1",
            ],
        );
        assert_eq!(refused(&g, "https://mirror.example.org:8443/x"), None);
        assert_eq!(refused(&g, "http://10.0.0.5:8000/x"), None);
        assert!(refused(&g, "http://10.0.0.5/x").is_some());
        assert_eq!(refused(&g, "http://[fd00::1]/x"), None);
        assert_eq!(refused(&g, "http://[fe80::1]:9/x"), None);
        for bad in [
            "", "h:", "h:0", "h:x", "a b", "[::1", "[::1]x", "h/x", "user@h", ":::",
        ] {
            assert_eq!(parse_host_entry(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_host_entry("[FD00::1]:80"),
            Some(("fd00::1".into(), Some(80)))
        );
    }

    #[test]
    fn link_local_and_metadata_addresses_need_an_explicit_entry() {
        let implied = UrlGrant::new(
            [
                "http://169.254.169.254/latest",
                "http://[fe80::1]/x",
                "http://100.100.100.200/x",
                "http://[::ffff:169.254.169.254]/x",
            ],
            [],
        );
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://[fe80::1]/x",
            "http://100.100.100.200/x",
            "http://[::ffff:169.254.169.254]/x",
        ] {
            let e = refused(&implied, url).unwrap();
            assert!(e.contains("link-local or metadata"), "{url}: {e}");
        }
        let explicit = UrlGrant::new([], ["169.254.169.254", "[fe80::1]"]);
        assert_eq!(refused(&explicit, "http://169.254.169.254/latest"), None);
        assert_eq!(refused(&explicit, "http://[fe80::1]/x"), None);
    }

    #[test]
    fn special_addresses() {
        for ip in [
            "169.254.169.254",
            "169.254.0.1",
            "100.100.100.200",
            "fe80::1",
            "febf::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(is_special(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "8.8.8.8",
            "::1",
            "fec0::1",
            "100.100.100.201",
        ] {
            assert!(!is_special(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn resolved_names_reach_special_addresses_only_when_named() {
        let meta: SocketAddr = "169.254.169.254:80".parse().unwrap();
        let plain: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let implied = UrlGrant::new(["http://metadata.test/x"], []);
        assert!(implied.check_resolved("metadata.test", &[plain]).is_ok());
        let e = implied
            .check_resolved("metadata.test", &[plain, meta])
            .unwrap_err();
        assert!(
            matches!(&e, Error::Denied { host, reason } if host == "metadata.test" && reason.contains("169.254.169.254")),
            "{e:?}"
        );
        let explicit = UrlGrant::new([], ["Metadata.test:80"]);
        assert!(explicit.check_resolved("metadata.test", &[meta]).is_ok());
    }
}
