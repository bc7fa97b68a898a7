//! One probe: a GET through a proxy (or straight to the echo) and the judgement of its answer.
//!
//! To an `http://` echo the proxy is sent the GET in absolute form. To an `https://` echo the
//! proxy is asked for a CONNECT tunnel, and inside it the checker speaks TLS to the echo and
//! sends the GET in origin form: the nonce and the echo's answer cross the proxy encrypted,
//! so a proxy can neither read the nonce nor forge the answer.

use crate::classify::{Expect, classify};
use crate::outcome::{Outcome, Reason};
use crate::url::EchoUrl;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONNECTION, HOST, USER_AGENT};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout_at};

/// What to probe: through `proxy`, or with `proxy: None` straight to the echo (the direct
/// check that tells an echo outage from broken proxies).
#[derive(Clone, PartialEq, Eq)]
pub struct ProbeRequest {
    pub proxy: Option<SocketAddr>,
    pub echo: Arc<EchoUrl>,
    /// Sent as the [`crate::NONCE_PARAM`] query parameter; URL-safe text.
    pub nonce: String,
    /// More of the checker's own addresses for this probe, besides the options' (those the
    /// echoes saw the checker come from when asked directly: behind a NAT, its public ones).
    pub client_addresses: Vec<IpAddr>,
    /// The `Proxy-Authorization` value the proxy requires (`Basic …`): sent to the proxy only,
    /// on the plain GET and on the CONNECT, never inside the tunnel. Secret: no message
    /// quotes it.
    pub proxy_authorization: Option<String>,
}

/// Without the credential.
impl std::fmt::Debug for ProbeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeRequest")
            .field("proxy", &self.proxy)
            .field("echo", &self.echo)
            .field("nonce", &self.nonce)
            .field("client_addresses", &self.client_addresses)
            .field(
                "proxy_authorization",
                &self.proxy_authorization.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ProbeRequest {
    pub fn new(proxy: Option<SocketAddr>, echo: Arc<EchoUrl>, nonce: String) -> ProbeRequest {
        ProbeRequest {
            proxy,
            echo,
            nonce,
            client_addresses: Vec::new(),
            proxy_authorization: None,
        }
    }

    /// The request presenting `authorization` to the proxy.
    pub fn with_authorization(mut self, authorization: String) -> ProbeRequest {
        self.proxy_authorization = Some(authorization);
        self
    }
}

/// One check of a proxy: each request's probe at once (the plain GET's and the tunnel's),
/// judged together by [`Outcome::all_of`].
pub async fn probe_all(prober: &dyn Prober, requests: &[ProbeRequest]) -> Outcome {
    let probes = requests.iter().map(|r| prober.probe(r));
    Outcome::all_of(futures::future::join_all(probes).await)
}

/// Sends probes. The real one is [`HttpProber`]; a simulated backend implements this over its
/// model (and may judge the answers it makes up with [`crate::classify()`]).
#[async_trait::async_trait]
pub trait Prober: Send + Sync {
    /// Never fails: every way a probe can go wrong is an [`Outcome`] reason.
    async fn probe(&self, request: &ProbeRequest) -> Outcome;
}

/// How [`HttpProber`] probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Bounds the whole probe: connect, request, and the complete answer.
    pub timeout: Duration,
    /// Bounds the answer's body; an echo answer is a few hundred bytes.
    pub max_answer_bytes: usize,
    /// The local address probes are sent from (the kernel chooses when None): a proxy admits
    /// clients by source address, so the checker must come from an allowed one.
    pub local_address: Option<IpAddr>,
    /// More addresses that are the client's own besides the probe connection's local address,
    /// e.g. the public address a NAT gives the checker. The echo must see none of them.
    pub extra_own_addresses: Vec<IpAddr>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            timeout: Duration::from_secs(10),
            max_answer_bytes: 64 * 1024,
            local_address: None,
            extra_own_addresses: Vec::new(),
        }
    }
}

/// Read buffer of a probe connection (hyper's minimum): an answer's head must fit, and it
/// bounds the memory of each probe in flight.
const READ_BUFFER: usize = 8192;

const USER_AGENT_VALUE: &str = concat!("egress-check/", env!("CARGO_PKG_VERSION"));

/// Probes over a fresh TCP connection each, with hyper's client connection API: no pool and
/// no client object per proxy, so holding 10,000 proxies costs nothing between probes, and the
/// connection goes to the proxy while the request names the echo (absolute form), which a
/// pooled client keyed by the request's host could not express.
#[derive(Debug, Clone, Default)]
pub struct HttpProber {
    options: ProbeOptions,
    /// What TLS to https echoes trusts; the system's roots when not given, built at first use.
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// The system-roots client config, built once per process.
fn system_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::tls::Trust::System
                .client_config()
                .map_err(|e| e.to_string())
        })
        .clone()
}

impl HttpProber {
    /// Trusts https echoes by the system's roots.
    pub fn new(options: ProbeOptions) -> HttpProber {
        HttpProber { options, tls: None }
    }

    /// Trusts https echoes by `trust`.
    pub fn with_trust(
        options: ProbeOptions,
        trust: &crate::tls::Trust,
    ) -> Result<HttpProber, crate::tls::TlsError> {
        Ok(HttpProber {
            options,
            tls: Some(trust.client_config()?),
        })
    }

    pub fn options(&self) -> &ProbeOptions {
        &self.options
    }
}

#[async_trait::async_trait]
impl Prober for HttpProber {
    #[tracing::instrument(level = "debug", skip_all, fields(proxy = ?request.proxy, echo = %request.echo))]
    async fn probe(&self, request: &ProbeRequest) -> Outcome {
        let start = Instant::now();
        let deadline = start + self.options.timeout;
        let outcome = self.exchange(request, start, deadline).await;
        tracing::debug!(reason = %outcome.reason, message = %outcome.message, "probe");
        outcome
    }
}

/// A failed step: the reason, and what happened in words.
type Failure = (Reason, String);

/// Local errors that are the checker's, not the proxy's: out of descriptors, buffers, memory
/// or ephemeral ports (Linux errno values; elsewhere only the portable kinds are known).
fn is_local_resource_error(e: &io::Error) -> bool {
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    matches!(
        e.kind(),
        io::ErrorKind::AddrNotAvailable | io::ErrorKind::OutOfMemory
    ) || (cfg!(target_os = "linux")
        && matches!(e.raw_os_error(), Some(ENOMEM | ENFILE | EMFILE | ENOBUFS)))
}

fn io_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io);
        }
        source = err.source();
    }
    None
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why no answer head arrived.
fn head_failure(e: &hyper::Error, who: &str) -> Failure {
    if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        return (
            Reason::BadEcho,
            format!("the {who} did not answer HTTP/1.1: {e}"),
        );
    }
    if e.is_timeout() {
        return (
            Reason::Timeout,
            format!("the {who} did not answer in time: {e}"),
        );
    }
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return (
            Reason::ProxyUnreachable,
            format!("the {who} closed the connection without answering"),
        );
    }
    let detail = io_cause(e).map_or_else(|| e.to_string(), ToString::to_string);
    (
        Reason::ProxyUnreachable,
        format!("the connection to the {who} failed: {detail}"),
    )
}

/// Why the body of an answer could not be read.
fn body_failure(e: &(dyn std::error::Error + Send + Sync + 'static), limit: usize) -> Failure {
    if e.downcast_ref::<LengthLimitError>().is_some() {
        return (
            Reason::BadEcho,
            format!("the answer is larger than {limit} bytes"),
        );
    }
    (Reason::BadEcho, format!("the answer broke off: {e}"))
}

impl HttpProber {
    async fn exchange(&self, request: &ProbeRequest, start: Instant, deadline: Instant) -> Outcome {
        match self.try_exchange(request, start, deadline).await {
            Ok(outcome) => outcome,
            Err((reason, message)) => Outcome::failed(reason, message),
        }
    }

    async fn connect(
        &self,
        target: SocketAddr,
        who: &str,
        deadline: Instant,
    ) -> Result<TcpStream, Failure> {
        let unavailable = |m: String| (Reason::CheckerUnavailable, m);
        let socket = match target {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(|e| unavailable(format!("the checker cannot open a socket: {e}")))?;
        if let Some(local) = self.options.local_address {
            socket.bind(SocketAddr::new(local, 0)).map_err(|e| {
                unavailable(format!(
                    "the checker cannot send from {local} (the probe's local address): {e}"
                ))
            })?;
        }
        match timeout_at(deadline, socket.connect(target)).await {
            Err(_) => Err((
                Reason::Timeout,
                format!(
                    "no TCP connection to the {who} {target} within {:?}",
                    self.options.timeout
                ),
            )),
            Ok(Err(e)) if is_local_resource_error(&e) => Err(unavailable(format!(
                "the checker cannot connect to {target}: {e}"
            ))),
            Ok(Err(e)) => Err((
                Reason::ProxyUnreachable,
                format!("cannot connect to the {who} {target}: {e}"),
            )),
            Ok(Ok(stream)) => Ok(stream),
        }
    }

    async fn resolve(&self, echo: &EchoUrl, deadline: Instant) -> Result<SocketAddr, Failure> {
        let found = timeout_at(
            deadline,
            tokio::net::lookup_host((echo.host(), echo.port())),
        )
        .await
        .map_err(|_| {
            (
                Reason::Timeout,
                format!(
                    "resolving {} took longer than {:?}",
                    echo.host(),
                    self.options.timeout
                ),
            )
        })?
        .map_err(|e| {
            (
                Reason::ProxyUnreachable,
                format!("cannot resolve {}: {e}", echo.host()),
            )
        })?;
        // Sent from a fixed local address, only that family can connect.
        let family = self.options.local_address.map(|a| a.is_ipv4());
        let mut found = found.filter(|a| family.is_none_or(|v4| a.is_ipv4() == v4));
        found.next().ok_or_else(|| {
            (
                Reason::ProxyUnreachable,
                format!("{} has no address of the probe's family", echo.host()),
            )
        })
    }

    async fn try_exchange(
        &self,
        request: &ProbeRequest,
        start: Instant,
        deadline: Instant,
    ) -> Result<Outcome, Failure> {
        let echo = &request.echo;
        let (target, who) = match request.proxy {
            Some(proxy) => (proxy, "proxy"),
            None => (self.resolve(echo, deadline).await?, "echo"),
        };
        // Only a plain GET through a proxy names the echo in the request line.
        let uri = if request.proxy.is_some() && !echo.is_https() {
            echo.absolute_form(&request.nonce)
        } else {
            echo.origin_form(&request.nonce)
        };
        let uri: Uri = uri.parse().map_err(|e| {
            (
                Reason::CheckerUnavailable,
                format!("the nonce does not fit in a URL: {e}"),
            )
        })?;
        let mut stream = self.connect(target, who, deadline).await?;
        let mut own = Vec::with_capacity(
            1 + self.options.extra_own_addresses.len() + request.client_addresses.len(),
        );
        if let Ok(local) = stream.local_addr() {
            own.push(local.ip().to_canonical());
        }
        own.extend(self.options.extra_own_addresses.iter().copied());
        own.extend(request.client_addresses.iter().copied());
        // One request, one answer: no delay for small writes.
        let _ = stream.set_nodelay(true);
        let (parts, body) = if echo.is_https() {
            let who = if request.proxy.is_some() {
                self.open_tunnel(
                    &mut stream,
                    echo,
                    request.proxy_authorization.as_deref(),
                    deadline,
                )
                .await?;
                "echo through the tunnel"
            } else {
                "echo"
            };
            let tls = self
                .handshake(stream, echo, request.proxy.is_some(), deadline)
                .await?;
            // Inside the tunnel the request goes to the echo: no proxy credential in it.
            self.get(tls, uri, echo, who, None, deadline).await?
        } else {
            let auth = request.proxy.and(request.proxy_authorization.as_deref());
            self.get(stream, uri, echo, who, auth, deadline).await?
        };
        let latency = start.elapsed();
        let mut outcome = classify(
            parts.status.as_u16(),
            &parts.headers,
            &body,
            &Expect {
                nonce: &request.nonce,
                own_addresses: &own,
                via_proxy: request.proxy.is_some(),
            },
        );
        outcome.latency_ms = Some(millis(latency));
        Ok(outcome)
    }

    fn timed_out(&self, what: &str) -> Failure {
        (
            Reason::Timeout,
            format!("{what} within {:?}", self.options.timeout),
        )
    }

    /// Asks the proxy for a tunnel to the echo and reads its answer head (bounded). Only a
    /// 2xx opens one; anything else, or a closed connection, is [`Reason::TunnelRefused`].
    async fn open_tunnel(
        &self,
        stream: &mut TcpStream,
        echo: &EchoUrl,
        proxy_authorization: Option<&str>,
        deadline: Instant,
    ) -> Result<(), Failure> {
        let target = echo.connect_authority();
        let auth = proxy_authorization
            .filter(|a| !a.contains(['\r', '\n']))
            .map(|a| format!("Proxy-Authorization: {a}\r\n"))
            .unwrap_or_default();
        let ask = format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}User-Agent: {USER_AGENT_VALUE}\r\n\r\n"
        );
        let refused = |m: String| (Reason::TunnelRefused, m);
        let exchange = async {
            stream
                .write_all(ask.as_bytes())
                .await
                .map_err(|e| refused(format!("the proxy took no CONNECT request: {e}")))?;
            let mut head = Vec::with_capacity(512);
            let mut chunk = [0u8; 1024];
            let end = loop {
                if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                if head.len() > READ_BUFFER {
                    return Err(refused(format!(
                        "the proxy's answer to CONNECT {target} has a head larger than {READ_BUFFER} bytes"
                    )));
                }
                let n = stream.read(&mut chunk).await.map_err(|e| {
                    refused(format!(
                        "the proxy broke the connection instead of answering CONNECT {target}: {e}"
                    ))
                })?;
                if n == 0 {
                    return Err(refused(format!(
                        "the proxy closed the connection instead of answering CONNECT {target}"
                    )));
                }
                head.extend_from_slice(&chunk[..n]);
            };
            Ok::<_, Failure>((head, end))
        };
        let (head, end) = timeout_at(deadline, exchange)
            .await
            .map_err(|_| self.timed_out(&format!("the proxy did not answer CONNECT {target}")))??;
        let text = String::from_utf8_lossy(&head[..end]);
        let mut first = text.lines().next().unwrap_or_default().split_whitespace();
        let status = match (first.next(), first.next()) {
            (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
            _ => None,
        };
        let Some(status) = status else {
            return Err(refused(format!(
                "the proxy did not answer CONNECT {target} in HTTP/1.1"
            )));
        };
        if !(200..300).contains(&status) {
            let squid_error = text
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("x-squid-error"))
                .map(|(_, v)| format!(" ({})", v.trim().escape_debug()))
                .unwrap_or_default();
            return Err(refused(format!(
                "the proxy answered CONNECT {target} with {status}{squid_error}"
            )));
        }
        if head.len() > end {
            // The echo speaks only after the client's hello: bytes now are the proxy's own.
            return Err((
                Reason::TlsFailed,
                format!("the proxy sent data of its own after opening the tunnel to {target}"),
            ));
        }
        Ok(())
    }

    /// TLS to the echo over `stream` (inside the tunnel, or straight to the echo).
    async fn handshake(
        &self,
        stream: TcpStream,
        echo: &EchoUrl,
        tunnelled: bool,
        deadline: Instant,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failure> {
        let config = match &self.tls {
            Some(c) => c.clone(),
            None => system_tls().map_err(|m| (Reason::CheckerUnavailable, m))?,
        };
        let name =
            rustls::pki_types::ServerName::try_from(echo.host().to_string()).map_err(|e| {
                (
                    Reason::CheckerUnavailable,
                    format!("{} is not a TLS server name: {e}", echo.host()),
                )
            })?;
        let connector = tokio_rustls::TlsConnector::from(config);
        let where_ = if tunnelled {
            " inside the proxy's tunnel"
        } else {
            ""
        };
        match timeout_at(deadline, connector.connect(name, stream)).await {
            Err(_) => Err(self.timed_out(&format!(
                "no TLS handshake with {}{where_}",
                echo.connect_authority()
            ))),
            Ok(Err(e)) if tunnelled => Err((
                Reason::TlsFailed,
                format!("TLS with {}{where_} failed: {e}", echo.connect_authority()),
            )),
            // Straight to the echo, the echo itself is broken or not the one trusted.
            Ok(Err(e)) => Err((
                Reason::BadEcho,
                format!("TLS with the echo {} failed: {e}", echo.connect_authority()),
            )),
            Ok(Ok(tls)) => Ok(tls),
        }
    }

    /// One GET over `io` and its whole answer, bounded by the deadline and the size limit.
    async fn get<IO>(
        &self,
        io: IO,
        uri: Uri,
        echo: &EchoUrl,
        who: &str,
        proxy_authorization: Option<&str>,
        deadline: Instant,
    ) -> Result<(hyper::http::response::Parts, Bytes), Failure>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(READ_BUFFER)
            .title_case_headers(true)
            .handshake::<_, Empty<Bytes>>(TokioIo::new(io))
            .await
            .map_err(|e| head_failure(&e, who))?;
        let mut req = Request::get(uri);
        if let Some(auth) = proxy_authorization {
            req = req.header(hyper::header::PROXY_AUTHORIZATION, auth);
        }
        let req = req
            .header(HOST, echo.authority())
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, USER_AGENT_VALUE)
            // Each probe proves a fresh connection; nothing is left open between intervals.
            .header(CONNECTION, "close")
            .body(Empty::new())
            .map_err(|e| {
                (
                    Reason::CheckerUnavailable,
                    format!("the probe request cannot be built: {e}"),
                )
            })?;
        let limit = self.options.max_answer_bytes;
        let exchange = async {
            let response = sender
                .send_request(req)
                .await
                .map_err(|e| head_failure(&e, who))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, limit)
                .collect()
                .await
                .map_err(|e| body_failure(e.as_ref(), limit))?
                .to_bytes();
            Ok::<_, Failure>((parts, body))
        };
        // The connection is driven here, beside the exchange, rather than spawned: the probe
        // is one task, and dropping it (at the deadline) closes the socket.
        let driven = async {
            tokio::pin!(exchange);
            tokio::pin!(connection);
            tokio::select! {
                r = &mut exchange => r,
                c = &mut connection => {
                    // The connection ended first: the exchange now ends at once, and the
                    // connection's own error, if any, says more.
                    let r = exchange.await;
                    match (r, c) {
                        (Err(_), Err(e)) => Err(head_failure(&e, who)),
                        (r, _) => r,
                    }
                }
            }
        };
        timeout_at(deadline, driven).await.map_err(|_| {
            (
                Reason::Timeout,
                format!(
                    "the {who} accepted the connection but gave no complete answer within {:?}",
                    self.options.timeout
                ),
            )
        })?
    }
}
